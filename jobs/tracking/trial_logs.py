"""What a trial printed, kept in its folder and attached to its MLflow run, whatever the
backend: `trials/<trial_id>/logs/trial.log` gets every attempt's stdout and stderr (file
descriptors 1 and 2, so DeepSpeed's, torch's and child processes' output too), after a
header line per attempt; a failed attempt also leaves its Python traceback in
`logs/traceback.txt`. That is rank 0's log: in a trial of several ranks, rank r > 0 writes
`logs/rank<r>.log` (and `traceback-rank<r>.txt`), whether the ranks are this machine's
child processes (jobs/launch.py) or a SLURM job's tasks, each of which runs `captured`
itself: 64 tasks appending to one file on a shared filesystem interleave and can lose
lines. When the attempt ends, rank 0 attaches `job.json` and `logs/` to the run as
artifacts, once, so the MLflow UI shows them on the trial's Artifacts tab (a SLURM task of
another rank still running then has its log attached as far as it got).
"""

from __future__ import annotations

import codecs
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from scalelab.contract.workdir import JOB_FILE, LOGS_DIR, TRACEBACK_FILE, trial_dir, trial_log
from scalelab.jobs.environ import scoped_environ
from scalelab.jobs.training import slurm_task


def launcher_rank() -> int:
    """This process's rank in its trial as its launcher set it, before any process group
    exists (the variables jobs/training/distributed.py reads): RANK, a SLURM task's
    SLURM_PROCID (over a RANK the task inherited from the submitting shell), else 0."""
    env = os.environ
    if slurm_task.rank_from_launcher(env):
        return int(env["RANK"])
    if slurm_task.in_task(env):
        return int(env["SLURM_PROCID"])
    return 0


def open_log(trial_id: str, rank: int, run_id: str | None) -> BinaryIO:
    """Rank `rank`'s log of the trial, opened for appending after this attempt's header."""
    log = trial_log(trial_id, rank)
    log.parent.mkdir(parents=True, exist_ok=True)
    sink = open(log, "ab", buffering=0)  # noqa: SIM115 - the caller closes it
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    where = f"on {socket.gethostname()} pid {os.getpid()}" + (f" rank {rank}" if rank else "")
    sink.write(f"==== {stamp} run {run_id} {where}\n".encode())
    return sink


@contextmanager
def captured(
    trial_id: str, run_id: str | None, job_json: str, artifact_uri: str = ""
) -> Iterator[Path]:
    """Send this process's stdout and stderr (and its children's) to its rank's log
    (trials/<id>/logs/) while the block runs; rank 0 writes job.json first and attaches
    the files to `run_id` at the end."""
    folder, rank = trial_dir(trial_id), launcher_rank()
    log = trial_log(trial_id, rank)
    if rank == 0:
        log.parent.mkdir(parents=True, exist_ok=True)
        (folder / JOB_FILE).write_text(job_json)
    failed = TRACEBACK_FILE if rank == 0 else f"traceback-rank{rank}.txt"
    with open_log(trial_id, rank, run_id) as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield log
        except BaseException:
            (log.parent / failed).write_text(traceback.format_exc())
            traceback.print_exc()  # into the log too, where it happened
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if run_id and rank == 0:
                attach(trial_id, run_id, artifact_uri)


def attach(trial_id: str, run_id: str, artifact_uri: str = "") -> None:
    """job.json and logs/ as the run's artifacts. Best effort: a tracking store that cannot
    be reached now costs the attachment, never the trial (the files stay in its folder).
    A run whose artifacts are a folder this machine sees (`artifact_uri` file:...) gets
    them copied there, as MLflow's local artifact store does, without importing MLflow (a
    Ray worker of a short trial spent seconds on that import alone)."""
    from scalelab.jobs.tracking import mlflow_store as tracking_store
    from scalelab.jobs.tracking.tracker import fail_fast_environ

    folder = trial_dir(trial_id)
    if _copied(folder, artifact_uri):
        return
    try:
        with scoped_environ(fail_fast_environ()):
            client = tracking_store.client()
            if (folder / JOB_FILE).exists():
                client.log_artifact(run_id, str(folder / JOB_FILE))
            client.log_artifacts(run_id, str(folder / LOGS_DIR), LOGS_DIR)
    except Exception as e:  # noqa: BLE001 - whatever the store raised, the trial's outcome stands
        print(f"scalelab: the trial's logs were not attached to run {run_id}: {e}", file=sys.stderr)


def _copied(folder: Path, artifact_uri: str) -> bool:
    """Copy job.json and logs/ into a local artifact folder; False when it is not one this
    machine can write (then MLflow uploads them)."""
    import shutil
    from urllib.parse import unquote, urlparse

    where = urlparse(artifact_uri)
    if where.scheme != "file" or where.netloc not in ("", "localhost"):
        return False
    target = Path(unquote(where.path))
    try:
        (target / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        if (folder / JOB_FILE).exists():
            shutil.copy2(folder / JOB_FILE, target / JOB_FILE)
        shutil.copytree(folder / LOGS_DIR, target / LOGS_DIR, dirs_exist_ok=True)
    except OSError:
        return False
    return True


def tail(trial_id: str, lines: int = 20, end: int | None = None, rank: int = 0) -> str:
    """The last `lines` lines of the trial's log (or rank `rank`'s) before byte `end`
    (default: its end; '' when it has none)."""
    log = trial_log(trial_id, rank)
    if not log.exists():
        return ""
    end = log.stat().st_size if end is None else end
    with open(log, "rb") as f:
        f.seek(max(0, end - 64 * 1024))
        text = f.read(end - f.tell()).decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def follow(
    path: Path,
    offset: int,
    ended: Callable[[], bool],
    write: Callable[[str], None],
    *,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
) -> bool:
    """`write` what is appended to the log at `path` after `offset`, until `ended()` says
    the trial has ended (what it wrote last is still written) or `timeout_s` has passed;
    a log not there yet is waited for, as `tail -F` does. True when the trial ended."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span reads
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        done = ended()  # asked before reading: the last lines come before the end is seen
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:  # not started yet
            chunk = b""
        offset += len(chunk)
        if text := decoder.decode(chunk, final=done):
            write(text)
        if done:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
