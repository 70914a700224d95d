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
The same script marks MLflow's assistant panel as already shown once (its local storage
`mlflow.assistant.fab.autoOpenedOnFirstLoad_v1`), so a first visit opens on the runs, not
beside the panel; its button still opens it.
Every request goes to MLflow's app unchanged but the index page's body and cache headers.

The login (on unless `--no-login`): MLflow's own basic-auth app (`mlflow server --app-name
basic-auth`), so another user of the machine, who reaches 127.0.0.1 as well as its owner
does, can neither read nor change a run through the UI (docs/reliability.md, Security). Its
files live in the work directory's `ui/` folder (0700), each 0600: `password` (the `admin`
login, made on the first start), `auth.ini` (MLflow's auth configuration) and `auth.db`
(MLflow's sqlite store of logins and permissions). See `login`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import stat
import uuid
import warnings
from pathlib import Path
from typing import Any, NamedTuple

WORKFLOW_KEY = "mlflow.workflowType_v1"  # MLflow's useLocalStorage key: `${key}_v${version}`
# set: MLflow's assistant panel has "already opened itself once" (on a UI served on
# 127.0.0.1 it opens on the first visit and takes a third of the window)
ASSISTANT_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
DEFAULTS = {WORKFLOW_KEY: "machine_learning", ASSISTANT_KEY: True}
DEFAULT_SCRIPT = (
    "<script>/* scalelab: model training, the assistant panel closed, unless this browser"
    " chose otherwise */try{"
    + "".join(
        f'if(localStorage.getItem("{key}")===null)'
        f'localStorage.setItem("{key}",{json.dumps(json.dumps(value))});'
        for key, value in DEFAULTS.items()
    )
    + "}catch(e){}</script>"
).encode()
# headers that would let the index page come back unchanged (a 304, or compressed)
_DROPPED_REQUEST = {b"if-none-match", b"if-modified-since", b"accept-encoding"}
_DROPPED_RESPONSE = {b"content-length", b"etag", b"last-modified", b"cache-control"}


def with_default(html: bytes) -> bytes:
    """The index page with DEFAULT_SCRIPT first in its <head> (before MLflow's scripts)."""
    at = html.find(b"<head>")
    at = 0 if at < 0 else at + len(b"<head>")
    return html[:at] + DEFAULT_SCRIPT + html[at:]


LOGIN_ENV = "_SCALELAB_UI_LOGIN"  # "1": the app is MLflow's basic-auth one
LOGIN_USER = "admin"
_AUTH_INI = """[mlflow]
default_permission = READ
database_uri = sqlite:///{db}
admin_username = {user}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


class Login(NamedTuple):
    user: str
    password: str
    password_file: Path
    config: Path
    new: bool  # the password was made by this start


def _private(path: Path, mode: int) -> None:
    """`path` is ours and no one else's: owned by this user, its mode set to `mode`."""
    st = path.lstat()
    if st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
        raise PermissionError(
            f"{path} is not this user's own {'folder' if mode & 0o100 else 'file'}"
        )
    if stat.S_IMODE(st.st_mode) != mode:
        path.chmod(mode)


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` through a 0600 file made for it (never readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def login(home: Path) -> Login:
    """The UI's login in `home`/ui: the password kept from an earlier start, else a new one
    (and a new login store: a deleted `password` file is how to get a new password)."""
    folder = home / "ui"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _private(folder, 0o700)
    password_file, db, config = folder / "password", folder / "auth.db", folder / "auth.ini"
    password = password_file.read_text().strip() if password_file.exists() else ""
    new = not password
    if new:
        for old in (db, *(db.with_name(db.name + end) for end in ("-journal", "-wal", "-shm"))):
            old.unlink(missing_ok=True)
        password = secrets.token_urlsafe(18)
        _write_private(password_file, password + "\n")
    _private(password_file, 0o600)
    if not db.exists():  # sqlite keeps a file's mode, and gives its journal the same
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    _private(db, 0o600)
    _write_private(config, _AUTH_INI.format(db=db, user=LOGIN_USER))
    return Login(LOGIN_USER, password, password_file, config, new)


def login_environment(found: Login | None) -> dict[str, str]:
    """What the server needs for `found` (None: no login). The admin password goes in the
    environment, which only this user can read, and MLflow uses it only to make the admin
    of an empty login store; the secret key signs MLflow's sign-up form (CSRF), one per start."""
    if found is None:
        return {LOGIN_ENV: "0"}
    return {
        LOGIN_ENV: "1",
        "MLFLOW_AUTH_CONFIG_PATH": str(found.config),
        "MLFLOW_AUTH_ADMIN_USERNAME": found.user,
        "MLFLOW_AUTH_ADMIN_PASSWORD": found.password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32),
    }


class ScalelabUI:
    """An ASGI app: MLflow's (imported on first use, in each server worker) with the index
    page changed by `with_default`."""

    def __init__(self) -> None:
        self._mlflow: Any = None

    def _app(self) -> Any:
        if self._mlflow is None:
            # starlette's deprecation of the WSGI bridge MLflow uses: nothing a user can act on
            warnings.filterwarnings("ignore", message="starlette.middleware.wsgi is deprecated")
            if os.environ.get(LOGIN_ENV) == "1":
                from mlflow.server.auth import create_app

                self._mlflow = create_app()  # MLflow's app behind its basic-auth checks
            else:
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
