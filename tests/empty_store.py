"""An empty MLflow sqlite store, made once per test process and copied wherever a test needs
a fresh store whose creation is not what it checks. Creating one runs MLflow's migrations
(5-10 s on the CI's two busy cores), which every fresh work directory or `mlflow server`
store would otherwise pay; tests of the creation itself (two first submits, a full disk)
keep starting from nothing."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], str]:
    """empty_store(db) puts an empty store at `db` (made by the product's own
    `tracking_store.ensure_sqlite` the first time) and returns its sqlite URI."""
    template: list[Path] = []

    def copy(db: Path) -> str:
        if not template:
            from scalelab.jobs.tracking.mlflow_store import ensure_sqlite

            made = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
            ensure_sqlite(made)
            template.append(made)
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template[0], db)
        return f"sqlite:///{db}"

    return copy
