"""One probe result from the results of every rank of a DDP job; and, when the job failed, which rank failed first.

The job advances at the pace of its slowest rank (DDP's gradient all-reduce waits for every rank), so the merged
raw lists take, step by step, the slowest rank's step time, data wait and copy time, and the sum of the ranks'
items: job throughput = items of all ranks / job time; the job's GPU energy is the ranks' summed. Each rank's own
numbers stay under `extra.distributed.ranks`.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
from pathlib import Path
from typing import Any


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _share(part: list[float], total: list[float]) -> float | None:
    return sum(part) / sum(total) if total and sum(total) > 0 else None


def merge(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank results (as the probe child writes them, plus a `rank` section) -> the probe's result."""
    ranks = sorted(ranks, key=lambda r: r["rank"]["rank"])
    raws = [r["raw"] for r in ranks]
    n = min(len(raw["step_s"]) for raw in raws)  # equal by construction (rank 0 decides when to stop)
    slowest = {key: [max(raw[key][i] for raw in raws) for i in range(n)] for key in ("step_s", "data_wait_s", "h2d_s")}
    losses = [[raw["loss"][i] for raw in raws] for i in range(n)]
    raw = {
        **slowest,
        "items": [sum(raw["items"][i] for raw in raws) for i in range(n)],
        # DDP averages gradients, not losses: the job's loss is the ranks' mean (null once any is non-finite)
        "loss": [sum(ls) / len(ls) if None not in ls else None for ls in losses],
    }
    if all("loss_step" in raw for raw in raws):  # every rank runs the same global steps: rank 0's stand for all
        raw["loss_step"] = raws[0]["loss_step"][:n]
    first = ranks[0]
    merged = {key: first.get(key) for key in ("status", "error", "unit", "applied", "gpu")}
    if merged["gpu"] is not None:  # rank 0's GPU in full; every rank's own utilisation beside it
        merged["gpu"] = {**merged["gpu"], "ranks": [_rank_gpu(r.get("gpu")) for r in ranks]}
        energy = job_energy(ranks)
        if energy is not None:  # the job's: every rank's GPU, not rank 0's alone
            merged["gpu"]["energy"] = energy
    merged["raw"] = raw
    merged["extra"] = dict(first.get("extra") or {})
    merged["extra"]["distributed"] = summary(ranks, raw)
    merged["memory"] = job_memory(ranks)
    return merged


