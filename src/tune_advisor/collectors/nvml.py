"""NVML samples of the probe's GPU during the measured steps: utilisation, memory, power, clocks, throttling; and
its energy counter read at the measured window's start and end (joules over the window, per item).

Runs as a thread inside the probe child (NVML reads the device the child uses, whatever CUDA_VISIBLE_DEVICES
says). It sleeps between samples and each NVML call releases the GIL, so the timed steps do not notice it.
Absent-safe: without pynvml, a driver or a GPU, `start()` records why and `result()` is None.

`nvml` may be any object with pynvml's functions (tests pass a fake); by default `import pynvml`
(nvidia-ml-py) is used.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from typing import Any

INTERVAL_S = 1 / 15  # 15 Hz: NVML's own utilisation counters refresh every 1/6 s to 1 s
TIMELINE_POINTS = 200

# NVML clock event ("throttle") reason bits (nvml.h nvmlClocksEventReason*), named as the rules read them.
THROTTLE_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}


def decode_throttle_reasons(mask: int) -> list[str]:
    """NVML's reason bitmask -> sorted lower-case names; unknown bits become `unknown_0x...`."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    if rest:
        names.append(f"unknown_{rest:#x}")
    return sorted(names)


def load_nvml(nvml: Any = None) -> tuple[Any, str | None]:
    """(the pynvml module, None) or (None, why it is absent)."""
    if nvml is not None:
        return nvml, None
    try:
        import pynvml
    except ImportError:
        return None, "absent: nvidia-ml-py (pynvml) is not installed"
    return pynvml, None


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.decode() if isinstance(text, bytes) else text


def init_status(nvml: Any = None) -> tuple[Any, str]:
    """Initialise NVML: (module, "ok") or (None, "absent: ...") with the reason in people's words."""
    nvml, why = load_nvml(nvml)
    if nvml is None:
        return None, why
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / NoPermission, or an OSError
        text = _error_text(exc)
        if "not found" in text.lower() or "not loaded" in text.lower():
            return None, f"absent: no NVIDIA driver ({text})"
        return None, f"absent: NVML could not start ({text})"
    return nvml, "ok"


def cuda_identity(device: str, props: Any = None) -> dict[str, str]:
    """What identifies torch device `device` whatever the numbering: {"uuid": ..., "pci_bus_id": ...} (either may
    be missing), from `torch.cuda.get_device_properties` (or `props`, as tests pass)."""
    if props is None:
        import torch  # the probe child has it loaded already; the collector module itself stays torch-free

        props = torch.cuda.get_device_properties(torch.device(device))
    found = {}
    uuid = getattr(props, "uuid", None)
    if uuid:
        found["uuid"] = str(uuid)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain, dev = getattr(props, "pci_domain_id", 0) or 0, getattr(props, "pci_device_id", 0) or 0
        found["pci_bus_id"] = f"{domain:08X}:{bus:02X}:{dev:02X}.0"  # NVML's form: domain:bus:device.function
    return found


def device_handle(nvml: Any, device: str, identity: dict[str, str] | None = None) -> tuple[Any, str]:
    """(the NVML handle of torch device `device` ("cuda", "cuda:N"), how it was matched).

    NVML numbers every GPU on the machine in PCI bus order; CUDA numbers the visible ones fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES may list indices (in CUDA's order), UUIDs or MIG ids. So
    an index means nothing across the two: the GPU is matched by its UUID (GPU-... or, for a MIG instance,
    MIG-...), else its PCI bus id, as CUDA reports them (`identity`, default `cuda_identity(device)`). Only when
    neither is known does an index decide, and the match says it was assumed.
    """
    if identity is None:
        try:
            identity = cuda_identity(device)
        except Exception:  # no CUDA in this process (tests, a broken driver): fall back to the numbering
            identity = {}
    uuid = identity.get("uuid")
    if uuid:
        names = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
        for name in names:
            try:
                return nvml.nvmlDeviceGetHandleByUUID(name), f"uuid {name}"
            except Exception:  # not this form (a MIG instance has the MIG- prefix): try the next
                continue
    bus_id = identity.get("pci_bus_id")
    if bus_id:
        by_bus = getattr(nvml, "nvmlDeviceGetHandleByPciBusId_v2", None) or nvml.nvmlDeviceGetHandleByPciBusId
        try:
            return by_bus(bus_id), f"pci bus id {bus_id}"
        except Exception:
            pass
    index = int(device.split(":")[1]) if ":" in device else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        chosen = visible[index]
        if chosen.startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(chosen), f"uuid {chosen} (CUDA_VISIBLE_DEVICES)"
        if chosen.isdigit():
            index = int(chosen)
    order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    how = f"index {index}" + ("" if order == "PCI_BUS_ID" else
                              " (assumed: CUDA gave no UUID or PCI bus id, and its order may differ from NVML's)")
    return nvml.nvmlDeviceGetHandleByIndex(index), how


