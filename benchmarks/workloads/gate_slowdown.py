"""A compute-bound MLP for benchmarks/gate_reliability.py, with a plantable slowdown.

TUNE_ADVISOR_SLOWDOWN=0.15 makes every training step about 15% slower by adding 15% more hidden blocks: real
extra compute in forward, backward and the optimizer, not a sleep that a busy machine would hide or exaggerate.
"""
import os

import torch
from torch.utils.data import TensorDataset

WIDTH, BLOCKS = 256, 40
BASELINE = {"batch_size": 64}


def _slowdown() -> float:
    text = os.environ.get("TUNE_ADVISOR_SLOWDOWN", "0") or "0"
    value = float(text)  # a malformed value fails loading, with the workload's line in the error
    if not 0 <= value < 10:
        raise ValueError(f"TUNE_ADVISOR_SLOWDOWN={text}: expected a fraction such as 0.15")
    return value


def build_model():
    # One compute thread: on a 2-core machine shared with other jobs, two OpenMP threads that wait for each other
    # at every barrier turn a neighbour's load into 10x step-time swings; one thread degrades gracefully.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = round(BLOCKS * (1 + _slowdown()))
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(4096, WIDTH, generator=g), torch.randint(0, 10, (4096,), generator=g))
