"""Energy beside speed: the GPU's energy counter over the measured window (a fake NVML whose counter advances with
fake time), the figures per item, the verdict's clause and every report showing it."""

from __future__ import annotations

import copy
import io
from html import unescape
import sys

import pytest
from rich.console import Console

from tune_advisor import record
from tune_advisor.collectors import nvml
from tune_advisor.consistency import contradictions, shown_contradictions
from tune_advisor.distributed import merge
from tune_advisor.planner import figures
from tune_advisor.probe import measure
from tune_advisor.probe.result import ProbeResult
from tune_advisor.render import html, markdown, terminal, view

from ..conftest import golden
from ..fakes import FakeEnergyNvml


@pytest.fixture
def gpu(monkeypatch):
    """Install a fake pynvml; returns a function making one (FakeEnergyNvml's arguments)."""

    def install(**kwargs) -> FakeEnergyNvml:
        fake = FakeEnergyNvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    monkeypatch.setattr(measure, "memory_peaks", lambda device: {})  # no CUDA allocator in a CPU build
    return install


def measured(fake: FakeEnergyNvml | None, seconds: float = 2.0, items: list[float] = (64.0,) * 10,
             lockstep: dict | None = None, device: str = "cuda") -> dict:
    """A result as `measure.record` writes it after a window over which the fake GPU ran for `seconds`."""
    window = measure.Window(device, lambda: (0.0, 0.0))
    window.open()
    if fake is not None:
        fake.advance(seconds)
    window.close()
    out = {"extra": {}, "raw": {"step_s": [0.2] * len(items), "items": list(items)}}
    spent = measure.Measurement(window.spent, 0, 1, None, [], 1)
    measure.record(out, spent, window, measure.WarmUp(0, 0, 2, None), "off", lockstep)
    return out


# --- the probe: the counter over the window -------------------------------------------------------------------------


def test_the_window_reads_the_energy_counter_where_its_clock_opens_and_closes(gpu):
    # GIVEN a GPU drawing 250 W whose counter stands at 7,000 J since the driver loaded
    fake = gpu(watts=250.0)
    # WHEN a window of 640 samples runs while the GPU's time moves 2 s
    energy = measured(fake, seconds=2.0)["gpu"]["energy"]
    # THEN the counter was read twice (open, close), and its rise is the window's energy: 500 J, 0.78 J per sample
    assert fake.energy_reads == 2
    assert energy["status"] == "ok" and energy["joules"] == pytest.approx(500.0)
    assert energy["items"] == 640 and energy["joules_per_item"] == pytest.approx(500.0 / 640)
    assert energy["window_s"] > 0
    record.Gpu.model_validate({"energy": energy})  # typed as results.json says


@pytest.mark.parametrize("kind, why", [
    ("unsupported", "absent: this GPU keeps no energy counter (Not Supported: Volta and later do)"),
    ("missing", "absent: this pynvml has no nvmlDeviceGetTotalEnergyConsumption"),
    ("lost", "absent: NVML's energy counter could not be read (GPU is lost)"),
    ("reset", "absent: the energy counter went back over the measured window (7000000 to 500000 mJ: the driver "
              "reloaded or the counter wrapped)"),
])
def test_a_counter_that_is_missing_fails_or_goes_back_leaves_energy_absent_with_the_reason(gpu, kind, why):
    energy = measured(gpu(energy=kind))["gpu"]["energy"]
    assert energy["status"] == why
    assert energy["joules"] is None and energy["joules_per_item"] is None  # never a made-up figure


def test_a_counter_that_does_not_move_over_the_window_is_absent_not_zero(gpu):
    energy = measured(gpu(energy="stuck"))["gpu"]["energy"]
    assert energy["status"].startswith("absent: the energy counter did not move over the measured window (")
    assert energy["joules"] is None


def test_a_lockstep_side_has_no_energy_figure_since_the_counter_ran_through_its_partners_turns(gpu):
    energy = measured(gpu(), lockstep={"steps": 10})["gpu"]["energy"]
    assert energy["status"] == "absent: measured in lockstep, where the GPU's counter also ran through the " \
                               "partner's turns"
    assert energy["joules"] is None


def test_a_window_without_items_or_without_a_second_read_has_no_figure():
    assert nvml.window_energy(1000, 2000, 0, 1.0)["status"] == "absent: the measured window counted no items"
    assert nvml.window_energy(1000, None, 64, 1.0)["status"] == \
        "absent: the energy counter was not read at both ends of the measured window"
    assert nvml.window_energy(1000, 3000, 8, 1.0)["joules_per_item"] == pytest.approx(0.25)


