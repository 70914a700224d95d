"""What every `scalelab results` command does first: bring the sweep's tables up to date
by the results door's rule (analysis/door.py; after `scalelab eval` wrote scores:
`resynced`), and end
any failure of the command's body in one line and exit code 2: ResultsError/ScalingError
as their message, anything else (a corrupt Parquet file's ArrowInvalid, a numpy error) as
`results CMD failed: Type: message`, with the traceback above it when SCALELAB_DEBUG=1."""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import TypeVar

from typer.exceptions import TyperException

from scalelab.cli.console import err, fail

T = TypeVar("T")
DEBUG = "SCALELAB_DEBUG"  # set to 1: an unexpected failure prints its traceback too


def synced(sweep: str, uri: str | None) -> None:
    """Bring the sweep's tables up to date before a command answers, by the results door's
    one rule (analysis/door.py), printing what a user should hear of it: a sync that read
    new trials, or why the tables may be old."""
    from scalelab.analysis import door

    door.tell(door.up_to_date(sweep, uri), say)


def say(line: str) -> None:
    """A line about the tables, on stderr (what the command answers goes to stdout)."""
    err.print(line, highlight=False, soft_wrap=True)


def resynced(sweep: str, uri: str | None = None) -> str | None:
    """After a command wrote what the rows read (`scalelab eval`'s scores): the sync's line
    for a sweep synced before, so its tables have them at once; None for a sweep never
    synced (its first results command syncs it)."""
    from scalelab.analysis import door
    from scalelab.analysis.results import tables

    if not any(tables.partition_dir(tables.TRIALS, sweep).glob("*.parquet")):
        return None
    return door.up_to_date(sweep, uri).line


def guard(fn: Callable[[], T]) -> T:
    """Run a command body; any failure -> exit 2 with one line (module doc). Exits the
    body asks for itself (`raise fail(...)`, typer's) pass through unchanged."""
    import typer

    from scalelab.analysis.results.tables import ResultsError
    from scalelab.analysis.scaling import ScalingError

    try:
        return fn()
    except (ResultsError, ScalingError) as e:
        raise fail(str(e)) from None
    except (typer.Exit, typer.Abort, TyperException):
        raise
    except Exception as e:  # whatever it is: one line, unless debugging
        if _debugging():
            err.print(traceback.format_exc(), highlight=False, markup=False, end="")
        raise fail(f"{_command(fn)} failed: {_one_line(e)}") from None


def _command(fn: Callable[[], object]) -> str:
    """`results fit`: the command whose body `fn` is (a function or lambda defined in
    `fit_cmd`), by the `NAME_cmd` convention of the results commands."""
    outer = fn.__qualname__.split(".")[0]
    return f"results {outer.removesuffix('_cmd')}" if outer.endswith("_cmd") else "results"


def _one_line(e: BaseException) -> str:
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    hint = "" if _debugging() else f" (set {DEBUG}=1 for the traceback)"
    return f"{type(e).__name__}: {first.strip()}{hint}" if first else type(e).__name__ + hint


def _debugging() -> bool:
    return os.environ.get(DEBUG, "") not in ("", "0")
