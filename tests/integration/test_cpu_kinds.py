"""What an analysis does about bf16 on each kind of CPU, run as this machine detects itself and as an AVX2-only CPU
(bf16 only emulated there: its matmuls 25-80x slower than float32): a suite green here is green there."""

from tune_advisor import api, results

from ..conftest import FAST, WORKLOADS


def test_the_plan_measures_bf16_only_where_the_cpu_computes_it(each_cpu_kind, tmp_path, short_confirmation):
    # WHEN the mixed-precision knob alone is explored
    result = api.analyze(WORKLOADS / "tiny_cnn.py", api.AnalyzeOptions(
        out=tmp_path / "out", device="cpu", protocol=FAST, budget="3m", only_knobs=["amp"]))
    saved = results.read(result.results_path)
    # THEN the run records the verdict it planned with
    assert saved["environment"]["native_types"]["bf16"] == {"native": each_cpu_kind.bf16.native,
                                                            "reason": each_cpu_kind.bf16.reason}
    bf16 = [p for p in saved["probes"] if p["settings"]["amp"] == "bf16"]
    assert bf16, "the knob was considered, measured or not"
    if each_cpu_kind.bf16.native:
        # AND where bf16 is native it is measured against the baseline
        assert any(p["status"] == "ok" for p in bf16), [(p["id"], p["status"], p["error"]) for p in bf16]
    else:
        # AND where it is emulated no probe runs it: it is listed as not applicable, with the reason, and not advised
        assert all(p["status"] == "skipped" and "only emulates bf16" in p["error"] for p in bf16)
        assert saved["recommended"]["settings"]["amp"] == "off"
