"""Loss parity over real child probes: losses are compared at the same global training step (analysis/parity.py).

A compiled probe warms up until compilation settles, so its first measured step is a later training step than its
float32 twin's; paired by list position, its losses would read as a different training."""

import pytest

from tune_advisor import knobs
from tune_advisor.analysis import parity
from tune_advisor.probe.runner import run_probe
from tune_advisor.probe.spec import ProbeSpec, Protocol

from ..conftest import WORKLOADS

pytestmark = pytest.mark.slow

# Few warm-up steps and enough measured ones that the two probes share several global steps; a tiny model's steps
# take a millisecond, so min_steps, not time, ends the measurement.
SHORT = Protocol(warmup_steps=2, min_steps=12, min_time_s=0.05, max_steps=16, max_time_s=10.0)


def measure(tmp_path, name: str, **settings):
    spec = ProbeSpec(id=name, workload=str(WORKLOADS / "tiny_raw_sensor.py"), device="cpu", protocol=SHORT,
                     settings=knobs.full_settings({"batch_size": 64, **settings}), count_flops=False)
    result = run_probe(spec, tmp_path / name)
    assert result.ok, result.error
    # each measured loss carries its global step: the measured steps follow the warm-up without a gap
    warmup = result.extra["warmup_steps"]
    assert result.raw["loss_step"] == list(range(warmup, warmup + len(result.raw["loss"])))
    return result


def test_compile_agrees_with_float32_at_the_same_steps_and_bf16_on_raw_readings_does_not(tmp_path):
    reference = measure(tmp_path, "off")
    compiled = measure(tmp_path, "compile", compile="default")
    # GIVEN the compiled probe warmed up longer (compilation settling), so its measured steps start later
    assert compiled.extra["warmup_steps"] > reference.extra["warmup_steps"]
    # WHEN the losses are compared at the global steps both measured
    found = parity.compare_probes(reference, compiled)
    # THEN compile did not change the training
    assert found is not None and found.ok, found
    assert found.at[0] == compiled.extra["warmup_steps"] and found.steps >= parity.MIN_STEPS
    # (paired by position, the same losses would have barred compile: this model's loss falls fast per step)
    assert not parity.compare(reference.raw["loss"], compiled.raw["loss"]).ok

    # AND bf16, which rounds the raw readings' signal away before the calibration layer, is flagged
    bf16 = measure(tmp_path, "bf16", amp="bf16")
    found = parity.compare_probes(reference, bf16)
    assert found is not None and not found.ok, found
