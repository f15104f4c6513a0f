"""TA1xx: the input pipeline — DataLoader workers, worker restarts, host memory for copies."""

from __future__ import annotations

import math

from .. import knobs, snippets
from ..analysis import restart, stats
from ..fmt import fmt_rate
from .context import Config, Context, Finding, Gain
from .registry import rule

WAIT_BOUND = 0.30  # data wait above this share of the step makes the input pipeline the bottleneck
H2D_VISIBLE = 0.05  # host-to-device copies above this share of the step are worth pinning
RESTART_WORTH = 0.01  # a restart cost below 1% of the time per step is not worth a finding


@rule("TA101", "input-pipeline-bound", "warning")
def input_pipeline_bound(ctx: Context) -> Finding | None:
    """Training waits for the next batch for most of each step.

    What it finds:
        The baseline spends at least 30% of its step time blocked on `next(loader)`: the model is idle while
        the DataLoader reads and prepares data. The finding quotes the knee of the loader ladder: the smallest
        `num_workers` past which more workers no longer gave a significant gain.

    Why it matters:
        A step cannot be faster than its data. While the input pipeline is the bottleneck, a faster model,
        AMP or a larger batch changes nothing; more loader workers (or cheaper preprocessing) do.
        I/O-bound loaders keep gaining far past the core count, CPU-bound ones peak near it, so the value is
        measured, not guessed.

    How it is measured:
        `data_wait_frac` of the baseline probe(s). The knee walks the baseline's `num_workers` ladder (probes
        equal to the baseline but for `num_workers`) upwards, keeping each value whose throughput beats the best
        so far by at least 3% with a ratio CI above 1 (`analysis.stats.ratio_ci` over the raw `items` and
        `step_s`). The gain is the measured ratio knee / baseline. Without a ladder the gain is estimated as
        the upper bound `1 / (1 - data_wait_frac)` (all waiting removed; with CPU-bound loading, spread over the
        workers the cores can feed: `1 / ((1 - w) + w / workers)`) and labelled so. Where the baseline
        loaded without workers, its `extra.fetch_cpu_frac` (the loading thread's CPU share) and the usable cores
        (`environment.usable_cores`) give the workers the cores can feed (cores / share); a pick at or past that
        count is said to fill the cores. Where the planner recommends a worker count, the finding names it and
        quotes its gain at the recommendation's other settings: the confirmation's speedup where the
        recommendation changes only the workers and their worker knobs (`persistent_workers`, `prefetch_factor`
        come with the workers), else the recommendation against itself with the baseline's workers (its
        ablation, or a probe). Where that was not measured: the workers' gain at the baseline's other settings,
        and the message says it was not measured beside the recommendation's.

    Fix:
        Set `num_workers` to the knee (or the planner's choice, when it recommends one) in your DataLoader;
        if the data comes from disk or network, more workers than cores can still pay. If the knee is the
        largest value tried, try larger values.

    Example:
        `waiting for the next batch takes 99% of each step at num_workers=0; num_workers=8 (the knee of the
        loader ladder) trains 6.82x [5.65, 8.24] faster`

        Where the loading is CPU work (`extra.fetch_cpu_frac` of the baseline, without workers) and the pick
        already uses the workers the cores can feed: `...; num_workers=2 (the planner's choice) trains 1.17x
        [1.03, 1.38] faster; the loading kept its thread on a CPU 100% of each fetch, so about 2 workers fill the
        2 cores: past them, cheaper preprocessing or more cores pay, not more workers`

        ```python
        loader = DataLoader(dataset, shuffle=True, batch_size=32, num_workers=8, persistent_workers=True)
        ```
    """
    base = ctx.baseline
    wait = base.share("data_wait_s") if base else None
    if wait is None or wait < WAIT_BOUND:
        return None
    workers = base["num_workers"]
    knee = ctx.knee(base, "num_workers")
    ladder = {c["num_workers"]: round(c.throughput, 1) for c in ctx.series(base, "num_workers")}
    evidence = {"data_wait_frac": round(wait, 4), "num_workers": workers, "knee_num_workers": knee["num_workers"],
                "throughput_by_num_workers": ladder, "unit": ctx.unit}
    head = f"waiting for the next batch takes {wait:.0%} of each step at num_workers={workers}"
    cap = _workers_the_cores_feed(ctx, base)
    if cap is not None:
        evidence.update({"fetch_cpu_frac": round(base.extra("fetch_cpu_frac"), 3), "usable_cores": ctx.usable_cores,
                         "workers_the_cores_feed": cap})
    rec = ctx.recommended
    if rec is not None and rec is not base and rec["num_workers"] != workers:
        # The planner's choice of workers outranks this reading of the ladder: it was kept in comparisons measured
        # side by side, and the report must name one value, judged at the settings it comes with.
        return _planners_workers(ctx, base, rec, head, evidence, cap)
    if knee is base:
        if cap is not None and workers == 0:  # the loading can be spread over `cap` workers at most
            gain = Gain.estimated(1 / ((1 - wait) + wait / cap), f"upper bound if the loading were spread over the "
                                  f"{cap} workers the cores can feed; no larger num_workers beat the baseline")
        else:
            gain = Gain.estimated(1 / (1 - wait) if wait < 1 else None,
                                  "upper bound if all data wait were removed; no larger num_workers beat the baseline")
        tried = f"; no larger num_workers measured better ({', '.join(map(str, ladder))} tried)" if len(ladder) > 1 \
            else "; no num_workers ladder was measured"
        return Finding(head + tried + _cpu_bound(ctx, base, cap, max(ladder)), evidence, {},
                       snippets.dataloader(ctx.applied({}), ctx.cuda), gain, base.ids)
    gain = ctx.gain(base, knee)
    message = f"{head}; num_workers={knee['num_workers']} (the knee of the loader ladder) trains {gain.text()} faster"
    fix = {"num_workers": knee["num_workers"]}
    return Finding(message + _beyond(ctx, base, cap, knee["num_workers"], max(ladder)), evidence, fix,
                   snippets.dataloader(ctx.applied(fix), ctx.cuda), gain, knee.ids)


