"""TA8xx: environment — CPU threads against cores, GPU clock throttling, operators this machine has no kernel for."""

from __future__ import annotations

from .. import snippets
from ..analysis import stats
from .context import Context, Finding, Gain, join
from .registry import rule

CPU_SATURATED = 0.90  # share of all cores busy during the measured steps
BENIGN_THROTTLE = {"gpu_idle", "applications_clocks_setting", "none", "sw_power_cap_idle"}


@rule("TA801", "cpu-thread-oversubscription", "warning")
def cpu_thread_oversubscription(ctx: Context) -> Finding | None:
    """Intra-op threads and loader workers together ask for more cores than the machine has.

    What it finds:
        Among the baseline, the recommendation and their loader ladders (the same settings at other worker
        counts), settings with `num_workers > 0` whose demand for cores — the training process's intra-op threads plus
        what the loader workers keep busy — exceeds the CPU cores, while the CPU was saturated (at least 90% of
        all cores busy, the median over that setting's probes). A worker keeps a core busy the share of its time
        its loading spends on a CPU: the baseline's `fetch_cpu_frac` where it loaded without workers (workers
        asleep on storage ask for little), else a whole core each.

    Why it matters:
        PyTorch starts one intra-op thread per core by default. Every loader worker that computes is another busy
        process; together they time-slice the cores, the intra-op threads stall each other at every parallel
        region, and the worker probes under-report what workers could give. On CPU training this also hides how
        fast the model itself can run.

    How it is measured:
        For each setting with `ok` probes: `extra.torch_threads + settings.num_workers × fetch_cpu_frac` against
        `environment.cpu_count`, and the median of `extra.cpu_util` (CPU seconds of the probe process tree over
        the measured wall time and all cores) over the setting's probes. Not measured as a speed-up: thread
        counts are not a knob yet, so the gain is left unmeasured.

    Fix:
        Give the intra-op threads the cores the workers leave: `torch.set_num_threads(cores - num_workers)`
        (or `OMP_NUM_THREADS`), then re-measure the loader ladder.

    Example:
        `num_workers 1, 2, 4 ran beside 2 intra-op threads on 2 cores with the CPU 99% busy: workers and compute
        threads compete`
    """
    cores = ctx.cpu_count
    if not cores:
        return None
    share = worker_cpu_share(ctx)

    def threads(c) -> int:
        return c.extra("torch_threads") or ctx.environment.get("torch_threads") or 0

    # the settings a user runs (baseline, recommendation) and the loader ladders through them: a crowded rung of
    # some other ladder (a batch rung at 32 workers) does not describe what the user will run
    near = {id(c): c for s in ctx.subjects() for c in ctx.series(s, "num_workers")} or {
        id(c): c for c in ctx.configs.values()}
    crowded = [c for c in near.values() if c["num_workers"] > 0
               and threads(c) + c["num_workers"] * share > cores
               and (c.median_extra("cpu_util") or 0) >= CPU_SATURATED]
    if not crowded:
        return None
    workers = sorted({c["num_workers"] for c in crowded})
    most = max(threads(c) for c in crowded)
    busy = max(c.median_extra("cpu_util") for c in crowded)
    message = (f"num_workers {join(workers)} ran beside {most} intra-op threads on {cores} cores with the CPU "
               f"{busy:.0%} busy: workers and compute threads compete")
    evidence = {"cpu_count": cores, "torch_threads": most, "num_workers": workers,
                "median_cpu_util": round(busy, 3), "worker_cpu_share": round(share, 3)}
    snippet = snippets.set_num_threads(max(1, cores - workers[0]))
    gain = Gain.estimated(None, "intra-op thread count is not a probed knob")
    return Finding(message, evidence, {}, snippet, gain, [i for c in crowded for i in c.ids])


def worker_cpu_share(ctx: Context) -> float:
    """The share of a core one loader worker keeps busy: the median `fetch_cpu_frac` of the settings that loaded
    without workers (the loading thread's CPU time over its fetches' wall time), else 1 (a busy process)."""
    shares = [v for c in ctx.configs.values() if c["num_workers"] == 0
              and (v := c.median_extra("fetch_cpu_frac")) is not None]
    return min(1.0, stats.median(shares)) if shares else 1.0


