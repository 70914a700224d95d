"""The MLflow tracking store: clients that never meet a half-made sqlite store, and one line
for a store that fails.

MLflow creates a sqlite store's tables on first use by running its migrations, without a
lock. Two processes opening a fresh store at once (two first submits) collide halfway
("duplicate column name"), and a store cut short by a full disk stays half-migrated and
refuses every later open. So a new sqlite store is made under a file lock, in a temporary
file renamed into place once complete: a store file that exists is whole.

A sqlite store keeps a write-ahead log (`PRAGMA journal_mode=WAL`, recorded in the file, so
every process that opens it, MLflow's UI too, uses it), and this process's connections
sync it at checkpoints only (`synchronous=NORMAL`): every MLflow call commits, and in
sqlite's default rollback-journal mode each commit wrote and synced a journal, the database
and the folder, about half of a driver's time per trial (docs/benchmarks.md,
"Orchestrator"). Readers (`status`, the UI) no longer block the driver's writes. A killed
process loses nothing it committed; a power cut may lose the last commits, never the file.
Copying `mlflow.db` alone while a driver runs may miss what is still in `mlflow.db-wal`.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import sqlite3
import sys
import threading
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.contract import workdir
from scalelab.contract.runs import Status, Tag

if TYPE_CHECKING:
    from mlflow import MlflowClient

# MlflowException codes that mean "the store failed" (unreachable, full, locked) rather
# than "the store answered and refused this request".
FAILURE_CODES = {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED"}

FULL_BELOW_BYTES = 1 << 20  # a store's disk with less room than this is called full

_made: set[Path] = set()
_made_lock = threading.Lock()


def set_terminal(
    client: MlflowClient,
    run_id: str,
    status: str,
    clear_error: bool = True,
    end_ms: int | None = None,
) -> None:
    """End a run with `status`, at `end_ms` (default: now). A FINISHED run drops the error
    tag an earlier attempt left: a run that finished carries no error (the attempts' logs
    keep what happened); `clear_error=False` when none can have one (a trial's first
    attempt: one request less)."""
    from mlflow.exceptions import MlflowException

    client.set_terminated(run_id, status=status, end_time=end_ms)
    if status == Status.FINISHED and clear_error:
        try:
            client.delete_tag(run_id, Tag.ERROR)
        except MlflowException as e:  # no such tag: nothing to drop
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise


def set_open_status(client: MlflowClient, run_id: str, status: str) -> None:
    """Set a run SCHEDULED or RUNNING, keeping its end time, in one request:
    `MlflowClient.update_run` first reads the whole run (every param and tag) for the end
    time it passes back unchanged, which the store keeps anyway when given none; half of a
    first launch's status write (docs/benchmarks.md, "Orchestrator")."""
    from mlflow.entities import RunStatus

    store = client._tracking_client.store  # mlflow is pinned (requirements/constraints.txt)
    store.update_run_info(run_id, RunStatus.from_string(status), end_time=None, run_name=None)


def move_start_time(client: MlflowClient, run_ids: list[str], start_ms: int) -> bool:
    """Set the start time of some active runs (and no end), in one statement, where the store is a
    database this process writes (sqlite, or one MLflow reaches by a database URI); False,
    with nothing written, for a tracking server, whose API cannot move a start time. A
    trial's placeholder run is made at submit; its first launch moves its start, so that
    the UI's Created and Duration are the trial's own (the alternative, a new run created
    at launch with the placeholder's params and tags, costs four writes per trial:
    docs/benchmarks.md, "Orchestrator")."""
    store = client._tracking_client.store  # mlflow is pinned (requirements/constraints.txt)
    # loaded by any store of that kind; importing it for a tracking server's client costs seconds
    sql = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    if sql is None or not isinstance(store, sql.SqlAlchemyStore):
        return False
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlRun

    with store.ManagedSessionMaker() as session:
        session.query(SqlRun).filter(
            SqlRun.run_uuid.in_(run_ids), SqlRun.lifecycle_stage == LifecycleStage.ACTIVE
        ).update({SqlRun.start_time: start_ms, SqlRun.end_time: None}, synchronize_session=False)
    return True


