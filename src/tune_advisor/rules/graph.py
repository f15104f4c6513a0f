"""TA5xx: graph, compile and cuDNN — memory layout, torch.compile, and convolution autotuning."""

from __future__ import annotations

from .. import snippets
from ..analysis import breakeven
from .context import Context, Finding, Gain, changed
from .registry import rule


@rule("TA501", "channels-last-unused", "warning")
def channels_last_unused(ctx: Context) -> Finding | None:
    """A convolutional model runs in NCHW layout where channels_last was measured faster.

    What it finds:
        The model has Conv2d/Conv3d layers, the baseline keeps the default NCHW memory format, and a probe that
        differs only in `channels_last=True` trained significantly faster — at the baseline, or on top of
        another change such as AMP (channels_last pays most under reduced precision).

    Why it matters:
        Convolution kernels on tensor cores (CUDA) and oneDNN (CPU) work in NHWC; with NCHW tensors every
        convolution converts its input and output layouts. Converting the model and the inputs once removes
        that work.

    How it is measured:
        Pairs of `ok` probes equal but for `channels_last`, the pair at the baseline first; the first with a
        significant throughput ratio (median gain >= 3%, CI above 1) is reported. `applied` shows how many conv
        weights and whether the inputs were channels_last in the probe. Silent without convolution layers
        (`workload.facts.conv_layers`).

    Fix:
        Convert the model and every 4-D input batch to `torch.channels_last`.

    Example:
        `channels_last=True trains 1.26x [1.20, 1.32] faster (7 conv layers)`

        ```python
        model = model.to(memory_format=torch.channels_last)
        images = images.to(device).contiguous(memory_format=torch.channels_last)
        ```
    """
    base = ctx.baseline
    if base is None or base["channels_last"] or not ctx.facts.get("conv_layers"):
        return None
    for off, on in ctx.pairs("channels_last", True):
        gain = ctx.gain(off, on)
        if not gain.significant:
            continue
        where = "" if off is base else f" with {changed(off.settings, base.settings)}"
        message = f"channels_last=True trains {gain.text()} faster{where} ({ctx.facts['conv_layers']} conv layers)"
        evidence = {"conv_layers": ctx.facts["conv_layers"],
                    "conv_weights_channels_last": on.first.get("applied", {}).get("conv_weights_channels_last")}
        return Finding(message, evidence, {"channels_last": True}, snippets.channels_last(), gain, on.ids)
    return None


@rule("TA502", "cudnn-benchmark-off", "info")
def cudnn_benchmark_off(ctx: Context) -> Finding | None:
    """cuDNN autotuning is off for a convolutional model whose input shapes never change.

    What it finds:
        On CUDA, a model with convolution layers runs with `torch.backends.cudnn.benchmark=False` while its input
        shapes are static, and either a probe with `cudnn_benchmark=True` trained significantly faster or no
        such probe was run.

    Why it matters:
        With benchmark mode, cuDNN times the candidate algorithms for each new input shape once and then uses
        the fastest; with fixed shapes that one-off cost is amortised over the whole run. Without it, cuDNN
        uses a heuristic choice that is often slower.

    How it is measured:
        `workload.facts.conv_layers`, the baseline's `extra.input_shapes_static` (whether every measured batch
        had the same per-sample shape; a document without it is treated as static only when a probe measured
        the gain) and the throughput ratio of a probe equal to the baseline but for `cudnn_benchmark=True`.
        A measured ratio that is not significant silences the rule. Silent on CPU.

    Fix:
        `torch.backends.cudnn.benchmark = True` before training.

    Example:
        `cudnn_benchmark=True trains 1.09x [1.04, 1.14] faster: input shapes are static (1 shape)`
    """
    base = ctx.baseline
    if not ctx.cuda or base is None or base["cudnn_benchmark"] or not ctx.facts.get("conv_layers"):
        return None
    static = base.extra("input_shapes_static")
    if static is False:
        return None
    tuned = ctx.variant(base, cudnn_benchmark=True)
    if tuned is None and static is None:
        return None
    gain = ctx.gain(base, tuned) if tuned else Gain.estimated(None, "no cudnn_benchmark=True probe was run")
    if tuned is not None and not gain.significant:
        return None
    shapes = base.extra("distinct_input_shapes")
    message = (f"cudnn_benchmark=True trains {gain.text()} faster" if tuned else "cudnn_benchmark is off") + \
        (f": input shapes are static ({shapes} shape)" if static else "")
    return Finding(message, {"input_shapes_static": static, "distinct_input_shapes": shapes},
                   {"cudnn_benchmark": True}, snippets.cudnn_benchmark(True), gain, base.ids)


