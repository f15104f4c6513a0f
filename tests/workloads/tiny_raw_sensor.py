"""A tiny MLP on raw sensor readings (fixtures/raw_sensor_mlp.py, scaled down so probes take a second): readings
around 300 K whose class shows only in half a kelvin, turned into deviations by a frozen calibration layer.

float32 learns within a few steps, so the loss falls fast and a probe's losses are tied to the training step they
came from. bf16 stores only every second kelvin near 300: autocast rounds the readings before the calibration
matmul, every deviation comes out 0 and the loss stays at chance.
"""
import torch
from torch import nn
from torch.utils.data import TensorDataset

N_ITEMS, SENSORS, WIDTH = 2048, 16, 64
OFFSET_K, SIGNAL_K = 300.0, 0.5

BASELINE = {"batch_size": 64}


def build_dataset():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 2, (N_ITEMS,), generator=g)
    pattern = torch.randn(SENSORS, generator=g).sign()  # which sensors read warmer for class 1
    readings = OFFSET_K + SIGNAL_K * (2 * labels[:, None] - 1) * pattern + 0.1 * torch.randn(N_ITEMS, SENSORS,
                                                                                             generator=g)
    return TensorDataset(readings, labels)


def build_model():
    calibration = nn.Linear(SENSORS, SENSORS)
    with torch.no_grad():  # deviation from the nominal temperature, per sensor
        calibration.weight.copy_(torch.eye(SENSORS))
        calibration.bias.fill_(-OFFSET_K)
    calibration.requires_grad_(False)
    return nn.Sequential(calibration, nn.Linear(SENSORS, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 2))


def build_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2)  # fast enough that the loss falls visibly from one step to the next
