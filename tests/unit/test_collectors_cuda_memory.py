"""Memory for a lockstep pair on one GPU, against a fake NVML and a fake torch: two contexts and reserved peaks."""

from __future__ import annotations

from types import SimpleNamespace

from tune_advisor.collectors import cuda_memory

GiB = 2**30
MiB = 2**20


class FakeCuda:
    def __init__(self, nvml, context_bytes, initialized=False):
        self.nvml, self.context_bytes, self.initialized = nvml, context_bytes, initialized

    def is_initialized(self):
        return self.initialized

    def init(self):
        if not self.initialized:
            self.nvml.used += self.context_bytes  # the driver maps the context as the process initialises CUDA
            self.initialized = True


class FakeTorch:
    def __init__(self, nvml, context_bytes, initialized=False):
        self.cuda = FakeCuda(nvml, context_bytes, initialized)

    def zeros(self, n, device):
        self.cuda.nvml.used += 2 * MiB  # the allocator's first block


class FakeNvml:
    def __init__(self, used):
        self.used = used

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.used, total=80 * GiB)


def test_a_context_is_measured_as_the_memory_the_gpu_gained_when_this_process_started_cuda():
    nvml = FakeNvml(used=3 * GiB)  # another tenant holds 3 GiB already
    size, how = cuda_memory.context_bytes("cuda:0", nvml=nvml, torch=FakeTorch(nvml, 500 * MiB))
    assert size == 502 * MiB and "NVML" in how  # the context and the allocator's first block, not the tenant's


def test_a_context_created_before_is_this_process_s_memory_in_nvml_s_process_list(monkeypatch):
    import os

    nvml = FakeNvml(used=3 * GiB)
    nvml.processes = [SimpleNamespace(pid=1, usedGpuMemory=3 * GiB),
                      SimpleNamespace(pid=os.getpid(), usedGpuMemory=480 * MiB)]
    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: nvml.processes, raising=False)
    torch = FakeTorch(nvml, 500 * MiB, initialized=True)
    torch.cuda.get_device_properties = lambda device: (_ for _ in ()).throw(RuntimeError("no CUDA in the test"))
    size, how = cuda_memory.context_bytes("cuda", nvml=nvml, torch=torch)
    assert size == 480 * MiB and "this process" in how
    # AND a process NVML does not list (another PID namespace; an H200 in a Firecracker VM listed none) has it
    # measured by a fresh process, which has no context yet, and says so
    nvml.processes = nvml.processes[:1]
    asked = []

    def fresh(device):
        asked.append(device)
        return 510 * MiB, "NVML used memory before and after this process's CUDA context"

    size, how = cuda_memory.context_bytes("cuda", nvml=nvml, torch=torch, fresh=fresh)
    assert size == 510 * MiB and asked == ["cuda"] and "no memory for this process" in how
    # AND a fresh process that cannot measure it leaves it unmeasured, with its reason
    size, how = cuda_memory.context_bytes("cuda", nvml=nvml, torch=torch,
                                          fresh=lambda device: (None, "not measured: NVML did not start"))
    assert size is None and how.startswith("not measured: NVML did not start")


def test_the_fresh_process_runs_this_module_and_hands_back_its_measure():
    # a real child process: on a machine without a GPU it reports why it measured nothing, on one with a GPU the size
    size, how = cuda_memory.in_fresh_process("cuda")
    assert how.startswith("in a fresh process: ") and "could not measure" not in how
    assert (size is None and "not measured" in how) or size > 0


def test_a_pair_that_fits_by_allocated_peaks_does_not_fit_with_two_contexts_and_reserved_blocks():
    # GIVEN an 80 GiB GPU, 500 MiB contexts, and two probes that each allocated 35 GiB but reserved 36.5 GiB
    room = cuda_memory.pair_room(80 * GiB, 500 * MiB)
    allocated, reserved = 35 * GiB, int(36.5 * GiB)
    # THEN the old check (allocated peaks against 90% of the GPU) let them pair, and the new one does not
    assert 2 * allocated <= 0.9 * 80 * GiB
    assert 2 * cuda_memory.footprint(allocated, {"cuda_max_reserved_bytes": reserved}) > room
    # AND a smaller --max-memory still caps the room
    assert cuda_memory.pair_room(80 * GiB, 500 * MiB, memory_budget=10 * GiB) == 10 * GiB


def test_without_a_measured_context_the_room_is_the_share_and_the_footprint_at_least_the_allocated_peak():
    assert cuda_memory.pair_room(80 * GiB, None) == int(0.9 * 80 * GiB)
    assert cuda_memory.footprint(5 * GiB, {}) == 5 * GiB
