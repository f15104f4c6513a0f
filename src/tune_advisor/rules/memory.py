"""TA3xx: memory — capacity left unused, capacity nearly used up, and the out-of-memory frontier."""

from __future__ import annotations

import math

from .. import snippets
from ..fmt import fmt_bytes
from .context import Context, Finding, Gain
from .registry import rule

HEADROOM = 0.50  # peak memory below half of the capacity leaves room for a batch twice as large
NEAR_LIMIT = 0.90  # peak memory above this share of the capacity leaves no room for variation
MEMORY_CUT = 0.03  # a knob cutting peak memory by less than this opens no larger batch worth naming
MEMORY_SAVING = (("amp", "bf16"), ("amp", "fp16"), ("checkpointing", True))


@rule("TA301", "memory-headroom-unused", "info")
def memory_headroom_unused(ctx: Context) -> Finding | None:
    """Most of the memory is unused, and throughput was still rising with the batch size.

    What it finds:
        The recommended settings peak below half of the memory available, their batch size is the largest
        one measured, and the step up to it still gave a significant gain: larger batches would fit and were
        not tried (the search stopped at its `SEARCH` bound or budget, not at memory).

    Why it matters:
        Memory that is never used buys nothing. While throughput still climbs with the batch, the next
        doubling is likely to pay too, and there is room for it.

    How it is measured:
        Capacity: `budget.memory_budget_bytes` when the run had a memory budget, else on CUDA
        `environment.gpu.memory_total_bytes`, else `environment.memory_total_bytes`; silent when none is
        recorded. Peak: the largest `peak_memory_bytes` (on CUDA also `memory.cuda_max_reserved_bytes`) of the
        recommended probes, scaled to the dataset's longest item where their batches held none that long
        (`workload.facts.extra.longest_item` against each probe's `extra.largest_input`, linearly: an upper-ish
        guess for activations); the message says what it leaves free. The gain is estimated as the measured
        gain of the last step up the batch ladder per doubling (its geometric share, where that step was
        larger), labelled so: returns usually diminish, so it is an upper guess.

    Fix:
        Try `batch_size` twice as large (`tune-advisor analyze` with a larger `SEARCH["batch_size"]`), and scale
        the learning rate (TA703).

    Example:
        `the recommended settings peak at 537.5 MiB of 40.0 GiB (1%), which leaves 39.5 GiB (99%) free at
        batch_size=64, and throughput still rose 1.18x [1.12, 1.22] from batch_size 32 to 64: larger batches fit
        and were not tried`
    """
    subject, capacity = ctx.recommended or ctx.baseline, ctx.memory_capacity()
    if subject is None or capacity is None or not subject.peak_memory:
        return None
    limit, source = capacity
    judged, _ = ctx.judged_peak(subject)
    if judged >= HEADROOM * limit:
        return None
    ladder = ctx.series(subject, "batch_size")
    batch = subject["batch_size"]
    if batch != ladder[-1]["batch_size"] or len(ladder) < 2 or _oom_above(ctx, subject):
        return None
    previous = ladder[-2]
    climb = ctx.gain(previous, subject)
    if not climb.significant:
        return None
    # The measured step below the recommendation need not be one doubling (a recommendation whose other knobs
    # changed may have only its ablation's batch beside it, 4x smaller): the estimate is a larger step's gain per
    # doubling, its geometric share. A step smaller than a doubling keeps its own gain: stretching it to a doubling
    # would extrapolate upwards.
    doublings = max(1.0, math.log2(batch / previous["batch_size"]))
    per_doubling = climb.median ** (1 / doublings)
    step = "" if doublings == 1 else f" ({per_doubling:.2f}x a doubling)"
    message = (f"the recommended settings peak at {_peak_text(ctx, subject)} of {fmt_bytes(limit, digits=1)} "
               f"({judged / limit:.0%}), which {ctx.memory_left(subject)}, and throughput still rose "
               f"{climb.text()} from batch_size "
               f"{previous['batch_size']} to {batch}{step}: larger batches fit and were not tried")
    evidence = {"peak_memory_bytes": subject.peak_memory, "capacity_bytes": limit, "capacity_source": source,
                "judged_peak_bytes": int(judged), "batch_size": batch,
                "previous_batch_size": previous["batch_size"],
                "last_step_speedup": climb.median, "per_doubling_speedup": per_doubling}
    basis = (f"the next batch doubling gaining as much as the last step did per doubling ({climb.text()} from "
             f"{previous['batch_size']} to {batch})")
    gain = Gain.estimated(per_doubling, basis)
    fix = {"batch_size": batch * 2}
    snippet = (snippets.dataloader(ctx.applied(fix), ctx.cuda) + "\n"
               + snippets.lr_scaling(batch, batch * 2))
    return Finding(message, evidence, fix, snippet, gain, previous.ids + subject.ids)


