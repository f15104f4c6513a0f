"""A tiny MLP for DDP probes: SEARCH names only DDP knobs, so a grid is two probes (plus the confirmation).

RANK_FAULT (environment) makes one rank fail, for the failure tests: "raise:1" raises in rank 1's loss,
"segv:1" kills rank 1 with SIGSEGV, "hang:1" makes it sleep.
"""
import os
import signal
import time

import torch
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 16}
SEARCH = {"gradient_as_bucket_view": [False, True]}


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))


def compute_loss(model, batch):
    fault, _, rank = os.environ.get("RANK_FAULT", "").partition(":")
    if fault and os.environ.get("RANK") == rank:
        if fault == "raise":
            raise ValueError(f"planted fault in rank {rank}")
        if fault == "hang":
            time.sleep(3600)
        os.kill(os.getpid(), signal.SIGSEGV)
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(model(inputs), targets)
