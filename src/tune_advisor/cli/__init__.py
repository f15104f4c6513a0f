"""The `tune-advisor` command line: one module per command, registered explicitly below."""

from __future__ import annotations

import sys

import typer

from ..errors import UsageError
from . import analyze, baseline, compare, config, env, gate, probe, report, rules
from ._common import err, state

app = typer.Typer(
    help="Measure which training settings make a PyTorch model train fastest on this machine.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)


@app.callback()
def _root(ctx: typer.Context,
          debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    state.debug = debug
    try:
        ctx.default_map = {**config.default_map(), **(ctx.default_map or {})}
    except UsageError as exc:
        err.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(exc.exit_code) from None


app.command("analyze", help=analyze.__doc__)(analyze.command)
app.command("probe", help=probe.__doc__)(probe.command)
app.command("env", help=env.__doc__)(env.command)
app.command("rules", help=rules.__doc__)(rules.command)
app.command("report", help=report.__doc__)(report.command)
app.command("compare", help=compare.__doc__)(compare.command)
app.command("gate", help=gate.__doc__)(gate.command)
app.command("baseline", help=baseline.__doc__)(baseline.command)


def main() -> None:
    state.program = True  # the process is ours to end (not a test's CliRunner)
    sys.exit(app())
