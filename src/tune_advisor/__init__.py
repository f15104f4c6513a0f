"""tune-advisor: measure which training settings make a PyTorch model train fastest on this machine."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Analysis", "AnalyzeOptions", "analyze", "__version__"]


def __getattr__(name: str):
    # The API pulls in numpy and the planner; `import tune_advisor` alone stays cheap for the CLI and the child.
    if name in ("analyze", "Analysis", "AnalyzeOptions"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
