"""Which reduced-precision types the device computes natively, and why we think so.

A type is native when the hardware has instructions for its arithmetic. Elsewhere torch still runs it, emulated:
bf16 matmuls on an AVX2-only CPU ran 25-80x slower than float32, and oneDNN has no bf16 LSTM there. Knob
applicability (`knobs.not_applicable`), the peak calibration (`collectors.flops`) and `tune-advisor env` all
read this one verdict. Its inputs can be injected (`cpu_info`, `cuda_props`) so that tests fake any machine; in
child processes too, through TUNE_ADVISOR_CPUINFO (a cpuinfo file read instead of /proc/cpuinfo), which the test
suite uses to run the dtype-dependent tests as on an AVX2-only CPU whatever CPU it runs on.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import asdict, dataclass
from typing import Any

CPUINFO = "/proc/cpuinfo"
CPUINFO_ENV = "TUNE_ADVISOR_CPUINFO"  # another CPU's cpuinfo to read instead (inherited by every child process)
X86_BF16 = ("avx512_bf16", "amx_bf16")  # instructions that compute in bf16 (AVX-512 dot products, AMX tiles)
X86_FP16 = ("avx512_fp16", "amx_fp16")
ARM_BF16 = ("bf16",)  # FEAT_BF16 (Armv8.6; Neoverse V1/N2, Graviton 3)
ARM_FP16 = ("asimdhp", "fphp")  # half-precision SIMD and scalar arithmetic (Armv8.2)
UNKNOWN_CPU = "cannot tell whether this CPU runs {dtype} natively (no CPU flags in /proc/cpuinfo)"


@dataclass(frozen=True)
class Native:
    native: bool
    reason: str  # why the type is, or is not, native: shown to users as is


@dataclass(frozen=True)
class NativeTypes:
    bf16: Native
    fp16: Native

    def get(self, dtype: str) -> Native:
        return getattr(self, dtype)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {"bf16": asdict(self.bf16), "fp16": asdict(self.fp16)}


def cpuinfo_path() -> str:
    """Where this process reads its CPU's facts: TUNE_ADVISOR_CPUINFO where set, /proc/cpuinfo otherwise."""
    return os.environ.get(CPUINFO_ENV) or CPUINFO


def cpuinfo_forced() -> str | None:
    """The file standing in for /proc/cpuinfo, or None when the real one is read: recorded with a run."""
    return os.environ.get(CPUINFO_ENV) or None


def read_cpuinfo(path: str | None = None) -> str:
    """The text of `path` (default: cpuinfo_path()), or "" where there is none (macOS, Windows) or it cannot be
    read."""
    path = path or cpuinfo_path()
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def cpu_native_types(cpu_info: str) -> NativeTypes:
    """The verdict for a CPU from its /proc/cpuinfo text: x86 lists `flags`, Arm lists `Features`."""
    fields = _first_fields(cpu_info, ("flags", "Features"))
    if "flags" in fields:
        return NativeTypes(_x86("bf16", fields["flags"], X86_BF16), _x86("fp16", fields["flags"], X86_FP16))
    if "Features" in fields:
        return NativeTypes(_arm("bf16", fields["Features"], ARM_BF16), _arm("fp16", fields["Features"], ARM_FP16))
    return NativeTypes(Native(False, UNKNOWN_CPU.format(dtype="bf16")), Native(False, UNKNOWN_CPU.format(dtype="fp16")))


def cuda_native_types(props: Any, bf16_native: bool | None = None) -> NativeTypes:
    """The verdict for a CUDA device from its properties (`name`, `major`, `minor`, as
    torch.cuda.get_device_properties gives them); `bf16_native` overrides the compute-capability rule."""
    name = getattr(props, "name", "") or "this GPU"
    capability = f"{props.major}.{props.minor}"
    if bf16_native is None:
        bf16_native = (props.major, props.minor) >= (8, 0)
    bf16 = (Native(True, f"{name} (compute capability {capability}) has bf16 tensor cores") if bf16_native else
            Native(False, f"{name} (compute capability {capability}) has no native bf16 (it needs 8.0 or newer, "
                          "Ampere+): use fp16 with a GradScaler"))
    return NativeTypes(bf16, Native(True, f"{name} computes fp16 natively"))


def native_types(device: str, cpu_info: str | None = None, cuda_props: Any = None) -> NativeTypes:
    """The native types of `device` ("cpu", "cuda", "cuda:N"). `cpu_info` replaces /proc/cpuinfo's text ("" for a
    machine without one); `cuda_props` replaces torch.cuda.get_device_properties(device)."""
    if not device.startswith("cuda"):
        return cpu_native_types(read_cpuinfo() if cpu_info is None else cpu_info)
    if cuda_props is not None:
        return cuda_native_types(cuda_props)
    import torch  # only here: the CPU verdict and the tests need no torch

    dev = torch.device(device)
    return cuda_native_types(torch.cuda.get_device_properties(dev), _torch_bf16_native(torch, dev))


def _torch_bf16_native(torch: Any, device: Any) -> bool | None:
    """torch's own verdict, without the emulation it counts as support by default; None where this torch cannot
    say (before `including_emulation` existed, is_bf16_supported() is true on pre-Ampere GPUs too)."""
    check = torch.cuda.is_bf16_supported
    try:
        if "including_emulation" not in inspect.signature(check).parameters:
            return None
        with torch.cuda.device(device):
            return bool(check(including_emulation=False))
    except (TypeError, ValueError, RuntimeError):
        return None


def _first_fields(cpu_info: str, names: tuple[str, ...]) -> dict[str, set[str]]:
    """The first processor's `names` lines as sets of words (every core lists the same)."""
    fields: dict[str, set[str]] = {}
    for line in cpu_info.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in names and key not in fields:
            fields[key] = set(value.split())
    return fields


def _x86(dtype: str, flags: set[str], needed: tuple[str, ...]) -> Native:
    found = [f for f in needed if f in flags]
    if found:
        return Native(True, f"this CPU computes {dtype} natively ({'/'.join(found)})")
    return Native(False, f"this CPU only emulates {dtype} (no {'/'.join(needed)}): {_slower(dtype)}")


def _arm(dtype: str, features: set[str], needed: tuple[str, ...]) -> Native:
    found = [f for f in needed if f in features]
    if found:
        return Native(True, f"this Arm CPU computes {dtype} natively ({'/'.join(found)} in its Features)")
    return Native(False, f"this Arm CPU only emulates {dtype} (no {'/'.join(needed)} in its Features): "
                         f"{_slower(dtype)}")


def _slower(dtype: str) -> str:
    # measured: bf16 25-80x slower on AVX2-only Zen CPUs; fp16 6x slower on an avx512_bf16 EPYC without avx512_fp16
    return f"{dtype} matmuls run many times slower than float32"
