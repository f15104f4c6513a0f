"""From batch 64 the forward asks the device for 2 TiB per sample: a real CUDA OOM (on CPU: allocator failure)."""
import torch
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 16}


class Greedy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        if x.shape[0] >= 64:
            torch.empty(x.shape[0], 2**39, device=x.device)  # 2 TiB of float32 per sample
        return self.fc(x)


def build_model():
    return Greedy()


def build_dataset():
    return TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