class StoreError(RuntimeError):
    """The tracking store could not be created or used; the message is one line."""


def client(uri: str | None = None, one_try: bool = False) -> MlflowClient:
    """An MlflowClient for `uri` (default: `workdir.tracking_uri()`), creating a sqlite store
    safely first. `one_try`: each request to a tracking server is tried once, with a short
    timeout (`jobs/tracking/one_try.py`), for a caller that asks again later itself."""
    from mlflow import MlflowClient

    uri = uri or workdir.tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        ensure_sqlite(db)
        _opens(db, uri)
    try:
        made = MlflowClient(uri)  # a sqlite store is opened here (its first connection)
    except Exception as e:
        if (why := failure(e, uri)) is None:
            raise
        raise StoreError(f"cannot open the MLflow store {uri}: {why}") from None
    if one_try:
        from scalelab.jobs.tracking.one_try import tried_once

        return tried_once(made)
    return made


def _opens(db: Path, uri: str) -> None:
    """Open the sqlite store once here, failing at once: MLflow retries a store it cannot
    open for ~100 s (a database server may still be starting), which a file on a full disk
    never stops failing. A store another process has locked is left to MLflow's retries."""
    try:
        with closing(sqlite3.connect(db, timeout=5.0)) as con:
            con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.Error as e:
        if getattr(e, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return
        raise StoreError(f"cannot open the MLflow store {uri}: {failure(e, uri) or e}") from None


def ensure_sqlite(db: Path) -> None:
    """Create the sqlite store `db` once, whole, whoever else tries at the same time."""
    if db in _made:
        return
    # MLflow logs each sqlite error with its traceback before raising it; the raised error
    # is what callers report (one line), so the log is noise on a terminal.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    with _made_lock:
        if db in _made:
            return
        if not _is_whole(db):
            db.parent.mkdir(parents=True, exist_ok=True)
            with open(db.with_name(f".{db.name}.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if not _is_whole(db):
                    _create(db)
        _write_ahead_log(db)
        _made.add(db)


def _write_ahead_log(db: Path) -> None:
    """Put the store in write-ahead-log mode (once per file: sqlite records it), and sync
    this process's connections at checkpoints. Best effort: a store another process holds
    in a transaction is switched by a later open."""
    _sync_at_checkpoints()
    try:
        with closing(sqlite3.connect(db, timeout=1.0)) as con:
            con.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error:
        pass


@functools.cache
def _sync_at_checkpoints() -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.listen(Engine, "connect", _on_connect)


def _on_connect(dbapi_connection: object, _record: object) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")


def _is_whole(db: Path) -> bool:
    return db.exists() and db.stat().st_size > 0


def _create(db: Path) -> None:
    from mlflow import MlflowClient

    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    try:
        MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)  # migrations
        os.replace(tmp, db)
    except Exception as e:
        raise StoreError(
            f"cannot create the MLflow database {db}: {failure(e, f'sqlite:///{db}') or e}"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def failure(e: BaseException, uri: str | None = None) -> str | None:
    """One line saying why the store failed, when `e` is the store failing (unreachable,
    disk full, locked); None when it is a refusal (bad value, already exists) or not from
    the store. With the store's `uri`, a sqlite store on a full disk says so: opening one
    there fails as "disk I/O error" (its shared-memory file cannot be made)."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException) and e.error_code not in FAILURE_CODES:
        return None
    if not isinstance(
        e, MlflowException | sqlalchemy.exc.OperationalError | sqlite3.Error | OSError
    ):
        return None
    root: BaseException = e
    while root.__cause__ is not None:
        root = root.__cause__
    root = getattr(root, "orig", None) or root  # sqlalchemy wraps the driver's error
    lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
    why = lines[0] if lines else type(root).__name__
    if uri and uri.startswith("sqlite:///") and "full" not in why:
        folder = Path(uri.removeprefix("sqlite:///")).parent
        if _disk_full(folder):
            why += f" (No space left on device: the disk of {folder} is full)"
    return why


def _disk_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < FULL_BELOW_BYTES
    except OSError:
        return False
