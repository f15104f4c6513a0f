"""A tiny training script written for torchrun, for script-mode DDP tests: it joins the process group from the
environment torchrun sets (env://, gloo), wraps its MLP in DDP, shards random data with a DistributedSampler and
destroys the group at its end, as such scripts do. `DDP_SCRIPT_FAULT=raise:N` makes rank N fail at its third step;
`--read-local-rank` reads LOCAL_RANK before joining (as scripts that pick their GPU by it do)."""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--read-local-rank", action="store_true")
    args = parser.parse_args()
    if args.read_local_rank:
        print("local rank", int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 32), torch.randint(4, (1024,)))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    fault = os.environ.get("DDP_SCRIPT_FAULT", "")
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if fault == f"raise:{rank}" and step == 3:
                raise ValueError(f"planted fault in rank {rank}")
            if step >= args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
