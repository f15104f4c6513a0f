"""What two probes measured together on one GPU need: a CUDA context each, and each allocator's reserved peak.

A lockstep pair runs two child processes on the same GPU at once. Each holds its own CUDA context (driver state,
kernels of the loaded modules: hundreds of MiB, which no allocator statistic counts) and its caching allocator
keeps freed blocks reserved, so `max_memory_allocated` under-states what a process holds. A pair judged on the
allocated peaks alone could OOM where either probe alone would not. Inputs are injectable (`nvml`, `torch`) so
tests fake any GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Callable

PAIR_SHARE = 0.9  # of the GPU's memory, for the two probes of a pair: the rest is fragmentation and other tenants


def context_bytes(device: str, nvml: Any = None, torch: Any = None,
                  fresh: Callable[[str], tuple[int | None, str]] | None = None) -> tuple[int | None, str]:
    """(bytes one CUDA context takes on `device`, how that was found); (None, why) when it cannot be measured.

    Before this process has created a context: NVML's used memory before and after creating it (NVML itself
    creates none). After: NVML's per-process list, as this process (the analysis' parent) allocates nothing on the
    GPU and what NVML counts for it is its context; where that list does not show this process (an H200 in a
    Firecracker VM listed no process at all), the first way in a fresh process (`fresh`, injectable)."""
    if torch is None:
        import torch  # heavy: only a run on a GPU gets here
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return None, "not measured: nvidia-ml-py (pynvml) is not installed"
    from .nvml import device_handle

    try:
        nvml.nvmlInit()
    except Exception as exc:
        return None, f"not measured: NVML did not start ({exc})"
    try:
        if torch.cuda.is_initialized():
            handle, _ = device_handle(nvml, device)
            mine = [p for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
            if mine and mine[0].usedGpuMemory:
                return int(mine[0].usedGpuMemory), "NVML's memory of this process, which holds only its context"
            size, how = (fresh or in_fresh_process)(device)
            return size, f"{how}; NVML lists no memory for this process (another PID namespace?)"
        handle, _ = device_handle(nvml, device, identity={})  # CUDA cannot be asked before its context exists
        before = nvml.nvmlDeviceGetMemoryInfo(handle).used
        torch.cuda.init()
        torch.zeros(1, device=device)  # the context and the allocator's first block
        after = nvml.nvmlDeviceGetMemoryInfo(handle).used
        return max(0, int(after - before)), "NVML used memory before and after this process's CUDA context"
    except Exception as exc:  # a driver without per-process or memory info, a GPU lost: the cap goes without it
        return None, f"not measured: {exc}"
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def in_fresh_process(device: str, timeout_s: float = 120.0) -> tuple[int | None, str]:
    """context_bytes measured by a new Python process that has no context yet (this module run as a script)."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__, device], capture_output=True, text=True,
                              timeout=timeout_s)
        size, how = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return None, f"not measured: a fresh process could not measure it ({exc})"
    return size, f"in a fresh process: {how}"


def pair_room(total_bytes: int, context: int | None, memory_budget: int | None = None,
              share: float = PAIR_SHARE) -> int:
    """What the two probes' allocator peaks may add up to: `share` of the GPU less two contexts (neither in any
    allocator statistic), or `memory_budget` (--max-memory) when that is smaller."""
    room = int(share * total_bytes) - 2 * (context or 0)
    return min(room, memory_budget) if memory_budget else room


def footprint(peak_memory_bytes: int | None, memory: dict[str, Any]) -> int:
    """What a probe's process held on the GPU besides its context: the allocator's reserved peak (freed blocks
    stay reserved), at least the allocated peak."""
    return max(peak_memory_bytes or 0, memory.get("cuda_max_reserved_bytes") or 0)


def judged_peak(peak_memory_bytes: int | None, memory: dict[str, Any], extra: dict[str, Any],
                longest: dict[str, Any] | None) -> tuple[float, str | None]:
    """(the peak that decides whether a batch fits, how it was carried to the longest item or None).

    The `footprint` (on a CPU the process's peak, as no allocator statistic is recorded there), scaled to the
    dataset's longest item (`longest`: probe.evidence.longest_item) where the probe's batches never held an input
    that long (`extra.largest_input`: the largest per-sample input of its measured steps, padded as the collator
    pads). The scale is linear in the input's size: an upper-ish guess for activations, which grow about linearly
    with a sequence's length, while it over-states the fixed part (weights, optimizer state) and under-states an
    attention that materialises its score matrix (quadratic in the length; fused SDPA kernels keep it linear)."""
    peak = footprint(peak_memory_bytes, memory)
    seen, size = extra.get("largest_input"), (longest or {}).get("size")
    if not (peak and seen and size and size > seen):
        return float(peak), None
    return peak * size / seen, (f"scaled {size / seen:.2f}x from the longest input its steps held ({seen:,} "
                                f"elements a sample) to the dataset's longest item ({size:,})")


if __name__ == "__main__":  # in_fresh_process: one line of JSON, [bytes or null, how]
    print(json.dumps(context_bytes(sys.argv[1] if len(sys.argv) > 1 else "cuda")))
