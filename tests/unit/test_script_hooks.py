"""Script mode's patches, in this process: what they observe of a script and what they change, and that they
leave nothing behind. The script here is this test's own code, calling torch as a training script would."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tune_advisor import knobs, workload
from tune_advisor.probe import evidence
from tune_advisor.probe.spec import ProbeSpec, Protocol
from tune_advisor.script import driver
from tune_advisor.script.hooks import ForwardHooks, Hooks, ScriptStop, outermost_module

from ..conftest import BAD

HERE = Path(__file__)


def make_hooks(settings=None, apply_knobs=True, mapped=(), steps=None, train_site=None):
    steps = [] if steps is None else steps
    return Hooks(HERE, knobs.full_settings(settings or {}), "cpu", apply_knobs, set(mapped), train_site,
                 on_step=lambda optimizer: steps.append(optimizer)).install()


def dataset(n=32):
    return TensorDataset(torch.randn(n, 4, 8, 8), torch.randint(2, (n,)))


def build_loaders():
    """A script's loaders: an evaluation one built first, then the training one."""
    evaluation = DataLoader(dataset(), batch_size=2)
    train = DataLoader(dataset(), batch_size=4, shuffle=True)
    return evaluation, train


def one_step(loader):
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = next(iter(loader))
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def script():
    """What a script does: reads an evaluation batch, then trains one step."""
    evaluation, train = build_loaders()
    next(iter(evaluation))
    one_step(train)
    return evaluation, train


def run_twice(probe_settings, mapped=()):
    """The inspection, then a probe with `probe_settings` told the training loader's site: the same script run
    from the same place, as the probe child runs it again."""
    runs, site = [], None
    for settings, apply_knobs in (({}, False), (probe_settings, True)):
        hooks = make_hooks(settings, apply_knobs=apply_knobs, mapped=mapped, train_site=site)
        try:
            evaluation, train = script()
        finally:
            hooks.remove()
        site = hooks.train_site
        runs.append((hooks, evaluation, train))
    return runs


def test_the_training_loader_is_the_one_that_fed_the_first_step_and_gets_the_knob_values():
    (inspected, _, _), (probe, evaluation, train) = run_twice({"batch_size": 16})
    # THEN the inspection knows the training loader by where it is built, and what the script asked of it
    assert inspected.loader_facts["batch_size"] == 4 and inspected.loader_facts["dataset_len"] == 32
    line = next(i for i, text in enumerate(HERE.read_text().splitlines(), 1) if "train = DataLoader(" in text)
    assert inspected.train_site.startswith(f"test_script_hooks.py:{line} < ") and len(inspected.loaders) == 2
    # AND in the probe only the training loader gets the knob's value
    assert train.batch_size == 16 and evaluation.batch_size == 2
    assert probe.applied["loader"]["batch_size"] == 16


def test_a_mapped_knob_is_left_to_the_script():
    _, (_, _, train) = run_twice({"batch_size": 16}, mapped={"batch_size"})
    assert train.batch_size == 4


