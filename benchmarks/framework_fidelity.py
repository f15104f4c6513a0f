"""Does a probe of a framework workload read what the framework's own training loop does? (issues 23 and 59: within
5%, on every framework fixture.)

A probe runs the framework's own loop (`trainer.train()` / `Trainer.fit()`, probe/loop.py), stopped by its callback.
Against it, the same loop run plainly in a fresh process: the object as the file builds it, its own arguments (only
the step count, and no checkpoints, evaluation or loggers, as a probe sets them), timed by a callback at each batch's
end, the first WARM_BATCHES left out. Each fixture, at its own settings, runs in rounds of one each, who goes first
alternating. Both are given in samples per second (batches of batch_size samples). Prints each round and the centre
of the rounds' ratios with the 95% CI of their geometric mean (a fresh process's throughput varies by itself, so a
paired ratio is the figure). Prints the CPU model and flags first. About 6 minutes on 2 cores at 5 rounds.

--in-process: the probe's side (probe/loop.py's driver, run here rather than in a child) and the plain loop in this
one process, alternating: tells a gap from what the probe adds to the loop from one between processes.

    python benchmarks/framework_fidelity.py [--rounds 5] [--in-process] [NAME ...]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "tests" / "workloads"
# Every framework fixture: the shipped ones and the tests' own (code as written: manual optimization and two
# optimizers, a module that reads its Trainer, a Trainer subclass with its own compute_loss).
FIXTURES = {"hf_trainer": ROOT / "fixtures" / "hf_trainer.py",
            "lightning_module": ROOT / "fixtures" / "lightning_module.py",
            "tiny_gan": WORKLOADS / "tiny_gan.py", "tiny_scheduled": WORKLOADS / "tiny_scheduled.py",
            "tiny_compute_loss": WORKLOADS / "tiny_compute_loss.py"}
WARM_BATCHES = 12  # batches left out at the start of the plain loop (compiles, allocator, first batches)
MEASURED_BATCHES = 200  # batches timed at least ...
MIN_TIME_S = 2.0  # ... and seconds: the probe's window below lasts at least as long (its protocol's min_time_s)
# A probe's window: at least MIN_TIME_S, its step cap far enough not to cut millisecond steps' windows to a fraction
# of a second (one stray stall then moved a round's ratio by 10-30%).
PROTOCOL = {"warmup_steps": 3, "min_steps": 20, "min_time_s": MIN_TIME_S, "max_time_s": 15.0, "max_steps": 5000}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, FIXTURES[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Batches:
    """Each batch's end and size; says stop once WARM_BATCHES + MEASURED_BATCHES have ended, MIN_TIME_S after the
    first timed one."""

    def __init__(self):
        self.ends: list[float] = []
        self.sizes: list[int] = []

    def ended(self, size: int) -> bool:
        if len(self.ends) == WARM_BATCHES - 1:
            gc.collect()  # start-up's backlog, as a probe's window does before its clock (measure.Window.open)
        self.ends.append(time.perf_counter())
        self.sizes.append(size)
        return (len(self.ends) >= WARM_BATCHES + MEASURED_BATCHES
                and self.ends[-1] - self.ends[WARM_BATCHES - 1] >= MIN_TIME_S)

    def rate(self) -> dict:
        first = WARM_BATCHES - 1
        return {"samples_per_s": sum(self.sizes[first + 1:]) / (self.ends[-1] - self.ends[first]),
                "batches": len(self.ends) - 1 - first}


def plain_hf(name: str) -> dict:
    """The Trainer's own train(), as the file builds it: each micro-batch's end (substep or step) timed."""
    import dataclasses

    from transformers import TrainerCallback

    from tune_advisor.frameworks.hf_loop import PROBE_FIELDS

    trainer = _load(name).build_trainer()
    # as a probe sets them (the clock stops training; no checkpoint or evaluation falls in the window: a checkpoint
    # at the file's save_steps made two rounds of tiny_compute_loss's plain loop read a third of the others)
    names = {f.name for f in dataclasses.fields(trainer.args)}
    trainer.args = dataclasses.replace(trainer.args, **{k: v for k, v in PROBE_FIELDS.items() if k in names},
                                       output_dir=tempfile.mkdtemp(prefix="hf-fidelity-"))
    trainer.create_accelerator_and_postprocess()
    size = trainer.args.per_device_train_batch_size
    clock = Batches()

    class Clock(TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            control.should_training_stop = clock.ended(size)

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = clock.ended(size)

    trainer.add_callback(Clock())
    trainer.train()
    return clock.rate()


def plain_lightning(name: str) -> dict:
    """Trainer.fit() with the file's TRAINER_ARGS (no logger or checkpoints, one CPU device, and steps enough for the
    clock, as a probe's)."""
    import lightning as L

    module = _load(name)
    clock = Batches()

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            trainer.should_stop = clock.ended(len(batch[0]))

    args = {**module.TRAINER_ARGS, "max_steps": 10 ** 9, "max_epochs": -1,  # the clock stops it, as a probe's
            "accelerator": "cpu", "devices": 1,
            "logger": False, "enable_checkpointing": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
            "default_root_dir": tempfile.mkdtemp(prefix="lightning-fidelity-"), "callbacks": [Clock()]}
    L.Trainer(**args).fit(module.build_module())
    return clock.rate()


