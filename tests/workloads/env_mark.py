"""Fails to build, naming the value of TA_TEST_MARK: shows which environment the probe child saw."""
import os

import torch


def build_model():
    raise RuntimeError(f"mark={os.environ.get('TA_TEST_MARK')}")


def build_dataset():
    return torch.utils.data.TensorDataset(torch.randn(8, 2), torch.zeros(8, dtype=torch.long))