def _peak_text(ctx: Context, subject) -> str:
    """A peak as a finding states it. The report's cards and tables show a probe's allocated peak; where the CUDA
    allocator reserved more (the figure that counts against the GPU's memory), the finding names both, so one
    setting does not read at two unexplained peaks (an H200 cnn: a card's 409.75 MiB beside TA301's 458.0); and
    where it was scaled to the dataset's longest item (`Context.judged_peak`), how and to what."""
    allocated = subject.allocated_peak
    text = fmt_bytes(subject.peak_memory, digits=1)
    if allocated and subject.peak_memory > allocated:
        text += f" reserved by the CUDA allocator ({fmt_bytes(allocated, digits=1)} allocated)"
    judged, how = ctx.judged_peak(subject)
    if how:
        text += f", {fmt_bytes(int(judged), digits=1)} {how}"
    return text


def _oom_above(ctx: Context, subject) -> bool:
    others = {k: v for k, v in subject.settings.items() if k != "batch_size"}
    return any({k: v for k, v in p["settings"].items() if k != "batch_size"} == others
               and p["settings"]["batch_size"] > subject["batch_size"] for p in ctx.failed("oom"))


@rule("TA302", "near-memory-limit", "warning")
def near_memory_limit(ctx: Context) -> Finding | None:
    """Training peaks within 10% of the memory available.

    What it finds:
        The baseline or recommended settings peak at 90% or more of the memory capacity.

    Why it matters:
        The probes ran a few steps on one data order. A longer sequence, a larger image, allocator
        fragmentation over hours, or an evaluation pass can push a run this close to the limit out of memory
        hours into training. On CPU the kernel's OOM killer ends the whole process.

    How it is measured:
        Peak: the largest `peak_memory_bytes` (CUDA: also `memory.cuda_max_reserved_bytes`) of the probes with
        those settings, scaled to the dataset's longest item as in TA301 where their batches held none that long;
        the message says what it leaves free at their batch size. Capacity as in TA301
        (`budget.memory_budget_bytes`, `environment.gpu.memory_total_bytes` or `environment.memory_total_bytes`);
        silent when none is recorded. No speed gain is claimed.

    Fix:
        Leave headroom: enable a memory-saving knob that applies and is off — AMP (activations in 16 bits) or
        gradient checkpointing of repeated blocks — or lower `batch_size` and accumulate gradients.

    Example:
        `the recommended settings peak at 6.1 GiB, 93% of 6.6 GiB, which leaves 0.5 GiB (7%) free at
        batch_size=64: little room for longer inputs or fragmentation`
    """
    capacity = ctx.memory_capacity()
    if capacity is None:
        return None
    limit, source = capacity
    for subject in reversed(ctx.subjects()):
        peak, _ = ctx.judged_peak(subject)
        if not peak or peak < NEAR_LIMIT * limit:
            continue
        which = "recommended" if subject is ctx.recommended and subject is not ctx.baseline else "baseline"
        message = (f"the {which} settings peak at {_peak_text(ctx, subject)}, {peak / limit:.0%} of "
                   f"{fmt_bytes(limit, digits=1)}, which {ctx.memory_left(subject)}: little room for longer inputs "
                   "or fragmentation")
        fix, snippet = _memory_fix(ctx, subject.settings)
        evidence = {"peak_memory_bytes": subject.peak_memory, "judged_peak_bytes": int(peak),
                    "capacity_bytes": limit, "capacity_source": source}
        return Finding(message, evidence, fix, snippet, Gain.estimated(None, "a safety margin, not a speed-up"),
                       subject.ids)
    return None


