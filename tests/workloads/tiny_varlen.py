"""Token sequences of varying length, padded per batch: every batch can have a new shape (recompiles)."""
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

BASELINE = {"batch_size": 8}
SEARCH = {"compile": ["off", "default"]}  # for the golden run: tests/golden/compile_varlen.results.json


class Sequences(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        n = 3 + (i * 7) % 29  # 3 to 31 tokens: the longest in each shuffled batch of 8 varies
        return torch.full((n,), i % 50), i % 3


def collate_fn(samples):
    tokens, labels = zip(*samples)
    return pad_sequence(tokens, batch_first=True), torch.tensor(labels)


class Bag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, tokens):
        return self.head(self.embed(tokens).mean(dim=1))


def build_model():
    return Bag()


def build_dataset():
    return Sequences()
