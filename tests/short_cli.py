"""The CLI as the in-process tests run it, for tests that must run it as a process of its own (signals, kills):
`python tests/short_cli.py analyze …`. Its confirmation is `shorten_confirmation`'s, like every analysis in the
tests' own process (conftest `short_confirmation`); everything else is the installed `tune-advisor`."""

from __future__ import annotations

from typing import Any, Callable


def shorten_confirmation(setattr_: Callable[[Any, str, Any], None]) -> None:
    """The confirmation at most CONFIRM_ROUNDS rounds of any kind (where its precision would ask more), not spread
    over a fifth of the budget, its probes forked from the long-lived zygotes, without the runs alone after the
    rounds (the figures then come from the plan's own runs alone): end-to-end tests check what an analysis decides
    and writes, and on tiny workloads the default confirmation was most of their time (a 16-round one, 34 probes,
    took 103 s of the Ray grid test's 112; the kill-and-resume test's resumed run, a fifth of its 2-minute budget;
    the Trainer test's confirmation, 10 of its 12 probes, 31 s of its 50). How long a confirmation goes on, and its
    runs alone, are tested with fakes (tests/unit/test_planner.py); new parents in tests/integration/test_lockstep.py
    and test_probe_statuses.py."""
    from tune_advisor.planner import confirm

    setattr_(confirm, "CONFIRM_FRESH_PARENTS", False)
    setattr_(confirm, "CONFIRM_SPAN_SHARE", 0.0)
    setattr_(confirm, "CONFIRM_MAX_ROUNDS", confirm.CONFIRM_ROUNDS)
    setattr_(confirm, "CONFIRM_MAX_ROUNDS_IN_TURN", confirm.CONFIRM_ROUNDS)
    setattr_(confirm, "CONFIRM_ALONE", 0)


if __name__ == "__main__":
    shorten_confirmation(setattr)
    from tune_advisor.cli import main

    main()  # as `python -m tune_advisor`: the process is the CLI's to end