def _planners_workers(ctx: Context, base: Config, rec: Config, head: str, evidence: dict,
                      cap: int | None) -> Finding:
    """TA101 naming the recommendation's worker count, with its gain at the recommendation's other settings: the
    recommendation against itself with the baseline's workers (the confirmation's figure where that is the
    baseline), else the ablation's; where neither was measured, the workers' gain at the baseline's settings,
    marked as measured there only (a quick start quoted 32 workers at 5.33x, without the persistent workers the
    headline's 19.66x came with, as their gain)."""
    count, workers = rec["num_workers"], base["num_workers"]
    extra = ctx.companions(base, rec, "num_workers")  # what the recommendation changes besides the workers
    fewer = ctx.variant(rec, num_workers=workers)
    ablated = None if fewer is base else ctx.ablation_gain("num_workers", count)
    if fewer is base:  # the recommendation is its workers (and their worker knobs): the headline's comparison
        gain = ctx.gain(base, rec)
        shown = f"num_workers={count}" + (f" with {extra}" if extra else "")
        said = f"{shown} (the planner's choice) trains {gain.text()} faster"
    elif ablated is not None or fewer is not None:
        gain = ablated if ablated is not None else ctx.gain(fewer, rec)
        said = (f"num_workers={count} (the planner's choice) trains {gain.text()} faster than num_workers={workers} "
                f"beside the recommendation's {extra}")
    else:
        alone = ctx.variant(base, num_workers=count)
        gain = ctx.gain(base, alone) if alone is not None else Gain.estimated(None, "no probe measured it alone")
        said = (f"num_workers={count} (the planner's choice) trains {gain.text()} faster at the baseline's other "
                f"settings; not measured beside the recommendation's {extra}")
    largest = max(c["num_workers"] for c in ctx.configs.values())
    fix = {"num_workers": count}
    return Finding(f"{head}; {said}{_beyond(ctx, base, cap, count, largest)}", evidence, fix,
                   snippets.dataloader(ctx.applied(fix), ctx.cuda), gain, rec.ids)


def _beyond(ctx: Context, base: Config, cap: int | None, pick: int, largest: int) -> str:
    """What TA101 says past its pick: that the cores are full (more workers would only queue), or that the pick was
    the largest count measured: larger ones may gain more, or, where it is the largest the workload's SEARCH
    lists, SEARCH is where to ask for them."""
    if cap is not None and pick >= cap:
        return _cpu_bound(ctx, base, cap, pick)
    if pick != largest:
        return ""
    listed = ctx.search.get("num_workers") or []
    if listed and pick >= max(listed):
        return " and is the largest count SEARCH lists: list larger ones there to have them measured"
    return " and was the largest value tried: larger ones may gain more"