def _rank_gpu(gpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """What one rank's NVML sampler saw of its own GPU: utilisation, memory, and how that GPU was matched."""
    if not gpu:
        return None
    return {k: gpu.get(k) for k in ("util_mean", "util_p50", "memory_used_max_bytes", "memory_total_bytes",
                                    "device_matched_by", "energy")}


def job_energy(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job's GPU energy over its measured window (`gpu.energy`): every rank's own GPU's counter summed, per item
    of all the ranks' items, as the job's throughput counts them. Absent where any rank's is (naming the rank), or
    where two ranks read one GPU (its counter would count twice); None where no rank read one."""
    energies = [(r.get("gpu") or {}).get("energy") for r in ranks]
    if all(e is None for e in energies):
        return None
    absent = {"joules": None, "joules_per_item": None, "items": None, "window_s": None}
    for r, e in zip(ranks, energies):
        if not e or e.get("status") != "ok":
            why = (e or {}).get("status") or "no energy counter read"
            return {**absent, "status": f"absent: rank {r['rank']['rank']}: {why.removeprefix('absent: ')}"}
    gpus = [(r["rank"].get("host"), (r.get("gpu") or {}).get("device_matched_by")) for r in ranks]
    if len(set(gpus)) < len(gpus):
        return {**absent, "status": "absent: two ranks read one GPU's energy counter (it would count twice)"}
    joules, items = sum(e["joules"] for e in energies), sum(e["items"] for e in energies)
    return {"status": "ok", "joules": joules, "joules_per_item": joules / items if items > 0 else None,
            "items": items, "window_s": max(e.get("window_s") or 0.0 for e in energies) or None}


def summary(ranks: list[dict[str, Any]], job_raw: dict[str, list]) -> dict[str, Any]:
    """`extra.distributed`: the layout, each rank's figures, the straggler spread and the communication share.

    local_step_s is a rank's median step time with the gradient all-reduce off (its own data wait and compute);
    straggler_spread is how much of the job's step the fastest rank spends waiting for the slowest one;
    comm_frac is the share of the job's step the all-reduce adds beyond the slowest rank's own work."""
    per_rank = []
    for r in ranks:
        raw, extra = r["raw"], r.get("extra") or {}
        steps = raw["step_s"]
        per_rank.append({
            **{k: r["rank"][k] for k in ("rank", "local_rank", "host", "device")},
            "steps": len(steps),
            "step_time_s": {"median": _median(steps),
                            "iqr": (statistics.quantiles(steps, n=4)[2] - statistics.quantiles(steps, n=4)[0])
                            if len(steps) >= 2 else None},
            "data_wait_frac": _share(raw["data_wait_s"], steps),
            "items_per_s": sum(raw["items"]) / sum(steps) if steps and sum(steps) > 0 else None,
            "local_step_s": _median(extra.get("local_step_s") or []),
            "peak_memory_bytes": max((r.get("memory") or {}).get(k) or 0
                                     for k in ("child_maxrss_bytes", "cuda_max_allocated_bytes")) or None,
            "gpu": _rank_gpu(r.get("gpu")),
            "raw": {"step_s": steps, "data_wait_s": raw["data_wait_s"], "local_step_s": extra.get("local_step_s")},
        })
    job_step = _median(job_raw["step_s"])
    medians = [p["step_time_s"]["median"] for p in per_rank if p["step_time_s"]["median"]]
    local = [p["local_step_s"] for p in per_rank if p["local_step_s"] is not None]
    out: dict[str, Any] = {
        "world_size": len(ranks),
        "backend": ranks[0]["rank"].get("backend"),
        "ddp": ranks[0]["rank"].get("ddp"),  # the DDP settings as the wrapper reports them
        "hosts": sorted({p["host"] for p in per_rank}),
        "ranks": per_rank,
        "step_time_s": job_step,
        "step_time_spread": (max(medians) - min(medians)) / min(medians) if medians and min(medians) > 0 else None,
        "straggler_spread": None, "slowest_rank": None, "comm_s": None, "comm_frac": None,
    }
    if job_step and len(local) == len(per_rank):
        slowest = max(per_rank, key=lambda p: p["local_step_s"])
        out["slowest_rank"] = slowest["rank"]
        out["straggler_spread"] = (max(local) - min(local)) / job_step
        out["comm_s"] = max(0.0, job_step - max(local))
        out["comm_frac"] = out["comm_s"] / job_step
    return out


def job_memory(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU: the job's resident memory is every rank's together; CUDA: each rank has a GPU, so its largest peak."""
    memories = [r.get("memory") or {} for r in ranks]
    memory: dict[str, Any] = {"ranks_maxrss_bytes": [m.get("child_maxrss_bytes") for m in memories],
                              "child_maxrss_bytes": sum(m.get("child_maxrss_bytes") or 0 for m in memories)}
    for key in ("cuda_max_allocated_bytes", "cuda_max_reserved_bytes"):
        values = [m[key] for m in memories if m.get(key) is not None]
        if values:
            memory[key] = max(values)
    return memory


def failure(result_path: Path, log_tail: str) -> tuple[str, str] | None:
    """(status, message) for a job that left no merged result, or None when nothing says why.

    A rank killed by a signal leaves no rank file, and the others then fail on the broken connection: so a rank
    that torchrun reports killed by a signal (other than the SIGTERM/SIGKILL with which it stops the rest) is the
    cause; else the rank file (of those this machine can see) that failed first; else torchrun's report."""
    files = {}
    for path in result_path.parent.glob(result_path.name + ".rank*"):
        try:
            r = json.loads(path.read_text())
            files[r["rank"]["rank"]] = r
        except (OSError, json.JSONDecodeError, KeyError):
            continue
    # torchrun's summary lists each failed rank: "rank      : 1 (local_rank: 1)" ... "exitcode  : -11 (pid: 123)"
    reported = [(int(rank), int(code)) for rank, code in
                re.findall(r"rank\s*:\s*(\d+)\s*\(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log_tail)]
    for rank, code in reported:
        if code < 0 and rank not in files and -code not in (signal.SIGTERM, signal.SIGKILL):
            return "crashed", f"rank {rank} was killed by {_signal_name(-code)} without a result"
    failed = [r for r in files.values() if r.get("status") != "ok"]
    if failed:
        first = min(failed, key=lambda r: r["rank"].get("finished_at", float("inf")))
        return first["status"], f"rank {first['rank']['rank']}: {first.get('error')}"
    for rank, code in reported:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        return "crashed", f"rank {rank} {how} without a result"
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
