"""Regenerate the example reports: `tune-advisor analyze` on each fixtures/*.py into reports/<fixture>/.

    python reports/generate.py                      # every fixture, 5 minutes each
    python reports/generate.py --budget 2m cnn      # one fixture, a smaller budget
    python reports/generate.py --budget 2m train_cnn  # the plain script fixtures/scripts/train_cnn.py (script mode)

Each run writes results.json; the reports are then re-rendered from it with `tune-advisor report`, so the folder
always holds report.html and report.md of the current renderers. Probes are timed: run this on an idle machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"  # fixtures/bad/ holds broken workloads: not examples
REPORTS = ROOT / "reports"

# Plain training scripts (script mode): their path, then analyze's options and the script's own arguments (after --).
SCRIPTS = {
    "train_cnn": ("fixtures/scripts/train_cnn.py",
                  ["--map", "batch_size=--batch-size", "--map", "num_workers=--workers", "--map",
                   "amp=--precision:bf16"],
                  ["--epochs", "5", "--lr", "3e-4"]),
    # Code as people write it (issue 59), from the integration tests' workloads: a script naming its helpers
    # build_model(args) and collate_fn; a nanoGPT-style one run from its folder (exec of configurator.py, data/ read
    # by relative path, --key=value flags, no DataLoader); Hydra-style key=value overrides; one written for torchrun.
    "script_helper_names": ("tests/workloads/scripts/helper_names.py", [], ["--epochs", "200"]),
    "script_configurator": ("tests/workloads/scripts/configurator_style/train.py",
                            ["--script-cwd", "tests/workloads/scripts/configurator_style",
                             "--map", "batch_size=--batch_size="],
                            ["config/tiny.py", "--batch_size=12"]),
    "script_hydra": ("tests/workloads/scripts/hydra_style.py", ["--map", "batch_size=training.batch_size="],
                     ["training.epochs=200", "training.batch_size=8"]),
    "script_torchrun": ("tests/workloads/scripts/ddp_script.py",
                        ["--nproc-per-node", "2", "--map", "batch_size=--batch-size"], ["--steps", "100000"]),
}
# Frameworks' objects as written (issue 59): a LightningModule with manual optimization and two optimizers, one
# reading self.trainer with a per-step schedule, a Trainer subclass with its own compute_loss.
WORKLOADS = {
    "lightning_gan": "tests/workloads/tiny_gan.py",
    "lightning_scheduled": "tests/workloads/tiny_scheduled.py",
    "hf_compute_loss": "tests/workloads/tiny_compute_loss.py",
}


def fixtures() -> list[str]:
    return sorted([*(p.stem for p in FIXTURES.glob("*.py")), *SCRIPTS, *WORKLOADS])


def tune_advisor(*args: str) -> int:
    command = [sys.executable, "-m", "tune_advisor", *args]
    print("$ tune-advisor", " ".join(args), flush=True)
    return subprocess.run(command, cwd=ROOT).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="FIXTURE", help=f"fixtures to run (default: all of {fixtures()})")
    parser.add_argument("--budget", default="5m", help="wall-time budget of each analysis (default: 5m)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(fixtures()))
    if unknown:
        parser.error(f"unknown fixture(s) {', '.join(unknown)}; choose from {', '.join(fixtures())}")
    failed = []
    for name in args.names or fixtures():
        out = REPORTS / name
        started = time.monotonic()
        # Paths relative to the repository, so the committed results.json records a command anyone can re-run.
        path, options, script_args = SCRIPTS.get(name, (WORKLOADS.get(name, f"fixtures/{name}.py"), [], []))
        options = [*options, *(["--", *script_args] if script_args else [])]
        code = tune_advisor("analyze", path, "-o", f"reports/{name}", "--budget", args.budget,
                            "--device", args.device, "--quiet", *options)
        if (out / "results.json").exists():  # also after a failed or interrupted run: its partial results
            code = tune_advisor("report", f"reports/{name}/results.json", "--quiet") or code
        print(f"{name}: exit {code} in {time.monotonic() - started:.0f} s", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
