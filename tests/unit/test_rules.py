"""The rules engine over golden results documents: every rule fires on one and stays silent on another.

io_bound and cnn are real `tune-advisor analyze` runs on a 2-core CPU machine. The synthetic_cuda_* documents
are derived from cnn by tests/golden/rules/derive.py (each change listed in their "_synthetic" key): the CUDA
rules cannot fire on a CPU run, so these are hand-made and not measurements; the real-GPU check comes later.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import pytest

from tune_advisor.errors import UsageError
from tune_advisor.rules import RULES, chosen, docs, evaluate

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
DOCUMENTS = {
    "io_bound": GOLDEN / "io_bound.results.json",
    # the README's quick start (reports/io_bound, adapted by tests/golden/rules/derive_io_bound.py: 32 workers
    # without persistent workers read 0.56x of 16, as on the machine of issue 65)
    "quickstart": GOLDEN / "io_bound_quickstart.results.json",
    "cnn": GOLDEN / "cnn.results.json",
    "cuda_untuned": GOLDEN / "rules" / "synthetic_cuda_untuned.results.json",
    "cuda_fp16_dynamic": GOLDEN / "rules" / "synthetic_cuda_fp16_dynamic.results.json",
    "compile_varlen": GOLDEN / "compile_varlen.results.json",
    "compile_loss": GOLDEN / "rules" / "synthetic_compile_loss.results.json",
    "ddp_gloo": GOLDEN / "ddp_gloo.results.json",  # a real DDP run: 2 ranks, gloo, 2-core CPU
    "ddp_straggler": GOLDEN / "rules" / "synthetic_ddp_straggler.results.json",
    "unsupported_op": GOLDEN / "rules" / "synthetic_unsupported_op.results.json",  # cnn + one bf16 probe w/o kernel
}
GIB = 2**30


def load(name: str) -> dict:
    return json.loads(DOCUMENTS[name].read_text())


@lru_cache(maxsize=None)
def _findings(name: str) -> str:
    return json.dumps(evaluate(load(name)), allow_nan=False)  # evaluated once per document, and must be JSON


def findings(name: str) -> dict[str, dict]:
    return {f["code"]: f for f in json.loads(_findings(name))}


def with_memory(doc: dict, total: int) -> dict:
    """The lead's api (tune_advisor.api) is to record the machine's memory; these CPU runs predate that key."""
    doc = copy.deepcopy(doc)
    doc["environment"]["memory_total_bytes"] = total
    return doc


# Each rule: (document where it fires, document where it stays silent).
CASES = {
    "TA101": ("io_bound", "cnn"),
    "TA102": ("cnn", "io_bound"),
    "TA103": ("io_bound", "cnn"),
    "TA104": ("cuda_untuned", "cuda_fp16_dynamic"),
    "TA201": ("cnn", "io_bound"),
    "TA202": ("cuda_fp16_dynamic", "cuda_untuned"),
    "TA302": ("cuda_fp16_dynamic", "cuda_untuned"),
    "TA303": ("cuda_fp16_dynamic", "cnn"),
    "TA401": ("cnn", "io_bound"),
    "TA402": ("cuda_fp16_dynamic", "cuda_untuned"),
    "TA403": ("cuda_untuned", "cuda_fp16_dynamic"),
    "TA501": ("cnn", "io_bound"),
    "TA504": ("compile_varlen", "cnn"),
    "TA505": ("compile_varlen", "cnn"),
    "TA704": ("compile_loss", "compile_varlen"),
    "TA601": ("ddp_gloo", "cnn"),
    "TA602": ("ddp_straggler", "ddp_gloo"),
    "TA502": ("cuda_untuned", "cuda_fp16_dynamic"),
    "TA503": ("cuda_fp16_dynamic", "cuda_untuned"),
    "TA701": ("cuda_fp16_dynamic", "cnn"),
    "TA702": ("cuda_untuned", "cnn"),
    "TA703": ("cnn", "io_bound"),
    "TA801": ("cnn", "io_bound"),
    "TA802": ("cuda_untuned", "cuda_fp16_dynamic"),
    "TA803": ("unsupported_op", "cnn"),
    "TA301": ("cuda_untuned", "cuda_fp16_dynamic"),
}


def test_every_rule_has_a_firing_and_a_silent_case():
    assert sorted(CASES) == sorted(RULES)


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_on_its_golden_document(code):
    # GIVEN the document in which the problem was planted (or measured)
    fires_on, _ = CASES[code]
    # WHEN the rules run over it
    found = findings(fires_on)
    # THEN the rule reports a finding with a message, a fix and its probes
    assert code in found, f"{code} did not fire on {fires_on}"
    finding = found[code]
    assert finding["name"] == RULES[code].name and finding["severity"] == RULES[code].severity
    assert finding["message"] and finding["probes"]
    # AND code to apply, unless its fix left the finding as the planner did not keep it (no code then beside the
    # report's "Apply it")
    assert finding["fix"]["snippet"] or "not in the recommendation" in finding["message"]


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_is_silent_where_the_problem_is_absent(code):
    _, silent_on = CASES[code]
    assert code not in findings(silent_on), findings(silent_on).get(code, {}).get("message")


def test_cuda_rules_are_silent_on_cpu_runs():
    cuda_only = {"TA104", "TA402", "TA403", "TA502", "TA503", "TA802"}
    for name in ("io_bound", "cnn"):
        assert not cuda_only & set(findings(name)), name


def test_input_pipeline_bound_quotes_the_knee_and_measures_the_gain():
    # GIVEN the I/O-bound loader: 99% data wait at num_workers=0, ladder 2, 4, 8, 16, read with no recommendation
    doc = load("io_bound")
    doc["recommended"] = None
    finding = {f["code"]: f for f in evaluate(doc)}["TA101"]
    # THEN it names num_workers=16 (1.5x over 8 with a CI above 1 once the bootstrap keeps loader waves whole)
    assert finding["evidence"]["knee_num_workers"] == 16
    assert finding["fix"]["settings"] == {"num_workers": 16}
    assert "num_workers=16 (the knee of the loader ladder)" in finding["message"]
    assert "num_workers=16" in finding["fix"]["snippet"] and "DataLoader(" in finding["fix"]["snippet"]
    # AND its snippet does not spell out persistent_workers=False (the default), which TA103 may advise against
    assert "persistent_workers" not in finding["fix"]["snippet"]
    assert "persistent_workers=True" in findings("io_bound")["TA103"]["fix"]["snippet"]
    gain = finding["gain"]
    assert gain["measured"] is True
    assert 1 < gain["speedup"]["ci_low"] < gain["speedup"]["median"] < gain["speedup"]["ci_high"]
    assert gain["time_saved_frac"] == pytest.approx(1 - 1 / gain["speedup"]["median"])
    assert {"p001", "p012"} <= set(finding["probes"])  # the baseline and the 16-worker probe


def test_input_pipeline_bound_names_the_planners_choice_of_workers_when_it_made_one():
    # GIVEN the same run as recorded: the planner recommended 8 workers, the ladder's knee reads 16
    finding = findings("io_bound")["TA101"]
    # THEN the finding names 8, with 8's measured gain, so the report states one value (the knee stays evidence)
    assert finding["fix"]["settings"] == {"num_workers": 8} and finding["evidence"]["knee_num_workers"] == 16
    assert "num_workers=8 (the planner's choice) trains" in finding["message"]
    assert "num_workers=8" in finding["fix"]["snippet"] and finding["gain"]["speedup"]["ci_low"] > 1


def test_the_planners_choice_of_workers_is_judged_beside_the_recommendations_other_settings():
    # GIVEN the same run, but a recommendation that also doubles the batch (the headline's speedup is then the
    # whole recommendation's), with batch 64 also measured without workers (p008)
    doc = load("io_bound")
    eight = next(p for p in doc["probes"] if p["id"] == "p011")  # 8 workers at the baseline's other settings
    doc["recommended"] = {**copy.deepcopy(eight), "id": "p017", "settings": {**eight["settings"], "batch_size": 64}}
    doc["probes"].append(doc["recommended"])
    finding = {f["code"]: f for f in evaluate(doc)}["TA101"]
    # THEN the finding names 8 workers with their gain at batch 64: the recommendation over p008
    assert finding["fix"]["settings"] == {"num_workers": 8}
    assert "num_workers=8 (the planner's choice) trains" in finding["message"]
    assert finding["message"].endswith("faster than num_workers=0 beside the recommendation's batch_size=64")
    assert {"p008", "p017"} <= set(finding["probes"])
    # AND its code starts from the recommendation (batch 64), not from the baseline
    assert "batch_size=64, num_workers=8" in finding["fix"]["snippet"]
    # WHEN batch 64 was not measured without workers: the gain of 8 workers alone, marked as measured there only
    doc["probes"] = [p for p in doc["probes"] if p["id"] != "p008"]
    finding = {f["code"]: f for f in evaluate(doc)}["TA101"]
    assert ("at the baseline's other settings; not measured beside the recommendation's batch_size=64"
            in finding["message"])
    # AND with the recommendation that changes only the workers it says nothing of the kind
    assert "beside" not in findings("io_bound")["TA101"]["message"]


# --- issue 65: findings about workers judged at the recommendation's other settings ------------------------------


def _without(doc: dict, *ids: str) -> dict:
    doc = copy.deepcopy(doc)
    doc["probes"] = [p for p in doc["probes"] if p["id"] not in ids]
    return doc


def test_the_quick_starts_workers_are_quoted_with_the_persistent_workers_they_were_recommended_with():
    # GIVEN the quick start: 32 workers with persistent workers recommended, 23.26x confirmed; 32 workers alone
    # (without persistent workers) measured 6x over the baseline
    doc = load("quickstart")
    finding = {f["code"]: f for f in evaluate(doc)}["TA101"]
    # THEN TA101 quotes the headline's comparison, not the workers alone: one figure for 32 workers
    assert "num_workers=32 with persistent_workers=true (the planner's choice) trains 23.26x [22.28, 24.19]" \
        in finding["message"]
    assert finding["gain"]["speedup"]["median"] == pytest.approx(doc["speedup"]["median"])
    # AND 32, the largest count tried, is the largest its SEARCH lists: it says so, not that more were left untried
    assert finding["message"].endswith("and is the largest count SEARCH lists: list larger ones there to have them "
                                       "measured")
    doc["workload"]["search"].pop("num_workers")  # the planner's own ladder goes on to 64
    assert {f["code"]: f for f in evaluate(doc)}["TA101"]["message"].endswith(
        "and was the largest value tried: larger ones may gain more")
    # AND its code is the recommendation's loader line
    assert finding["fix"]["snippet"] == ("loader = DataLoader(dataset, shuffle=True, batch_size=32, num_workers=32, "
                                         "persistent_workers=True)")


def test_oversubscription_measured_without_persistent_workers_is_judged_again_beside_them():
    # GIVEN the quick start: without persistent workers 32 read 0.56x of 16; with them (p021/p023 and the
    # recommendation) 32 read faster than 16
    doc = load("quickstart")
    # THEN TA102 does not advise 16 workers against the recommendation: its comparison was re-measured there
    assert "TA102" not in {f["code"] for f in evaluate(doc)}
    # WHEN 16 workers were never measured with persistent workers: the finding stands, marked as measured without
    # them, and it asks for no fewer workers than the recommendation (no fix; its code is the recommendation's)
    (finding,) = evaluate(_without(doc, "p021", "p023"), select=["TA102"])
    assert "measured without the recommendation's persistent_workers=true, and not beside it" in finding["message"]
    assert "re-measure there before lowering num_workers=32" in finding["message"]
    assert finding["fix"]["settings"] == {} and finding["gain"]["measured"] is False
    assert "num_workers=32, persistent_workers=True" in finding["fix"]["snippet"]
    assert finding["evidence"]["measured_without"] == "persistent_workers=true"


def test_oversubscription_beside_the_recommendation_is_judged_on_the_recommendations_own_ladder():
    # GIVEN the quick start where the recommendation (32 persistent workers) read slower than 16 with them
    doc = copy.deepcopy(load("quickstart"))
    for p in doc["probes"]:
        if p["settings"]["num_workers"] == 16 and p["settings"]["persistent_workers"]:
            p["step_time_s"]["samples"] = [t / 3 for t in p["step_time_s"]["samples"]]
    (finding,) = evaluate(doc, select=["TA102"])
    # THEN TA102 speaks of the ladder beside the recommendation's persistent workers, without a caveat
    assert finding["message"].startswith("num_workers=32 trains") and "measured without" not in finding["message"]
    assert finding["evidence"]["best_num_workers"] == 16


def test_a_finding_about_another_knob_starts_its_code_from_the_recommendation():
    # GIVEN an A100 run whose recommendation doubled the batch (32 -> 64), where pinned memory was never measured:
    # TA104's code had set batch 32 beside it (reports/gpu/cnn_240s: 32 beside a recommendation at 128)
    doc = load("cuda_untuned")
    doc["probes"] = [p for p in doc["probes"] if not p["settings"]["pin_memory"]]
    (finding,) = evaluate(doc, select=["TA104"])
    # THEN its code starts from the recommended batch, with the pinning it advises on top
    assert finding["fix"]["settings"] == {"pin_memory": True}
    assert "batch_size=64, num_workers=0, pin_memory=True" in finding["fix"]["snippet"]
    # AND where the planner measured pinning and did not keep it, the finding says so and shows no code to apply
    (finding,) = evaluate(load("cuda_untuned"), select=["TA104"])
    assert finding["fix"] == {"settings": {}, "snippet": ""} and "not in the recommendation" in finding["message"]


def test_estimated_gains_are_labelled():
    gain = findings("io_bound")["TA103"]["gain"]
    assert gain["measured"] is False and gain["basis"].startswith("estimated")
    assert isinstance(gain["speedup"], float) and 0 < gain["time_saved_frac"] < 1


def test_a_worker_restart_is_estimated_by_the_steps_it_slowed_not_by_its_data_wait_alone():
    # GIVEN hf_trainer's shape at 2 workers (prefetch 2): 64 steps of 20 ms an epoch; the step that begins an epoch
    # takes 0.32 s while waiting only 0.08 s for its batch, and the new workers' refill slows the next three
    doc = load("io_bound")
    subject = [p for p in doc["probes"] if p["status"] == "ok" and p["settings"]["num_workers"] == 8]
    for p in subject:
        steps, wait = [0.02] * 64, [0.0] * 64
        steps[32:36], wait[32] = [0.32, 0.03, 0.03, 0.06], 0.08
        p["settings"].update(num_workers=2, prefetch_factor=2)
        p["step_time_s"]["samples"], p["raw"]["data_wait_s"] = steps, wait
        p["extra"].update(epoch_start_steps=[32], epoch_steps=64)
    doc["recommended"]["settings"].update(num_workers=2, prefetch_factor=2)
    (finding,) = evaluate(doc, select=["TA103"])
    # THEN the cost is the four steps' 0.36 s beyond typical ones, once an epoch of 1.64 s: ~22% of the time (the
    # data wait alone said 5%); the planner ranks persistent_workers by this same figure (analysis.restart)
    assert finding["evidence"]["restart_stall_s"] == pytest.approx(0.36, abs=0.001)
    assert finding["gain"]["time_saved_frac"] == pytest.approx(0.36 / 1.64, rel=0.01)
    assert "the steps it began took 0.36 s more" in finding["message"]


def test_findings_are_ranked_by_time_saved():
    # GIVEN the cnn run, where AMP, channels_last and a larger batch each measured a different gain
    ranked = json.loads(_findings("cnn"))
    saved = [f["gain"]["time_saved_frac"] for f in ranked]
    measured = [s for s in saved if s is not None]
    # THEN the largest saving comes first and findings without a gain come last
    assert measured == sorted(measured, reverse=True)
    assert saved[: len(measured)] == measured
    assert ranked[0]["code"] == "TA401"


def test_memory_headroom_needs_a_known_capacity():
    # GIVEN the cnn run (batch 32 -> 64 still climbing) on a machine with 16 GiB, and the same without that fact
    assert "TA301" in {f["code"] for f in evaluate(with_memory(load("cnn"), 16 * GIB), select=["TA301"])}
    assert evaluate(load("cnn"), select=["TA3"]) == []


def test_memory_headroom_estimates_the_next_doubling_per_doubling_of_a_larger_step():
    # GIVEN the cnn run where the batch below the recommendation's 64 is made 16, not 32 (as on the H200, where a
    # recommendation with a fused optimizer had only its ablation's batch, 4x smaller, beside it)
    doc = with_memory(load("cnn"), 16 * GIB)
    (below,) = [p for p in doc["probes"] if p["id"] == "p011"]
    below["settings"]["batch_size"] = 16
    (found,) = evaluate(doc, select=["TA301"])
    # THEN the step's 1.18x is spread over its two doublings, and the estimate for the next one is that share
    step = found["evidence"]["last_step_speedup"]
    assert found["evidence"]["previous_batch_size"] == 16 and step == pytest.approx(1.175, abs=0.001)
    assert found["evidence"]["per_doubling_speedup"] == pytest.approx(step ** 0.5)
    assert found["gain"]["speedup"] == pytest.approx(step ** 0.5) and found["fix"]["settings"] == {"batch_size": 128}
    assert "from batch_size 16 to 64 (1.08x a doubling)" in found["message"]
    # WHEN the step below is smaller than a doubling (48 to 64): its own gain, not stretched to a doubling
    below["settings"]["batch_size"] = 48
    (found,) = evaluate(doc, select=["TA301"])
    assert found["gain"]["speedup"] == pytest.approx(found["evidence"]["last_step_speedup"])
    assert "a doubling)" not in found["message"]


def test_a_peak_the_cuda_allocator_reserved_beyond_its_allocations_is_named_with_both_figures():
    # GIVEN the cnn run where each probe of the recommended settings also records a reserved peak 10% above the
    # allocated one (as on CUDA, where freed blocks stay reserved)
    doc = with_memory(load("cnn"), 16 * GIB)
    recommended = doc["recommended"]["settings"]
    for probe in doc["probes"]:
        if probe["settings"] == recommended:
            probe.setdefault("memory", {})["cuda_max_reserved_bytes"] = int(probe["peak_memory_bytes"] * 1.1)
    (found,) = evaluate(doc, select=["TA301"])
    # THEN the finding gives the reserved peak it compares with the capacity, and the allocated one the cards show
    assert "peak at 591.2 MiB reserved by the CUDA allocator (537.5 MiB allocated) of 16.0 GiB" in found["message"]
    # and a run without reserved figures (CPU) states its one peak as before
    (plain,) = evaluate(with_memory(load("cnn"), 16 * GIB), select=["TA301"])
    assert "peak at 537.5 MiB of 16.0 GiB" in plain["message"]


def test_near_memory_limit_on_cpu_uses_the_machine_memory():
    # GIVEN the cnn run on a machine whose memory is barely above the recommended peak (537 MiB)
    found = evaluate(with_memory(load("cnn"), 580 * 2**20), select=["TA302"])
    assert [f["code"] for f in found] == ["TA302"]
    assert found[0]["evidence"]["capacity_source"] == "the machine's memory"


def test_a_partial_document_without_baseline_falls_back_to_the_baseline_probe():
    # GIVEN a run interrupted before the summary fields were written
    doc = load("cnn")
    doc["baseline"] = doc["recommended"] = doc["speedup"] = None
    # THEN the speed rules still find the baseline probe; rules that need a recommendation stay silent
    codes = {f["code"] for f in evaluate(doc)}
    assert {"TA401", "TA501", "TA201"} <= codes and "TA703" not in codes


def test_an_empty_document_gives_no_findings():
    assert evaluate({"schema_version": 1, "probes": []}) == []


def test_select_and_ignore_by_prefix():
    assert [r.code for r in chosen(["TA1"], ["TA103"])] == ["TA101", "TA102", "TA104"]
    assert [r.code for r in chosen(["ta4,TA501"])] == ["TA401", "TA402", "TA403", "TA501"]
    assert len(chosen()) == len(RULES)
    codes = {f["code"] for f in evaluate(load("cnn"), select=["TA4", "TA5"])}
    assert codes == {"TA401", "TA501"}


def test_an_unknown_prefix_is_a_usage_error_listing_the_codes():
    with pytest.raises(UsageError, match=r"TA9.*valid codes: TA101"):
        evaluate(load("cnn"), ignore=["TA9"])


def test_every_rule_is_documented_in_every_section():
    for code, r in RULES.items():
        assert r.family and r.summary.endswith("."), code
        assert set(r.sections()) == {"What it finds", "Why it matters", "How it is measured", "Fix", "Example"}


def test_rule_pages_are_up_to_date():
    assert docs.stale() == [], "docs/rules is stale: run python -m tune_advisor.rules.docs"


def test_a_stale_page_is_detected(tmp_path):
    docs.write(tmp_path)
    (tmp_path / "TA101.md").write_text("old text")
    (tmp_path / "TA999.md").write_text("a removed rule")
    assert docs.stale(tmp_path) == ["TA101.md", "TA999.md"]


def test_cli_lists_and_explains_rules(cli):
    listing = cli("rules", "--select", "TA7")
    assert listing.exit_code == 0 and "non-finite-loss" in listing.output and "TA101" not in listing.output
    explained = cli("rules", "ta101")
    assert explained.exit_code == 0 and "How it is measured" in explained.output
    unknown = cli("rules", "TA999")
    assert unknown.exit_code == 2 and "valid codes" in unknown.output


def test_ta803_explains_an_unsupported_probe_without_counting_it_a_failure():
    found = findings("unsupported_op")
    assert "LSTM (in Tagger) has no kernel here for amp=bf16 (p077)" in found["TA803"]["message"]
    assert found["TA803"]["probes"] == ["p077"] and found["TA803"]["fix"]["settings"] == {}
    assert "p077" not in (found.get("TA701") or {}).get("probes", [])


@pytest.mark.parametrize("median, low, high, says", [
    (1.12, 1.08, 1.16, "trains 1.12x [1.08, 1.16] faster"),
    (1.01, 0.98, 1.03, "did not train faster: 1.01x [0.98, 1.03]"),
])
def test_ta504_quotes_the_ablations_figure_for_the_compile_mode_it_measured(median, low, high, says):
    # GIVEN the planner's ablation measured compile=default beside the recommendation without it
    doc = load("compile_varlen")
    doc["plan"] = {"ablation": [{"knob": "compile", "value": "default", "without": "off", "probes": ["p009", "p010"],
                                 "contribution": {"median": median, "ci_low": low, "ci_high": high},
                                 "kept": low > 1.0, "method": "in lockstep"}]}
    # THEN TA504 states that figure (one comparison, one figure), not its own from separate probes (0.30x here)
    found = {f["code"]: f for f in evaluate(doc)}["TA504"]
    assert says in found["message"] and found["gain"]["speedup"]["median"] == median


def test_ta504_quotes_the_figure_compile_was_kept_on_where_the_ablation_had_no_time_to_measure_it():
    # GIVEN a recommendation holding compile=default, which the search kept at 1.04x [1.01, 1.08] in lockstep over
    # the baseline and the ablation could not measure again (raw_sensor_mlp: TA504 otherwise read 0.97x from
    # separate probes and said "leave it off" beside a recommendation that held it)
    doc = load("compile_varlen")
    doc["plan"] = {"ablation": [{"knob": "compile", "value": "default", "without": "off", "probes": ["p009", "p010"],
                                 "beside": "the baseline", "contribution": {"median": 1.04, "ci_low": 1.01,
                                                                            "ci_high": 1.08},
                                 "kept": True, "method": "from the search's keep of compile=default beside the "
                                                         "baseline (over budget to re-measure)"}]}
    found = {f["code"]: f for f in evaluate(doc)}["TA504"]
    # THEN TA504 states the figure the recommendation rests on, and says what it compares
    assert "trains 1.04x [1.01, 1.08] faster" in found["message"] and "leave it off" not in found["message"]
    assert "compile=default kept beside the baseline" in found["gain"]["basis"]


def test_ta504_sets_the_break_even_against_the_run_train_steps_states():
    # GIVEN compile measured 1.12x faster beside its twin, and the break-even it works out from that
    doc = load("compile_varlen")
    doc["plan"] = {"ablation": [{"knob": "compile", "value": "default", "without": "off", "probes": ["p009", "p010"],
                                 "contribution": {"median": 1.12, "ci_low": 1.08, "ci_high": 1.16},
                                 "kept": True, "method": "in lockstep"}]}
    unstated = {f["code"]: f for f in evaluate(doc)}["TA504"]
    steps = unstated["evidence"]["break_even_steps"]
    compiled = next(p for p in doc["probes"] if p["settings"]["compile"] == "default")["settings"]["batch_size"]
    base = doc["baseline"]["settings"]["batch_size"]

    def with_run(train_steps):
        doc["workload"]["train_steps"] = train_steps
        return {f["code"]: f for f in evaluate(doc)}["TA504"]

    # WHEN the run is ten times the break-even THEN TA504 says it pays off within it, and does not advise against it
    long = with_run(round(10 * steps * compiled / base))
    assert "steps of the run --train-steps states" in long["message"] and ", within the" in long["message"]
    assert "leave it off" not in long["message"] and long["evidence"]["run_steps"] >= 9 * steps
    # WHEN it is a tenth of it THEN it says past it, and advises leaving compile off
    short = with_run(max(1, round(steps * compiled / base / 10)))
    assert ", past the" in short["message"] and "steps of the run --train-steps states: leave it off" in short["message"]
    assert short["fix"]["settings"] == {}
    # AND without a stated run it says neither
    assert "--train-steps" not in unstated["message"] and "leave it off" not in unstated["message"]


def test_ta504_claims_no_speedup_for_a_compile_that_compiled_no_graph():
    # GIVEN a compile probe that read 1.12x over its eager twin, though dynamo compiled no graph (an LSTM)
    doc = load("compile_varlen")
    probe = next(p for p in doc["probes"] if p["settings"]["compile"] == "default")
    probe["extra"]["compile"].update(graphs=0, unsupported=["Attempted to wrap RNN, GRU, or LSTM"])
    doc["plan"] = {"ablation": [{"knob": "compile", "value": "default", "without": "off", "probes": ["p009", "p010"],
                                 "contribution": {"median": 1.12, "ci_low": 1.08, "ci_high": 1.16},
                                 "kept": True, "method": "in lockstep"}]}
    found = {f["code"]: f for f in evaluate(doc)}["TA504"]
    # THEN it says the model ran eagerly, advises nothing and claims no measured gain
    assert "compiled no graph (Attempted to wrap RNN, GRU, or LSTM), so the model ran eagerly" in found["message"]
    assert "leave it off" in found["message"] and found["fix"]["settings"] == {}
    assert found["gain"]["measured"] is False


def test_input_pipeline_bound_says_when_cpu_bound_loading_already_fills_the_cores():
    def with_loading(share, cores):
        doc = load("io_bound")
        doc["environment"]["usable_cores"] = cores
        baseline = next(p for p in doc["probes"] if p["id"] == "p001")
        baseline.setdefault("extra", {})["fetch_cpu_frac"] = share
        return {f["code"]: f for f in evaluate(doc)}["TA101"]

    # GIVEN the same run as if its baseline's loading had kept its thread on a CPU 99% of each fetch, on 2 cores
    finding = with_loading(0.99, 2)
    # THEN the planner's 8 workers already fill the cores: the finding says cheaper loading or more cores pay
    assert finding["fix"]["settings"] == {"num_workers": 8}
    assert ("the loading kept its thread on a CPU 99% of each fetch, so about 2 workers fill the 2 cores: past "
            "them, cheaper preprocessing or more cores pay, not more workers") in finding["message"]
    assert finding["evidence"]["workers_the_cores_feed"] == 2 and finding["evidence"]["fetch_cpu_frac"] == 0.99
    # AND where no worker count beat the baseline, the estimated bound spreads the loading over those 2 workers,
    # not "all waiting removed"
    doc = load("io_bound")
    doc["environment"]["usable_cores"] = 2
    doc["recommended"] = None
    doc["probes"] = [p for p in doc["probes"] if p["settings"]["num_workers"] == 0]
    for p in doc["probes"]:
        p.setdefault("extra", {})["fetch_cpu_frac"] = 0.99
    alone = {f["code"]: f for f in evaluate(doc)}["TA101"]
    wait = alone["evidence"]["data_wait_frac"]
    assert alone["gain"]["measured"] is False
    assert alone["gain"]["speedup"] == pytest.approx(1 / ((1 - wait) + wait / 2), rel=1e-3)
    assert "spread over the 2 workers the cores can feed" in alone["gain"]["basis"]
    # AND loading that waits on storage (2% on a CPU: 100 workers' worth of 2 cores) gets no such line
    finding = with_loading(0.02, 2)
    assert "fill the" not in finding["message"] and finding["evidence"]["workers_the_cores_feed"] == 100


def _crowded(doc: dict, busy: dict[str, float], fetch_share: float | None = None) -> dict:
    """`doc` with each named probe's CPU utilisation set, and the baseline's loading thread's CPU share."""
    doc = copy.deepcopy(doc)
    for p in doc["probes"]:
        if p["id"] in busy:
            p["extra"]["cpu_util"] = busy[p["id"]]
        if fetch_share is not None and p["status"] == "ok" and p["settings"]["num_workers"] == 0:
            p["extra"]["fetch_cpu_frac"] = fetch_share
    return doc


