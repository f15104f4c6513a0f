"""TA7xx: numerics and safety — losses that are not finite, AMP that changes the loss, batch changes."""

from __future__ import annotations

from .. import frameworks, knobs, snippets
from ..frameworks.common import accumulation
from ..analysis import parity
from .context import Config, Context, Finding, changed
from .registry import rule


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
        but for `amp` agree step by step up to rounding. The rule compares the losses of the global training
        steps both probes measured (`raw.loss_step`; warm-up lengths differ, so list positions do not match,
        `analysis.parity`): mean |loss_amp - loss_fp32| over the mean of the larger of the two per step,
        above 0.05 fires. The planner applies the same test and does not recommend such settings.

    Fix:
        Keep the numerically sensitive parts in float32 (compute the loss outside autocast, or wrap the
        operation in `torch.autocast(..., enabled=False)` and cast its input with `.float()`), prefer bf16 over
        fp16, and check the loss curve over a longer run before adopting AMP.

    Example:
        `with amp=bf16 the loss over 40 measured steps differs from float32 by 30% on average (p001 vs p002)`
    """
    for value in ("bf16", "fp16"):
        found = _loss_change(ctx, "amp", value)
        if found:
            snippet = ("with torch.autocast(device_type=device.type, dtype=torch.bfloat16):\n"
                       "    output = model(inputs)\n"
                       "loss = loss_fn(output.float(), targets)  # the loss in float32, outside autocast")
            return _loss_finding("amp", value, *found, snippet)
    return None


@rule("TA704", "compile-or-tf32-changes-loss", "warning")
def compile_or_tf32_changes_loss(ctx: Context) -> Finding | None:
    """torch.compile or TF32 matmuls changed the loss, not only the speed.

    What it finds:
        Two probes that differ only in `compile` (off against a compile mode) or in `matmul_precision`
        (highest against high, TF32 on Ampere+ GPUs, or medium, bf16 inside float32 matmuls) trained on the
        same data in the same order from the same initial weights, yet their losses over the common measured
        steps differ by more than 5% on average.

    Why it matters:
        Both knobs are meant to leave training the same: compiled kernels reorder floating-point sums, and TF32
        and bf16 round matmul inputs to 10 and 7 mantissa bits, which should move the loss only in its last
        digits. A visible change points at a numerically fragile model (huge activations, catastrophic
        cancellation) or a compiler bug, and the speed is worth nothing if the model then learns differently.

    How it is measured:
        As TA702 (`analysis.parity`): mean |loss_knob - loss_reference| over the mean of the larger of the
        two per step, on the global training steps both probes measured (`raw.loss_step`: a compiled probe
        warms up until compilation settles, so its first measured step comes later than the reference's);
        above 0.05 fires. The planner applies the same test and does not recommend such settings.

    Fix:
        Keep the knob off for this model, or find the fragile operation (compare the two runs layer by layer)
        and keep it in full precision: `torch.set_float32_matmul_precision("highest")` around it, or exclude
        it from compilation with `torch.compiler.disable`.

    Example:
        `with compile=default the loss over 40 measured steps differs from the reference by 12% on average
        (p001 vs p007)`
    """
    for knob, values in (("compile", ("default", "reduce-overhead", "max-autotune")),
                         ("matmul_precision", ("high", "medium"))):
        for value in values:
            found = _loss_change(ctx, knob, value)
            if found:
                snippet = (f"# {knob}={value} changed the loss: keep it at "
                           f"{parity.NUMERIC_KNOBS[knob]} for this model\n"
                           "@torch.compiler.disable  # or: keep one fragile function out of the compiled graph\n"
                           "def fragile_part(x): ...")
                return _loss_finding(knob, value, *found, snippet)
    return None


def _loss_change(ctx: Context, knob: str, value) -> tuple[Config, Config, parity.Parity] | None:
    """The first pair differing only in `knob` (reference value against `value`) whose losses part ways."""
    for ref, on in ctx.pairs(knob, value):
        if ref[knob] != parity.NUMERIC_KNOBS[knob]:
            continue
        found = parity.compare_probes(ref.first, on.first)  # at the same global steps
        if found is not None and not found.ok:
            return ref, on, found
    return None


def _loss_finding(knob: str, value, ref: Config, on: Config, found: parity.Parity, snippet: str) -> Finding:
    first, second = ref.ids[0], on.ids[0]
    reference = "float32" if knob == "amp" else "the reference"
    message = (f"with {knob}={value} the loss over {found.steps} measured steps differs from {reference} by "
               f"{found.difference:.0%} on average ({first} vs {second})")
    evidence = {knob: value, "steps": found.steps, "mean_relative_difference": round(found.difference, 4),
                "tolerance": parity.TOLERANCE, "global_steps": list(found.at) if found.at is not None else None,
                "loss_reference": list(found.reference), f"loss_{knob}": list(found.candidate)}
    return Finding(message, evidence, {}, snippet, probes=[first, second])


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
        this finding (the batch change's own gain is reported by TA201 or the run's speedup). For a Trainer or
        LightningModule the recommendation rescales the framework's gradient accumulation to keep the effective
        batch (the report's framework note): the rule reads the same accumulation, stays silent when the
        effective batch is kept, and otherwise scales the learning rate by the effective batch's change.

    Fix:
        Scale the learning rate with the batch (linear for SGD, square root is common for Adam-style
        optimisers) and re-check convergence. Gradient accumulation keeps the effective batch: when the batch
        shrinks, accumulate old/new micro-batches; if you already accumulate n micro-batches, divide n by
        new/old when the batch grows.

    Example:
        `batch_size 32 → 128: each optimizer step averages 4x the samples; 1,563 → 391 optimizer steps per
        epoch. Scale the learning rate about 4x (linear rule, SGD) or 2x (square root, Adam-style) with a
        warm-up, and re-check convergence; if you already accumulate gradients over n micro-batches of 32,
        accumulate n/4 of 128 to keep your effective batch of 32·n.`
    """
    base, rec = ctx.baseline, ctx.recommended
    if base is None or rec is None or base["batch_size"] == rec["batch_size"]:
        return None
    old, new = base["batch_size"], rec["batch_size"]
    framework_accumulation = frameworks.accumulation_steps(ctx.document.get("workload", {}).get("framework"))
    if framework_accumulation is not None:
        return _effective_batch_change(old, framework_accumulation, new, rec)
    message = knobs.batch_change_note(old, new, ctx.facts.get("dataset_len"))
    evidence = {"baseline_batch_size": old, "recommended_batch_size": new, "samples_per_step_ratio": new / old}
    if new < old and old % new == 0:  # keep the baseline's effective batch by accumulating
        evidence["accumulation_steps"] = old // new
        snippet = snippets.gradient_accumulation(old // new)
    else:
        snippet = snippets.lr_scaling(old, new)
        if new % old == 0:
            evidence["accumulation_divisor"] = new // old
            snippet += (f"\n# already accumulating n micro-batches of {old}? Accumulate n/{new // old} of {new} "
                        "instead: same effective batch")
    return Finding(message, evidence, {"batch_size": new}, snippet, probes=rec.ids[:1])


def _effective_batch_change(old: int, old_accum: int, new: int, rec: Config) -> Finding | None:
    """TA703 for a framework's loop, whose recommendation rescales its gradient accumulation as the framework note
    says (frameworks.common.accumulation): nothing when the effective batch is kept, else its change."""
    new_accum, kept = accumulation(old, old_accum, new)
    if kept:
        return None
    effective, new_effective = old * old_accum, new * new_accum
    ratio = new_effective / effective
    message = (f"batch_size {old} → {new} with gradient accumulation {old_accum} → {new_accum}: the effective "
               f"batch changes from {effective} to {new_effective} ({ratio:.3g}x the samples per optimizer step). "
               f"Scale the learning rate about {ratio:.3g}x (linear rule, SGD) or {ratio ** 0.5:.3g}x (square "
               "root, Adam-style) and re-check convergence.")
    evidence = {"baseline_batch_size": old, "recommended_batch_size": new, "baseline_accumulation": old_accum,
                "recommended_accumulation": new_accum, "effective_batch_ratio": ratio}
    snippet = (f"# effective batch (batch x accumulation) {effective} -> {new_effective}: scale the learning rate\n"
               f"lr = base_lr * {ratio:.3g}  # linear rule (SGD); Adam-style optimisers: base_lr * {ratio ** 0.5:.3g}")
    return Finding(message, evidence, {"batch_size": new}, snippet, probes=rec.ids[:1])
