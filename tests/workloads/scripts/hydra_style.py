"""A script configured by Hydra-style `key=value` overrides (parsed by hand: no Hydra needed), which refuses a key
given twice as Hydra does. Its batch size is `training.batch_size`."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

config = {"training.batch_size": 8, "training.epochs": 50, "model.width": 32}
seen = set()
for override in sys.argv[1:]:
    key, sep, value = override.partition("=")
    if not sep or key not in config:
        sys.exit(f"Could not override '{override}': expected key=value with key one of {sorted(config)}")
    if key in seen:
        sys.exit(f"Multiple values for {key}")
    seen.add(key)
    config[key] = int(value)

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randint(4, (256,)))
loader = DataLoader(data, batch_size=config["training.batch_size"], shuffle=True)
model = nn.Sequential(nn.Linear(16, config["model.width"]), nn.ReLU(), nn.Linear(config["model.width"], 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(config["training.epochs"]):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
