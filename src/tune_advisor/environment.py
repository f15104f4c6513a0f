"""What machine a run measured: recorded in results.json, and hashed into a fingerprint for comparisons."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from typing import Any

from . import hardware


def cpu_model() -> str:
    for line in hardware.read_cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The CPU features that decide whether bf16 is fast on the CPU (x86 `flags`, Arm `Features`)."""
    for line in hardware.read_cpuinfo().splitlines():
        if line.startswith(("flags", "Features")):
            flags = set(line.split(":", 1)[1].split())
            return sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "bf16"})
    return []


def machine_line(device: str = "cpu", saved: dict[str, Any] | None = None) -> str:
    """What a benchmark prints beside its figures: the CPU model and the flags that decide bf16, and the device
    where it is not the CPU. `saved`: a results.json `environment` to describe instead of this machine."""
    if saved is not None:
        cpu, flags, device = saved.get("cpu_model"), saved.get("cpu_flags") or [], saved.get("device") or "cpu"
        name = saved.get("device_name")
    else:
        cpu, flags = cpu_model(), cpu_flags()
        name = collect(device).get("device_name") if device != "cpu" else None
    line = f"CPU: {cpu}; flags: {', '.join(flags) or 'none of note'}"
    return line if device == "cpu" else f"{line}\ndevice: {name or device}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container or `taskset` can give fewer than the
    machine has), where loader workers and the training threads share the CPU."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on macOS and Windows
        return os.cpu_count() or 1


def compile_unavailable(device_type: str) -> str | None:
    """Why torch.compile's default backend (inductor) cannot build kernels here, or None when it can.

    Inductor writes C++ for the CPU (a compiler is needed) and Triton for CUDA GPUs.
    """
    import importlib.util
    import shutil

    if device_type == "cuda":
        return None if importlib.util.find_spec("triton") else "torch.compile needs triton for CUDA (not installed)"
    compilers = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    if any(shutil.which(c) for c in compilers):
        return None
    return f"torch.compile needs a C++ compiler on the CPU ({' or '.join(compilers)} not found)"


def inductor_cache_dir() -> str:
    """Where torch.compile caches what it builds: TORCHINDUCTOR_CACHE_DIR, else inductor's default (its
    `default_cache_dir`) under this process's temporary folder. Probe children get this one (probe/runner.py), not
    one under their own scratch folder, so that one probe's compile serves the next."""
    import getpass
    import re
    import tempfile

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'."""
    import re

    import torch

    from .errors import UsageError

    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", requested):
        raise UsageError(f"--device {requested}: expected auto, cpu, cuda or cuda:N")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {requested}: torch sees no CUDA device here (torch {torch.__version__})")
    return requested


def collect(device: str) -> dict[str, Any]:
    import psutil
    import torch

    gpu = None
    device_name = cpu_model()
    native = hardware.native_types(device)
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        device_name = props.name
        # native, not torch's default is_bf16_supported(), which also counts the emulation of pre-Ampere GPUs
        gpu = {"name": props.name, "driver": _nvidia_driver(), "memory_total_bytes": props.total_memory,
               "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
               "bf16_supported": native.bf16.native}
    env = {
        "device": device.split(":")[0],
        "device_name": device_name,
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "native_types": native.to_dict(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "gpu": gpu,
    }
    if hardware.cpuinfo_forced():  # the CPU facts above were read from another CPU's cpuinfo (a test run)
        env["cpuinfo_forced"] = hardware.cpuinfo_forced()
    env["fingerprint"] = fingerprint(env)
    return env


def fingerprint(env: dict[str, Any]) -> str:
    """Stable hash of the facts that change measured speed (not of the hostname or the date)."""
    keys = ("device", "device_name", "cpu_model", "cpu_count", "torch")
    facts = {k: env.get(k) for k in keys}
    if env.get("gpu"):
        facts["gpu"] = {k: env["gpu"].get(k) for k in ("name", "driver", "memory_total_bytes")}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else version
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML absent or unusable: the driver is then simply unknown
        return None