def _workers_the_cores_feed(ctx: Context, base: Config) -> int | None:
    """The workers the cores can keep busy, from the baseline's in-process loading (as the planner caps its
    ladder); None where that was not measured (the baseline used workers) or the cores are not known."""
    share, cores = base.extra("fetch_cpu_frac"), ctx.usable_cores
    return knobs.workers_the_cores_feed(share, cores) if share is not None and cores else None


def _cpu_bound(ctx: Context, base: Config, cap: int | None, largest: int) -> str:
    """What to say when the largest worker count measured already fills the cores with CPU-bound loading."""
    if cap is None or largest < cap:
        return ""
    return (f"; the loading kept its thread on a CPU {base.extra('fetch_cpu_frac'):.0%} of each fetch, so about "
            f"{cap} workers fill the {ctx.usable_cores} cores: past them, cheaper preprocessing or more cores pay, "
            "not more workers")


@rule("TA102", "loader-oversubscribed", "warning")
def loader_oversubscribed(ctx: Context) -> Finding | None:
    """More DataLoader workers than help: past the best count, training got measurably slower.

    What it finds:
        In a `num_workers` ladder, a worker count above the fastest one trains measurably slower than it.
        Workers are processes: beyond what the data needs they compete with the training process for cores,
        memory bandwidth and host memory.

    Why it matters:
        "More workers" is not free: each one is a process with its own copy of the dataset object, and on a
        machine with few cores extra workers take CPU time from the intra-op threads doing the model's work.
        Setting `num_workers` to the core count (or higher) out of habit can cost throughput.

    How it is measured:
        For the recommended settings, then the baseline, the probes equal to them but for `num_workers` (and
        the worker knobs, for the count without workers). The fastest count is the one with the highest median
        throughput; a larger count fires the rule when the upper end of its throughput-ratio CI against the
        fastest is below 1. A ladder measured at other settings than the recommendation's is judged again
        beside the recommendation where both counts were measured there; where they were not, the finding says
        so, and asks for no fewer workers than the recommendation keeps. Evidence: throughput per count,
        the cores (`environment.cpu_count`) and each probe's `extra.cpu_util`. The gain is measured when the
        settings themselves use more workers than the fastest count, else there is none to claim.

    Fix:
        Use the fastest `num_workers`; on CPU training, also leave cores for the intra-op threads (see TA801).

    Example:
        `num_workers=4 trains 0.89x [0.83, 0.97] as fast as num_workers=1 (219 samples/s vs 246 samples/s) on 2 cores:
        past num_workers=1, more workers compete for the CPU`
    """
    rec = ctx.recommended
    for subject in reversed(ctx.subjects()):  # the recommended settings first: the comparison a user runs
        ladder = ctx.series(subject, "num_workers")
        if len(ladder) < 2:
            continue
        best = max(ladder, key=lambda c: c.throughput)
        slower = [c for c in ladder if c["num_workers"] > best["num_workers"] and ctx.gain(best, c).slower]
        if not slower:
            continue
        worst = min(slower, key=lambda c: c.throughput)
        elsewhere = ctx.companions(subject, rec, "num_workers") if rec is not None else ""
        if elsewhere and ctx.variant(rec, num_workers=best["num_workers"]) is not None \
                and ctx.variant(rec, num_workers=worst["num_workers"]) is not None:
            continue  # re-measured beside the recommendation's settings, whose own ladder spoke first
        return _oversubscribed(ctx, subject, ladder, best, worst, slower, elsewhere)
    return None