def test_each_optimizer_step_is_a_step_with_its_samples_wait_and_loss():
    steps: list = []
    hooks = make_hooks(steps=steps)
    try:
        loader = DataLoader(dataset(24), batch_size=8)
        model = nn.Sequential(nn.Flatten(), nn.Linear(256, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            wait, items, new_epoch, _ = hooks.take_step_input()
            assert items == 8 and wait >= 0
            assert hooks.read_loss() == pytest.approx(loss.item())
    finally:
        hooks.remove()
    assert len(steps) == 3 and hooks.epochs == 1 and hooks.model is model


def test_the_model_is_the_outermost_module_holding_the_parameters():
    inner = nn.Linear(4, 2)
    outer = nn.Sequential(inner, nn.ReLU())
    assert outermost_module({id(p) for p in inner.parameters()}) is outer


def test_amp_and_channels_last_are_applied_around_the_models_forward():
    hooks = make_hooks({"amp": "bf16", "channels_last": True})
    try:
        model = nn.Conv2d(4, 4, 3)
        torch.optim.SGD(model.parameters(), lr=0.1)
        out = model(torch.randn(2, 4, 8, 8))
    finally:
        hooks.remove()
    assert out.dtype == torch.bfloat16 and model.weight.is_contiguous(memory_format=torch.channels_last)
    assert not hooks.own_autocast


def test_the_scripts_own_autocast_is_seen():
    hooks = make_hooks(apply_knobs=False)
    try:
        model = nn.Linear(4, 2)
        torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(2, 4))
    finally:
        hooks.remove()
    assert hooks.own_autocast


def test_with_several_optimizers_only_the_first_ones_steps_count():
    steps: list = []
    hooks = make_hooks(steps=steps)
    try:
        a, b = nn.Linear(2, 2), nn.Linear(2, 2)
        opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
        for _ in range(2):
            (a(torch.randn(1, 2)).sum() + b(torch.randn(1, 2)).sum()).backward()
            opt_a.step()
            opt_b.step()
    finally:
        hooks.remove()
    assert len(hooks.stepped) == 2 and steps == [opt_a, opt_a]


def test_processes_started_by_the_script_are_refused_before_they_start():
    hooks = make_hooks()
    try:
        with pytest.raises(ScriptStop) as stopped:
            multiprocessing.get_context("fork").Process(target=print).start()
        with pytest.raises(ScriptStop):
            subprocess.run([sys.executable, "-c", "pass"])
        with pytest.raises(ScriptStop):
            os.fork()
    finally:
        hooks.remove()
    assert stopped.value.kind == "refused" and "test_script_hooks.py:" in stopped.value.message


def test_dataloader_workers_are_not_the_scripts_processes():
    hooks = make_hooks({"num_workers": 1, "batch_size": 4})
    try:
        batches = list(DataLoader(dataset(8), batch_size=4))
    finally:
        hooks.remove()
    assert len(batches) == 2 and hooks.refused is None


def test_stdin_is_at_end_of_file_and_a_read_is_noted():
    hooks = make_hooks()
    try:
        with pytest.raises(EOFError):
            input("continue? ")
    finally:
        hooks.remove()
    assert hooks.stdin.read_from and sys.stdin is not hooks.stdin


def test_remove_puts_everything_back():
    before = (DataLoader.__init__, DataLoader.__iter__, torch.optim.Optimizer.__init__, torch.Tensor.backward,
              subprocess.Popen.__init__, os.fork, sys.stdin)
    make_hooks().remove()
    assert (DataLoader.__init__, DataLoader.__iter__, torch.optim.Optimizer.__init__, torch.Tensor.backward,
            subprocess.Popen.__init__, os.fork, sys.stdin) == before


@pytest.mark.parametrize("source, script", [
    ("import argparse\nparser = argparse.ArgumentParser()\n", True),
    ("def build_model():\n    pass\n", False),
    ("from models import build_model\n", False),
    ("def build_dataset():\n    pass\n", False),  # a workload missing build_model(): named as such, not run
    ("def build_modle():\n    pass\n", False),
    ("def main():\n    pass\n", True),
])
def test_a_file_without_build_model_is_a_script(tmp_path, source, script):
    path = tmp_path / "f.py"
    path.write_text(source)
    assert workload.is_script(path) is script


def script_facts(**overrides):
    base = {"optimizers": 1, "model_found": True, "own_autocast": False, "own_compile": False,
            "loader": {"batch_sampler": False}, "mapped": []}
    return knobs.WorkloadFacts(conv_layers=2, extra={"script": {**base, **overrides}})


@pytest.mark.parametrize("knob, value, facts, reason", [
    ("amp", "bf16", script_facts(own_autocast=True), "enters torch.autocast itself"),
    ("channels_last", True, script_facts(optimizers=2), "steps 2 optimizers"),
    ("batch_size", 64, script_facts(loader=None), "builds no torch DataLoader"),
    ("batch_size", 64, script_facts(loader={"batch_sampler": True}), "batch_sampler"),
    ("compile", "default", script_facts(own_compile=True), "compiles its model itself"),
    ("optimizer_impl", "fused", script_facts(), "builds its own optimizer"),
])
def test_knobs_script_mode_cannot_set_are_not_applicable_with_the_reason(knob, value, facts, reason):
    assert reason in knobs.not_applicable(knob, value, facts, knobs.DeviceFacts("cpu"))


def test_a_mapped_knob_applies_whatever_the_script_does_itself():
    facts = script_facts(own_autocast=True, mapped=["amp"])
    assert knobs.not_applicable("amp", "bf16", facts, knobs.DeviceFacts("cpu")) is None


def inspect(name: str, cwd: Path) -> dict:
    spec = ProbeSpec(id="i", workload=str(BAD / "scripts" / name), settings=knobs.full_settings(), mode="inspect",
                     script={"args": [], "map": {}, "cwd": str(cwd)})
    return driver.inspect(spec, lambda text: None)


def test_inspecting_a_script_that_exits_early_says_what_it_printed(tmp_path):
    error = inspect("exits_early.py", tmp_path)["error"]
    assert "exited with sys.exit(2) before its first optimizer step" in error["cause"]
    assert "the following arguments are required: --data" in error["cause"]


def test_inspecting_a_script_that_crashes_names_its_line(tmp_path):
    error = inspect("crashes_early.py", tmp_path)["error"]
    assert "raised RuntimeError" in error["cause"] and "before its first optimizer step" in error["cause"]
    assert error["line"] == 14


def test_inspecting_a_script_that_never_steps_says_nothing_trained(tmp_path):
    error = inspect("no_optimizer_step.py", tmp_path)["error"]
    assert "without calling optimizer.step()" in error["cause"] and "nothing trained" in error["cause"]


def test_a_deep_copied_or_pickled_model_still_works():
    import copy
    import pickle

    hooks = make_hooks({"amp": "bf16"})
    try:
        model = nn.Linear(4, 2)
        torch.optim.SGD(model.parameters(), lr=0.1)
        ema = copy.deepcopy(model)  # an EMA copy, as many scripts keep
        with torch.no_grad():
            ema.weight.zero_()
            ema.bias.zero_()
        out = ema(torch.randn(2, 4))
        restored = pickle.loads(pickle.dumps(model))  # torch.save(model) pickles it whole
    finally:
        hooks.remove()
    assert out.abs().sum() == 0 and out.dtype == torch.bfloat16  # the copy's own weights, under the knob's autocast
    assert restored(torch.randn(1, 4)).shape == (1, 2)


def test_a_probe_whose_loader_is_built_elsewhere_than_inspected_is_refused():
    hooks = make_hooks({"batch_size": 16}, train_site="train.py:12 < train.py:40")
    try:
        with pytest.raises(ScriptStop) as stopped:
            one_step(DataLoader(dataset(), batch_size=4))
    finally:
        hooks.remove()
    assert "not at train.py:12 < train.py:40 as when it was inspected" in stopped.value.message


class Sleepy(torch.utils.data.Dataset):
    """Samples that each wait 3 ms for storage: the loading thread is mostly asleep."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.zeros(4), 0


class Busy(Sleepy):
    """Samples computed in Python: the loading thread is on a CPU the whole fetch. `cpu_s`: the CPU time the
    samples' own computation took, read on the thread's own clock."""

    cpu_s = 0.0

    def __getitem__(self, i):
        started = time.thread_time()
        total = sum(j * j for j in range(30_000))
        Busy.cpu_s += time.thread_time() - started
        return torch.full((4,), float(total % 7)), 0


def test_the_training_loaders_fetches_count_their_wall_and_the_threads_cpu_time():
    # GIVEN a script training on a loader whose samples wait for storage, then on one whose samples are computed
    sleepy, Busy.cpu_s = fetched(Sleepy()), 0.0
    busy = fetched(Busy())
    # THEN the fetches' wall time is counted, and the thread's CPU time in them tells the two apart (the planner's
    # worker cap reads it as fetch_cpu_frac): a sleeping fetch holds almost none of its wall time on a CPU; a
    # computing one holds at least the CPU time its samples took. Measured against that, not against the wall
    # clock: on a busy machine a computing thread waits for a CPU too (its share of the wall read 0.24 under a
    # load of 7 on 2 cores)
    assert sleepy.fetch_wall_s > 0 and busy.fetch_wall_s > 0
    assert sleepy.fetch_cpu_s / sleepy.fetch_wall_s <= 0.2
    assert busy.fetch_cpu_s >= 0.9 * Busy.cpu_s > 0


def fetched(data):
    """A script's loop over `data` under the hooks; the hooks, removed, with what they counted."""
    hooks = make_hooks()
    try:
        model = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(data, batch_size=4):
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    finally:
        hooks.remove()
    return hooks


class FakeHooks:
    """What driver.Steps reads of the hooks: each step's samples and wait, its loss, and the fetches' totals."""

    def __init__(self, losses):
        self.losses, self.train_loader, self.applied = list(losses), None, {}
        self.fetch_wall_s = self.fetch_cpu_s = 0.0

    def take_step_input(self):
        return 0.001, 8.0, False, 1

    def read_loss(self):
        return self.losses.pop(0)


def steps_for(losses, protocol):
    out = {"raw": evidence.empty_raw(), "extra": {}}
    spec = ProbeSpec(id="p", workload="train.py", settings=knobs.full_settings(), protocol=protocol)
    steps = driver.Steps(spec, out, lambda text: None, "cpu")
    steps.hooks = FakeHooks(losses)
    return steps, out


def test_steps_warm_up_then_measure_until_the_stop_rule_ends_the_script():
    protocol = Protocol(warmup_steps=2, min_steps=3, min_time_s=0.0, max_steps=3, max_time_s=60.0)
    steps, out = steps_for([1.0] * 10, protocol)
    with pytest.raises(ScriptStop) as stopped:
        for _ in range(10):
            steps(None)
    # THEN the two warm-up steps are not in the figures, three measured ones are, each with its samples and loss
    assert stopped.value.kind == "done" and steps.steps == 5
    assert len(out["raw"]["step_s"]) == 3 and out["raw"]["items"] == [8.0] * 3 and out["unit"] == "samples/s"
    assert out["raw"]["loss_step"] == [2, 3, 4]
    # AND a script that catches the stop and goes on is stopped again at its next step, nothing more recorded
    with pytest.raises(ScriptStop):
        steps(None)
    assert len(out["raw"]["step_s"]) == 3


def test_a_non_finite_loss_ends_the_script_as_diverged():
    steps, out = steps_for([1.0, float("nan")], Protocol(warmup_steps=1))
    steps(None)
    with pytest.raises(ScriptStop) as stopped:
        steps(None)
    assert stopped.value.kind == "diverged" and "loss became nan at optimizer step 2" in stopped.value.message
    assert out["raw"]["loss"] == [None]


def test_with_gradient_accumulation_a_step_counts_every_micro_batch():
    hooks = make_hooks()
    try:
        loader = DataLoader(dataset(32), batch_size=8)
        model = nn.Sequential(nn.Flatten(), nn.Linear(256, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x, y) in enumerate(loader):
            (nn.functional.cross_entropy(model(x), y) / 2).backward()
            if i % 2 == 1:  # one optimizer step per two micro-batches
                optimizer.step()
                _, items, _, _ = hooks.take_step_input()
                assert items == 16
    finally:
        hooks.remove()


def test_a_side_whose_lockstep_pair_ended_under_it_is_stopped_not_failed():
    # the partner failed and the parent closed the channel: half a comparison, as probe/lockstep.py says elsewhere
    from tune_advisor.probe.result import Status

    stop = ScriptStop("lockstep", "the gate's parent process closed the lockstep channel")
    status, message = driver._problem("stopped", stop, 5, None, None, Path("train.py"), {})
    assert status is Status.STOPPED and message.startswith("stopped: the other side of the lockstep pair ended")


def test_a_script_without_a_loader_counts_the_mapped_batch_per_backward():
    # GIVEN a script with no DataLoader whose batch size a flag sets: two micro-batches of 12 before a step
    steps, out = steps_for([1.0] * 20, Protocol(warmup_steps=1, min_steps=50, min_time_s=100.0))
    steps.flag_batch = 12
    steps.hooks.take_step_input = lambda: (0.0, 0.0, False, 2)
    for _ in range(3):
        steps(None)
    # THEN each measured step counts 24 samples
    assert set(out["raw"]["items"]) == {24.0} and out["unit"] == "samples/s"


def test_a_script_without_a_loader_takes_its_mapped_batch_size_from_its_command_line():
    from ..conftest import WORKLOADS

    folder = WORKLOADS / "scripts" / "configurator_style"

    def inspect_with(args):
        script = {"args": args, "map": {"batch_size": {"flag": "--batch_size=", "values": {}}}, "cwd": None,
                  "home": str(folder)}
        spec = ProbeSpec(id="i", workload=str(folder / "train.py"), settings=knobs.full_settings(), mode="inspect",
                         script=script)
        return driver.inspect(spec, lambda text: None)

    # WHEN the arguments do not give the flag, the baseline's batch size is unknown: asked for, in its syntax
    missing = inspect_with(["config/tiny.py"])
    assert missing["status"] == "load_error" and "its arguments do not give it" in missing["error"]["cause"]
    assert "--batch_size=32" in missing["error"]["fix"]
    # WHEN they do: the baseline is the value given, counted in samples; what it wrote is listed
    found = inspect_with(["config/tiny.py", "--batch_size=12"])
    assert found["status"] == "ok" and found["baseline"]["batch_size"] == 12 and found["item_name"] == "samples"
    assert found["script"]["batch_size_from"] == {"flag": "--batch_size=", "value": 12}
    assert set(found["script"]["wrote"]) >= {"out", "train_log.txt"}
    assert not (folder / "out").exists() and not (folder / "train_log.txt").exists()


def test_the_amp_knobs_autocast_around_a_compiled_models_forward_is_entered_and_left_eagerly():
    # GIVEN the amp knob's hooks on a model the script then compiles (dynamo's eager backend: the trace is what
    # matters, and it compiles in a moment)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    hooks = ForwardHooks("bf16", "cpu", channels_last=False)
    model.register_forward_pre_hook(hooks.before)
    model.register_forward_hook(hooks.after)
    compiled = torch.compile(model, backend="eager")
    # WHEN it trains a few steps (traced, the autocast's exit raised: AttributeError: no attribute 'prev')
    for _ in range(3):
        out = compiled(torch.randn(4, 8))
        out.float().sum().backward()
    # THEN the forward ran in bf16, and autocast is off again after it
    assert out.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu") and hooks.entered == []