def test_thread_oversubscription_reads_a_settings_median_busy_share_not_one_probes():
    # GIVEN io_bound's run on 2 cores with 2 intra-op threads, where the recommended 8 workers (p011, p014, p016)
    # read the CPU saturated in one probe of three
    doc = _crowded(load("io_bound"), {"p011": 0.97, "p014": 0.40, "p016": 0.45})
    # THEN that one moment of the machine is no finding
    assert "TA801" not in {f["code"] for f in evaluate(doc)}
    # AND two of three saturated are
    doc = _crowded(load("io_bound"), {"p011": 0.97, "p014": 0.95, "p016": 0.45})
    finding = {f["code"]: f for f in evaluate(doc)}["TA801"]
    assert finding["evidence"]["median_cpu_util"] == 0.95 and finding["evidence"]["num_workers"] == [8]


def test_thread_oversubscription_counts_a_worker_by_the_cpu_its_loading_keeps_busy():
    # GIVEN 2 intra-op threads on 2 cores and 8 saturated loader workers
    busy = {"p011": 0.97, "p014": 0.95, "p016": 0.96}
    # WHEN the baseline's loading kept its thread on a CPU only 1% of the time (workers asleep on storage):
    # 2 + 8 x 0.01 cores asked for on 2 cores still crowds them, and it is said with the share
    finding = {f["code"]: f for f in evaluate(_crowded(load("io_bound"), busy, fetch_share=0.01))}["TA801"]
    assert finding["evidence"]["worker_cpu_share"] == 0.01
    # AND with 1 intra-op thread, the same sleeping workers ask for 1.08 cores of 2: nothing competes
    doc = _crowded(load("io_bound"), busy, fetch_share=0.01)
    for p in doc["probes"]:
        if p.get("extra"):
            p["extra"]["torch_threads"] = 1
    assert "TA801" not in {f["code"] for f in evaluate(doc)}
    # AND where the share is not known (no baseline without workers), each worker counts as a busy process
    doc["probes"] = [p for p in doc["probes"] if p["settings"]["num_workers"] != 0 or p["id"] == "p001"]
    for p in doc["probes"]:
        p["extra"].pop("fetch_cpu_frac", None) if p.get("extra") else None
    assert "TA801" in {f["code"] for f in evaluate(doc)}


