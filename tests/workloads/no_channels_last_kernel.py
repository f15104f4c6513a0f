"""A tiny CNN whose convolution has "no kernel" for channels_last input on this machine, as a oneDNN build
without that layout would say: a probe with channels_last=true fails the way such a machine fails it."""
import torch
from torch.utils.data import TensorDataset

BASELINE = {"batch_size": 8}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 8 * 8, 2)

    def forward(self, x):
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
            raise RuntimeError("could not create a primitive descriptor for the convolution forward propagation "
                               "primitive")
        return self.head(torch.relu(self.conv(x)).flatten(1))


def build_model():
    return Net()


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(128, 3, 8, 8, generator=g), torch.randint(0, 2, (128,), generator=g))