def _memory_fix(ctx: Context, settings: dict) -> tuple[dict, str]:
    """The memory-saving knobs that are off and apply here, as settings and a snippet."""
    fix, parts = {}, []
    # on a CPU that only emulates bf16 (environment.native_types; absent in older files) autocast would save memory
    # at many times the step time
    cpu_bf16 = ((ctx.environment.get("native_types") or {}).get("bf16") or {}).get("native") is not False
    if settings["amp"] == "off" and (ctx.cuda or cpu_bf16):
        amp = "fp16" if ctx.cuda and ctx.gpu.get("bf16_supported") is False else "bf16"
        fix["amp"] = amp
        parts.append(snippets.autocast(amp, "cuda" if ctx.cuda else "cpu"))
    if not settings["checkpointing"] and (ctx.facts.get("repeated_blocks") or ctx.facts.get("hf_checkpointing")):
        fix["checkpointing"] = True
        parts.append(snippets.checkpointing())
    if not parts:
        parts.append(snippets.gradient_accumulation(2) + f"  # with batch_size={max(1, settings['batch_size'] // 2)}")
    return fix, "\n\n".join(parts)


@rule("TA303", "oom-frontier", "info")
def oom_frontier(ctx: Context) -> Finding | None:
    """A batch size ran out of memory: the largest one that fits, and what AMP or checkpointing would open.

    What it finds:
        A probe ended with status `oom`. The finding names the largest batch size that fitted with the same
        other settings and, for each memory-saving knob measured elsewhere in the run (AMP, gradient
        checkpointing), how much it cut peak memory and roughly how large a batch it would let fit.

    Why it matters:
        The out-of-memory frontier bounds the batch-size search. AMP and checkpointing move it: their value is
        often not their own speed but the larger batch they make fit (SPEC §3).

    How it is measured:
        The `oom` probe with the smallest `batch_size`; the largest `ok` batch with the same other settings.
        For each knob, pairs of `ok` probes differing only in that knob give the ratio of their
        `peak_memory_bytes`; the batch it would open is estimated as the largest fitting batch divided by that
        ratio (memory taken as proportional to the batch — it is not quite, as weights and optimiser state do
        not shrink, so the estimate is optimistic) and labelled so.

    Fix:
        Stay at the largest batch that fits, or enable the knob that opens a larger one and measure again.

    Example:
        `batch_size=128 ran out of memory (p020); the largest batch that fits is 64 (peak 6.1 GiB). Measured
        elsewhere: amp=bf16 cuts peak memory to 0.93x (estimated batch ~68)`
    """
    ooms = sorted(ctx.failed("oom"), key=lambda p: p["settings"]["batch_size"])
    if not ooms:
        return None
    oom = ooms[0]
    others = {k: v for k, v in oom["settings"].items() if k != "batch_size"}
    fitting = [c for c in ctx.configs.values() if c["batch_size"] < oom["settings"]["batch_size"]
               and {k: v for k, v in c.settings.items() if k != "batch_size"} == others]
    fits = max(fitting, key=lambda c: c["batch_size"], default=None)
    message = f"batch_size={oom['settings']['batch_size']} ran out of memory ({oom['id']})"
    evidence = {"oom_probe": oom["id"], "oom_batch_size": oom["settings"]["batch_size"], "error": oom.get("error")}
    probes = [oom["id"]]
    if fits is None:
        return Finding(message + "; no smaller batch with the same settings was measured", evidence, {}, "",
                       Gain.estimated(None, "a capacity finding"), probes)
    message += f"; the largest batch that fits is {fits['batch_size']} (peak {fmt_bytes(fits.peak_memory, digits=1)})"
    evidence.update(fits_batch_size=fits["batch_size"], fits_peak_memory_bytes=fits.peak_memory)
    probes += fits.ids
    opened = {}
    for knob, value in MEMORY_SAVING:
        if fits[knob] == value:
            continue
        pair = next(((off, on) for off, on in ctx.pairs(knob, value) if off.peak_memory and on.peak_memory), None)
        if pair is None:
            continue
        ratio = pair[1].peak_memory / pair[0].peak_memory
        if ratio > 1 - MEMORY_CUT:
            continue  # saved nothing worth reporting here
        opened[f"{knob}={value}"] = {"memory_ratio": round(ratio, 3), "estimated_batch_size":
                                     int(fits["batch_size"] / ratio), "probes": pair[0].ids[:1] + pair[1].ids[:1]}
    if opened:
        message += ". Measured elsewhere: " + "; ".join(
            f"{k} cuts peak memory to {v['memory_ratio']:.2f}x (estimated batch ~{v['estimated_batch_size']})"
            for k, v in opened.items())
        evidence["memory_saving"] = opened
    snippet = snippets.dataloader(ctx.applied({"batch_size": fits["batch_size"]}), ctx.cuda)
    return Finding(message, evidence, {"batch_size": fits["batch_size"]}, snippet,
                   Gain.estimated(None, "a capacity finding: the batch it opens must be measured"), probes)