@rule("TA802", "gpu-throttling", "warning")
def gpu_throttling(ctx: Context) -> Finding | None:
    """The GPU slowed its clocks for heat or power while the probes ran.

    What it finds:
        NVML reported a thermal or power throttle reason during `ok` probes (software or hardware slowdown,
        power cap, power brake), with the SM clock below its maximum.

    Why it matters:
        A throttled GPU runs every kernel slower, and by a varying amount: measured speed-ups become noisy and
        the machine delivers less than it should. The cause is outside the training code — cooling, power
        limits, a shared chassis.

    How it is measured:
        Each probe's `gpu.throttle_reasons` (NVML clock-event reason names, lower case, e.g.
        `sw_thermal_slowdown`, `hw_slowdown`, `sw_power_cap`; idle and application-clock reasons ignored), and
        `gpu.sm_clock_mhz` against `gpu.max_sm_clock_mhz`, filled by the NVML collector. The gain is estimated as
        max clock / observed clock, an upper bound labelled so. Silent on CPU or without these keys.

    Fix:
        Check cooling and power limits (`nvidia-smi -q -d PERFORMANCE,CLOCK,POWER`); on a shared machine,
        measure when it is idle.

    Example:
        `NVML reported sw_thermal_slowdown in 19 of 19 probes; SM clock 1095 of 1410 MHz (78%)`
    """
    if not ctx.cuda:
        return None
    ok = [p for c in ctx.configs.values() for p in c.probes]
    throttled = [p for p in ok if set((p.get("gpu") or {}).get("throttle_reasons") or []) - BENIGN_THROTTLE]
    if not throttled:
        return None
    reasons = sorted({r for p in throttled for r in p["gpu"]["throttle_reasons"]} - BENIGN_THROTTLE)
    clocks = [(p["gpu"].get("sm_clock_mhz"), p["gpu"].get("max_sm_clock_mhz")) for p in throttled]
    clocks = [(c, m) for c, m in clocks if c and m]
    message = f"NVML reported {join(reasons)} in {len(throttled)} of {len(ok)} probes"
    evidence = {"throttle_reasons": reasons, "throttled_probes": len(throttled), "ok_probes": len(ok)}
    gain = Gain.estimated(None, "no SM clock was recorded")
    if clocks:
        clock = min(c for c, _ in clocks)
        top = max(m for _, m in clocks)
        message += f"; SM clock {clock:.0f} of {top:.0f} MHz ({clock / top:.0%})"
        evidence.update(sm_clock_mhz=clock, max_sm_clock_mhz=top)
        gain = Gain.estimated(top / clock, "upper bound: max SM clock over the lowest clock seen while throttled")
    snippet = "# outside Python:\nnvidia-smi -q -d PERFORMANCE,CLOCK,POWER   # why the clocks are held down"
    return Finding(message, evidence, {}, snippet, gain, [p["id"] for p in throttled])


@rule("TA803", "operator-unsupported-here", "info")
def operator_unsupported_here(ctx: Context) -> Finding | None:
    """A knob asked an operator for a dtype or memory layout this machine has no kernel for.

    What it finds:
        Probes with status `unsupported`: the probe child caught an error that names a missing kernel (oneDNN's
        "could not create a primitive descriptor for the LSTM forward propagation primitive", ATen's
        "\"addmm_impl_cpu_\" not implemented for 'BFloat16'") while a knob that changes dtypes or layouts
        (amp, channels_last, matmul_precision, compile) was on. The probe's error names the operator, the
        innermost layer that was running, and the knob.

    Why it matters:
        This is not a bug in the training code and not a crash: the setting cannot run on this machine (oneDNN
        has no bf16 LSTM on CPUs without native bf16, for one). The knob is not held against the model; it is
        simply not available here, and on another machine (a GPU, a CPU with AMX or avx512_bf16) it may be.

    How it is measured:
        The probe child matches the exception text against known missing-kernel messages, but only when a
        dtype- or layout-changing knob was set (the same error with every such knob off is the workload's own
        `error`); the innermost `nn.Module` in the traceback is the layer.

    Fix:
        Leave the knob off here, or keep the named layer out of it: run that layer in float32 under
        `torch.autocast(..., enabled=False)` with its input cast by `.float()`, or give it contiguous input.

    Example:
        `amp=bf16 cannot run on this machine: LSTM (in Tagger) has no kernel here for amp=bf16 (p004)`
    """
    missing = [p for p in ctx.probes if p.get("status") == "unsupported"]
    if not missing:
        return None
    causes = {}
    for p in missing:
        cause = str(p.get("error") or "no kernel for this setting")
        causes.setdefault(cause.split(": ", 1)[0], []).append(p["id"])
    message = "; ".join(f"{what} ({join(ids)})" for what, ids in causes.items())
    evidence = {"probes": {p["id"]: p.get("error") for p in missing}}
    snippet = ("# keep the layer without a kernel here out of autocast:\n"
               "with torch.autocast(device_type=device.type, enabled=False):\n"
               "    output = layer(inputs.float())")
    gain = Gain.estimated(None, "the setting cannot run on this machine")
    return Finding(f"not available on this machine: {message}", evidence, {}, snippet, gain,
                   [p["id"] for p in missing])