@rule("TA503", "cudnn-benchmark-with-dynamic-shapes", "warning")
def cudnn_benchmark_with_dynamic_shapes(ctx: Context) -> Finding | None:
    """cuDNN autotuning is on while the input shapes keep changing.

    What it finds:
        On CUDA, the baseline runs with `torch.backends.cudnn.benchmark=True` and its measured batches had
        more than one per-sample input shape (variable image sizes, sequence lengths padded per batch, ...).

    Why it matters:
        Benchmark mode re-times every candidate algorithm for each input shape it has not seen. With shapes
        that keep changing it autotunes again and again, and those slow steps never amortise.

    How it is measured:
        The baseline's `extra.input_shapes_static` (false) and `extra.distinct_input_shapes`, recorded in the
        probe child from the first tensor of each measured batch, batch dimension excluded. The gain is measured
        against a probe equal to the baseline but for `cudnn_benchmark=False` when one exists; otherwise it is
        left unmeasured; a measured ratio that is not significant silences the rule. Silent on CPU and when the
        shape record is absent.

    Fix:
        `torch.backends.cudnn.benchmark = False`, or make the shapes static (pad or bucket to a few fixed
        sizes) and keep it on.

    Example:
        `cudnn_benchmark is on but the inputs took 9 different shapes in 30 steps; cudnn_benchmark=False trains
        1.13x [1.08, 1.18] faster`
    """
    base = ctx.baseline
    if not ctx.cuda or base is None or not base["cudnn_benchmark"] or base.extra("input_shapes_static") is not False:
        return None
    shapes = base.extra("distinct_input_shapes")
    untuned = ctx.variant(base, cudnn_benchmark=False)
    gain = ctx.gain(base, untuned) if untuned else Gain.estimated(None, "no cudnn_benchmark=False probe was run")
    if untuned is not None and not gain.significant:
        return None  # measured: autotuning does not cost here despite the shapes
    message = f"cudnn_benchmark is on but the inputs took {shapes} different shapes in {len(base.step_s)} steps"
    if untuned:
        message += f"; cudnn_benchmark=False trains {gain.text()} faster"
    return Finding(message, {"input_shapes_static": False, "distinct_input_shapes": shapes},
                   {"cudnn_benchmark": False}, snippets.cudnn_benchmark(False), gain, base.ids)


@rule("TA504", "compile-break-even", "info")
def compile_break_even(ctx: Context) -> Finding | None:
    """What torch.compile bought, and after how many steps its compile time pays for itself.

    What it finds:
        A probe with `compile` on and its twin equal but for `compile=off`, both finished. The finding states
        the measured speed-up of the steady state, the compile time, and the break-even step count; or that
        compiling did not make the steps faster.

    Why it matters:
        torch.compile trades a one-off compilation (seconds to minutes, paid again whenever the code or the
        input shapes change) for faster steps. Whether that pays depends on how long the training runs: a
        short fine-tune may never earn back what compiling cost.

    How it is measured:
        The compiled probe's `extra.compile.compile_s`: the warm-up steps' time beyond as many steady measured
        steps (compilation and autotuning happen in the first steps, never in the timed ones; warm-up goes on
        until 3 steps in a row compile nothing new), with torch's on-disk compile caches as they stand (a
        first-ever compile of the model takes longer). If dynamo still recompiled inside the timed steps, no
        speed or break-even is claimed. The per-step
        saving is the difference of the two probes' median step times; break-even = compile time / saving.
        The speed-up is the throughput ratio with its bootstrap CI. A compile that compiled no graph (dynamo
        gave up on the model, e.g. an LSTM) ran eagerly: no speed-up is claimed, whatever the two probes read.
        With `--train-steps N` (the run's steps at the baseline's batch) the break-even is set against the run,
        in steps of the compiled probe's batch; past it the finding advises leaving compile off, and the planner
        does not recommend it.

    Fix:
        When the break-even is well inside your training run, compile the model; otherwise leave it off.

    Example:
        `torch.compile (default) trains 1.31x [1.24, 1.38] faster after 41.2 s of compiling: it pays off after
        about 2,300 steps (6.1 min of training at the compiled speed)`
    """
    base = ctx.baseline
    for mode in ("default", "reduce-overhead", "max-autotune"):
        for off, on in ctx.pairs("compile", mode):
            if off["compile"] != "off":
                continue
            stats = on.extra("compile") or {}
            compile_s = stats.get("compile_s")
            if compile_s is None:
                continue
            gain = ctx.gain(off, on)
            saving = off.step_median - on.step_median
            ablated = ctx.ablation_gain("compile", mode)  # the recommendation's own figure, when it was measured
            if ablated is not None and ablated.median:
                gain, saving = ablated, on.step_median * (ablated.median - 1)
            if ctx.loss_changed(off, on):  # not a speed-up to take: TA704 reports the loss
                message = (f"torch.compile ({mode}) changed the loss (see TA704): {gain.text()} after "
                           f"{compile_s:.1f} s of compiling, but not recommended")
                return Finding(message, {"mode": mode, "compile_s": round(compile_s, 3)}, {},
                               snippets.compile_model(mode), gain, off.ids + on.ids)
            if stats.get("recompiles_measured"):  # compile time inside the timed steps: no steady speed to quote
                message = (f"torch.compile ({mode}) kept recompiling into the measured steps (new input shapes, "
                           f"see TA505): its steady speed was not measured ({compile_s:.1f} s of compiling before)")
                evidence = {"mode": mode, "compile_s": round(compile_s, 3),
                            "recompiles_measured": stats["recompiles_measured"]}
                return Finding(message, evidence, {}, snippets.compile_model(mode), Gain.estimated(
                    None, "no steady state to compare"), off.ids + on.ids)
            where = "" if off is base else f" (with {changed(off.settings, base.settings)})" if base else ""
            evidence = {"mode": mode, "compile_s": round(compile_s, 3), "graphs": stats.get("graphs"),
                        "unsupported": stats.get("unsupported") or [],
                        "recompiles": (stats.get("recompiles_warmup") or 0) + (stats.get("recompiles_measured") or 0),
                        "step_s_off": round(off.step_median, 6), "step_s_on": round(on.step_median, 6)}
            if stats.get("graphs") == 0:  # dynamo compiled nothing: both probes ran the same eager model
                why = f" ({stats['unsupported'][0]})" if stats.get("unsupported") else ""
                message = (f"torch.compile ({mode}) compiled no graph{why}, so the model ran eagerly{where}: the "
                           f"{gain.text()} between the two probes is their processes' spread, not compile's; leave "
                           "it off")
                return Finding(message, evidence, {}, snippets.compile_model(mode),
                               Gain.estimated(None, "it compiled no graph"), off.ids + on.ids)
            if gain.significant and saving > 0:
                steps = compile_s / saving
                evidence["break_even_steps"] = round(steps)
                message = (f"torch.compile ({mode}) trains {gain.text()} faster{where} after {compile_s:.1f} s of "
                           f"compiling: it pays off after about {steps:,.0f} steps "
                           f"({steps * on.step_median / 60:.1f} min of training at the compiled speed)")
                settings = {"compile": mode}
                if ctx.train_steps and base:  # the run the user stated decides (the planner judged it so too)
                    run = breakeven.run_steps(ctx.train_steps, base.settings["batch_size"], on.settings["batch_size"])
                    evidence["run_steps"] = round(run)
                    message += f", {breakeven.verdict(steps, run)}"
                    if steps > run:
                        message += ": leave it off"
                        settings = {}
            else:
                message = (f"torch.compile ({mode}) did not train faster{where}: {gain.text()} after "
                           f"{compile_s:.1f} s of compiling; leave it off")
                settings = {}
            return Finding(message, evidence, settings, snippets.compile_model(mode), gain, off.ids + on.ids)
    return None


