"""The command line's consoles and its one error printer.

Bad input ends a command with one line on stderr, `error: <what and where>`, and exit code
2 (a failed sweep: 1); the message is printed as it is, never read as rich markup."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, soft_wrap=True)


def stdout_console(width_when_piped: int) -> Console:
    """A console for tables: the terminal's width, or `width_when_piped` columns in a pipe
    or a file (a plan or a trials table then stays one row per trial)."""
    return Console(width=None if sys.stdout.isatty() else width_when_piped)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `error: message` and return the Exit to raise (`raise fail(...)`)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)
