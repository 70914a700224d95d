"""A one-try MLflow client fails at once where MLflow's own client sleeps through its retry
chain (MLFLOW_HTTP_REQUEST_MAX_RETRIES: minutes in all)."""

from __future__ import annotations

import socket
import time

import pytest
from mlflow.exceptions import MlflowException

from scalelab.jobs.tracking import mlflow_store as tracking_store


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def test_a_request_to_a_server_that_is_down_is_tried_once(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)  # MLflow's: 7
    client = tracking_store.client(f"http://127.0.0.1:{_closed_port()}", one_try=True)
    started = time.monotonic()
    with pytest.raises(MlflowException) as e:
        client.search_runs(["0"], "")
    assert time.monotonic() - started < 1.5  # the first retry alone would sleep ~2 s
    assert tracking_store.failure(e.value) is not None  # "the store failed", not a refusal
