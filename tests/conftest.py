"""Shared helpers: paths, a fast measurement protocol for real child probes, a CLI runner, results documents for
the renderers' tests, and the processes a test run started."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from tune_advisor import hardware, results
from tune_advisor.planner import compile_cost
from tune_advisor.probe.spec import Protocol

from . import fakes
from .short_cli import shorten_confirmation

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
BAD = FIXTURES / "bad"
WORKLOADS = Path(__file__).resolve().parent / "workloads"
GOLDEN = ROOT / "tests" / "golden"

# Real child processes, measured briefly: these tests check behaviour, not speed.
FAST = Protocol(warmup_steps=1, min_steps=3, min_time_s=0.1, max_steps=30, max_time_s=2.0)


@pytest.fixture(autouse=True)
def own_compile_record(tmp_path_factory, monkeypatch) -> Path:
    """Each test reads and writes a record of compile times of its own (planner/compile_cost.py), not the machine's:
    what one test's probes compiled must not change what another's plan affords."""
    path = tmp_path_factory.mktemp("compile-record") / compile_cost.RECORD
    monkeypatch.setattr(compile_cost, "record_path", lambda: path)
    return path


@pytest.fixture
def cli():
    from tune_advisor.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke


@pytest.fixture
def short_confirmation(monkeypatch):
    """The confirmation as short as its rules allow, for analyses in this process (`short_cli.shorten_confirmation`
    says why); a CLI run as a subprocess keeps the defaults unless it runs through tests/short_cli.py."""
    shorten_confirmation(monkeypatch.setattr)


# --- CPU kinds: the native-type detection forced, in this process and every child it starts --------------------

# The kinds this project's users and machines have; the names are what a test id shows.
CPU_KINDS = {"avx2-only": fakes.ZEN3_CPUINFO, "avx512_bf16": fakes.AVX512_BF16_CPUINFO, "amx": fakes.AMX_CPUINFO}


def pytest_report_header(config) -> list[str]:
    """The CPU this run's native-type decisions read, first in every log: what a [this-cpu] test id ran as."""
    from tune_advisor import environment

    bf16 = hardware.native_types("cpu").bf16
    return [environment.machine_line(), f"bf16 on this CPU: {bf16.reason}; tests with [avx2-only] in their id run "
                                        "as on an AVX2-only CPU (bf16 only emulated)"]


@pytest.fixture
def force_cpu(tmp_path_factory, monkeypatch):
    """force_cpu(kind): from here on this test's process and its probe children read CPU_KINDS[kind] as their
    cpuinfo (hardware.CPUINFO_ENV), so the product decides as on that CPU; torch still runs on this one."""

    def force(kind: str) -> hardware.NativeTypes:
        path = tmp_path_factory.mktemp("cpuinfo") / f"{kind}.cpuinfo"
        path.write_text(CPU_KINDS[kind])
        monkeypatch.setenv(hardware.CPUINFO_ENV, str(path))
        return hardware.native_types("cpu")

    return force


@pytest.fixture(params=["this-cpu", "avx2-only"])
def each_cpu_kind(request, force_cpu) -> hardware.NativeTypes:
    """Runs a test twice: with this machine's own detection, and as on an AVX2-only CPU (bf16 only emulated), so a
    suite green on a CPU with native bf16 is green on one without. Returns the verdict the test runs under; a test
    asserts what the product does under it (bf16 tried where native, "not applicable" where not)."""
    return hardware.native_types("cpu") if request.param == "this-cpu" else force_cpu(request.param)


@pytest.fixture
def native_bf16(force_cpu) -> hardware.NativeTypes:
    """The bf16 path on any CPU: the detection declares bf16 native (a CPU with AMX). On a CPU that only emulates
    bf16 torch still runs it, slower: tests using this check what is applied and recorded, not speed."""
    return force_cpu("amx")


# --- results documents: real runs, runs with findings, hostile and nearly empty ones ------------------------------

HOSTILE = "</script><img src=x onerror=alert(1)> [/] [bold red]x `|` **y** {{ 7*7 }}"


def golden(name: str = "cnn") -> dict:
    return results.read(GOLDEN / f"{name}.results.json")


