"""A LightningModule handed over as it is (build_module()), small enough for a test: a tiny MLP on records that each
take 8 ms to read, read in the training process (num_workers=0). The wait dominates each step by far, so loader
workers win clearly even on a busy machine (a sleeping read needs no CPU)."""
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

READ_LATENCY_S = 0.008
SEARCH = {"num_workers": [0, 2]}  # one rung: the test checks the path, not the ladder
TRAINER_ARGS = {"precision": "32-true", "accumulate_grad_batches": 1, "max_epochs": 10}


class SlowRecords(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, idx):
        time.sleep(READ_LATENCY_S)
        g = torch.Generator().manual_seed(idx)
        return torch.randn(32, generator=g), int(torch.randint(4, (1,), generator=g))


class TinyClassifier(L.LightningModule):
    def __init__(self, batch_size=16):
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(SlowRecords(), batch_size=self.batch_size, shuffle=True, num_workers=0)


def build_module():
    return TinyClassifier()