def plain_rate(name: str) -> dict:
    """The plain loop in a fresh process."""
    out = subprocess.run([sys.executable, __file__, "--plain", name], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _per_sample(settings: dict, step_s: list[float]) -> float:
    """Samples per second of a probe's steps (a step: one batch; the probe counts tokens where a batch has an
    attention_mask, so its steps are counted here instead)."""
    return settings["batch_size"] * len(step_s) / sum(step_s)


def probe_rate(name: str, workdir: Path) -> tuple[float, int]:
    """A probe (a tune-advisor child) at the file's own settings: samples per second, steps."""
    from tune_advisor import api
    from tune_advisor.probe.spec import Protocol

    _, result = api.probe(FIXTURES[name], device="cpu", workdir=workdir, protocol=Protocol(**PROTOCOL))
    if not result.ok:
        raise SystemExit(f"{name}: the probe failed: {result.status.value}: {result.error}")
    return _per_sample(result.settings, result.step_s), len(result.step_s)


def probe_in_process(name: str) -> tuple[float, int]:
    """probe/loop.py's driver in this process at the file's own settings: samples per second, steps."""
    from tune_advisor import knobs
    from tune_advisor.probe import evidence, loop, training
    from tune_advisor.probe.spec import ProbeSpec, Protocol

    out = {"status": "ok", "error": None, "raw": evidence.empty_raw(), "applied": {}, "extra": {}}
    spec = ProbeSpec(id="in-process", workload=str(FIXTURES[name]), settings={}, count_flops=False,
                     protocol=Protocol(**PROTOCOL))
    wl = training.load(spec, lambda phase: None, out)
    spec = ProbeSpec(id="in-process", workload=str(FIXTURES[name]), settings=knobs.full_settings(wl.baseline),
                     count_flops=False, protocol=Protocol(**PROTOCOL))
    loop.train(spec, lambda phase: None, out, None, wl)
    return _per_sample(spec.settings, out["raw"]["step_s"]), len(out["raw"]["step_s"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(FIXTURES)} (default: all)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--in-process", action="store_true", help="both loops in this one process, alternating")
    parser.add_argument("--plain", help=argparse.SUPPRESS)  # the plain loop, in this fresh process
    args = parser.parse_args(argv)
    if args.plain:
        hf = hasattr(_load(args.plain), "build_trainer")
        print(json.dumps((plain_hf if hf else plain_lightning)(args.plain)))
        return 0
    from tune_advisor import environment
    from tune_advisor.analysis import stats

    print(environment.machine_line())
    print("both loops in this one process, alternating" if args.in_process else
          "each loop in a fresh process (the probe: tune-advisor's child)")
    workdir = Path(tempfile.mkdtemp(prefix="framework-fidelity-"))
    worst = 0.0
    for name in args.names or FIXTURES:
        hf = hasattr(_load(name), "build_trainer")
        measure_probe = (lambda: probe_in_process(name)) if args.in_process else (lambda: probe_rate(name, workdir))
        measure_plain = (lambda: (plain_hf if hf else plain_lightning)(name)) if args.in_process else (
            lambda: plain_rate(name))
        ratios = []
        for i in range(args.rounds):
            if i % 2:
                probe, steps = measure_probe()
                plain = measure_plain()
            else:
                plain = measure_plain()
                probe, steps = measure_probe()
            ratios.append(probe / plain["samples_per_s"])
            print(f"{name} round {i + 1}: probe {probe:.1f} samples/s over {steps} steps, plain loop "
                  f"{plain['samples_per_s']:.1f} over {plain['batches']} batches; ratio {ratios[-1]:.3f}", flush=True)
        ratio, low, high = stats.rounds_ratio_interval(ratios)
        worst = max(worst, abs(ratio - 1))
        print(f"{name}: probe / plain loop {ratio:.3f} ({ratio - 1:+.1%}), 95% CI [{low:.3f}, {high:.3f}] over "
              f"{len(ratios)} rounds", flush=True)
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