def test_a_cpu_probe_reads_no_counter_and_records_no_gpu(gpu):
    fake = gpu()
    out = measured(fake, device="cpu")
    assert out["gpu"] is None and fake.energy_reads == 0


def test_a_sampler_never_started_gives_the_reason_it_has_no_device():
    sampler = nvml.NvmlSampler("cpu")
    sampler.start()
    sampler.mark_energy()
    sampler.mark_energy()
    assert sampler.energy(64, 1.0)["status"] == "absent: no NVML device to read (absent: the probe runs on the CPU)"


# --- DDP: the job's energy is its ranks' --------------------------------------------------------------------------


def rank(n: int, energy: dict | None, gpu_id: str | None = None) -> dict:
    return {"rank": {"rank": n, "local_rank": n, "host": "h", "device": f"cuda:{n}"}, "status": "ok",
            "raw": {"step_s": [0.1, 0.1], "data_wait_s": [0.0, 0.0], "h2d_s": [0.0, 0.0], "items": [32, 32],
                    "loss": [1.0, 1.0]},
            "gpu": {"util_mean": 90.0, "device_matched_by": gpu_id or f"uuid GPU-{n}",
                    **({"energy": energy} if energy is not None else {})}}


def test_a_ddp_jobs_energy_sums_its_ranks_gpus_and_each_rank_keeps_its_own():
    ranks = [rank(0, nvml.window_energy(0, 30_000, 64, 1.0)), rank(1, nvml.window_energy(5, 50_005, 64, 1.0))]
    gpu = merge.merge(ranks)["gpu"]
    assert gpu["energy"]["status"] == "ok" and gpu["energy"]["joules"] == pytest.approx(80.0)
    assert gpu["energy"]["joules_per_item"] == pytest.approx(80.0 / 128)  # per item of the job's items
    assert [r["energy"]["joules"] for r in gpu["ranks"]] == [pytest.approx(30.0), pytest.approx(50.0)]


def test_a_ddp_job_with_a_rank_without_energy_or_two_ranks_on_one_gpu_has_none():
    absent = nvml.window_energy(None, None, 64, 1.0, why="absent: this GPU keeps no energy counter (Not Supported)")
    ranks = [rank(0, nvml.window_energy(0, 30_000, 64, 1.0)), rank(1, absent)]
    assert merge.merge(ranks)["gpu"]["energy"]["status"] == \
        "absent: rank 1: this GPU keeps no energy counter (Not Supported)"
    shared = [rank(n, nvml.window_energy(0, 30_000, 64, 1.0), gpu_id="index 0") for n in (0, 1)]
    energy = merge.merge(shared)["gpu"]["energy"]
    assert energy["status"].startswith("absent: two ranks read one GPU's energy counter") and energy["joules"] is None
    assert "energy" not in merge.merge([rank(0, None), rank(1, None)])["gpu"]


# --- the figures: median per item of each side, and the ratio ---------------------------------------------------


BASE, REC = {"batch_size": 32}, {"batch_size": 128}


def probe(probe_id: str, settings: dict, joules_per_item: float | None, partner: str | None = None) -> ProbeResult:
    energy = nvml.window_energy(0, round(joules_per_item * 640_000), 640, 2.0) if joules_per_item else \
        nvml.window_energy(None, None, 640, 2.0, why="absent: this GPU keeps no energy counter (Not Supported)")
    return ProbeResult.from_dict({
        "id": probe_id, "settings": settings, "status": "ok", "step_time_s": {"samples": [0.1] * 10},
        "raw": {"items": [64.0] * 10}, "gpu": {"util_mean": 90.0, "energy": energy},
        "extra": {"lockstep": {"partner": partner}} if partner else {}})


def test_each_sides_energy_is_the_median_of_its_runs_alone_and_the_change_their_ratio():
    probes = [probe("p001", BASE, 0.300), probe("p002", BASE, 0.330), probe("p003", BASE, 0.312),
              probe("p004", REC, 0.253), probe("p005", REC, None),  # a run whose GPU read no counter
              probe("p006", REC, 0.900, partner="p007")]  # beside a partner: not its own energy (never ok anyway)
    got = figures.energy(probes, BASE, REC, "samples/s")
    assert got["unit"] == "J/sample"
    assert got["baseline"] == {"median": pytest.approx(0.312), "runs": ["p001", "p002", "p003"]}
    assert got["recommended"] == {"median": pytest.approx(0.253), "runs": ["p004"]}
    assert got["ratio"] == pytest.approx(0.253 / 0.312)
    record.Figures.model_validate({"energy": got})


