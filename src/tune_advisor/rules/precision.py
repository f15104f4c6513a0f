"""TA4xx: precision and tensor cores — float32 compute where reduced precision pays, fp16 where bf16 would do."""

from __future__ import annotations

from .. import snippets
from .context import Context, Finding, Gain
from .registry import rule

FAST_CPU_BF16 = ("amx_bf16", "avx512_bf16")  # CPU features that make bf16 autocast fast


@rule("TA401", "full-precision-compute", "warning")
def full_precision_compute(ctx: Context) -> Finding | None:
    """The model computes in float32 where mixed precision was measured faster.

    What it finds:
        The baseline runs with `amp=off`, and a probe equal to it but for `amp=bf16` or `amp=fp16` trained
        significantly faster.

    Why it matters:
        Under autocast, matmuls and convolutions run in 16-bit types: on tensor cores (CUDA) or AMX/AVX-512
        BF16 units (CPU) they are several times faster, and activations take half the memory, which also opens
        larger batches. Numerically sensitive operations (softmax, norms, losses) stay in float32.

    How it is measured:
        Throughput ratio of the AMP probe over the baseline (`analysis.stats.ratio_ci` over raw `items` and
        `step_s`), significant when its median gain is at least 3% and its CI lies above 1. The probe's
        `applied.compute_dtypes` shows the layers really ran in the reduced type. On CPU the evidence lists the
        `environment.cpu_flags` that make bf16 fast. Check TA702 before adopting: AMP must not change the loss.

    Fix:
        Wrap the forward pass and loss in `torch.autocast`; with fp16 on CUDA, add a `GradScaler`.

    Example:
        `amp=bf16 trains 1.69x [1.61, 1.77] faster than float32 (layers ran in bfloat16)`

        ```python
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = compute_loss(model, batch)
        loss.backward()
        ```
    """
    base = ctx.baseline
    if base is None or base["amp"] != "off":
        return None
    measured = [(ctx.gain(base, on), on) for value in ("bf16", "fp16") if (on := ctx.variant(base, amp=value))]
    measured = [(g, on) for g, on in measured if g.significant and not ctx.loss_changed(base, on)]  # TA702
    if not measured:
        return None
    gain, best = max(measured, key=lambda m: m[0].median)
    dtypes = best.first.get("applied", {}).get("compute_dtypes")
    message = f"amp={best['amp']} trains {gain.text()} faster than float32"
    if dtypes:
        message += f" (layers ran in {', '.join(dtypes)})"
    evidence = {"amp": best["amp"], "compute_dtypes": dtypes}
    if not ctx.cuda:
        evidence["cpu_flags"] = [f for f in ctx.environment.get("cpu_flags") or [] if f in FAST_CPU_BF16]
    device = "cuda" if ctx.cuda else "cpu"
    return Finding(message, evidence, {"amp": best["amp"]}, snippets.autocast(best["amp"], device), gain, best.ids)


@rule("TA402", "fp16-where-bf16-is-available", "info")
def fp16_where_bf16_is_available(ctx: Context) -> Finding | None:
    """Training uses fp16 autocast on a GPU that supports bf16.

    What it finds:
        The baseline runs `amp=fp16` on a CUDA device whose `bf16_supported` is true (Ampere and newer).

    Why it matters:
        fp16 has a narrow exponent range: gradients underflow without a `GradScaler`, activations can
        overflow to inf, and the scaler skips steps when they do. bf16 has float32's range with the same
        tensor-core speed on these GPUs, needs no scaler and no skipped steps.

    How it is measured:
        `environment.gpu.bf16_supported` and the baseline's `amp` setting. When a probe equal to the baseline
        but for `amp=bf16` exists, its throughput ratio is reported as the measured gain (usually close to 1:
        the reason to switch is numerical robustness); otherwise the gain is left unmeasured.

    Fix:
        `torch.autocast(device_type="cuda", dtype=torch.bfloat16)` and drop the `GradScaler`.

    Example:
        `amp=fp16 on NVIDIA A100-SXM4-40GB which supports bf16: bf16 needs no GradScaler and cannot overflow`
    """
    base = ctx.baseline
    if not ctx.cuda or base is None or base["amp"] != "fp16" or not ctx.gpu.get("bf16_supported"):
        return None
    bf16 = ctx.variant(base, amp="bf16")
    gain = ctx.gain(base, bf16) if bf16 else Gain.estimated(None, "no bf16 probe next to the fp16 baseline")
    message = (f"amp=fp16 on {ctx.gpu.get('name') or 'a GPU'} which supports bf16: bf16 needs no GradScaler "
               "and cannot overflow")
    if bf16:
        message += f"; measured {gain.text()} against fp16"
    return Finding(message, {"bf16_supported": True, "amp": "fp16"}, {"amp": "bf16"},
                   snippets.autocast("bf16", "cuda"), gain, base.ids)


@rule("TA403", "tf32-disabled", "info")
def tf32_disabled(ctx: Context) -> Finding | None:
    """float32 matmuls run at full precision on a GPU with TF32 tensor cores.

    What it finds:
        On a CUDA device of compute capability 8.0 or newer, the baseline computes in float32 (`amp=off`) with
        `matmul_precision="highest"` (PyTorch's default), so matmuls do not use the TF32 tensor cores.

    Why it matters:
        TF32 keeps float32's range with a 10-bit mantissa and runs float32 matmuls on tensor cores, several
        times faster on Ampere and newer, without changing the model's code or dtypes. Most training tolerates
        it; `torch.set_float32_matmul_precision("high")` turns it on.

    How it is measured:
        `environment.gpu.capability` and the baseline's `amp` and `matmul_precision` settings (a document
        without `matmul_precision` ran at the default, "highest"). The gain is measured against a probe equal
        to the baseline but for `matmul_precision="high"` when one exists; otherwise it is left unmeasured.

    Fix:
        `torch.set_float32_matmul_precision("high")` once at start-up (or use AMP, TA401).

    Example:
        `float32 matmuls on NVIDIA A100 (capability 8.0) run without TF32 (matmul_precision="highest")`
    """
    base = ctx.baseline
    if not ctx.cuda or base is None or base["amp"] != "off" or base["matmul_precision"] != "highest":
        return None
    try:
        major = int(str(ctx.gpu.get("capability", "0")).split(".")[0])
    except ValueError:
        return None
    if major < 8:
        return None
    fix = {"matmul_precision": "high"}
    tf32 = ctx.variant(base, **fix)
    gain = ctx.gain(base, tf32) if tf32 else Gain.estimated(None, "no matmul_precision=high probe was run")
    if tf32 is not None and not gain.significant:
        return None  # measured, and it did not pay here
    message = (f"float32 matmuls on {ctx.gpu.get('name') or 'the GPU'} (capability {ctx.gpu.get('capability')}) "
               'run without TF32 (matmul_precision="highest")')
    if tf32:
        message += f'; matmul_precision="high" trains {gain.text()} faster'
    return Finding(message, {"capability": ctx.gpu.get("capability"), "matmul_precision": "highest"}, fix,
                   snippets.matmul_precision("high"), gain, base.ids)
