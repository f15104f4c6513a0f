"""A training script written the usual way, with helpers named as the workload contract's (`build_model(args)`,
`collate_fn(batch)`): argparse, a hand-written loop, a `__main__` block. Script mode runs it as a script."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader


def collate_fn(batch):
    xs, ys = zip(*batch)
    return torch.stack(xs), torch.tensor(ys)


def build_model(args):
    return nn.Sequential(nn.Linear(16, args.width), nn.ReLU(), nn.Linear(args.width, 4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = [(torch.randn(16), int(i % 4)) for i in range(256)]
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, collate_fn=collate_fn)
    model = build_model(args)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
