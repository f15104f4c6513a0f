"""TA6xx: distributed — DDP probes (`--nproc-per-node`) whose step is spent syncing gradients or waiting for a rank."""

from __future__ import annotations

from typing import Any

from .. import knobs
from .context import Config, Context, Finding, Gain
from .registry import rule

COMM_BOUND = 0.25  # gradient sync past this share of the step: the job spends a quarter of its time communicating
IMBALANCE = 0.10  # the fastest rank idles this share of the step waiting for the slowest


def _ddp(config: Config | None) -> dict[str, Any] | None:
    ddp = config.extra("distributed") if config is not None else None
    return ddp if ddp and ddp.get("comm_frac") is not None else None


def _best_ddp_variant(ctx: Context, base: Config) -> tuple[Config, Gain] | None:
    """The measured config differing from `base` only in DDP knobs that significantly beats it, if any."""
    others = {k: v for k, v in base.settings.items() if k not in knobs.DDP_KNOBS}
    found = []
    for config in ctx.configs.values():
        if config is base or {k: v for k, v in config.settings.items() if k not in knobs.DDP_KNOBS} != others:
            continue
        gain = ctx.gain(base, config)
        if gain.significant:
            found.append((config, gain))
    return max(found, key=lambda f: f[1].median) if found else None


def _ddp_snippet(settings: dict[str, Any]) -> str:
    return (f"model = DDP(model, device_ids=[local_rank], bucket_cap_mb={settings['ddp_bucket_cap_mb']},\n"
            f"            gradient_as_bucket_view={settings['gradient_as_bucket_view']}, "
            f"static_graph={settings['static_graph']})")


ACCUMULATE = """# or sync every k-th micro-batch only: accumulate gradients locally in between
for i, batch in enumerate(loader):
    sync = (i + 1) % k == 0
    with contextlib.nullcontext() if sync else model.no_sync():
        (compute_loss(model, batch) / k).backward()
    if sync:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)"""


@rule("TA601", "gradient-sync-bound", "warning")
def gradient_sync_bound(ctx: Context) -> Finding | None:
    """A large share of each DDP step goes to the gradient all-reduce rather than to computing.

    What it finds:
        In a DDP probe (`--nproc-per-node` 2 or more), the baseline's step takes much longer than the same step
        with gradient synchronisation switched off: at least a quarter of the job's step is communication that
        backward does not hide.

    Why it matters:
        Every rank waits for the all-reduce of every gradient bucket before the optimizer step. When the model is
        large for the per-rank batch, or the interconnect (or gloo on the CPU) is slow, adding processes adds
        communication faster than it adds compute, and the job scales poorly.

    How it is measured:
        `extra.distributed` of the baseline probe: after its measured steps every rank runs 8 more steps under
        `DistributedDataParallel.no_sync()` (no all-reduce: its own data wait and compute). `comm_frac` is the job's
        median step time minus the slowest rank's median no-sync step, over the job's median step. The gain is
        measured when a probe differing only in DDP knobs (`ddp_bucket_cap_mb`, `gradient_as_bucket_view`,
        `static_graph`, `ddp_backend`) beats the baseline significantly; otherwise it is estimated as the speed-up
        if the communication were fully hidden, an upper bound.

    Fix:
        Give each rank more work per all-reduce: a larger per-rank `batch_size`, or gradient accumulation with
        `no_sync()` on all but every k-th micro-batch. Tune the DDP buckets (`ddp_bucket_cap_mb`), avoid the
        gradient copy (`gradient_as_bucket_view=True`), set `static_graph=True` when the same parameters are used
        every step, and use NCCL on GPUs.

    Example:
        `gradient sync takes 52% of each DDP step (2 ranks, gloo): 6.3 ms per step against 3.0 ms for the
        slowest rank's own work`
    """
    base = ctx.baseline
    ddp = _ddp(base)
    if ddp is None or ddp["comm_frac"] < COMM_BOUND:
        return None
    step, comm = ddp["step_time_s"], ddp["comm_s"]
    message = (f"gradient sync takes {ddp['comm_frac']:.0%} of each DDP step ({ddp['world_size']} ranks, "
               f"{ddp['backend']}): {step * 1e3:.3g} ms per step against {(step - comm) * 1e3:.3g} ms for the "
               "slowest rank's own work")
    evidence = {k: ddp[k] for k in ("world_size", "backend", "step_time_s", "comm_s", "comm_frac")}
    evidence["local_step_s"] = {r["rank"]: r["local_step_s"] for r in ddp["ranks"]}
    variant = _best_ddp_variant(ctx, base)
    if variant is not None:
        config, gain = variant
        fix = {k: config[k] for k in knobs.DDP_KNOBS if config[k] != base[k]}
        snippet = _ddp_snippet(config.settings) + "\n" + ACCUMULATE
        return Finding(message, evidence, fix, snippet, gain, base.ids + config.ids)
    gain = Gain.estimated(step / (step - comm) if step > comm else None,
                          "upper bound: the step if the gradient sync were fully hidden behind compute")
    snippet = _ddp_snippet({**base.settings, "gradient_as_bucket_view": True}) + "\n" + ACCUMULATE
    return Finding(message, evidence, {}, snippet, gain, base.ids)


