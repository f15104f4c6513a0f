"""TA2xx: host and launch overhead — fixed per-step costs, debugging switches left on."""

from __future__ import annotations

from .. import snippets
from .context import Context, Finding, Gain
from .registry import rule

DEBUG_SWITCHES = {
    "anomaly_detection": ("autograd anomaly detection", "torch.autograd.set_detect_anomaly(False)"),
    "autograd_profiler": ("the autograd profiler",
                          "# profile a few steps only: `with torch.profiler.profile(...)` around them, not the run"),
    "cuda_launch_blocking": ("CUDA_LAUNCH_BLOCKING=1", "# unset CUDA_LAUNCH_BLOCKING: it serialises every kernel"),
}


@rule("TA201", "small-batch-overhead", "warning")
def small_batch_overhead(ctx: Context) -> Finding | None:
    """Throughput still climbs with the batch size: each step pays a fixed cost the batch is too small to hide.

    What it finds:
        A larger `batch_size` than the baseline's trains significantly more items per second. The step has
        fixed costs — Python and framework overhead, kernel launches, the optimiser update, synchronisation —
        that a larger batch shares among more samples.

    Why it matters:
        With a small batch the device idles between short kernels; per-sample cost falls until the device is
        saturated. The knee of the batch ladder is where that stops paying.

    How it is measured:
        The baseline's `batch_size` ladder (probes equal to the baseline but for `batch_size`), walked upwards
        keeping each size that beats the best so far by at least 3% with a throughput-ratio CI above 1. The gain
        is the measured ratio (items/s, so batches of different sizes compare fairly) of the knee over the
        baseline. A larger batch changes optimisation: see TA703.

    Fix:
        Raise `batch_size` to the knee, and scale the learning rate (TA703).

    Example:
        `batch_size=64 trains 1.10x [1.05, 1.17] more samples/s than 32: per-step overhead is spread over more
        samples`
    """
    base = ctx.baseline
    if base is None:
        return None
    knee = ctx.knee(base, "batch_size")
    if knee is base:
        return None
    gain = ctx.gain(base, knee)
    message = (f"batch_size={knee['batch_size']} trains {gain.text()} more {ctx.unit} than {base['batch_size']}: "
               "per-step overhead is spread over more samples")
    ladder = {c["batch_size"]: round(c.throughput, 1) for c in ctx.series(base, "batch_size")}
    fix = {"batch_size": knee["batch_size"]}
    snippet = (snippets.dataloader(ctx.applied(fix), ctx.cuda) + "\n"
               + snippets.lr_scaling(base["batch_size"], knee["batch_size"]))
    return Finding(message, {"throughput_by_batch_size": ladder, "unit": ctx.unit}, fix, snippet, gain, knee.ids)


@rule("TA202", "debug-apis-on", "warning")
def debug_apis_on(ctx: Context) -> Finding | None:
    """A debugging switch is on while training: anomaly detection, the autograd profiler or blocking launches.

    What it finds:
        The probe process found, after the first training step, autograd anomaly detection enabled, the
        autograd profiler running, or `CUDA_LAUNCH_BLOCKING=1` in the environment — typically set in the
        workload's own code and forgotten there.

    Why it matters:
        Anomaly detection records a traceback for every autograd node and checks every backward output; the
        profiler records every operator; blocking launches make the host wait for each kernel. Each is a
        debugging tool that slows every step and belongs in a debugging session only.

    How it is measured:
        The baseline probe's `extra.anomaly_detection` (`torch.is_anomaly_enabled()`),
        `extra.autograd_profiler` (`torch.autograd` profiler state) and `extra.cuda_launch_blocking`, recorded in
        the probe child after the measured steps. Not measured as a speed-up: the tool cannot switch the
        workload's own code off, so the gain is left unmeasured. Silent when the keys are absent.

    Fix:
        Remove the switch from the training code (keep it behind a `--debug` flag if you need it).

    Example:
        `autograd anomaly detection is on during training (probe p001): it slows every step`

        ```python
        torch.autograd.set_detect_anomaly(False)
        ```
    """
    base = ctx.baseline
    if base is None:
        return None
    on = [key for key in DEBUG_SWITCHES if base.extra(key)]
    if not on:
        return None
    names = " and ".join(DEBUG_SWITCHES[k][0] for k in on)
    message = f"{names} {'is' if len(on) == 1 else 'are'} on during training (probe {base.ids[0]}): it slows every step"
    snippet = "\n".join(DEBUG_SWITCHES[k][1] for k in on)
    gain = Gain.estimated(None, "the switch is in the workload's code; the tool cannot measure without it")
    return Finding(message, {k: True for k in on}, {}, snippet, gain, base.ids[:1])