@rule("TA505", "compile-recompiles", "warning")
def compile_recompiles(ctx: Context) -> Finding | None:
    """torch.compile compiled the model again and again: the input shapes keep changing.

    What it finds:
        A probe with `compile` on whose dynamo counters show recompilations (a new graph for new input
        shapes), during warm-up beyond the first or while measuring, with more than one per-sample input shape
        among the measured batches (sequences padded per batch, variable image sizes).

    Why it matters:
        Every new shape costs another compilation, seconds each on a GPU and more on a CPU. After a shape
        changes, dynamo marks that dimension dynamic and compiles a general kernel, which is often slower
        than the specialised one. Recompiles inside the timed steps also make the steps' time unpredictable.

    How it is measured:
        `extra.compile.recompiles_warmup` and `recompiles_measured`: graphs torch._dynamo compiled after the
        first step (every step runs the same code, so a new graph means new shapes), before and after warm-up
        and `extra.distinct_input_shapes`. No gain is claimed.

    Fix:
        Pad or bucket the inputs to a few fixed lengths (for example multiples of 64 tokens), or compile with
        `dynamic=True` so one general graph serves every shape from the start; raise
        `torch._dynamo.config.cache_size_limit` only as a last resort.

    Example:
        `torch.compile recompiled 3 times (2 while measuring): the inputs took 17 shapes in 40 steps`
    """
    for config in ctx.configs.values():
        if config["compile"] == "off":
            continue
        stats = config.extra("compile") or {}
        warm, measured = stats.get("recompiles_warmup") or 0, stats.get("recompiles_measured") or 0
        shapes = config.extra("distinct_input_shapes")
        if warm + measured == 0 or not shapes or shapes <= 1:
            continue
        times = f"{warm + measured} time{'s' if warm + measured != 1 else ''}"
        message = (f"torch.compile recompiled {times} ({measured} while measuring): the inputs "
                   f"took {shapes} shapes in {len(config.step_s)} steps")
        evidence = {"recompiles_warmup": warm, "recompiles_measured": measured, "distinct_input_shapes": shapes,
                    "graphs": stats.get("graphs")}
        snippet = ("model = torch.compile(model, dynamic=True)  # one graph for every sequence length\n"
                   "# or pad each batch to a multiple of 64 in collate_fn so only a few shapes occur")
        return Finding(message, evidence, {}, snippet, probes=config.ids)
    return None
