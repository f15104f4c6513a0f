"""Wide inputs and a cheap model: each batch is 4 MiB, so its host-to-device copy takes the device far longer than
the host takes to launch it (with kilobyte batches both are a few microseconds and no overlap can show)."""
import torch
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 16}
FEATURES = 65536  # 256 KiB of float32 a sample


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 4))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, FEATURES, generator=g), torch.randint(0, 4, (64,), generator=g))