def test_energy_figures_for_one_side_only_have_no_ratio_and_none_without_any():
    one = figures.energy([probe("p001", BASE, 0.3), probe("p002", REC, None)], BASE, REC, "tokens/s")
    assert one["unit"] == "J/token" and one["recommended"] is None and one["ratio"] is None
    assert figures.energy([probe("p001", BASE, None)], BASE, REC) is None


# --- the verdict and the reports ----------------------------------------------------------------------------------


def with_energy(base_j: float | None = 0.0212, rec_j: float | None = 0.0095) -> dict:
    """The H200 run's document with energy read by its runs alone (p001, p030: baseline; p029: recommended), and
    the figures worked out from them as an analysis does."""
    doc = copy.deepcopy(golden("gpu/h200_cnn"))
    for p in doc["probes"]:
        side = base_j if p["id"] in ("p001", "p030") else rec_j if p["id"] == "p029" else None
        if side is not None and p.get("gpu"):
            items = sum(p["raw"]["items"])
            p["gpu"]["energy"] = nvml.window_energy(0, round(side * items * 1000), items, 1.0)
    probes = [ProbeResult.from_dict(p) for p in doc["probes"]]
    energy = figures.energy(probes, doc["baseline"]["settings"], doc["recommended"]["settings"])
    if energy is not None:
        doc["figures"]["energy"] = energy
    return doc


def terminal_text(doc: dict, verbose: bool = False) -> str:
    console = Console(file=io.StringIO(), width=400, color_system=None)
    terminal.document_summary(doc, console, verbose=verbose)
    return console.file.getvalue()


def test_the_verdict_says_what_the_change_does_to_energy_as_well_as_time():
    r = view.build(with_energy())
    clause = "0.45x the energy per sample (21.2 → 9.5 mJ)"
    assert r.energy is not None and r.energy.clause == clause
    assert f"faster and {clause}; the speedup confirmed by measuring" in r.verdict
    assert r.headline.endswith(f"x faster (95% CI 2.57–3.11) and {clause}.")
    assert ("energy per sample", "21.2 → 9.5 mJ") in r.epoch


@pytest.mark.parametrize("base_j, rec_j", [(0.0212, None), (None, 0.0095), (None, None)])
def test_the_verdict_names_no_energy_unless_both_sides_were_measured(base_j, rec_j):
    r = view.build(with_energy(base_j, rec_j))
    assert r.energy is None and "energy" not in r.verdict and "energy" not in r.headline
    assert not any("energy" in what for what, _ in r.epoch)


def test_a_recommendation_that_keeps_the_baseline_names_no_energy():
    doc = with_energy()
    doc["recommended"] = copy.deepcopy(doc["baseline"])
    doc["speedup"] = None
    r = view.build(doc)
    assert r.energy is None and "energy" not in r.verdict


def test_every_report_shows_the_energy_clause_and_one_figure_for_it():
    doc = with_energy()
    record.parse(doc)  # a valid results.json
    clause = "0.45x the energy per sample (21.2 → 9.5 mJ)"
    page, md, text = html.render(doc), markdown.render(doc), terminal_text(doc)
    assert clause in page and clause in md and clause in text
    assert "energy per sample: 21.2 → 9.5 mJ" in md and "energy per sample: 21.2 → 9.5 mJ" in text
    assert 'id="energy-card"' in page and page.count('data-energy="0.0212 0.0095"') == 3  # verdict, card, how
    assert shown_contradictions(page) == []
    # behind "how this was measured": which runs, and that the board's energy includes other processes
    how = "the median of the baseline's 2 runs (p001, p030) and of the recommendation's 1 run (p029)"
    assert how in unescape(page) and how in md and how in terminal_text(doc, verbose=True)
    assert not [c for c in contradictions(doc) if "energy" in c]


def test_a_report_showing_two_energy_figures_and_figures_off_their_ratio_are_contradictions():
    page = '<p data-energy="0.0212 0.0095">…</p><div data-energy="0.0212 0.0101">…</div>'
    assert shown_contradictions(page) == [
        "the energy per item is shown as 0.0212 0.0095 and 0.0212 0.0101 J (baseline, recommended)"]
    doc = with_energy()
    doc["figures"]["energy"]["ratio"] = 0.6
    assert "the energy figures read 0.45x the baseline's energy per item, their ratio reads 0.60x" in \
        contradictions(doc)
