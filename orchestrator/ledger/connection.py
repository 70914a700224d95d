"""The ledger's connection to MLflow: a client whose store failures are one line
(LedgerUnavailable), the sweep's experiment, searches, and the writes every part of the
ledger makes (tags, statuses)."""

from __future__ import annotations

import functools
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalelab.contract import workdir
from scalelab.contract.runs import TERMINAL, search_all
from scalelab.jobs.tracking import mlflow_store as tracking_store

if TYPE_CHECKING:
    from mlflow import MlflowClient

MAX_TAG = 8000  # characters of an MLflow tag value


class LedgerUnavailable(RuntimeError):
    """The tracking store cannot be reached, or failed (unreachable, disk full, locked);
    the message is one line. MLflow keeps what was written before: a later submit of the
    same sweep picks up from there."""


class _GuardedClient:
    """An MlflowClient whose store failures raise LedgerUnavailable with one line; its
    refusals (a param already set, an experiment that exists) stay MlflowExceptions."""

    def __init__(self, client: MlflowClient, uri: str) -> None:
        self._client, self._uri = client, uri

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        return self._guarded(attr) if callable(attr) else attr

    def set_open_status(self, run_id: str, status: str) -> None:
        self._guarded(tracking_store.set_open_status)(self._client, run_id, status)

    def move_start_time(self, run_ids: list[str], start_ms: int) -> bool:
        return self._guarded(tracking_store.move_start_time)(self._client, run_ids, start_ms)

    def _guarded(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                why = tracking_store.failure(e, self._uri)
                if why is None:
                    raise
                raise LedgerUnavailable(f"the tracking store {self._uri} failed: {why}") from None

        return call


def guarded_client(uri: str, one_try: bool = False) -> MlflowClient:
    """A guarded client; `one_try`: each request to a tracking server is tried once, with a
    short timeout (`jobs/tracking/one_try.py`), for calls a periodic poll repeats at its next
    tick."""
    try:
        client = tracking_store.client(uri, one_try)
    except tracking_store.StoreError as e:
        raise LedgerUnavailable(str(e)) from None
    return _GuardedClient(client, uri)  # type: ignore[return-value]


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast (LedgerUnavailable) when an MLflow server is down, before any write."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as r:
                if r.status != 200:
                    raise LedgerUnavailable(f"MLflow server {uri} answered HTTP {r.status}")
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise LedgerUnavailable(f"MLflow server {uri} is not reachable: {reason}") from None
    elif uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.parent.is_dir():
            raise LedgerUnavailable(f"the folder of the MLflow database {db} does not exist")


class SweepStore:
    """One sweep's experiment in MLflow: what the parent run, the trial records and the
    claims (the ledger's other modules) read and write through."""

    parent_id: str | None

    def __init__(self, sweep: str, experiment: str | None, tracking_uri: str | None) -> None:
        self.sweep = sweep
        self.experiment = experiment or sweep
        self.uri = tracking_uri or workdir.tracking_uri()
        check_reachable(self.uri)
        self.client: MlflowClient = guarded_client(self.uri)
        self._poll_client: MlflowClient | None = None  # made at the first poll
        self._experiment_id: str | None = None
        self.parent_id = None

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """fn over items: in threads for a tracking server (it serves requests at once);
        one by one on sqlite, whose writers queue on a file lock (threads only add the
        lock's busy-wait backoff)."""
        if self.uri.startswith("sqlite") or len(items) < 2:
            return [fn(item) for item in items]
        return list(_pool().map(fn, items))

    def experiment_id(self, create: bool = False) -> str | None:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None and create:
                from mlflow.exceptions import MlflowException

                try:
                    artifacts = workdir.artifact_root().as_uri()
                    location = None if self.uri.startswith("http") else artifacts
                    self._experiment_id = self.client.create_experiment(self.experiment, location)
                except MlflowException:  # another driver created it just now (or a refusal)
                    exp = self.client.get_experiment_by_name(self.experiment)
                    if exp is None:
                        raise
            if exp is not None:
                self._experiment_id = exp.experiment_id
        return self._experiment_id

    @property
    def poll_client(self) -> MlflowClient:
        """For the driver's periodic polls (heartbeats, cancels): one try per request, so a
        poll during an outage fails at once (LedgerUnavailable) and the next tick asks again;
        MLflow's retry chain would keep the driver waiting up to a minute after the store is
        back. Writes that must land use `client` (MLflow's retries) or a spool."""
        if self._poll_client is None:
            self._poll_client = guarded_client(self.uri, one_try=True)
        return self._poll_client

    def search(self, filter_string: str, client: MlflowClient | None = None) -> list[Any]:
        eid = self.experiment_id()
        if eid is None:
            return []
        return search_all(client or self.client, [eid], filter_string)

    def parent_tags(self) -> dict[str, str]:
        return self.client.get_run(self.parent_id).data.tags

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, v[:MAX_TAG]) for k, v in tags.items()])

    def set_status(
        self, run_id: str, status: str, clear_error: bool = False, end_ms: int | None = None
    ) -> None:
        """`clear_error`: a FINISHED run that may carry an earlier attempt's error tag;
        `end_ms`: the end time a terminal status keeps (default: now)."""
        if status in TERMINAL:
            tracking_store.set_terminal(self.client, run_id, status, clear_error, end_ms)
        else:
            self.client.set_open_status(run_id, status)


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="scalelab-ledger")