def _oversubscribed(ctx: Context, subject: Config, ladder: list[Config], best: Config, worst: Config,
                    slower: list[Config], elsewhere: str) -> Finding:
    """TA102's finding on `subject`'s worker ladder. Measured at other settings than the recommendation's
    (`elsewhere`: the recommendation's, where they differ), it says so, and it does not advise fewer workers than
    the recommendation keeps: one quick start's TA102 asked for 16 workers without persistent workers beside a
    recommendation of 32 with them, which measured 1.25x faster than 16 with them."""
    loss = ctx.gain(best, worst)
    rates = [fmt_rate(c.throughput, ctx.unit, significant_below=100) for c in (worst, best)]
    message = (f"num_workers={worst['num_workers']} trains {loss.text()} as fast as num_workers={best['num_workers']} "
               f"({rates[0]} vs {rates[1]}) on {ctx.cpu_count} cores: past num_workers={best['num_workers']}, more "
               "workers compete for the CPU")
    evidence = {"best_num_workers": best["num_workers"], "cpu_count": ctx.cpu_count, "unit": ctx.unit,
                "throughput_by_num_workers": {c["num_workers"]: round(c.throughput, 1) for c in ladder},
                "cpu_util_by_num_workers": {c["num_workers"]: c.extra("cpu_util") for c in ladder}}
    fix = {"num_workers": best["num_workers"]}
    gain = (ctx.gain(subject, best) if subject["num_workers"] > best["num_workers"]
            else Gain.estimated(None, "the measured settings already use no more workers than the fastest count"))
    if elsewhere:
        evidence["measured_without"] = elsewhere
        message += f"; measured without the recommendation's {elsewhere}, and not beside it"
        if ctx.recommended["num_workers"] > best["num_workers"]:
            message += f": re-measure there before lowering num_workers={ctx.recommended['num_workers']}"
            fix, gain = {}, Gain.estimated(None, f"measured without {elsewhere}, the recommendation's")
    return Finding(message, evidence, fix, snippets.dataloader(ctx.applied(fix), ctx.cuda), gain,
                   best.ids + [i for c in slower for i in c.ids])


@rule("TA103", "worker-restart-cost", "info")
def worker_restart_cost(ctx: Context) -> Finding | None:
    """Loader workers are shut down and started again at every epoch.

    What it finds:
        Settings with `num_workers > 0` and `persistent_workers=False` where a new epoch started during the
        measured steps and the steps it began took markedly longer than typical ones.

    Why it matters:
        Without `persistent_workers`, each epoch ends by stopping every worker process and the next begins by
        starting them again (re-importing, re-building the dataset copy, refilling the prefetch queue while the
        training computes beside them). With small epochs or slow worker start-up this is paid often and shows
        as a stall at each epoch boundary.

    How it is measured:
        Measured when a probe with `persistent_workers=True` exists next to the settings. Otherwise estimated
        (`analysis.restart`, the figure the planner ranks the knob by): the steps from each epoch start
        (`extra.epoch_start_steps`) until the new workers refilled their queue (`num_workers x prefetch_factor`
        steps) beyond as many typical steps (the mean of the others), the median over the settings' probes; paid
        once per epoch of `extra.epoch_steps` steps (else `ceil(workload.facts.dataset_len / batch_size)`). The
        estimated share of the time is that cost over an epoch's steps at the mean step: an upper bound, as
        persistent workers still refill their queues when an epoch begins. Silent without an epoch length
        (iterable datasets) or when the share is below 1%.

    Fix:
        `DataLoader(..., num_workers=N, persistent_workers=True)`: the workers live for the whole training.

    Example:
        `a new epoch restarts 2 loader workers: the steps it began took 0.34 s more than typical ones, once
        every 128 steps (~11% of the time)`
    """
    for subject in reversed(ctx.subjects()):  # the recommended settings first
        if subject["num_workers"] == 0 or subject["persistent_workers"]:
            continue
        fix = {"persistent_workers": True}
        snippet = snippets.dataloader(ctx.applied(fix), ctx.cuda)
        measured = ctx.variant(subject, **fix)
        if measured is not None:
            gain = ctx.gain(subject, measured)
            if gain.significant:
                message = (f"persistent_workers=True trains {gain.text()} faster with num_workers="
                           f"{subject['num_workers']}: restarting the workers every epoch costs time")
                return Finding(message, {"num_workers": subject["num_workers"]}, fix, snippet, gain, subject.ids)
            continue
        estimate = _restart_cost(ctx, subject)
        if estimate is None:
            continue
        stall, steps_per_epoch, share = estimate
        gain = Gain.estimated(1 / (1 - share), f"upper bound: {stall:.3f} s more in the steps an epoch start "
                                               f"slows, once per epoch of {steps_per_epoch} steps, over an "
                                               "epoch's time")
        message = (f"a new epoch restarts {subject['num_workers']} loader workers: the steps it began took "
                   f"{stall:.2f} s more than typical ones, once every {steps_per_epoch} steps (~{share:.0%} of "
                   "the time)")
        evidence = {"restart_stall_s": round(stall, 4), "steps_per_epoch": steps_per_epoch,
                    "num_workers": subject["num_workers"]}
        return Finding(message, evidence, fix, snippet, gain, subject.ids)
    return None


