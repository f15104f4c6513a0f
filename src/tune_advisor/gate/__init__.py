"""The CI performance gate (SPEC §8): re-measure, compare with a reference, and fail only on a real regression.

    checks.py    checks parsed from strings like "throughput:5%"; each judges the evidence on its own
    verdict.py   the statistics: rounds of raw step samples -> ratios with bootstrap CIs
    baseline.py  perf/baseline.json: writing, reading with clear errors, comparing the machines
    measure.py   which settings, rounds of probes (interleaved with a git ref's version when asked)
    run.py       record_baseline() and run_gate(): what the CLI and the pytest plugin call
    report.py    terminal, Markdown and JUnit outputs

Exit codes: 0 pass, 1 regression, 2 unusable input, 3 baseline from other hardware (refused).
"""

from __future__ import annotations

from .baseline import EXIT_OTHER_HARDWARE
from .checks import parse_check, parse_checks
from .run import (DEFAULT_CHECKS, DEFAULT_MAX_ROUNDS, DEFAULT_ROUNDS, EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE,
                  GateResult, record_baseline, run_gate)

__all__ = ["DEFAULT_CHECKS", "DEFAULT_MAX_ROUNDS", "DEFAULT_ROUNDS", "EXIT_OTHER_HARDWARE", "EXIT_PASS",
           "EXIT_REGRESSION", "EXIT_UNUSABLE", "GateResult", "parse_check", "parse_checks", "record_baseline",
           "run_gate"]
