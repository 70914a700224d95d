"""What every `scalelab results` command does first: sync a sweep never synced (a command
that writes what the rows read syncs a synced sweep again: `resynced`), and end
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
    """Sync first when the sweep has never been synced or imported (queries then just
    work)."""
    from scalelab.analysis.results import sync, tables

    if tables.read_table(tables.TRIALS, sweep) is None:
        err.print(str(sync(sweep, uri)), highlight=False)


def resynced(sweep: str, uri: str | None = None) -> str | None:
    """Sync again a sweep synced before, after a command wrote what its rows read (`scalelab
    eval`'s scores): every results command reads the table, and none of them searches MLflow
    for news itself. A sweep never synced is left to the first results command (`synced`).
    The sync's line, or None when there was none."""
    from scalelab.analysis.results import sync, tables

    if not any(tables.partition_dir(tables.TRIALS, sweep).glob("*.parquet")):
        return None
    return str(sync(sweep, uri))


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
