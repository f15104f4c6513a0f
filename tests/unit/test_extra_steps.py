"""Inside the probe child, a collector that runs steps of its own and fails leaves a note, never fails the probe."""

from __future__ import annotations

from tune_advisor.probe import extra_steps
from tune_advisor.probe.spec import ProbeSpec
from tune_advisor.probe.training import Diverged

SETTINGS = {"amp": "off"}


def spec(**kw):
    return ProbeSpec(id="p001", workload="w.py", settings=SETTINGS, **kw)


def test_a_failing_profiled_step_is_a_note_and_its_loss_is_not_kept(tmp_path):
    # GIVEN three measured losses, then a profiled step whose loss turns non-finite
    out = {"raw": {"loss": [2.3, 2.2, 2.1], "loss_step": [3, 4, 5]}, "extra": {}}

    def step(i):
        out["raw"]["loss"].append(None)
        out["raw"]["loss_step"].append(6 + i)
        raise Diverged("loss became nan at step 9")

    status = extra_steps.profile(spec(profile=True), out, tmp_path, step)
    # THEN the collector says so, the measured losses are untouched, and no profile or trace is left
    assert status == "error: Diverged: loss became nan at step 9"
    assert out["raw"]["loss"] == [2.3, 2.2, 2.1] and out["raw"]["loss_step"] == [3, 4, 5]
    assert "profile" not in out["extra"]
    assert not list(tmp_path.iterdir())


def test_a_failing_flop_count_is_a_note(tmp_path):
    out = {"raw": {"loss": [1.0], "items": [8.0], "step_s": [0.01]}, "extra": {}}

    def forward_backward():
        raise RuntimeError("unsupported op")

    assert extra_steps.count_flops(spec(), out, forward_backward) == "error: RuntimeError: unsupported op"
    assert "flops" not in out["extra"]


def test_flops_are_scaled_to_the_typical_measured_batch(tmp_path, monkeypatch):
    # GIVEN a counted step that drew a short last batch of 4 items while measured steps had 8
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = {"raw": {"items": [8.0, 8.0, 8.0], "step_s": [0.5, 0.5, 0.5]}, "extra": {}}

    def forward_backward():
        import torch

        torch.mm(torch.ones(4, 10), torch.ones(10, 10))  # 2*4*10*10 = 800 FLOPs for 4 items
        return 4.0

    status = extra_steps.count_flops(spec(), out, forward_backward)
    assert status.startswith("partial: no measured fp32 peak")
    assert out["extra"]["flops"]["per_step"] == 1600 and out["extra"]["flops"]["achieved_flops_per_s"] == 3200
