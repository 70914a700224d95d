"""Helpers of the input fault tests: run the real CLI in this process, count the runs in
the tracking store, bound a call's time, and a job that fails the way a bad input does."""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner, Result
from typer.main import get_command

from scalelab.cli.main import app

# typer's CliRunner builds the click command on every call (~25 ms); build it once
command = get_command(app)
runner = CliRunner()
REFUSED = " (invalid sweep, nothing submitted)"


def scalelab(home: Path, *args: object) -> Result:
    """`scalelab ARGS` in this process, with its work directory (and sqlite store) at home."""
    env = {"SCALELAB_HOME": str(home), "MLFLOW_TRACKING_URI": None}
    return runner.invoke(command, [str(a) for a in args], env=env)


def runs_in(home: Path) -> int:
    """MLflow runs in the home's sqlite store (0 when the store was never created)."""
    db = home / "mlflow.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("select name from sqlite_master")}
        return con.execute("select count(*) from runs").fetchone()[0] if "runs" in tables else 0


def problem_lines(result: Result) -> list[str]:
    """The problems of a clean refusal (exit 2, no traceback), one per line."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 2, result.output[-3000:]
    assert "Traceback" not in result.output
    lines = result.stderr.rstrip("\n").splitlines()
    assert lines and lines[0].startswith("error: "), result.stderr
    if lines[0] == "error: invalid sweep, nothing submitted:":
        return lines[1:]
    assert len(lines) == 1 and lines[0].endswith(REFUSED), result.stderr
    return [lines[0].removeprefix("error: ").removesuffix(REFUSED)]


def blocker_lines(result: Result) -> list[str]:
    """The blockers (data not here) of a submit's clean refusal (exit 2, no traceback)."""
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output[-3000:]
    lines = result.stderr.rstrip("\n").splitlines()
    if len(lines) == 1:
        assert lines[0].startswith("error: ") and lines[0].endswith(" (nothing submitted)")
        return [lines[0].removeprefix("error: ").removesuffix(" (nothing submitted)")]
    assert lines[0].startswith("error: ") and lines[0].endswith(
        ": its data is not here, nothing submitted:"
    ), result.stderr
    return lines[1:]


def one_line_error(result: Result) -> str:
    """The single problem of a clean refusal (exit 2, one line, no traceback)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 2, result.output[-3000:]
    assert "Traceback" not in result.output
    lines = result.stderr.rstrip("\n").splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0].removeprefix("error: ").removesuffix(REFUSED)


def answered(result: Result, shown: str, seconds: float, limit_s: float) -> bool:
    """A fuzz case's answer, accepted (True) or refused with exit 2 (False); AssertionError
    on a traceback, an exception other than an exit, or an answer slower than `limit_s`."""
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{shown}: {result.exception!r}"
    )
    assert "Traceback" not in result.output, shown
    assert seconds < limit_s, f"{shown}: {seconds:.1f} s"
    if result.exit_code == 0:
        return True
    assert result.exit_code == 2, f"{shown}: exit {result.exit_code}: {result.output[-500:]}"
    return False


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread if the block runs longer than `seconds`:
    a hang becomes a failing test instead of a stuck suite."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def fails_like_bad_input(job: object, run_id: str | None = None) -> None:
    """A job function (`--job faults.input_cli:fails_like_bad_input`) that stops the way the
    training job stops on input it cannot use."""
    raise ValueError(f"data.source of trial {job.trial_id} vanished before it ran")
