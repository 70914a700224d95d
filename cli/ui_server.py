"""The MLflow UI as `scalelab ui` serves it: MLflow's own server (the `mlflow.app` plugin
`scalelab`, pyproject.toml), with one change to its page: a browser that has not chosen
between *GenAI* and *Model training* opens in model training (docs/monitoring.md).

Why a change to the page: MLflow 3.17's UI decides an experiment's kind from that switch
alone (the address's `workflowType`, else the browser's local storage
`mlflow.workflowType_v1`, else GenAI); the experiment's `mlflow.experimentKind` tag is
read only when the switch is off, and 3.17 builds it on. So the page sets the stored choice
to model training where the browser has none; a choice made with the switch stays.
Every request goes to MLflow's app unchanged but the index page's body and cache headers.
"""

from __future__ import annotations

import os
from typing import Any

WORKFLOW_KEY = "mlflow.workflowType_v1"  # MLflow's useLocalStorage key: `${key}_v${version}`
DEFAULT_SCRIPT = (
    "<script>/* scalelab: model training unless this browser chose otherwise */"
    f'try{{if(localStorage.getItem("{WORKFLOW_KEY}")===null)'
    f'localStorage.setItem("{WORKFLOW_KEY}",JSON.stringify("machine_learning"))}}'
    "catch(e){}</script>"
).encode()
# headers that would let the index page come back unchanged (a 304, or compressed)
_DROPPED_REQUEST = {b"if-none-match", b"if-modified-since", b"accept-encoding"}
_DROPPED_RESPONSE = {b"content-length", b"etag", b"last-modified", b"cache-control"}


def with_default(html: bytes) -> bytes:
    """The index page with DEFAULT_SCRIPT first in its <head> (before MLflow's scripts)."""
    at = html.find(b"<head>")
    at = 0 if at < 0 else at + len(b"<head>")
    return html[:at] + DEFAULT_SCRIPT + html[at:]


class ScalelabUI:
    """An ASGI app: MLflow's (imported on first use, in each server worker) with the index
    page changed by `with_default`."""

    def __init__(self) -> None:
        self._mlflow: Any = None

    def _app(self) -> Any:
        if self._mlflow is None:
            from mlflow.server.fastapi_app import app

            self._mlflow = app
        return self._mlflow

    @staticmethod
    def _index_path() -> str:
        return os.environ.get("_MLFLOW_STATIC_PREFIX", "").rstrip("/") + "/"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        app = self._app()
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or scope["path"] != self._index_path()
        ):
            await app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROPPED_REQUEST]
        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def index_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page = b"".join(body)
            kind = dict(start.get("headers", [])).get(b"content-type", b"")
            if start.get("status") == 200 and kind.startswith(b"text/html"):
                page = with_default(page)
            out = [
                (k, v) for k, v in start.get("headers", []) if k.lower() not in _DROPPED_RESPONSE
            ]
            out += [(b"content-length", str(len(page)).encode()), (b"cache-control", b"no-cache")]
            await send({**start, "headers": out})
            await send({"type": "http.response.body", "body": page})

        await app({**scope, "headers": headers}, receive, index_send)


app = ScalelabUI()