def test_thread_oversubscription_looks_only_at_what_the_user_runs_and_its_loader_ladder():
    # GIVEN io_bound's run: the recommended 8 workers at batch 32 calm, 16 workers saturated on the same ladder
    doc = _crowded(load("io_bound"), {"p012": 0.96})
    assert {f["code"]: f for f in evaluate(doc)}["TA801"]["evidence"]["num_workers"] == [16]
    # WHEN that saturated probe is moved off the ladder (another batch size): it describes nothing the user runs
    for p in doc["probes"]:
        if p["id"] == "p012":
            p["settings"]["batch_size"] = 128
    assert "TA801" not in {f["code"] for f in evaluate(doc)}


def test_a_rule_quoting_the_recommendation_over_the_baseline_states_the_confirmations_figure():
    # GIVEN a run whose recommendation changes only the workers, confirmed at 6.84x [5.31, 8.91] in rounds
    doc = load("io_bound")
    confirmed = doc["speedup"]
    # THEN TA101, comparing exactly those two settings, quotes that figure, not its own from pooled probes
    found = {f["code"]: f for f in evaluate(doc)}["TA101"]
    assert found["gain"]["speedup"] == {k: confirmed[k] for k in ("median", "ci_low", "ci_high")}
    assert f"trains {confirmed['median']:.2f}x [{confirmed['ci_low']:.2f}, {confirmed['ci_high']:.2f}]" in (
        found["message"])
    assert found["gain"]["basis"].startswith("measured: the confirmation")


