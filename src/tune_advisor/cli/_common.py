"""What every command shares: error handling with exit codes, output streams, settings parsing."""

from __future__ import annotations

import functools
import sys
import traceback
from dataclasses import dataclass

import typer
from rich.console import Console
from rich.markup import escape  # messages quote user text and commands like pip install 'pkg[extra]'

from ..errors import TuneAdvisorError, UsageError

EXIT_INTERRUPTED = 130
# The workload argument's help, one text for every command that takes a workload file.
WORKLOAD_HELP = ("The workload file: it defines build_model() and build_dataset(), or build_trainer() returning a "
                 "Hugging Face Trainer, or build_module() returning a LightningModule (docs/frameworks.md); a file "
                 "without one taking no arguments, or whose __main__ block trains, runs as a plain training script "
                 "(docs/script-mode.md).")
# probe, baseline and gate measure workload files: --workload loads one that looks like a plain script as one.
AS_WORKLOAD_HELP = ("Load FILE as a workload file even where it looks like a plain training script (an entry point "
                    "taking arguments, or a __main__ block that trains).")


@dataclass
class State:
    debug: bool = False
    program: bool = False  # run as the `tune-advisor` program (main()), not inside a caller's process


state = State()
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def handle_errors(fn):
    """Turn TuneAdvisorError into its message and exit code; Ctrl-C into exit 130. Tracebacks only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TuneAdvisorError as exc:
            if state.debug:
                err.print(traceback.format_exc(), markup=False)
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted: the running probe was stopped; finished probes are in results.json")
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def parse_sets(pairs: list[str]) -> dict[str, str]:
    """['batch_size=64', 'amp=bf16'] -> {'batch_size': '64', 'amp': 'bf16'} (values are parsed by the knobs)."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set {pair!r}: expected KNOB=VALUE, e.g. --set batch_size=64")
        settings[name.strip()] = value.strip()
    return settings


def command_line() -> list[str]:
    """This run's command as a user would type it again (`python -m tune_advisor` leaves a __main__.py path)."""
    return ["tune-advisor", *sys.argv[1:]]
