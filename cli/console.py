"""The command line's consoles and its one error printer.

Bad input ends a command with one line on stderr, `error: <what and where>`, and exit code
2 (a failed sweep: 1); the message is printed as it is, never read as rich markup."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, soft_wrap=True)


def stdout_console(width_when_piped: int) -> Console:
    """A console for tables, as wide as `output_width` says."""
    return Console(width=output_width(width_when_piped))


def output_width(width_when_piped: int) -> int | None:
    """`COLUMNS` when set; else the terminal's width: stdout's (None: rich follows it as it
    changes), or in a pipe the terminal the command runs in (stderr's or stdin's); else, with
    no terminal at all (a file from cron, CI), `width_when_piped` columns. Rich itself
    would take 80 whenever it is given no width and stdout is not a terminal."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return None
    for fd in (2, 0):
        try:
            if os.isatty(fd) and os.get_terminal_size(fd).columns > 0:
                return os.get_terminal_size(fd).columns
        except OSError:
            continue
    return width_when_piped


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: message` and return the Exit to raise (`raise fail(...)`)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)
