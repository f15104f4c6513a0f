"""Does a probe of a framework workload read what the framework's own training loop does? (issue 23: within 5%.)

For fixtures/hf_trainer.py (a transformers Trainer) and fixtures/lightning_module.py (a LightningModule), at the
file's own settings: a probe (tune-advisor's child, the adapter's training step) and the framework's loop
(`trainer.train()` / `Trainer.fit()`, in a fresh process, timed by a callback after each optimizer step, the first
WARM_STEPS left out) run in rounds of one each, who goes first alternating. Both are given in samples (sequences,
images) per second. Prints each round and the median of the rounds' ratios with the 95% CI of their geometric
mean: a fresh process's throughput varies by itself, so a paired ratio is the figure. Prints the CPU model and
flags first. About 3 minutes on 2 cores.

--in-process: the same comparison inside this one process, alternating: the framework's loop and the probe's
training loop (probe/training.py, run here rather than in a child). It tells a gap in the step (what the adapter
runs per step) from one between processes.

--fresh-loop: the probe's training loop (as --in-process) in a fresh process of its own, against the framework's loop
in another: no tune-advisor child, runner or zygote. It tells a gap from the child's process from one that any fresh
process shows. --three-way: all three in each round (the child, the loop in a fresh process, the framework's loop),
their order rotating, so that the two probes are compared in the same moments of the machine.

    python benchmarks/framework_fidelity.py [--rounds 5] [--in-process | --fresh-loop | --three-way] [NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = {"hf_trainer": "hf", "lightning_module": "lightning"}
WARM_STEPS = 3  # optimizer steps left out at the start of the framework's loop (compiles, allocator, first batch)
MEASURED_STEPS = 16  # optimizer steps timed


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "fixtures" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_loop(name: str) -> dict:
    """The Trainer's own train(): samples per second over optimizer steps, per_device batch x accumulation each."""
    from transformers import TrainerCallback

    trainer = _load(name).build_trainer()
    args = trainer.args
    args.max_steps = WARM_STEPS + MEASURED_STEPS
    args.disable_tqdm = True  # no save or log falls due within so few steps (their defaults are every 500)
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
    timed = ends[WARM_STEPS - 1:]
    return {"samples_per_s": per_step * (len(timed) - 1) / (timed[-1] - timed[0]), "steps": len(timed) - 1,
            "samples_per_step": per_step}


def lightning_loop(name: str) -> dict:
    """Trainer.fit() with the file's TRAINER_ARGS: samples per second over optimizer steps."""
    import lightning as L

    module = _load(name)
    model = module.build_module()
    ends: list[float] = []
    sizes: list[int] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ends.append(time.perf_counter())
            sizes.append(len(batch[0]))

    accumulate = int(module.TRAINER_ARGS.get("accumulate_grad_batches", 1))
    trainer = L.Trainer(**{**module.TRAINER_ARGS, "max_epochs": None}, max_steps=WARM_STEPS + MEASURED_STEPS,
                        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock()],
                        default_root_dir=tempfile.mkdtemp(prefix="lightning-fidelity-"))
    trainer.fit(model)
    first = WARM_STEPS * accumulate - 1  # the end of the last warm-up step's last micro-batch
    return {"samples_per_s": sum(sizes[first + 1:]) / (ends[-1] - ends[first]), "steps": MEASURED_STEPS,
            "samples_per_step": sizes[-1] * accumulate}