def _restart_cost(ctx: Context, subject: Config) -> tuple[float, int, float] | None:
    """(seconds an epoch start costs, steps per epoch, share of the time) for `subject`, or None."""
    dataset_len = ctx.facts.get("dataset_len")
    span = restart.refill_steps(subject["num_workers"], subject["prefetch_factor"])
    costs, epochs = [], []
    for probe in subject.probes:
        extra = probe.get("extra") or {}
        steps = (probe.get("step_time_s") or {}).get("samples") or []
        per_epoch = extra.get("epoch_steps") or (math.ceil(dataset_len / subject["batch_size"])
                                                 if dataset_len else None)
        starts, wait = extra.get("epoch_start_steps"), (probe.get("raw") or {}).get("data_wait_s") or []
        if starts is None and (extra.get("epochs_started") or 0) >= 1 and wait:  # older documents: the longest wait
            starts = [max(range(len(wait)), key=lambda i: wait[i] or 0)]
        cost = restart.restart_cost(steps, starts or [], span, per_epoch)
        if cost is not None and per_epoch:
            costs.append(cost)
            epochs.append(per_epoch)
    if not costs:
        return None
    stall, share = stats.median([c.excess_s for c in costs]), stats.median([c.share for c in costs])
    return (stall, int(stats.median(epochs)), share) if RESTART_WORTH <= share < 1 else None


@rule("TA104", "pageable-host-memory", "warning")
def pageable_host_memory(ctx: Context) -> Finding | None:
    """Batches are copied to the GPU from pageable host memory, and the copies take visible time.

    What it finds:
        CUDA settings with `pin_memory=False` where host-to-device copies take at least 5% of the step time,
        or where the profiler saw copies from pageable memory.

    Why it matters:
        A copy from pageable memory is staged through a pinned bounce buffer by the driver and blocks the
        host; from page-locked memory it runs by DMA and, with `non_blocking=True`, overlaps the previous
        step's compute. `pin_memory=True` makes the loader's workers hand over page-locked batches.

    How it is measured:
        The share of step time in the `raw.h2d_s` samples (timed around `.to(device)`) of the baseline, or a
        positive `extra.profile.h2d_pageable_bytes` (filled by the profiler collector when it runs). The gain
        is measured against a probe equal to the baseline but for `pin_memory=True`; without one it is the
        estimated upper bound `1 / (1 - h2d share)`, labelled so. Silent on CPU. Where the probes timed their
        steps by CUDA events (`extra.h2d`), the finding quotes each side's overlap: the share of the copy's
        time on the GPU that the host did not wait for (pageable: near 0; pinned with `non_blocking=True`:
        near 1). Such steps keep one in flight as a real loop does, alone or in device-time lockstep, so the gain
        is what that overlap bought; an overlap with no gain means nothing was left to hide the copy behind.

    Fix:
        `DataLoader(..., pin_memory=True)` and `tensor.to(device, non_blocking=True)`.

    Example:
        `host-to-device copies take 15% of each step from pageable memory; pin_memory=True trains 1.05x
        [1.00, 1.10] faster`
    """
    base = ctx.baseline
    if not ctx.cuda or base is None or base["pin_memory"]:
        return None
    h2d = base.share("h2d_s") or 0.0
    pageable = ((base.extra("profile") or {}).get("h2d_pageable_bytes") or 0)
    if h2d < H2D_VISIBLE and not pageable:
        return None
    fix = {"pin_memory": True}
    pinned = ctx.variant(base, **fix)
    gain = (ctx.gain(base, pinned) if pinned is not None else
            Gain.estimated(1 / (1 - h2d) if h2d else None, "upper bound if the copies overlapped compute entirely"))
    message = f"host-to-device copies take {h2d:.0%} of each step from pageable memory"
    if pinned is not None:
        message += f"; pin_memory=True trains {gain.text()} faster"
    evidence = {"h2d_frac": round(h2d, 4), "h2d_pageable_bytes": pageable or None}
    overlaps = {side: (config.extra("h2d") or {}).get("overlap_frac") if config is not None else None
                for side, config in (("pageable", base), ("pinned", pinned))}
    if overlaps["pinned"] is not None:  # measured by CUDA events (probe/device_clock.py overlap)
        shown = ", ".join(f"{side} {value:.0%}" for side, value in overlaps.items() if value is not None)
        message += f" (the copies' overlap with the host's work: {shown})"
        evidence.update({f"{side}_overlap_frac": round(value, 4) for side, value in overlaps.items()
                         if value is not None})
    return Finding(message, evidence, fix, snippets.dataloader(ctx.applied(fix), True), gain, base.ids)
