"""Tables wider than the screen are paged or folded, never crushed into one-letter columns.

On a terminal, a table wider than it goes to a pager at its natural width (`less -S`:
scroll sideways; `$PAGER` when set); otherwise (a pipe, a file) its columns are folded:
printed as several tables, one under the other, each as wide as the screen at most and
each starting with the table's first column (the trial id), so every row can be followed.
A table that fits is printed as it is.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shlex
import shutil
import subprocess

from rich.console import Console
from rich.pager import Pager
from rich.table import Table

UNBOUNDED = 100_000  # columns: a width to measure a table's natural width against
DEFAULT_PAGER = "less -S -R"  # chop long lines (scroll sideways), keep the colours


class SidewaysPager(Pager):
    """$PAGER, else `less -S -R`."""

    def __init__(self, command: str | None = None) -> None:
        self.command = command or os.environ.get("PAGER") or DEFAULT_PAGER

    def available(self) -> bool:
        args = shlex.split(self.command)
        return bool(args) and shutil.which(args[0]) is not None

    def show(self, content: str) -> None:
        subprocess.run(shlex.split(self.command), input=content, text=True, check=False)


def print_table(console: Console, table: Table, pager: Pager | None = None) -> None:
    """Print `table` whole: as it is when it fits, else paged (a terminal) or folded."""
    natural = console.measure(table, options=console.options.update_width(UNBOUNDED)).maximum
    if natural <= console.width:
        console.print(table)
        return
    pager = pager or SidewaysPager()
    usable = not isinstance(pager, SidewaysPager) or pager.available()
    if console.is_terminal and usable:  # rendered apart: a console caps a print's width
        page = Console(
            file=io.StringIO(), width=natural, force_terminal=True,
            color_system=console.color_system,  # type: ignore[arg-type]
        )  # fmt: skip
        page.print(table)
        pager.show(page.file.getvalue())  # type: ignore[attr-defined]
        return
    for part in fold(console, table):
        console.print(part)
    if table.caption:  # under the parts, at the screen's width: the last part may be narrow
        console.print(table.caption, justify="center", style="table.caption")


def fold(console: Console, table: Table) -> list[Table]:
    """`table`'s columns in groups that each fit the console's width, the first column
    repeated at the left of each; the title on the first part (print_table prints the
    caption under them all)."""
    columns = table.columns
    widths = [_natural_width(console, column) for column in columns]
    borders = 1 if table.show_edge else -1
    groups: list[list[int]] = []
    used = 0
    for i in range(1, len(columns)):
        cost = widths[i] + 3  # padding 2, border 1
        if not groups or used + cost > console.width:
            groups.append([0])
            used = widths[0] + 3 + borders
        groups[-1].append(i)
        used += cost
    groups = groups or [[0]]
    parts = []
    for n, group in enumerate(groups):
        part = Table(
            title=table.title if n == 0 else None,
            box=table.box,
            show_edge=table.show_edge,
            show_lines=table.show_lines,
            title_justify=table.title_justify,
        )
        part.columns = [dataclasses.replace(columns[i], _cells=[]) for i in group]
        cells = [list(columns[i].cells) for i in group]
        for row in zip(*cells, strict=True):
            part.add_row(*row)
        parts.append(part)
    return parts


def _natural_width(console: Console, column: object) -> int:
    """The widest of a column's header and cells, on one line."""
    items = [column.header, *column.cells]  # type: ignore[attr-defined]
    wide = console.options.update_width(UNBOUNDED)
    return max(console.measure(item, options=wide).maximum for item in items)
