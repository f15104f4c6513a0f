"""The NVML sampler against a fake pynvml: sampling, summary, throttle reasons, failures, absence."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import pytest

from tune_advisor.collectors import nvml


class NVMLError(Exception):
    pass


class FakeNvml:
    """The slice of pynvml the sampler uses. `fail_after`: raise on the n-th utilisation read (GPU lost)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError

    def __init__(self, reasons=0x0, fail_after=None, init_error=None, unsupported=(), gpus=2, uuids=(), bus_ids=()):
        self.reasons, self.fail_after, self.init_error = reasons, fail_after, init_error
        self.uuids, self.bus_ids = set(uuids), set(bus_ids)
        self.unsupported, self.gpus = set(unsupported), gpus
        self.reads = 0
        self.handles: list = []
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(index)
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise NVMLError("Not Found")
        self.handles.append(uuid)
        return ("handle", uuid)

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id):
        if bus_id not in self.bus_ids:
            raise NVMLError("Not Found")
        self.handles.append(bus_id)
        return ("handle", bus_id)

    def _check(self, what):
        if what in self.unsupported:
            raise NVMLError("Not Supported")

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=50 + self.reads % 2 * 40, memory=10)  # alternates 90, 50

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2**30 * (1 + self.reads % 3), total=16 * 2**30, free=0)

    def nvmlDeviceGetPowerUsage(self, handle):
        self._check("power")
        return 250_000  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1095

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1410

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 80 + self.reads % 5

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetName(self, handle):
        return "Fake GPU"


def run_sampler(fake, seconds=0.25, device="cuda", interval_s=0.01):
    sampler = nvml.NvmlSampler(device, interval_s=interval_s, nvml=fake)
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    return sampler


def test_throttle_reasons_are_decoded_into_lower_case_names():
    assert nvml.decode_throttle_reasons(0) == []
    assert nvml.decode_throttle_reasons(0x1) == ["gpu_idle"]
    # sw_power_cap | sw_thermal_slowdown | hw_slowdown, plus a bit a newer driver may add
    assert nvml.decode_throttle_reasons(0x4 | 0x20 | 0x8 | 0x10000) == [
        "hw_slowdown", "sw_power_cap", "sw_thermal_slowdown", "unknown_0x10000"]


def test_sampler_summarises_what_nvml_reported():
    # GIVEN a GPU thermally throttled at 1095 of 1410 MHz
    fake = FakeNvml(reasons=0x20)
    # WHEN the sampler runs for a quarter of a second at 100 Hz
    sampler = run_sampler(fake)
    gpu = sampler.result()
    # THEN the summary carries the keys the rules read, with the fake's values
    assert sampler.status == "ok" and gpu["samples"] >= 5
    assert gpu["throttle_reasons"] == ["sw_thermal_slowdown"]
    assert gpu["throttle_reason_frac"] == {"sw_thermal_slowdown": 1.0}
    assert gpu["sm_clock_mhz"] == 1095 and gpu["max_sm_clock_mhz"] == 1410
    assert 50 <= gpu["util_mean"] <= 90 and gpu["util_p50"] in (50, 70, 90)
    assert gpu["memory_used_max_bytes"] in (2 * 2**30, 3 * 2**30) and gpu["memory_total_bytes"] == 16 * 2**30
    assert gpu["power_mean_w"] == 250.0 and 80 <= gpu["temperature_max_c"] <= 84
    timeline = gpu["timeline"]
    assert set(timeline) == {"t_s", "util", "mem_gib", "power_w", "sm_clock_mhz"}
    assert all(len(v) == gpu["samples"] for v in timeline.values())
    assert timeline["t_s"] == sorted(timeline["t_s"])
    assert fake.shutdowns == 1
    json.dumps(gpu, allow_nan=False)  # goes into results.json as is


def test_an_nvml_error_mid_run_keeps_the_samples_taken_before_it():
    fake = FakeNvml(fail_after=3)
    sampler = run_sampler(fake, seconds=0.2)
    assert sampler.status == "error: NVML failed after 3 samples (GPU is lost)"
    assert sampler.result()["samples"] == 3
    assert fake.shutdowns == 1


def test_a_metric_the_gpu_does_not_support_is_left_out():
    sampler = run_sampler(FakeNvml(unsupported={"power"}), seconds=0.1)
    gpu = sampler.result()
    assert sampler.status == "ok" and gpu["power_mean_w"] is None and gpu["util_mean"] is not None
    assert "power_w" not in gpu["timeline"]


def test_no_driver_means_no_gpu_summary_and_says_why():
    sampler = run_sampler(FakeNvml(init_error="NVML Shared Library Not Found"), seconds=0)
    assert sampler.status == "absent: no NVIDIA driver (NVML Shared Library Not Found)"
    assert sampler.result() is None