def framework_rate(name: str, mode: str = "--loop") -> dict:
    """`mode` --loop: the framework's loop in a fresh process; --probe-loop: the probe's training loop in one."""
    out = subprocess.run([sys.executable, __file__, mode, name], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe_rate(name: str, workdir: Path) -> tuple[float, int]:
    """A probe at the file's own settings: samples per second (steps of batch_size samples; the probe counts
    tokens for a batch with an attention_mask, so its steps are counted here instead)."""
    from tune_advisor import api
    from tune_advisor.probe.spec import Protocol

    _, result = api.probe(ROOT / "fixtures" / f"{name}.py", device="cpu", workdir=workdir,
                          protocol=Protocol(warmup_steps=3, min_steps=20, min_time_s=2.0, max_time_s=15.0))
    if not result.ok:
        raise SystemExit(f"{name}: the probe failed: {result.status.value}: {result.error}")
    return result.settings["batch_size"] * len(result.step_s) / sum(result.step_s), len(result.step_s)


def probe_in_process(name: str) -> tuple[float, int]:
    """probe/training.py's loop in this process at the file's own settings: samples per second, steps."""
    from tune_advisor import knobs, workload
    from tune_advisor.probe import evidence, training
    from tune_advisor.probe.spec import ProbeSpec, Protocol

    path = ROOT / "fixtures" / f"{name}.py"
    settings = knobs.full_settings(workload.load(path).baseline)
    spec = ProbeSpec(id="in-process", workload=str(path), settings=settings, count_flops=False,
                     protocol=Protocol(warmup_steps=3, min_steps=20, min_time_s=2.0, max_time_s=15.0))
    out = {"status": "ok", "error": None, "raw": evidence.empty_raw(), "applied": {}, "extra": {}}
    training.train(spec, lambda phase: None, out)
    steps = out["raw"]["step_s"]
    return settings["batch_size"] * len(steps) / sum(steps), len(steps)


def measurers(name: str, where: str, workdir: Path):
    """(probe, framework loop): functions measuring each. `where`: "in-process" (both here), "fresh-loop" (each
    in a fresh process, the probe's loop without its child) or "child" (the probe a tune-advisor child)."""
    if where == "in-process":
        loop = hf_loop if FIXTURES[name] == "hf" else lightning_loop
        return (lambda: probe_in_process(name)), (lambda: loop(name))
    if where == "fresh-loop":
        def fresh_probe() -> tuple[float, int]:
            got = framework_rate(name, "--probe-loop")
            return got["samples_per_s"], got["steps"]
        return fresh_probe, (lambda: framework_rate(name))
    return (lambda: probe_rate(name, workdir)), (lambda: framework_rate(name))


def three_way(name: str, rounds: int, workdir: Path) -> float:
    """Each round measures the probe as a child, the probe's loop in a fresh process and the framework's loop, in
    an order rotating by one each round. Prints the ratios of each round and their medians with 95% CIs; returns
    child / framework loop."""
    from tune_advisor.analysis import stats

    child, _ = measurers(name, "child", workdir)
    fresh, loop = measurers(name, "fresh-loop", workdir)
    measure = {"child": lambda: child()[0], "fresh loop": lambda: fresh()[0],
               "framework": lambda: loop()["samples_per_s"]}
    pairs = {("child", "fresh loop"): [], ("fresh loop", "framework"): [], ("child", "framework"): []}
    names = list(measure)
    for i in range(rounds):
        order = names[i % 3:] + names[:i % 3]
        got = {n: measure[n]() for n in order}
        for (a, b), ratios in pairs.items():
            ratios.append(got[a] / got[b])
        print(f"{name} round {i + 1} ({', '.join(order)}): " + ", ".join(f"{n} {got[n]:.1f}" for n in names)
              + " samples/s; " + ", ".join(f"{a} / {b} {r[-1]:.3f}" for (a, b), r in pairs.items()), flush=True)
    for (a, b), ratios in pairs.items():
        ratio, low, high = stats.rounds_ratio_interval(ratios)
        print(f"{name}: {a} / {b} {ratio:.3f}, 95% CI [{low:.3f}, {high:.3f}] over {rounds} rounds", flush=True)
    return stats.rounds_ratio_interval(pairs[("child", "framework")])[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(FIXTURES)} (default: both)")
    parser.add_argument("--rounds", type=int, default=5)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--in-process", action="store_true", help="both loops in this one process, alternating")
    where.add_argument("--fresh-loop", action="store_true",
                       help="the probe's training loop in a fresh process, not a tune-advisor child")
    where.add_argument("--three-way", action="store_true",
                       help="the child, the fresh-process loop and the framework's loop in each round")
    parser.add_argument("--loop", help=argparse.SUPPRESS)  # the framework's loop, in this fresh process
    parser.add_argument("--probe-loop", help=argparse.SUPPRESS)  # the probe's training loop, in this fresh process
    args = parser.parse_args(argv)
    if args.loop:
        print(json.dumps((hf_loop if FIXTURES[args.loop] == "hf" else lightning_loop)(args.loop)))
        return 0
    if args.probe_loop:
        rate, steps = probe_in_process(args.probe_loop)
        print(json.dumps({"samples_per_s": rate, "steps": steps}))
        return 0
    where = ("in-process" if args.in_process else "fresh-loop" if args.fresh_loop else
             "three-way" if args.three_way else "child")
    from tune_advisor import environment
    from tune_advisor.analysis import stats

    print(environment.machine_line())
    print({"in-process": "both loops in this one process, alternating",
           "fresh-loop": "each loop in a fresh process (the probe: its training loop, no tune-advisor child)",
           "child": "each loop in a fresh process (the probe: tune-advisor's child)",
           "three-way": "the probe as a child, its loop in a fresh process, the framework's loop: each round all three"}
          [where])
    workdir = Path(tempfile.mkdtemp(prefix="framework-fidelity-"))
    worst = 0.0
    if where == "three-way":
        for name in args.names or FIXTURES:
            worst = max(worst, abs(three_way(name, args.rounds, workdir) - 1))
        return 0 if worst <= 0.05 else 1
    for name in args.names or FIXTURES:
        ratios = []
        measure_probe, measure_loop = measurers(name, where, workdir)
        for i in range(args.rounds):
            if i % 2:
                probe, steps = measure_probe()
                loop = measure_loop()
            else:
                loop = measure_loop()
                probe, steps = measure_probe()
            ratios.append(probe / loop["samples_per_s"])
            print(f"{name} round {i + 1}: probe {probe:.1f} samples/s over {steps} steps, framework loop "
                  f"{loop['samples_per_s']:.1f} over {loop['steps']} optimizer steps of {loop['samples_per_step']} "
                  f"samples; ratio {ratios[-1]:.3f}", flush=True)
        ratio, low, high = stats.rounds_ratio_interval(ratios)
        worst = max(worst, abs(ratio - 1))
        print(f"{name}: probe / framework loop {ratio:.3f} ({ratio - 1:+.1%}), 95% CI [{low:.3f}, {high:.3f}] over "
              f"{len(ratios)} rounds", flush=True)
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
