"""A Conv2d then a Linear, no bias-free tricks: its FLOPs per step can be counted by hand (see the collector tests).

conv: Conv2d(3, 8, 3, padding=1) on 8x8 images; linear: Linear(8*8*8, 10). Batch 16.
"""
import torch
from torch import nn
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 16}
C_IN, C_OUT, K, HW, CLASSES = 3, 8, 3, 8, 10


def build_model():
    return nn.Sequential(nn.Conv2d(C_IN, C_OUT, K, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(C_OUT * HW * HW, CLASSES))


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(256, C_IN, HW, HW, generator=g), torch.randint(0, CLASSES, (256,), generator=g))
