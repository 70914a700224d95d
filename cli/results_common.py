"""What every `scalelab results` command does first: sync a sweep never synced, and turn
ResultsError/ScalingError into one line and exit code 2."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from scalelab.cli.console import err, fail

T = TypeVar("T")


def synced(sweep: str, uri: str | None) -> None:
    """Sync first when the sweep has never been synced or imported (queries then just
    work)."""
    from scalelab.analysis.results import store, sync

    if store.read_table(store.TRIALS, sweep) is None:
        err.print(str(sync(sweep, uri)), highlight=False)


def guard(fn: Callable[[], T]) -> T:
    """Run a command body; ResultsError/ScalingError -> exit 2 with one line."""
    from scalelab.analysis.results.store import ResultsError
    from scalelab.analysis.scaling import ScalingError

    try:
        return fn()
    except (ResultsError, ScalingError) as e:
        raise fail(str(e)) from None
