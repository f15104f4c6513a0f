"""A tiny argparse training script for script-mode tests: an MLP on random data; writes a log file and a
checkpoint next to where it runs (relative paths), as ordinary scripts do."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randint(4, (256,)))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
log = open("tiny_log.txt", "w")
for epoch in range(args.epochs):
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(epoch, float(loss), file=log, flush=True)
    torch.save(model.state_dict(), "tiny_checkpoint.pt")