def test_a_cpu_probe_does_not_start_nvml():
    fake = FakeNvml()
    sampler = run_sampler(fake, seconds=0, device="cpu")
    assert sampler.status == "absent: the probe runs on the CPU" and sampler.result() is None
    assert fake.handles == []


def test_the_fake_module_is_found_through_sys_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(reasons=0x1))
    sampler = nvml.NvmlSampler("cuda", interval_s=0.01)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    assert sampler.result()["throttle_reasons"] == ["gpu_idle"]


def test_a_missing_pynvml_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sampler = nvml.NvmlSampler("cuda")
    sampler.start()
    sampler.stop()
    assert sampler.status.startswith("absent: nvidia-ml-py")


@pytest.mark.parametrize("visible, device, expected", [
    ("", "cuda", 0), ("", "cuda:1", 1), ("2,3", "cuda:1", 3), ("GPU-abc", "cuda", "GPU-abc")])
def test_without_cuda_identity_the_handle_follows_cuda_visible_devices(monkeypatch, visible, device, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    fake = FakeNvml(uuids={"GPU-abc"})
    _, how = nvml.device_handle(fake, device, identity={})
    assert fake.handles == [expected]
    assert ("assumed" in how) == (not str(expected).startswith("GPU-"))


def test_the_gpu_is_matched_by_uuid_whatever_the_numbering(monkeypatch):
    # GIVEN two GPUs where CUDA's fastest-first cuda:0 is NVML's index 1, and CUDA_VISIBLE_DEVICES as indices
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    fake = FakeNvml(uuids={"GPU-1111", "GPU-2222"})
    props = SimpleNamespace(uuid="2222", pci_bus_id=0x3B, pci_domain_id=0, pci_device_id=0)
    # WHEN the handle of cuda:0 is found from what CUDA says about that device
    handle, how = nvml.device_handle(fake, "cuda:0", identity=nvml.cuda_identity("cuda:0", props))
    # THEN it is the GPU with that UUID, not NVML's index 0
    assert handle == ("handle", "GPU-2222") and how == "uuid GPU-2222" and fake.handles == ["GPU-2222"]


def test_a_mig_instance_is_matched_by_its_mig_uuid_and_a_gpu_without_uuid_by_pci_bus_id():
    fake = FakeNvml(uuids={"MIG-abcd"}, bus_ids={"00000000:3B:00.0"})
    assert nvml.device_handle(fake, "cuda", identity={"uuid": "abcd"})[1] == "uuid MIG-abcd"
    props = SimpleNamespace(uuid=None, pci_bus_id=0x3B, pci_domain_id=0, pci_device_id=0)
    identity = nvml.cuda_identity("cuda", props)
    assert identity == {"pci_bus_id": "00000000:3B:00.0"}
    assert nvml.device_handle(fake, "cuda", identity=identity) == (("handle", "00000000:3B:00.0"),
                                                                    "pci bus id 00000000:3B:00.0")


def test_the_gpu_summary_says_how_its_device_was_matched():
    fake = FakeNvml(uuids={"GPU-2222"})
    sampler = nvml.NvmlSampler("cuda", interval_s=0.01, nvml=fake, identity={"uuid": "2222"})
    sampler.start()
    time.sleep(0.1)
    sampler.stop()
    assert sampler.result()["device_matched_by"] == "uuid GPU-2222"


def test_the_timeline_is_downsampled_to_at_most_200_points():
    samples = [{"t_s": i / 15, "util": i % 100, "mem_used_bytes": 2**30, "power_w": 100.0, "sm_clock_mhz": 1400,
                "temperature_c": 60, "reasons": 0} for i in range(1000)]
    gpu = nvml.summarise(samples, 1410)
    assert len(gpu["timeline"]["t_s"]) == 200 and gpu["timeline"]["mem_gib"][0] == 1.0
    assert gpu["timeline"]["util"][0] == 2.0  # the mean of the first bucket, 0..4
    assert gpu["throttle_reasons"] == [] and gpu["samples"] == 1000
    assert nvml.summarise([]) is None


def test_nvml_status_lists_driver_and_gpus():
    info = nvml.nvml_status(FakeNvml(gpus=2))
    assert info["status"] == "ok" and info["driver"] == "550.54.15" and info["cuda_driver"] == "12.4"
    assert [g["name"] for g in info["gpus"]] == ["Fake GPU", "Fake GPU"]


def test_env_command_reports_nvml_and_cpu(cli, tmp_path, monkeypatch):
    # GIVEN no peaks cached: `env` only reads the cache unless asked to measure
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = cli("env", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["device"] == "cpu" and info["cpu_count"] >= 1 and info["torch_threads"] >= 1
    assert {"cpu_flags", "cuda_build", "cudnn", "nvml", "peaks", "fingerprint"} <= set(info)
    assert info["peaks"]["flops_per_s"] is None
    table = cli("env", "--device", "cpu")
    assert table.exit_code == 0 and "NVML" in table.output and "CPU flags" in table.output