def read_energy_mj(nvml: Any, handle: Any) -> tuple[int | None, str | None]:
    """The GPU's energy counter: (millijoules since the driver loaded, None), or (None, why there is none). Volta
    and later GPUs keep one; older ones raise NVMLError_NotSupported."""
    call = getattr(nvml, "nvmlDeviceGetTotalEnergyConsumption", None)
    if call is None:
        return None, "absent: this pynvml has no nvmlDeviceGetTotalEnergyConsumption"
    try:
        return int(call(handle)), None
    except Exception as exc:
        text = _error_text(exc)
        if "not supported" in text.lower():
            return None, f"absent: this GPU keeps no energy counter ({text}: Volta and later do)"
        return None, f"absent: NVML's energy counter could not be read ({text})"


def window_energy(start_mj: int | None, end_mj: int | None, items: float, seconds: float | None,
                  why: str | None = None) -> dict[str, Any]:
    """The probe's `gpu.energy`: what the GPU's energy counter rose by between the measured window's start and end
    (`start_mj`, `end_mj`), in joules and joules per item; or, with every figure null, why it is absent (`why`,
    a counter that went back or did not move)."""
    out: dict[str, Any] = {"status": "ok", "joules": None, "joules_per_item": None, "items": items,
                           "window_s": seconds}
    if why is None and (start_mj is None or end_mj is None):
        why = "absent: the energy counter was not read at both ends of the measured window"
    elif why is None and end_mj < start_mj:  # the counter only rises: the driver reloaded (or, in theory, it wrapped)
        why = (f"absent: the energy counter went back over the measured window ({start_mj} to {end_mj} mJ: the "
               "driver reloaded or the counter wrapped)")
    elif why is None and end_mj == start_mj:
        window = f"{seconds:.3g} s " if seconds is not None else ""
        why = (f"absent: the energy counter did not move over the measured window ({window}shorter than the "
               "interval at which the GPU updates it)")
    elif why is None and not items > 0:
        why = "absent: the measured window counted no items"
    if why is not None:
        return {**out, "status": why}
    joules = (end_mj - start_mj) / 1000
    return {**out, "joules": joules, "joules_per_item": joules / items}


