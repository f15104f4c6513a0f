"""TA7xx: numerics and safety — losses that are not finite, AMP that changes the loss, batch changes."""

from __future__ import annotations

from . import snippets
from .context import Context, Finding, changed
from .registry import rule

LOSS_STEPS = 10  # compare the loss over the first measured steps: same seed and data order, so it should agree
LOSS_TOLERANCE = 0.05  # a mean relative difference above 5% means reduced precision changed the training


@rule("TA701", "non-finite-loss", "error")
def non_finite_loss(ctx: Context) -> Finding | None:
    """The loss became NaN or infinite in a probe.

    What it finds:
        A probe ended with status `diverged`, or recorded a non-finite loss. The finding names the settings
        that diverged and what they changed from the baseline.

    Why it matters:
        A configuration that diverges is not faster, it is broken: those settings must not be adopted, and if
        the baseline itself diverges, no measurement of it means anything. fp16 overflow (without a
        `GradScaler`, or with too large a learning rate for the larger batch) is a common cause.

    How it is measured:
        `status == "diverged"` or `loss.finite == false` on any probe; the probe's `error` says at which step.
        When every diverging probe used `amp=fp16`, the fix is bf16 (where supported) or a GradScaler;
        otherwise gradient clipping and a lower learning rate.

    Fix:
        Do not adopt the diverging settings. Use bf16 instead of fp16, keep a GradScaler with fp16, clip
        gradients, or lower the learning rate when the batch grows.

    Example:
        `the loss became non-finite in p021 (batch_size=64, channels_last=true, checkpointing=true): loss became
        nan at step 7`
    """
    bad = [p for p in ctx.probes if p.get("status") == "diverged" or (p.get("loss") or {}).get("finite") is False]
    if not bad:
        return None
    base = ctx.baseline.settings if ctx.baseline else {}
    described = "; ".join(
        f"{p['id']} ({changed(p['settings'], base) if base else 'baseline'}): {p.get('error') or 'non-finite loss'}"
        for p in bad)
    message = f"the loss became non-finite in {described}"
    if all(p["settings"]["amp"] == "fp16" for p in bad):
        if ctx.cuda and ctx.gpu.get("bf16_supported"):
            settings, snippet = {"amp": "bf16"}, snippets.autocast("bf16", "cuda")
        else:
            settings, snippet = {}, snippets.autocast("fp16", "cuda")
    else:
        settings, snippet = {}, ("loss.backward()\n"
                                 "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
                                 "optimizer.step()")
    evidence = {"probes": {p["id"]: {"status": p.get("status"), "error": p.get("error")} for p in bad}}
    return Finding(message, evidence, settings, snippet, probes=[p["id"] for p in bad])


@rule("TA702", "amp-changes-loss", "warning")
def amp_changes_loss(ctx: Context) -> Finding | None:
    """Mixed precision changed the loss, not only the speed.

    What it finds:
        Two probes that differ only in `amp` (float32 against bf16 or fp16) trained on the same data in the
        same order from the same initial weights, yet their losses over the first measured steps differ by more
        than 5% on average.

    Why it matters:
        AMP is adopted for speed on the assumption that it leaves training the same. Losses that part ways
        within a few steps point at a numerically sensitive operation running in 16 bits (a large reduction,
        a softmax or norm kept out of float32 by custom code, a loss computed inside autocast in fp16).

    How it is measured:
        Every probe uses the same seed for weights and data order, so the `raw.loss` sequences of a pair equal
        but for `amp` agree step by step up to rounding. The rule compares the first 10 common measured steps:
        mean |loss_amp - loss_fp32| over mean |loss_fp32|, above 0.05 fires.

    Fix:
        Keep the numerically sensitive parts in float32 (compute the loss outside autocast, or wrap the
        operation in `torch.autocast(..., enabled=False)` and cast its input with `.float()`), prefer bf16 over
        fp16, and check the loss curve over a longer run before adopting AMP.

    Example:
        `with amp=bf16 the loss over the first 10 steps differs from float32 by 30% on average (p001 vs p002)`
    """
    for value in ("bf16", "fp16"):
        for off, on in ctx.pairs("amp", value):
            if off["amp"] != "off":
                continue
            a, b = ((c.first.get("raw") or {}).get("loss") or [] for c in (off, on))
            steps = [(x, y) for x, y in list(zip(a, b))[:LOSS_STEPS] if x is not None and y is not None]
            scale = sum(abs(x) for x, _ in steps)
            if not steps or scale == 0:
                continue
            diff = sum(abs(y - x) for x, y in steps) / scale
            if diff <= LOSS_TOLERANCE:
                continue
            first, second = off.ids[0], on.ids[0]
            message = (f"with amp={value} the loss over the first {len(steps)} steps differs from float32 by "
                       f"{diff:.0%} on average ({first} vs {second})")
            evidence = {"amp": value, "steps": len(steps), "mean_relative_difference": round(diff, 4),
                        "loss_float32": [x for x, _ in steps], f"loss_{value}": [y for _, y in steps]}
            snippet = ("with torch.autocast(device_type=device.type, dtype=torch.bfloat16):\n"
                       "    output = model(inputs)\n"
                       "loss = loss_fn(output.float(), targets)  # the loss in float32, outside autocast")
            return Finding(message, evidence, {}, snippet, probes=[first, second])
    return None


@rule("TA703", "batch-change-affects-optimisation", "info")
def batch_change_affects_optimisation(ctx: Context) -> Finding | None:
    """The recommended batch size differs from yours: the optimisation changes, not only the speed.

    What it finds:
        The recommended settings use a different `batch_size` than the baseline.

    Why it matters:
        Throughput is compared in items per second, so a larger batch can win on speed; but each optimiser
        step then averages over more samples and there are fewer steps per epoch. With the same learning rate
        the model trains differently: convergence per epoch and final accuracy can change.

    How it is measured:
        `recommended.settings.batch_size` against `baseline.settings.batch_size`. No speed gain is claimed by
        this finding (the batch change's own gain is reported by TA201 or the run's speedup).

    Fix:
        Scale the learning rate with the batch (linear for SGD, square root is common for Adam-style
        optimisers) and re-check convergence; or keep the old effective batch with gradient accumulation when
        the batch had to shrink.

    Example:
        `the recommended batch_size=64 is 2x the baseline's 32: scale the learning rate by 2 (SGD) or 1.41
        (Adam-style), or keep the effective batch by design`
    """
    base, rec = ctx.baseline, ctx.recommended
    if base is None or rec is None or base["batch_size"] == rec["batch_size"]:
        return None
    old, new = base["batch_size"], rec["batch_size"]
    ratio = new / old
    message = (f"the recommended batch_size={new} is {ratio:g}x the baseline's {old}: scale the learning rate by "
               f"{ratio:g} (SGD) or {ratio ** 0.5:.3g} (Adam-style), or keep the effective batch by design")
    snippet = snippets.lr_scaling(old, new)
    if ratio < 1 and (old % new == 0):
        snippet += "\n# or keep the effective batch of the baseline:\n" + snippets.gradient_accumulation(old // new)
    return Finding(message, {"baseline_batch_size": old, "recommended_batch_size": new}, {"batch_size": new},
                   snippet, probes=rec.ids[:1])
