"""List the rules, or explain one (tune-advisor rules TA101)."""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.markdown import Markdown
from rich.table import Table

from .. import rules as rules_mod
from ..errors import UsageError
from ..rules import docs
from ._common import handle_errors, out


@handle_errors
def command(
    code: Optional[str] = typer.Argument(None, help="A rule code, e.g. TA101, to explain that rule."),
    select: List[str] = typer.Option([], "--select", help="Only codes starting with these prefixes (TA1,TA4)."),
    ignore: List[str] = typer.Option([], "--ignore", help="Leave out codes starting with these prefixes."),
) -> None:
    """List the rules, or explain one (tune-advisor rules TA101)."""
    if code is not None:
        found = rules_mod.RULES.get(code.strip().upper())
        if found is None:
            raise UsageError(f"no rule {code!r}; valid codes: {', '.join(sorted(rules_mod.RULES))}")
        out.print(Markdown(docs.page(found).split("\n", 1)[1]))  # without the "generated" comment
        return
    # On a narrow terminal the description wraps and the family (implied by the code's hundreds) is left out.
    wide = out.width >= 140
    table = Table(title_justify="left")
    table.add_column("code", no_wrap=True, min_width=5)
    table.add_column("name", no_wrap=True)
    if wide:
        table.add_column("family", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("finds", ratio=1, min_width=20)
    for r in rules_mod.chosen(select, ignore):
        table.add_row(r.code, r.name, *([r.family] if wide else []), r.severity, r.summary)
    out.print(table)
