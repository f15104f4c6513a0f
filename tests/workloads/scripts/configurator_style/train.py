"""A script in nanoGPT's style, run from its own folder: module-level settings overridden by `--key=value` and
config files through `exec(open('configurator.py').read())`, data read from `data/` by a relative path, batches
drawn by index (no DataLoader), a checkpoint and a log written under `out/` and beside it."""
import os

import torch
from torch import nn

batch_size = 32
block_size = 8
max_iters = 100000
learning_rate = 1e-2
out_dir = "out"
exec(open("configurator.py").read())  # overrides from the command line or a config file

tokens = torch.tensor([int(t) for t in open(os.path.join("data", "train.txt")).read().split()])
assert batch_size > 0, batch_size


def get_batch():
    ix = torch.randint(len(tokens) - block_size - 1, (batch_size,))
    x = torch.stack([tokens[i:i + block_size] for i in ix])
    y = torch.stack([tokens[i + 1:i + 1 + block_size] for i in ix])
    return x, y


torch.manual_seed(1337)
model = nn.Sequential(nn.Embedding(16, 32), nn.Linear(32, 16))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
os.makedirs(out_dir, exist_ok=True)
log = open("train_log.txt", "w")
for it in range(max_iters):
    x, y = get_batch()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.view(-1, 16), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print(it, loss.item(), file=log, flush=True)
    if it == 2:
        torch.save(model.state_dict(), os.path.join(out_dir, "ckpt.pt"))
