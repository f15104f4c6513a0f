"""Plan and run probes over the knobs, recommend the fastest settings, and save results.json."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from .. import api, knobs
from ..planner import compare
from ..probe.spec import Protocol
from ..render.terminal import analysis_summary, probe_line
from . import _common
from ._common import EXIT_INTERRUPTED, command_line, err, handle_errors, out as stdout


def best_so_far(session) -> str:
    """The plan's best settings so far and their gain over the baseline with its 95% CI, as the planner measured
    it: provisional (results.json `best_so_far`) until the confirmation measures it again; '' while the baseline is
    the best."""
    ledger = session.ledger if session is not None else None
    base, best = (ledger.baseline, ledger.best) if ledger is not None else (None, None)
    if base is None or best is None or best.settings == base.settings or not (base.ok and best.ok):
        return ""
    median, low, high = compare.gain(ledger, base, best)
    gain = "gain not measurable yet" if median != median else f"{median:.2f}x [{low:.2f}, {high:.2f}]"
    return f" · provisional: {knobs.describe(best.settings, base.settings)} · {gain}"


class LiveOutput(api.SilentObserver):
    """analyze's live output on stderr: one status line (elapsed of the budget, probes done, the provisional best
    and its gain); `verbose` adds the workload and a line per finished probe; notices about resuming unless `quiet`.
    `show` False (--quiet, --json): no status line either."""

    def __init__(self, file: Path, budget_s: float | None, show: bool, quiet: bool, verbose: bool = False):
        self.file, self.budget_s, self.show, self.quiet, self.verbose = file, budget_s, show, quiet, verbose
        self.started = time.monotonic()
        self.status = err.status("inspecting the workload…") if show else None
        self.baseline, self.session, self.n, self.done = None, None, 0, 0

    def on_start(self, info, session) -> None:
        self.baseline, self.session = info.baseline, session
        if self.show and self.verbose:
            err.print(f"[bold]{self.file}[/]: {info.facts.model_class}, {info.facts.parameters:,} parameters; "
                      f"baseline {knobs.brief(info.baseline)}")
        self._update()

    def on_probe_start(self, probe_id, settings, role) -> None:
        self.n += 1
        self._update(f"probe {self.n} ({role})" if self.verbose else "")

    def on_probe(self, result, session) -> None:
        self.done += 1
        if self.show and self.verbose:
            err.print(probe_line(result, self.baseline), markup=False)
        self._update()

    def on_notice(self, message: str) -> None:
        if not self.quiet:
            err.print(message, markup=False)

    def _update(self, running: str = "") -> None:
        """The one status line: elapsed of the budget, probes done, the provisional best with its gain."""
        if self.status is None:
            return
        elapsed = time.monotonic() - self.started
        budget = f" / {self.budget_s:.0f} s" if self.budget_s is not None else ""
        running = f" · {running}" if running else ""
        done = f"{self.done} probe{'' if self.done == 1 else 's'} done"
        self.status.update(f"{elapsed:.0f} s{budget} · {done}{running}{best_so_far(self.session)}")


def _maps(flag_map: list[str] | None) -> list[str] | None:
    """--map specs (pyproject's [tool.tune-advisor.map] table arrives in the same form: cli/config.py)."""
    return list(flag_map or []) or None


@handle_errors
def command(
    file: Path = typer.Argument(..., help=_common.WORKLOAD_HELP),
    script_args: Optional[list[str]] = typer.Argument(None, metavar="SCRIPT_ARGS",
                                                      help="A script's own arguments, after --: it runs as "
                                                           "`python FILE SCRIPT_ARGS`."),
    flag_map: Optional[list[str]] = typer.Option(None, "--map", help="Set a knob through the script's own flag: "
                                                                     "KNOB=FLAG or KNOB=FLAG:VALUE (e.g. "
                                                                     "batch_size=--batch-size, amp=--precision:bf16); "
                                                                     "repeatable."),
    script_cwd: Optional[Path] = typer.Option(None, help="Run the script in this folder, where its own files "
                                                         "(checkpoints, logs) land [default: a scratch folder per "
                                                         "probe mirroring this one: it reads your files, its own "
                                                         "writes stay there, removed after it]."),
    as_script: Optional[bool] = typer.Option(None, "--script/--workload",
                                             help="Run FILE as a plain training script, or load it as a workload "
                                                  "file, whatever it defines [default: a file with a build_model() "
                                                  "taking no arguments and no __main__ block that trains is a "
                                                  "workload; anything else a script]."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Output folder [default: tune-advisor-report/<stem>]."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    budget: str = typer.Option(f"{api.DEFAULT_BUDGET_S / 60:g}m",
                               help="Wall-time budget of the whole analysis, start to last report written (e.g. 5m, "
                                    "90s)."),
    probe_timeout: str = typer.Option("120s", help="Wall-clock limit of each probe."),
    max_memory: Optional[str] = typer.Option(None, help="Memory budget for the batch ladder (e.g. 8GiB) "
                                                        "[default on CPU: 80% of the memory available]."),
    memory_margin: str = typer.Option("10%", help="Memory the recommended batch must leave free: a share of the "
                                                  "memory (--max-memory, else the GPU's) or a size (e.g. 4GiB); a "
                                                  "batch peaking inside it gives way to the next one down."),
    min_time: float = typer.Option(1.0, help="Measure each probe at least this many seconds after warm-up."),
    min_steps: int = typer.Option(10, help="Measure each probe at least this many steps after warm-up."),
    warmup: int = typer.Option(3, help="Warm-up steps excluded from the timing."),
    seed: int = typer.Option(0, help="Seed for the model, data order and sampling."),
    strategy: str = typer.Option("adaptive", help="adaptive: the most promising knobs first, within the budget; "
                                                  "grid: every combination of the workload's SEARCH values."),
    only_knobs: Optional[list[str]] = typer.Option(None, "--knobs", help="Explore only these knobs (comma-separated "
                                                                         "or repeated, e.g. batch_size,amp) "
                                                                         "[default: every knob that applies]."),
    select: Optional[list[str]] = typer.Option(None, help="Only rules whose code starts with this (e.g. TA1); "
                                                          "repeatable."),
    ignore: Optional[list[str]] = typer.Option(None, help="Skip rules whose code starts with this; repeatable."),
    profile: bool = typer.Option(True, "--profile/--no-profile",
                                 help="Run torch.profiler after the timed steps of the baseline and the recommended "
                                      "probes (top operators, step breakdown, a Perfetto trace)."),
    nproc_per_node: int = typer.Option(1, help="Probe DDP training: torchrun runs N processes per node (one per "
                                               "GPU; gloo on the CPU). batch_size is per process."),
    nnodes: int = typer.Option(1, help="Nodes of a DDP probe; run the same command on every node "
                                       "(needs --rdzv-endpoint)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="HOST:PORT of the torchrun rendezvous for --nnodes > 1."),
    executor: str = typer.Option("local", help="local: probes one at a time on this machine; ray: probes as Ray "
                                               "tasks (one GPU each), independent ones side by side "
                                               "(pip install 'tune-advisor[ray]')."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join with --executor ray (e.g. auto, "
                                                         "ray://head:10001) [default: a local Ray instance]."),
    resume: bool = typer.Option(False, "--resume", help="Continue the interrupted run in the output folder: its "
                                                        "finished probes are reused, not run again (refused when "
                                                        "the workload file, settings or hardware changed)."),
    session_drift: Optional[float] = typer.Option(
        None, help="How far this machine's speed moves from one run to the next, minutes to hours apart (log sd), "
                   "which every throughput figure's interval carries (scaled by 0.043/0.074, so does the range "
                   "given for a later measure of the speedup) [default: 0.074, calibrated on shared cloud "
                   "machines; benchmarks/session_drift.py measures a machine's own]."),
    train_steps: Optional[int] = typer.Option(None, help="How many training steps (batches at the baseline's batch "
                                                         "size) your run takes: torch.compile is recommended only "
                                                         "where its compile time pays off within them [default: "
                                                         "not stated; compile is judged by its speed]."),
    cost_per_hour: Optional[float] = typer.Option(None, help="What an hour of this machine costs (e.g. 2.50): the "
                                                             "reports show the cost of an epoch before and after."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every probe as it finishes, and every "
                                                                 "figure's derivation in the summary."),
    json_out: bool = typer.Option(False, "--json", help="Print results.json to stdout when done."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors (and --json output)."),
) -> None:
    """Plan and run probes over the knobs, recommend the fastest settings, and save results.json."""
    options = api.AnalyzeOptions(
        out=out, device=device, budget=budget, probe_timeout=probe_timeout, max_memory=max_memory,
        memory_margin=memory_margin,
        protocol=Protocol(warmup_steps=warmup, min_steps=min_steps, min_time_s=min_time), seed=seed,
        strategy=strategy,
        only_knobs=[k.strip() for item in only_knobs or [] for k in item.split(",") if k.strip()] or None,
        select=select, ignore=ignore, profile=profile, command=command_line(), nproc_per_node=nproc_per_node,
        nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, executor=executor, ray_address=ray_address, resume=resume,
        script_args=script_args, maps=_maps(flag_map), script_cwd=script_cwd, as_script=as_script,
        session_drift=session_drift, train_steps=train_steps)
    live = LiveOutput(file, options.budget, show=not (quiet or json_out), quiet=quiet)

    def second_ctrl_c_exits(signum, frame):  # the first Ctrl-C stops the probe and saves; a second exits at once
        signal.signal(signal.SIGINT, lambda *_: os._exit(EXIT_INTERRUPTED))  # results.json is written atomically
        raise KeyboardInterrupt

    previous_sigint = signal.getsignal(signal.SIGINT)
    if previous_sigint is signal.default_int_handler:  # not where Ctrl-C is ignored (a background job)
        signal.signal(signal.SIGINT, second_ctrl_c_exits)
    if live.status is not None:
        live.status.start()
    try:
        result = api.analyze(file, options, live)
    except KeyboardInterrupt:  # api.analyze has stopped the probe and saved what finished
        # Exiting now. Python's own handlers revert to the default action while the interpreter shuts down, so
        # a Ctrl-C then would end the process by SIGINT, not 130: only ignoring it covers the way out.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        err.print(f"interrupted: the running probe was stopped; finished probes are kept in "
                  f"{out or api.default_out_dir(file)}/results.json. Run the same command with --resume to "
                  "continue.", markup=False)
        if _common.state.program:  # leave without the interpreter's shutdown, where a late Ctrl-C ended the process
            sys.stdout.flush()  # by SIGINT (-2) instead of 130 in about 1 run of 3 of the kill test
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        if live.status is not None:
            live.status.stop()
        if signal.getsignal(signal.SIGINT) is second_ctrl_c_exits:  # in-process callers (tests) get theirs back
            signal.signal(signal.SIGINT, previous_sigint)
    if json_out:
        print(json.dumps(result.document, indent=1))
    elif not quiet:
        analysis_summary(result, stdout, verbose=verbose, cost_per_hour=cost_per_hour)
