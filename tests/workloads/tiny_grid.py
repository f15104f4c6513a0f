"""A tiny MLP whose SEARCH is eight quick combinations (no loader workers): runs to kill and resume."""
import torch
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 8}
SEARCH = {"batch_size": [8, 16, 32, 64], "amp": ["off", "bf16"]}


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))
