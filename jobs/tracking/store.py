"""The MLflow tracking store: clients that never meet a half-made sqlite store, and one line
for a store that fails.

MLflow creates a sqlite store's tables on first use by running its migrations, without a
lock. Two processes opening a fresh store at once (two first submits) collide halfway
("duplicate column name"), and a store cut short by a full disk stays half-migrated and
refuses every later open. So a new sqlite store is made under a file lock, in a temporary
file renamed into place once complete: a store file that exists is whole.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.contract import workdir
from scalelab.contract.runs import Status, Tag

if TYPE_CHECKING:
    from mlflow import MlflowClient

# MlflowException codes that mean "the store failed" (unreachable, full, locked) rather
# than "the store answered and refused this request".
FAILURE_CODES = {"TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED"}

_made: set[Path] = set()
_made_lock = threading.Lock()


def set_terminal(client: MlflowClient, run_id: str, status: str, clear_error: bool = True) -> None:
    """End a run with `status`. A FINISHED run drops the error tag an earlier attempt left:
    a run that finished carries no error (the attempts' logs keep what happened);
    `clear_error=False` when none can have one (a trial's first attempt: one request less)."""
    from mlflow.exceptions import MlflowException

    client.set_terminated(run_id, status=status)
    if status == Status.FINISHED and clear_error:
        try:
            client.delete_tag(run_id, Tag.ERROR)
        except MlflowException as e:  # no such tag: nothing to drop
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise


class StoreError(RuntimeError):
    """The tracking store could not be created or used; the message is one line."""


def client(uri: str | None = None, one_try: bool = False) -> MlflowClient:
    """An MlflowClient for `uri` (default: `workdir.tracking_uri()`), creating a sqlite store
    safely first. `one_try`: each request to a tracking server is tried once, with a short
    timeout (`jobs/tracking/one_try.py`), for a caller that asks again later itself."""
    from mlflow import MlflowClient

    uri = uri or workdir.tracking_uri()
    if uri.startswith("sqlite:///"):
        ensure_sqlite(Path(uri.removeprefix("sqlite:///")))
    if one_try:
        from scalelab.jobs.tracking.one_try import tried_once

        return tried_once(MlflowClient(uri))
    return MlflowClient(uri)


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
        _made.add(db)


def _is_whole(db: Path) -> bool:
    return db.exists() and db.stat().st_size > 0


def _create(db: Path) -> None:
    from mlflow import MlflowClient

    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    try:
        MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)  # migrations
        os.replace(tmp, db)
    except Exception as e:
        raise StoreError(f"cannot create the MLflow database {db}: {failure(e) or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def failure(e: BaseException) -> str | None:
    """One line saying why the store failed, when `e` is the store failing (unreachable,
    disk full, locked); None when it is a refusal (bad value, already exists) or not from
    the store."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException) and e.error_code not in FAILURE_CODES:
        return None
    if not isinstance(e, MlflowException | sqlalchemy.exc.OperationalError | OSError):
        return None
    root: BaseException = e
    while root.__cause__ is not None:
        root = root.__cause__
    root = getattr(root, "orig", None) or root  # sqlalchemy wraps the driver's error
    lines = [ln.strip() for ln in str(root).splitlines() if ln.strip()]
    return lines[0] if lines else type(root).__name__
