"""A plain hand-written training loop, the yardstick for benchmarks/fidelity.py.

Deliberately written without any tune_advisor code: the loop a user would write. Usage:
    python hand_loop.py WORKLOAD.py '{"batch_size": 32, ...}' STEPS [STEP_TIMES.json]
prints one JSON line: {"items_per_s": ..., "steps": ...}; with STEP_TIMES.json, also writes there each measured
step's (end time on the monotonic clock, items), for benchmarks that line steps up with events in another process.
"""

import contextlib
import importlib.util
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset


def main(path, settings, steps, warmup=3, times_path=None):
    spec = importlib.util.spec_from_file_location("workload", path)
    wl = importlib.util.module_from_spec(spec)
    sys.modules["workload"] = wl
    spec.loader.exec_module(wl)
    torch.manual_seed(0)
    model = wl.build_model()
    dataset = wl.build_dataset()
    if settings["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    opt = wl.build_optimizer(model.parameters()) if hasattr(wl, "build_optimizer") else torch.optim.AdamW(
        model.parameters(), lr=1e-3)
    iterable = isinstance(dataset, IterableDataset)
    loader = DataLoader(dataset, batch_size=settings["batch_size"], shuffle=not iterable,
                        num_workers=settings["num_workers"], collate_fn=getattr(wl, "collate_fn", None))

    def loss_of(batch):
        if hasattr(wl, "compute_loss"):
            return wl.compute_loss(model, batch)
        if isinstance(batch, dict):
            return model(**batch).loss
        x, y = batch
        if settings["channels_last"] and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(model(x), y)

    def batches():
        while True:
            yield from loader

    def amp():
        if settings["amp"] == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    it = batches()
    items = 0
    ends = []
    for step in range(warmup + steps):
        if step == warmup:
            start, items = time.perf_counter(), 0
        batch = next(it)
        with amp():
            loss = loss_of(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        n = wl.count_items(batch) if hasattr(wl, "count_items") else len(
            batch[0] if not isinstance(batch, dict) else next(iter(batch.values())))
        items += n
        if step >= warmup:
            ends.append((time.monotonic(), n))
    elapsed = time.perf_counter() - start
    if times_path:
        with open(times_path, "w") as f:
            json.dump(ends, f)
    print(json.dumps({"items_per_s": items / elapsed, "steps": steps}))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), times_path=sys.argv[4] if len(sys.argv) > 4 else None)
