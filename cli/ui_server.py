"""The MLflow UI as `scalelab ui` serves it: MLflow's own server app with one change to its
page: a browser that has not chosen between *GenAI* and *Model training* opens in model
training (docs/monitoring.md).

`scalelab ui` runs this app under uvicorn itself, with the environment `mlflow server`
would give its worker (`server_environment`), rather than through `mlflow server`: that
command imports MLflow in a first process only to start the worker, which imports it
again, and the UI answered only after both (docs/benchmarks.md, CLI start-up).

Why a change to the page: MLflow 3.17's UI decides an experiment's kind from that switch
alone (the address's `workflowType`, else the browser's local storage
`mlflow.workflowType_v1`, else GenAI); the experiment's `mlflow.experimentKind` tag is
read only when the switch is off, and 3.17 builds it on. So the page sets the stored choice
to model training where the browser has none; a choice made with the switch stays.
Every request goes to MLflow's app unchanged but the index page's body and cache headers.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
import warnings
from pathlib import Path
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
            # starlette's deprecation of the WSGI bridge MLflow uses: nothing a user can act on
            warnings.filterwarnings("ignore", message="starlette.middleware.wsgi is deprecated")
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


# What `mlflow server` (MLflow 3.17, pinned in requirements/constraints.txt) hands its
# uvicorn worker, by name: mlflow.server's *_ENV_VAR constants and the `server` command's
# defaults (tests/faults/test_ui_port.py checks the names against MLflow's own).
SERVER_ENV_NAMES = {
    "backend": "_MLFLOW_SERVER_FILE_STORE",
    "registry": "_MLFLOW_SERVER_REGISTRY_STORE",
    "artifact_root": "_MLFLOW_SERVER_ARTIFACT_ROOT",
    "serve_artifacts": "_MLFLOW_SERVER_SERVE_ARTIFACTS",
    "artifacts_destination": "_MLFLOW_SERVER_ARTIFACT_DESTINATION",
    "server": "_MLFLOW_SGI_NAME",
    "boot_id": "_MLFLOW_SERVER_BOOT_ID",
    "in_job_executor": "_MLFLOW_IN_JOB_EXECUTOR",
}


def server_environment(store_uri: str, artifacts: Path) -> dict[str, str]:
    """The environment of MLflow's server worker on `store_uri`, as `mlflow server
    --backend-store-uri store_uri` sets it but for the proxied artifacts of runs created
    in the UI, which go to `artifacts` (the work directory's) rather than ./mlartifacts."""
    names = SERVER_ENV_NAMES
    return {
        names["backend"]: store_uri,
        names["registry"]: store_uri,
        names["artifact_root"]: "mlflow-artifacts:/",
        names["serve_artifacts"]: "true",
        names["artifacts_destination"]: str(artifacts),
        names["server"]: "uvicorn",
        names["boot_id"]: uuid.uuid4().hex,
        names["in_job_executor"]: "false",
        "MLFLOW_TRACKING_URI": store_uri,
        "MLFLOW_REGISTRY_URI": store_uri,
        "MLFLOW_ENABLE_WORKSPACES": "false",
        "MLFLOW_SERVER_X_FRAME_OPTIONS": "SAMEORIGIN",
        # MLflow's job runner (7 huey processes, left behind by a SIGTERM): no scalelab need
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }


def uvicorn_command(python: str, host: str, port: int, workers: int) -> list[str]:
    """uvicorn serving this app, with MLflow's log format (found without importing MLflow)."""
    spec = importlib.util.find_spec("mlflow")
    assert spec is not None and spec.submodule_search_locations
    log_config = Path(spec.submodule_search_locations[0]) / "server" / "uvicorn_log_config.yaml"
    return [
        python, "-m", "uvicorn", "--log-config", str(log_config), "--host", host,
        "--port", str(port), "--workers", str(workers), f"{__name__}:app",
    ]  # fmt: skip
