"""MLflow clients whose requests to a tracking server are tried once, with a short timeout.

For calls whose caller retries anyway: the driver's periodic polls (cancels, heartbeats)
ask again at their next tick, and a spool (`jobs/tracking/outbox.py`) keeps what it could not send.
MLflow's own retry chain (MLFLOW_HTTP_REQUEST_MAX_RETRIES = 7, BACKOFF_FACTOR = 2) sleeps
for minutes in all and up to a minute at a time, so a caller inside it stays blind for that
long after the server is back. Those settings are environment variables, read at every
request by every thread of the process (and inherited by its children); MLflow's REST
store takes no per-request setting (mlflow 3.17: `RestStore._call_endpoint` passes none to
`http_request`, which accepts them), so this client's store passes them itself, the way
MLflow's own server-version probe does (`max_retries=0` and a short `timeout`).

Imported where MLflow is used anyway (it imports MLflow).
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any

from mlflow import MlflowClient
from mlflow.store.tracking.rest_store import RestStore
from mlflow.tracking._tracking_service.client import TrackingServiceClient
from mlflow.utils.credentials import get_default_host_creds
from mlflow.utils.proto_json_utils import parse_dict
from mlflow.utils.rest_utils import http_request, verify_rest_response

# One request's limit: MLFLOW_HTTP_REQUEST_TIMEOUT when set (MLflow's default is 120 s)
TIMEOUT_VAR = "MLFLOW_HTTP_REQUEST_TIMEOUT"
DEFAULT_TIMEOUT_S = 10


def tried_once(plain: MlflowClient) -> MlflowClient:
    """`plain`, changed so that its requests to a tracking server are tried once and wait at
    most MLFLOW_HTTP_REQUEST_TIMEOUT (else 10) seconds; a database store has no retry
    chain, so for one it stays as it is. Callers get it from `tracking_store.client`."""
    if plain.tracking_uri.startswith(("http://", "https://")):
        timeout = int(os.environ.get(TIMEOUT_VAR, DEFAULT_TIMEOUT_S))
        plain._tracking_client = _OneTryTracking(plain.tracking_uri, timeout)
    return plain


class _OneTryRestStore(RestStore):
    def __init__(self, uri: str, timeout: int) -> None:
        super().__init__(partial(get_default_host_creds, uri))
        self._timeout = timeout

    def _call_endpoint(
        self,
        api: Any,
        json_body: str | None = None,
        endpoint: str | None = None,
        retry_timeout_seconds: int | None = None,
        response_proto: Any = None,
    ) -> Any:
        if api in self._V3_APIS:  # traces and gateways: not used by scalelab
            return super()._call_endpoint(
                api, json_body, endpoint, retry_timeout_seconds, response_proto
            )
        path, method = self._METHOD_TO_INFO[api]
        path = endpoint or path
        body = json.loads(json_body) if json_body is not None else None
        response = http_request(
            self.get_host_creds(), path, method, max_retries=0, timeout=self._timeout,
            **{"params" if method == "GET" else "json": body},
        )  # fmt: skip
        response = verify_rest_response(response, path)
        message = response_proto or api.Response()
        if response.status_code != 204:
            parse_dict(js_dict=response.json(), message=message)
        return message


class _OneTryTracking(TrackingServiceClient):
    """MLflow's run-level client over a one-try REST store (its `store` is otherwise
    looked up by URI, with MLflow's retries)."""

    def __init__(self, uri: str, timeout: int) -> None:
        self._store = _OneTryRestStore(uri, timeout)
        super().__init__(uri)

    @property
    def store(self) -> RestStore:
        return self._store
