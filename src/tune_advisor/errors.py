"""Errors that reach the user: each carries the exit code the CLI returns and a message written for people."""

from __future__ import annotations


class TuneAdvisorError(Exception):
    """A failure the user can act on. The CLI prints `str(self)` (no traceback unless --debug) and exits."""

    exit_code = 2


class UsageError(TuneAdvisorError):
    """Bad command-line input: an unknown option value, an unwritable folder, ..."""


class WorkloadError(TuneAdvisorError):
    """The workload file cannot be used. Message: `file[:line]: what went wrong. What to do.`"""

    def __init__(self, path: str, cause: str, fix: str = "", line: int | None = None):
        self.path, self.cause, self.fix, self.line = path, cause, fix, line
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {cause}" + (f"\n  fix: {fix}" if fix else ""))