class NvmlSampler:
    """Samples one GPU at ~15 Hz between start() and stop(); result() is the probe's `gpu` summary or None.
    `mark_energy()` reads the GPU's energy counter (the measured window calls it at its start and end) and
    `energy()` is what the counter rose by between the two."""

    def __init__(self, device: str = "cuda", interval_s: float = INTERVAL_S, nvml: Any = None,
                 identity: dict[str, str] | None = None):
        self.device, self.interval_s, self._nvml_in, self._identity = device, interval_s, nvml, identity
        self.matched_by: str | None = None  # how the NVML device was found (device_handle)
        self.status = "not started"
        self.samples: list[dict[str, Any]] = []
        self.max_sm_clock_mhz: int | None = None
        self.memory_total_bytes: int | None = None
        self._nvml = None
        self._handle = None
        self._unsupported: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self.energy_mj: list[int | None] = []  # the energy counter at each mark_energy()
        self._energy_why: str | None = None  # the first reason a read gave none

    def start(self) -> None:
        if not self.device.startswith("cuda"):
            self.status = "absent: the probe runs on the CPU"
            return
        self._nvml, self.status = init_status(self._nvml_in)
        if self._nvml is None:
            return
        try:
            self._handle, self.matched_by = device_handle(self._nvml, self.device, self._identity)
            self.max_sm_clock_mhz = self._read("max_sm_clock", lambda h: self._nvml.nvmlDeviceGetMaxClockInfo(
                h, self._nvml.NVML_CLOCK_SM))
            memory = self._read("memory_total", self._nvml.nvmlDeviceGetMemoryInfo)
            self.memory_total_bytes = getattr(memory, "total", None)
        except Exception as exc:
            self.status = f"absent: no NVML handle for {self.device} ({_error_text(exc)})"
            self._shutdown()
            return
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._shutdown()

    def _shutdown(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # nothing left to do about a failing shutdown
                pass
            self._nvml = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # the GPU fell off the bus, the driver went away: keep what we have
                self.status = f"error: NVML failed after {len(self.samples)} samples ({_error_text(exc)})"
                return
            self._stop.wait(self.interval_s)

    def mark_energy(self) -> None:
        """Read the GPU's energy counter now, from the caller's thread (NVML is thread-safe): the measured window
        calls it where it reads its clock, so energy and time cover the same steps. Before start() or after stop()
        there is no NVML to read (None, with the sampler's status as the reason)."""
        if self._nvml is None or self._handle is None:
            value, why = None, f"absent: no NVML device to read ({self.status})"
        else:
            value, why = read_energy_mj(self._nvml, self._handle)
        self.energy_mj.append(value)
        self._energy_why = self._energy_why or why

    def energy(self, items: float, seconds: float | None, why: str | None = None) -> dict[str, Any]:
        """The probe's `gpu.energy` between the first and the last mark_energy() over `items` items and `seconds`
        (`window_energy`); `why`: a reason the caller knows the figure would mislead."""
        marks = self.energy_mj
        return window_energy(marks[0] if marks else None, marks[-1] if len(marks) > 1 else None, items, seconds,
                             why or self._energy_why)

    def _read(self, name: str, call):
        """One NVML query; a metric this GPU does not support is dropped for the rest of the run."""
        if name in self._unsupported:
            return None
        try:
            return call(self._handle)
        except Exception as exc:
            if "not supported" in _error_text(exc).lower():
                self._unsupported.add(name)
                return None
            raise

    def sample(self) -> dict[str, Any]:
        nv = self._nvml
        util = self._read("util", nv.nvmlDeviceGetUtilizationRates)
        memory = self._read("memory", nv.nvmlDeviceGetMemoryInfo)
        power_mw = self._read("power", nv.nvmlDeviceGetPowerUsage)
        sm_clock = self._read("sm_clock", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        temperature = self._read("temperature", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        # Newer drivers name them "clock event reasons"; older pynvml has only the throttle-reason call.
        reasons_call = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
        reasons = self._read("reasons", reasons_call)
        return {
            "t_s": time.perf_counter() - self._t0,
            "util": getattr(util, "gpu", None),
            "mem_used_bytes": getattr(memory, "used", None),
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "sm_clock_mhz": sm_clock,
            "temperature_c": temperature,
            "reasons": reasons,
        }

    def result(self) -> dict[str, Any] | None:
        """The probe's `gpu` object (see docs/results-json.md), or None when nothing was sampled."""
        summary = summarise(self.samples, self.max_sm_clock_mhz, self.memory_total_bytes, self.interval_s)
        if summary is not None:
            summary["device_matched_by"] = self.matched_by
        return summary


def summarise(samples: list[dict[str, Any]], max_sm_clock_mhz: int | None = None,
              memory_total_bytes: int | None = None, interval_s: float = INTERVAL_S) -> dict[str, Any] | None:
    """Summary statistics and a downsampled timeline of NVML samples (stateless, so tests feed it directly)."""
    if not samples:
        return None

    def col(key):
        return [s[key] for s in samples if s.get(key) is not None]

    util, mem, power, clock, temp = (col(k) for k in ("util", "mem_used_bytes", "power_w", "sm_clock_mhz",
                                                        "temperature_c"))
    reason_counts: dict[str, int] = {}
    for s in samples:
        if s.get("reasons") is not None:
            for name in decode_throttle_reasons(int(s["reasons"])):
                reason_counts[name] = reason_counts.get(name, 0) + 1
    return {
        "samples": len(samples),
        "interval_s": interval_s,
        "util_mean": statistics.fmean(util) if util else None,
        "util_p50": statistics.median(util) if util else None,
        "memory_used_max_bytes": max(mem) if mem else None,
        "memory_total_bytes": memory_total_bytes,
        "power_mean_w": statistics.fmean(power) if power else None,
        "power_max_w": max(power) if power else None,
        "sm_clock_mhz": statistics.median(clock) if clock else None,
        "sm_clock_min_mhz": min(clock) if clock else None,
        "max_sm_clock_mhz": max_sm_clock_mhz,
        "temperature_max_c": max(temp) if temp else None,
        "throttle_reasons": sorted(reason_counts),
        "throttle_reason_frac": {k: v / len(samples) for k, v in sorted(reason_counts.items())},
        "timeline": timeline(samples),
    }


def timeline(samples: list[dict[str, Any]], points: int = TIMELINE_POINTS) -> dict[str, list]:
    """Column-wise timeline of at most `points` points: consecutive samples averaged into equal buckets."""
    buckets = [samples[len(samples) * i // points:len(samples) * (i + 1) // points] for i in range(points)] \
        if len(samples) > points else [[s] for s in samples]
    keys = {"t_s": "t_s", "util": "util", "mem_gib": "mem_used_bytes", "power_w": "power_w",
            "sm_clock_mhz": "sm_clock_mhz"}
    out: dict[str, list] = {k: [] for k in keys}
    for bucket in buckets:
        if not bucket:
            continue
        for name, key in keys.items():
            values = [s[key] for s in bucket if s.get(key) is not None]
            value = statistics.fmean(values) if values else None
            if name == "mem_gib" and value is not None:
                value /= 2**30
            out[name].append(round(value, 4) if value is not None else None)
    # A column the GPU never reported would only draw an empty chart.
    return {k: v for k, v in out.items() if k == "t_s" or any(x is not None for x in v)}


def nvml_status(nvml: Any = None) -> dict[str, Any]:
    """What `tune-advisor env` shows: NVML state, driver, CUDA driver version and the GPUs NVML lists."""
    nv, status = init_status(nvml)
    if nv is None:
        return {"status": status}
    info: dict[str, Any] = {"status": status}
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        cuda = nv.nvmlSystemGetCudaDriverVersion()
        info["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(handle)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_total_bytes": nv.nvmlDeviceGetMemoryInfo(handle).total})
        info["gpus"] = gpus
    except Exception as exc:
        info["status"] = f"error: {_error_text(exc)}"
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return info
