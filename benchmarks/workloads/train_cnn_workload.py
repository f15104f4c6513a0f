"""fixtures/scripts/train_cnn.py's model, data and optimizer as a build_model() workload, for
benchmarks/script_mode.py: the same training, measured the two ways."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "scripts"))
from train_cnn import AugmentedImages, SmallCNN  # noqa: E402 — the script's own classes

BASELINE = {"batch_size": 32, "num_workers": 0}


def build_model():
    return SmallCNN()


def build_dataset():
    return AugmentedImages(2048)


def build_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)
