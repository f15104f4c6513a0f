"""The Python API: what the CLI, the gate and the benchmarks call.

options.py     AnalyzeOptions: analyze's options, parsed and checked once; durations and memory sizes
inspection.py  inspect_workload: the workload file loaded in a child process; the device's facts
observer.py    AnalysisObserver: what analyze tells its caller while it runs (the CLI's live output)
facade.py      analyze: inspect -> record -> backend -> plan -> rules -> reports, and its steps
single.py      probe: one configuration measured once (`tune-advisor probe`)
"""

from __future__ import annotations

from .facade import Analysis, analyze, default_out_dir
from .inspection import INSPECT_TIMEOUT_S, Inspection, device_facts, inspect_workload
from .observer import AnalysisObserver, SilentObserver
from .options import DEFAULT_BUDGET_S, DEFAULT_PROBE_TIMEOUT_S, AnalyzeOptions, parse_bytes, parse_duration
from .single import probe

__all__ = ["Analysis", "AnalysisObserver", "AnalyzeOptions", "DEFAULT_BUDGET_S", "DEFAULT_PROBE_TIMEOUT_S",
           "INSPECT_TIMEOUT_S", "Inspection", "SilentObserver", "analyze", "default_out_dir", "device_facts",
           "inspect_workload", "parse_bytes", "parse_duration", "probe"]
