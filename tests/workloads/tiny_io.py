"""Each sample waits 3 ms as if read from slow storage; the model is trivial, so loader workers pay."""
import time

import torch
from torch.utils.data import Dataset

BASELINE = {"batch_size": 8, "num_workers": 0}
SEARCH = {"num_workers": [2, 4], "batch_size": [16]}


class SlowStorage(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        time.sleep(0.003)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), i % 2


def build_model():
    return torch.nn.Linear(8, 2)


def build_dataset():
    return SlowStorage()