@rule("TA602", "rank-imbalance", "warning")
def rank_imbalance(ctx: Context) -> Finding | None:
    """One DDP rank is slower than the others, and every rank waits for it at each step.

    What it finds:
        In a DDP probe, the ranks' own work per step (data wait and compute, timed without gradient sync)
        differs by at least a tenth of the job's step: the fastest ranks idle in the all-reduce until the
        straggler arrives.

    Why it matters:
        A synchronous job runs at the pace of its slowest rank. A rank with a slower input pipeline, longer inputs
        (variable sequence lengths), a throttled or busier GPU, or a worse NUMA placement holds back all the
        others every step.

    How it is measured:
        `extra.distributed` of the baseline probe: each rank's median step time under `no_sync()`
        (`local_step_s`, 8 steps after the measured ones) and its data-wait share. `straggler_spread` is the
        slowest minus the fastest rank's local step, over the job's median step. The gain is estimated: the job's
        step if the slowest rank worked at the ranks' mean pace.

    Fix:
        If the slowest rank's longer data wait explains at least half of its extra work, give the loader more
        workers (`num_workers`) or faster storage.
        Otherwise balance the work: bucket variable-length inputs by length so ranks get similar batches, check
        the slow rank's GPU for throttling (`nvidia-smi -q -d PERFORMANCE`) and its node for other processes, and
        pin ranks to the NUMA node of their GPU.

    Example:
        `rank 1 is the straggler: its own work takes 4.1 ms per step against 2.6 ms on the fastest rank, so the
        others wait 24% of each 6.3 ms step`
    """
    base = ctx.baseline
    ddp = _ddp(base)
    if ddp is None or (ddp.get("straggler_spread") or 0) < IMBALANCE:
        return None
    ranks = {r["rank"]: r for r in ddp["ranks"]}
    slow = ranks[ddp["slowest_rank"]]
    local = [r["local_step_s"] for r in ranks.values()]
    fastest, step = min(local), ddp["step_time_s"]
    message = (f"rank {slow['rank']} is the straggler: its own work takes {slow['local_step_s'] * 1e3:.3g} ms per "
               f"step against {fastest * 1e3:.3g} ms on the fastest rank, so the others wait "
               f"{ddp['straggler_spread']:.0%} of each {step * 1e3:.3g} ms step")
    evidence = {"straggler_spread": ddp["straggler_spread"], "slowest_rank": slow["rank"],
                "local_step_s": {r: v["local_step_s"] for r, v in ranks.items()},
                "data_wait_frac": {r: v["data_wait_frac"] for r, v in ranks.items()},
                "hosts": {r: v["host"] for r, v in ranks.items()}}
    saved = slow["local_step_s"] - sum(local) / len(local)
    gain = Gain.estimated(step / (step - saved) if 0 < saved < step else None,
                          "the job's step if the slowest rank worked at the ranks' mean pace")
    # The straggler is loader-bound when its extra data wait explains at least half of its extra work.
    wait_s = {r: (v["data_wait_frac"] or 0) * v["step_time_s"]["median"] for r, v in ranks.items()}
    if wait_s[slow["rank"]] - min(wait_s.values()) >= 0.5 * (slow["local_step_s"] - fastest):
        fix = {"num_workers": max(2, 2 * base["num_workers"])}
        snippet = (f"# rank {slow['rank']} waits longest for data: more loader workers per rank\n"
                   f"loader = DataLoader(dataset, sampler=DistributedSampler(dataset), batch_size={base['batch_size']},"
                   f" num_workers={fix['num_workers']})")
    else:
        fix = {}
        snippet = ("# balance the work per rank: batches of similar length on every rank\n"
                   "sampler = DistributedSampler(sorted_by_length_buckets)  # e.g. bucket samples by sequence length\n"
                   "# and check the slow rank's device: nvidia-smi -q -d PERFORMANCE (throttle reasons)")
    return Finding(message, evidence, fix, snippet, gain, base.ids)
