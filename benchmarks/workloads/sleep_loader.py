"""A loader whose only cost is a known sleep per record, so its steady-state throughput can be computed:
with W loader workers, W records are read per record-time (benchmarks/steady_state.py). Its epoch is far longer
than any probe window, so no epoch boundary (a real, per-epoch cost a whole-epoch window counts) enters it."""
import time

import torch
from torch.utils.data import Dataset

RECORD_S = 0.010  # the sleep per record: far above the tiny model's step, so the loader alone sets the pace
N_ITEMS = 1_000_000
BASELINE = {"batch_size": 16, "num_workers": 1}


class SleepDataset(Dataset):
    def __len__(self):
        return N_ITEMS

    def __getitem__(self, idx):
        time.sleep(RECORD_S)
        return torch.full((8,), float(idx % 7)), idx % 2


def build_dataset():
    return SleepDataset()


def build_model():
    return torch.nn.Linear(8, 2)