def sample_findings() -> list[dict]:
    """Findings shaped like the rules engine's FINDING (SPEC §7): one measured, one estimated."""
    return [
        {"code": "TA401", "name": "fp32-on-bf16-capable-cpu", "severity": "high",
         "message": "Training runs in float32 although this CPU has AMX bf16: bf16 autocast ran 1.82x faster (p002).",
         "evidence": {"baseline_samples_per_s": 225.67, "bf16_samples_per_s": 411.65, "cpu_flags": ["amx_bf16"]},
         "fix": {"settings": {"amp": "bf16"},
                 "snippet": "with torch.autocast(device_type='cpu', dtype=torch.bfloat16):\n"
                            "    loss = compute_loss(model, batch)"},
         "gain": {"measured": True, "speedup": {"median": 1.82, "ci_low": 1.77, "ci_high": 1.88},
                  "time_saved_frac": 0.45},
         "probes": ["p001", "p002"]},
        {"code": "TA301", "name": "batch-too-small-for-memory", "severity": "low",
         "message": "Peak memory is 515 MiB of 20 GiB: a larger batch fits.",
         "evidence": {"peak_memory_bytes": 539734016},
         "fix": {"settings": {"batch_size": 64}, "snippet": ""},
         "gain": {"measured": False, "speedup": 1.19, "time_saved_frac": 0.16}, "probes": ["p007"]},
    ]


def with_findings() -> dict:
    doc = golden("cnn")
    doc["findings"] = sample_findings()
    return doc


def hostile_document() -> dict:
    """The cnn run with attacker-controlled text in every place a user's file or code can put text."""
    doc = golden("cnn")
    doc["workload"].update(model_class=HOSTILE, path=f"models/{HOSTILE}.py")
    doc["environment"]["device_name"] = HOSTILE
    doc["command"] = ["tune-advisor", "analyze", f"{HOSTILE}.py"]
    doc["notes"] = [HOSTILE]
    doc["budget"]["unexplored"] = [HOSTILE, f"{HOSTILE}: over budget"]  # the second in the more-time line too
    failed = doc["probes"][3]
    failed.update(status="error", error=f"ValueError: {HOSTILE}", role=HOSTILE)
    for probe in [doc["recommended"], *(p for p in doc["probes"] if p["id"] in ("p012", "p017", "p019"))]:
        probe["settings"]["amp"] = HOSTILE  # a setting value
    finding = sample_findings()[0]
    finding.update(code=HOSTILE, name=HOSTILE, severity=HOSTILE, message=HOSTILE, evidence={HOSTILE: HOSTILE},
                   fix={"settings": {"amp": HOSTILE}, "snippet": HOSTILE}, probes=[HOSTILE])
    doc["findings"] = [finding]
    return doc


def minimal_documents() -> dict[str, dict]:
    """Runs that produced (almost) nothing: each renderer must say so, not crash."""
    started = results.new_document(["tune-advisor", "analyze", "m.py"], {"device": "cpu"}, {"path": "m.py"})
    failed = copy.deepcopy(started)
    base = golden("cnn")["probes"][0]
    base.update(status="error", error="RuntimeError: boom at m.py:12", step_time_s={"median": None, "iqr": None,
                                                                                  "samples": []},
                throughput={"median": None, "ci_low": None, "ci_high": None, "unit": "samples/s"})
    failed.update(baseline=base, recommended=base, probes=[base], notes=["the baseline probe failed (error)"])
    stopped = copy.deepcopy(failed)
    stopped["baseline"].update(status="stopped", error="stopped: the analysis budget (--budget) ran out 1.3 s into it")
    stopped.update(recommended=stopped["baseline"], probes=[stopped["baseline"]], notes=[
        "the baseline probe did not finish (stopped: the analysis budget (--budget) ran out 1.3 s into it)"])
    return {"started": started, "baseline_failed": failed, "baseline_stopped": stopped, "bare": {"schema_version": 1}}


# --- processes ---------------------------------------------------------------------------------------------------


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Processes started under the environment tag `tag`: the CLI, its zygote, probe children, loader workers."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("TUNE_ADVISOR_TEST_TAG") == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture
def stuck_zygotes(monkeypatch) -> list:
    """Probe zygotes whose start never ends (a stalled import of torch): each a real process that never writes its
    ready line. Returns the list of those started, to check that each was ended."""
    from tune_advisor.probe import runner

    started = []

    class Stuck(runner.Zygote):
        def __init__(self, python, env, preload=()):
            self.python, self.env, self.ready, self.forked, self.preloaded = python, env, False, False, list(preload)
            self.proc = subprocess.Popen([python, "-c", "import time; time.sleep(120)"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, bufsize=0)
            self.replies = self.proc.stdout.fileno()
            started.append(self)

    monkeypatch.setattr(runner, "Zygote", Stuck)
    return started
