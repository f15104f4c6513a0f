"""A tiny MLP with a SEARCH of four combinations, for `--strategy grid`."""
import torch
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 16}
SEARCH = {"batch_size": [16, 32], "num_workers": [0, 1], "pin_memory": [False, True]}


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))