def as_framework(doc: dict, name: str, accumulate: int) -> dict:
    """The document as a Trainer's (hf) or LightningModule's run, with the user's gradient accumulation."""
    doc = copy.deepcopy(doc)
    config = ({"args": {"gradient_accumulation_steps": accumulate}} if name == "hf" else
              {"trainer_args": {"accumulate_grad_batches": accumulate}})
    doc["workload"]["framework"] = {"name": name, "config": config}
    return doc


def learning_rate_story_conflicts(doc: dict, found: list[dict]) -> list[str]:
    """The consistency check of TA703 against the framework note (to join consistency.py): both read the same
    accumulation, so a note saying the optimisation is unchanged and a TA703 asking to rescale the learning rate
    cannot stand in one report (`found`: the report's findings)."""
    from tune_advisor import frameworks

    base, rec = doc["baseline"]["settings"], doc["recommended"]["settings"]
    note = frameworks.batch_note(doc["workload"].get("framework"), base, rec) or ""
    ta703 = next((f for f in found if f["code"] == "TA703"), None)
    if "optimisation is unchanged" in note and ta703 is not None:
        return [f"the framework note keeps the effective batch but TA703 says: {ta703['message']}"]
    if "changes the optimisation" in note and (ta703 is None or "learning rate" not in ta703["message"]):
        return ["the framework note rescales the learning rate but TA703 does not"]
    return []


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_ta703_is_silent_where_the_frameworks_accumulation_keeps_the_effective_batch(framework):
    # GIVEN batch 32 -> 64 with accumulation 4: the recommendation writes accumulation 2, effective batch 128 kept
    doc = as_framework(load("cnn"), framework, 4)
    found = evaluate(doc)
    # THEN TA703 asks for no learning-rate change, as the framework note says (reports/hf_trainer had both)
    assert "TA703" not in {f["code"] for f in found}
    assert learning_rate_story_conflicts(doc, found) == []


def test_ta703_scales_the_learning_rate_by_the_effective_batch_when_accumulation_cannot_keep_it():
    # GIVEN batch 32 -> 64 with no accumulation (1): the effective batch doubles
    doc = as_framework(load("cnn"), "hf", 1)
    found = evaluate(doc)
    ta703 = {f["code"]: f for f in found}["TA703"]
    assert "effective batch changes from 32 to 64" in ta703["message"] and "about 2x" in ta703["message"]
    assert ta703["evidence"]["effective_batch_ratio"] == 2
    assert learning_rate_story_conflicts(doc, found) == []


def test_the_learning_rate_check_catches_the_old_contradiction():
    # the plain rule's "scale the learning rate 2x" beside a note keeping the effective batch: what the report had
    doc = as_framework(load("cnn"), "hf", 4)
    plain = copy.deepcopy(doc)
    del plain["workload"]["framework"]
    assert learning_rate_story_conflicts(doc, evaluate(plain))
