"""Memory headroom that holds (issue 61): a batch is judged on the allocator's reserved peak, carried to the
dataset's longest item, and must leave --memory-margin free; against a fake CUDA caching allocator."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, IterableDataset

from tune_advisor import knobs
from tune_advisor.api import AnalyzeOptions
from tune_advisor.api.options import memory_headroom, parse_margin
from tune_advisor.collectors import cuda_memory
from tune_advisor.errors import UsageError
from tune_advisor.knobs import DeviceFacts, WorkloadFacts
from tune_advisor.planner import PlanContext, Session, plan, pairing
from tune_advisor.probe import evidence
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.runner import peak_memory
from tune_advisor.rules import evaluate

from ..fakes import FakeBackend, FakeClock, FakeCudaAllocator, FakeCudaBackend
from .planning import cnn_rate, run_plan
from .test_cli_parsing import _project
from .test_rules import load, with_memory

GiB = 2**30
CUDA = DeviceFacts("cuda", "Fake GPU", tf32=True)
TEXT = WorkloadFacts(dataset_len=100_000)


def climbing(settings):
    """Throughput that keeps rising with the batch: only memory stops the ladder."""
    return 1000.0 * (1 + 0.3 * math.log2(settings["batch_size"] / 32))


LADDER = {"batch_size": [32, 64, 128, 256, 512, 1024]}  # listed: no bisection between the last that fit and the next


def gpu_plan(backend, capacity=16 * GiB, margin=0.1, workload=TEXT, baseline=32, search=LADDER):
    """An adaptive plan of the batch size alone on a GPU of `capacity`, keeping `margin` of it free."""
    session = Session(backend, None, clock=backend.clock)
    ctx = PlanContext(baseline=knobs.full_settings({"batch_size": baseline}), search=search,
                      workload=workload, device=CUDA, explore=("batch_size",),
                      memory_capacity_bytes=capacity, memory_margin_bytes=int(margin * capacity))
    return plan(ctx, session, "adaptive")


def cuda_backend(lengths, bytes_per_element, reserved=True, total=16 * GiB, weights=GiB):
    return FakeCudaBackend(climbing, total, lengths, bytes_per_element, weights_bytes=weights, reserved=reserved,
                           clock=FakeClock())


# --- the fake allocator is read as torch's ----------------------------------------------------------------------------


def test_the_fake_allocator_reserves_more_than_it_allocates_when_steps_grow_and_is_read_as_torch_is(monkeypatch):
    # GIVEN three steps whose batches are padded to ever longer sequences: the blocks cached for a shorter one
    # cannot hold a longer one's activations
    allocator = FakeCudaAllocator(16 * GiB)
    allocator.train(GiB, 64, [64, 96, 128], 2**16)
    assert allocator.max_memory_reserved() > 1.5 * allocator.max_memory_allocated()
    # and where every step asks for the same sizes, the cache serves them: reserved is what was allocated
    steady = FakeCudaAllocator(16 * GiB)
    steady.train(GiB, 64, [128, 128, 128], 2**16)
    assert steady.max_memory_reserved() == steady.max_memory_allocated() == allocator.max_memory_allocated()
    # WHEN the child records its peaks from torch.cuda's statistics (here the fake's)
    monkeypatch.setattr(evidence.torch.cuda, "max_memory_allocated", allocator.max_memory_allocated)
    monkeypatch.setattr(evidence.torch.cuda, "max_memory_reserved", allocator.max_memory_reserved)
    memory = evidence.memory_peaks("cuda")
    # THEN the probe's peak_memory_bytes is the allocated peak, and what judges a batch is the reserved one
    assert peak_memory(memory, "cuda") == allocator.max_memory_allocated()
    assert cuda_memory.footprint(peak_memory(memory, "cuda"), memory) == allocator.max_memory_reserved()


def test_the_fake_allocator_empties_its_cache_before_it_runs_out():
    allocator = FakeCudaAllocator(4 * GiB)
    allocator.train(GiB, 1, [GiB // 8, GiB // 4], 1, layers=2)  # 0.25 GiB then 0.5 GiB blocks: the cache is freed
    assert allocator.max_memory_reserved() <= 4 * GiB
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        FakeCudaAllocator(4 * GiB).train(GiB, 1, [2 * GiB], 1, layers=2)


# --- the reserved peak decides ----------------------------------------------------------------------------------------


def growing(settings):
    return [64, 96, 128]  # every probe's steps padded to ever longer sequences


def test_a_reserved_peak_beyond_the_allocated_one_changes_the_recommended_batch():
    # GIVEN a 16 GiB GPU, a 10% margin (14.4 GiB usable), and batches whose reserved peak is about twice their
    # allocated one (batch 128: 4 GiB allocated, 7.75 GiB reserved)
    judged = gpu_plan(cuda_backend(growing, 48 * 2**10))
    allocated_only = gpu_plan(cuda_backend(growing, 48 * 2**10, reserved=False))
    # THEN judged on what the allocator reserved, the line through 64 and 128 puts 256 at 14.5 GiB, inside the
    # margin, and 128 is recommended; judged on the allocated peak alone, 512 (13 GiB allocated, where the
    # allocator empties its cache to stay under 16 GiB) looks as if it left room
    assert judged.recommended.settings["batch_size"] == 128
    assert 256 not in [p.settings["batch_size"] for p in judged.probes]
    assert allocated_only.recommended.settings["batch_size"] == 512
    assert ("batch_size ladder stopped before batch_size=256: predicted peak memory 14.5 GiB of 16.0 GiB is inside "
            "the 10% (1.6 GiB) margin") in judged.notes


def test_a_batch_inside_the_margin_gives_way_to_the_next_one_down_with_a_note():
    # GIVEN an H200's 139.8 GiB, and batch 512 peaking at 131.2 GiB (more than 90% of it)
    capacity = int(139.8 * GiB)
    backend = FakeBackend(lambda s: {"rate": climbing(s), "memory": int((0.6 + s["batch_size"] * 0.255) * GiB)},
                          clock=FakeClock())
    outcome = gpu_plan(backend, capacity, baseline=256, search={"batch_size": [256, 512]})
    # THEN 512 ran, is not recommended, and the note says why and what stands in its place
    assert 512 in [c["batch_size"] for c in backend.calls]
    assert outcome.recommended.settings["batch_size"] == 256
    assert ("batch_size=512 peaked at 131.2 GiB of 139.8 GiB, inside the 10% (14.0 GiB) margin: batch_size=256 "
            "kept instead") in outcome.notes
    assert "inside the 10% (14.0 GiB) margin" in outcome.frontier["cause"]
    # and with a 5% margin it fits
    assert gpu_plan(FakeBackend(backend.rate, clock=FakeClock()), capacity, margin=0.05, baseline=256,
                    search={"batch_size": [256, 512]}).recommended.settings["batch_size"] == 512


def test_a_line_through_the_reserved_peaks_stops_the_ladder_before_a_batch_inside_the_margin():
    # GIVEN an 8 GiB GPU (7.2 GiB left by a 10% margin) and steady sizes (reserved == allocated): batch 128 peaks
    # at 4 GiB, 256 at 7 GiB
    backend = cuda_backend(lambda s: [128, 128, 128], 48 * 2**10)
    outcome = gpu_plan(backend, capacity=8 * GiB)
    # THEN 256 runs and is recommended, and 512, which the line through 128 and 256 puts at 13 GiB, never runs
    assert outcome.recommended.settings["batch_size"] == 256
    assert 512 not in [c["batch_size"] for c in backend.calls]
    assert ("batch_size ladder stopped before batch_size=512: predicted peak memory 13.0 GiB is over the 8.0 GiB of "
            "memory") in outcome.notes


# --- the longest item -------------------------------------------------------------------------------------------------


def test_a_peak_is_carried_to_the_datasets_longest_item_its_batches_never_held():
    # GIVEN probes whose batches were all padded to 64 tokens, in a dataset whose longest item has 256
    longest = WorkloadFacts(dataset_len=100_000, extra={"longest_item": {"size": 256, "index": 7, "scanned": 100_000,
                                                                        "items": 100_000, "fixed": False}})
    covered = gpu_plan(cuda_backend(lambda s: [64, 64, 64], 2**16, weights=GiB // 2))
    scaled = gpu_plan(cuda_backend(lambda s: [64, 64, 64], 2**16, weights=GiB // 2), workload=longest)
    # THEN the longest item's batch would peak 4x higher: batch 256 (4.5 GiB measured, 18 GiB carried) is dropped
    assert covered.recommended.settings["batch_size"] == 512
    assert scaled.recommended.settings["batch_size"] == 128
    (note,) = [n for n in scaled.notes if n.startswith("batch_size=256")]
    assert note == ("batch_size=256 peaked at 18.0 GiB (scaled 4.00x from the longest input its steps held (64 "
                    "elements a sample) to the dataset's longest item (256)), over the 16.0 GiB of memory: "
                    "batch_size=128 kept instead")


def test_the_report_says_whether_the_memory_judged_covers_the_longest_item():
    # GIVEN batches padded to varying lengths (at most 64), in a dataset whose longest item, of 2,000 read, has 256
    sampled = {"size": 256, "index": 7, "scanned": 2000, "items": 100_000, "fixed": False}
    varying = lambda s: [40, 64, 52]  # noqa: E731
    scaled = gpu_plan(cuda_backend(varying, 2**16, weights=GiB // 2),
                      workload=WorkloadFacts(dataset_len=100_000, extra={"longest_item": sampled}))
    assert ("the batches measured held inputs of at most 64 elements a sample, the dataset's longest item 256 (the "
            "longest of 2,000 of its 100,000 items, read at random): the peaks were scaled to it in proportion (an "
            "upper-ish guess for activations)") in scaled.notes
    # and where the longest item cannot be known (an IterableDataset), the report says the judgement does not cover it
    unknown = gpu_plan(cuda_backend(varying, 2**16, weights=GiB // 2))
    assert any("the dataset's longest item is not known" in n for n in unknown.notes)
    # and a batch that held it says so
    held = gpu_plan(cuda_backend(lambda s: [40, 256, 52], 2**14, weights=GiB // 2),
                    workload=WorkloadFacts(dataset_len=100_000, extra={"longest_item": {**sampled, "scanned": 10**5}}))
    assert "the memory judged covers the dataset's longest item, 256 elements: its batches held it" in held.notes
    # and where no probe recorded an input size (a framework's own loop), the note says the judgement cannot tell
    class Unrecorded(FakeCudaBackend):
        def _measure(self, spec, role, slowdown):
            result = super()._measure(spec, role, slowdown)
            result.extra.pop("largest_input", None)
            return result

    backend = Unrecorded(climbing, 16 * GiB, varying, 2**16, weights_bytes=GiB // 2, clock=FakeClock())
    blind = gpu_plan(backend, workload=WorkloadFacts(dataset_len=100_000, extra={"longest_item": sampled}))
    assert any(n.startswith("the dataset's longest item has 256 elements") and "recorded no input size" in n
               for n in blind.notes)


def test_a_probe_that_held_the_longest_item_is_not_scaled():
    peak, how = cuda_memory.judged_peak(GiB, {"cuda_max_reserved_bytes": 2 * GiB}, {"largest_input": 256},
                                        {"size": 256})
    assert (peak, how) == (2 * GiB, None)
    assert cuda_memory.judged_peak(GiB, {}, {}, {"size": 256}) == (GiB, None)  # nothing seen recorded: as measured
    assert cuda_memory.judged_peak(GiB, {}, {"largest_input": 64}, None) == (GiB, None)  # no longest item known


class Sequences(Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return torch.ones(self.lengths[i], dtype=torch.long), 0


def test_the_longest_item_is_found_by_scanning_the_dataset():
    lengths = [8 + (i * 37) % 90 for i in range(500)]
    found = evidence.longest_item(Sequences(lengths))
    assert found["size"] == max(lengths) and lengths[found["index"]] == max(lengths)
    assert found["scanned"] == found["items"] == 500 and not found["fixed"]


def test_a_scan_cut_short_by_its_time_says_how_much_it_read():
    ticks = iter(range(10_000))
    found = evidence.longest_item(Sequences([8 + i % 50 for i in range(1000)]), limit_s=9.5,
                                  clock=lambda: next(ticks))
    assert found["scanned"] == 10 and found["items"] == 1000


def test_fixed_size_items_end_the_scan_early_and_iterable_datasets_have_no_longest_item():
    found = evidence.longest_item(Sequences([32] * 1000))
    assert found == {"size": 32, "index": found["index"], "scanned": evidence.FIXED_AFTER, "items": 1000,
                     "fixed": True}

    class Stream(IterableDataset):
        def __iter__(self):
            yield torch.ones(3)

    assert evidence.longest_item(Stream()) is None


def test_item_sizes_read_tensors_token_lists_and_dicts():
    assert evidence.item_size((torch.zeros(3, 32, 32), 1)) == 3 * 32 * 32
    assert evidence.item_size({"input_ids": [5, 6, 7, 8], "label": 1}) == 4
    assert evidence.item_size("text") is None


def test_the_step_series_records_the_longest_padded_input_its_batches_held():
    series = evidence.StepSeries(evidence.empty_raw(), lambda batch: 1.0)
    for step, lengths in enumerate([(5, 9), (30, 12), (7, 7)]):
        batch = pad_sequence([torch.ones(n) for n in lengths], batch_first=True), torch.zeros(2)
        series.add(step, 0.0, 0.1, 0.1, 0.2, batch, 1.0, new_epoch=False)
    assert series.largest_input == 30


# --- pairs count reserved on both sides -------------------------------------------------------------------------------


def test_a_pairs_candidate_side_counts_what_its_allocator_reserved():
    backend = FakeBackend(climbing, pair_memory_bytes=10 * GiB)
    settings = knobs.full_settings({"batch_size": 64})
    reference = ProbeResult("p1", knobs.full_settings({"batch_size": 32}), Status.OK, peak_memory_bytes=2 * GiB,
                            memory={"cuda_max_reserved_bytes": 4 * GiB})
    seen = ProbeResult("p2", settings, Status.OK, peak_memory_bytes=3 * GiB,
                       memory={"cuda_max_reserved_bytes": 7 * GiB})
    peak = pairing.estimated_peak(seen, [reference, seen], settings, reference)
    assert peak == 7 * GiB and not pairing.can_pair(backend, reference, settings, peak)
    assert pairing.can_pair(backend, reference, settings, seen.peak_memory_bytes)  # allocated alone: 5 GiB fits


# --- where no capacity is known, nothing changes ----------------------------------------------------------------------


def test_a_cpu_without_a_memory_budget_has_no_margin():
    assert memory_headroom(None, 0.1, None) == (None, 0)
    assert memory_headroom(None, 0.1, {"memory_total_bytes": 80 * GiB}) == (80 * GiB, 8 * GiB)
    assert memory_headroom(8 * GiB, 0.1, {"memory_total_bytes": 80 * GiB}) == (8 * GiB, int(0.8 * GiB))
    assert memory_headroom(8 * GiB, 4 * GiB, None) == (8 * GiB, 4 * GiB)
    # and a CPU plan (no capacity in its context) recommends as before, peaks near its memory notwithstanding
    outcome, _ = run_plan(lambda s: cnn_rate(s) if isinstance(cnn_rate(s), Status) else
                          {"rate": cnn_rate(s), "memory": s["batch_size"] * 2**30})
    plain, _ = run_plan(cnn_rate)
    assert outcome.recommended.settings == plain.recommended.settings
    assert not any("margin" in n for n in outcome.notes)


# --- the option -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, margin", [("10%", 0.1), ("0.25", 0.25), (0.05, 0.05), ("4GiB", 4 * GiB),
                                          (2**30, GiB), ("0%", 0.0)])
def test_the_margin_is_a_share_or_a_size(text, margin):
    assert parse_margin(text) == margin
    assert AnalyzeOptions(memory_margin=text).memory_margin == margin


@pytest.mark.parametrize("text", ["150%", "100%", "-5%", "lots", 1.5])
def test_a_margin_of_the_whole_memory_or_nonsense_is_a_usage_error(text):
    with pytest.raises(UsageError, match=f"--memory-margin {text}: expected a share of the memory from 0% to below "
                                         r"100% \(e.g. 10%\) or a size \(e.g. 4GiB\)"):
        AnalyzeOptions(memory_margin=text)


def test_the_margin_on_the_command_line_and_in_pyproject(tmp_path, monkeypatch):
    from tune_advisor.cli.config import default_map

    cli = _project(tmp_path, monkeypatch, 'memory-margin = "150%"')
    assert default_map(tmp_path) == {"analyze": {"memory_margin": "150%"}}
    result = cli("analyze", "model.py")
    assert result.exit_code == 2 and "--memory-margin 150%: expected" in result.output
    result = cli("analyze", "model.py", "--memory-margin", "2%%")
    assert result.exit_code == 2 and "--memory-margin 2%%: expected" in result.output


# --- TA301 / TA302 say what is left -----------------------------------------------------------------------------------


def test_ta301_and_ta302_say_how_much_memory_the_recommended_batch_leaves():
    (roomy,) = evaluate(with_memory(load("cnn"), 16 * GiB), select=["TA301"])
    assert "which leaves 15.5 GiB (97%) free at batch_size=64, and throughput still rose" in roomy["message"]
    (tight,) = evaluate(with_memory(load("cnn"), 580 * 2**20), select=["TA302"])
    assert "93% of 580.0 MiB, which leaves 42.5 MiB (7%) free at batch_size=64: little room" in tight["message"]


def test_ta302_warns_where_the_longest_item_would_fill_the_memory():
    doc = with_memory(load("cnn"), 1 * GiB)  # the recommended 537.5 MiB leaves half of it
    assert evaluate(doc, select=["TA302"]) == []
    doc["workload"]["facts"]["extra"] = {"longest_item": {"size": 2 * 3 * 32 * 32}}  # twice the images measured
    for probe in doc["probes"]:
        probe["extra"]["largest_input"] = 3 * 32 * 32
    (found,) = evaluate(doc, select=["TA302"])
    assert "scaled 2.00x from the longest input its steps held" in found["message"]
    assert found["evidence"]["judged_peak_bytes"] == 2 * found["evidence"]["peak_memory_bytes"]
