"""A recorded sweep, read only: what `status`, `logs`, `ui`, `cancel` and a dry-run read of
it, without building MLflow's client (docs/architecture.md, 'Reading a sweep's state').

MLflow stays the sweep's one record; this is another way to read it, never a copy. Importing
mlflow and opening its sqlalchemy store cost about 2 s of CPU, more than the whole command
may take (issue 27). So on the default sqlite store, whose schema revision is one this
module knows, the runs are read with sqlite3 from MLflow's own tables (`experiments`,
`runs`, `tags`, `params`, `latest_metrics`), read only, in one read transaction: the
snapshot MLflow's own search would see. Any other store goes through MLflow's client: a
tracking server over http (its REST API, with MLflow's login, TLS and retries), another
database, or a sqlite file of another schema revision (a newer or older MLflow: MLflow's
client then says what to do).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from scalelab.contract import workdir
from scalelab.contract.runs import Role, Tag
from scalelab.orchestrator.ledger.connection import check_reachable
from scalelab.orchestrator.ledger.records import TrialRecord, latest_records, record_of

# alembic revisions of MLflow's tracking schema whose tables this module reads: MLflow
# 3.17's head (tests/orchestrator/test_ledger_view.py checks the installed MLflow's)
KNOWN_SCHEMAS = frozenset({"dc11669786a5"})
DEFAULT_WORKSPACE = "default"  # MLflow's single-tenant workspace
ACTIVE = "active"


class SweepReads(Protocol):
    """What the read-only commands use of a recorded sweep: a `SweepView`, or the `Ledger`
    (MLflow's client) where the store is not read directly."""

    sweep: str
    experiment: str
    uri: str

    def experiment_id(self) -> str | None: ...

    def records(self) -> dict[str, TrialRecord]: ...

    def record(self, run_id: str) -> TrialRecord: ...


@dataclass(frozen=True)
class RunInfo:
    """The fields of MLflow's RunInfo that `record_of` reads."""

    run_id: str
    run_name: str
    status: str
    start_time: int
    end_time: int | None
    artifact_uri: str
    lifecycle_stage: str


@dataclass(frozen=True)
class RunData:
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # each metric's latest value


@dataclass(frozen=True)
class Run:
    info: RunInfo
    data: RunData


class SqliteRuns:
    """MLflow's sqlite tracking store, read only."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def _connect(self) -> sqlite3.Connection:
        # mode=ro: never creates or writes the file; the timeout waits out a writer's commit
        con = sqlite3.connect(f"{self.db.as_uri()}?mode=ro", uri=True, timeout=30.0)
        con.isolation_level = None  # transactions are begun here, explicitly
        return con

    def schema(self) -> str | None:
        try:
            with closing(self._connect()) as con:
                row = con.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.Error:
            return None
        return row[0] if row else None

    def experiment_id(self, name: str) -> str | None:
        with closing(self._connect()) as con:
            row = con.execute(
                "SELECT experiment_id FROM experiments WHERE name = ? AND "
                "COALESCE(workspace, ?) = ?",
                (name, DEFAULT_WORKSPACE, DEFAULT_WORKSPACE),
            ).fetchone()
        return None if row is None else str(row[0])

    def sweep_experiment(self, sweep: str) -> tuple[str, str] | None:
        """(id, name) of the active experiment that holds `sweep`'s parent run, in the order
        MLflow's `sweep_experiment` looks (newest experiment first)."""
        with closing(self._connect()) as con:
            row = con.execute(
                "SELECT e.experiment_id, e.name FROM experiments e "
                "JOIN runs r ON r.experiment_id = e.experiment_id "
                "JOIN tags role ON role.run_uuid = r.run_uuid AND role.key = ? AND role.value = ? "
                "JOIN tags sw ON sw.run_uuid = r.run_uuid AND sw.key = ? AND sw.value = ? "
                "WHERE e.lifecycle_stage = ? AND r.lifecycle_stage = ? "
                "AND COALESCE(e.workspace, ?) = ? "
                "ORDER BY e.creation_time DESC, e.experiment_id ASC LIMIT 1",
                (Tag.ROLE, Role.SWEEP, Tag.SWEEP, sweep, ACTIVE, ACTIVE)
                + (DEFAULT_WORKSPACE, DEFAULT_WORKSPACE),
            ).fetchone()
        return None if row is None else (str(row[0]), row[1])

    def sweep_names(self) -> list[str]:
        """The sweeps whose parent run is in an active experiment, sorted."""
        with closing(self._connect()) as con:
            rows = con.execute(
                "SELECT DISTINCT sw.value FROM experiments e "
                "JOIN runs r ON r.experiment_id = e.experiment_id "
                "JOIN tags role ON role.run_uuid = r.run_uuid AND role.key = ? AND role.value = ? "
                "JOIN tags sw ON sw.run_uuid = r.run_uuid AND sw.key = ? "
                "WHERE e.lifecycle_stage = ? AND r.lifecycle_stage = ? "
                "AND COALESCE(e.workspace, ?) = ?",
                (Tag.ROLE, Role.SWEEP, Tag.SWEEP, ACTIVE, ACTIVE)
                + (DEFAULT_WORKSPACE, DEFAULT_WORKSPACE),
            ).fetchall()
        return sorted(row[0] for row in rows)

    def trial_runs(self, experiment_id: str, sweep: str) -> list[Run]:
        """The active runs of the experiment tagged as `sweep`'s trials (`trials_filter`)."""
        where = (
            "r.experiment_id = ? AND r.lifecycle_stage = ? AND "
            "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ? AND "
            "t.value = ?) AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND "
            "t.key = ? AND t.value = ?)"
        )
        args = (int(experiment_id), ACTIVE, Tag.ROLE, Role.TRIAL, Tag.SWEEP, sweep)
        return self._runs(where, args)

    def run(self, run_id: str) -> Run | None:
        """One run, whatever its lifecycle stage (as MLflow's `get_run`)."""
        found = self._runs("r.run_uuid = ?", (run_id,))
        return found[0] if found else None

    def _runs(self, where: str, args: tuple) -> list[Run]:
        with closing(self._connect()) as con:
            con.execute("BEGIN")  # one snapshot for the runs and their tags, params, metrics
            rows = con.execute(
                "SELECT r.run_uuid, r.name, r.status, r.start_time, r.end_time, "
                f"r.artifact_uri, r.lifecycle_stage FROM runs r WHERE {where}",
                args,
            ).fetchall()
            ids = [r[0] for r in rows]
            tags = self._items(con, "SELECT run_uuid, key, value FROM tags", ids)
            params = self._items(con, "SELECT run_uuid, key, value FROM params", ids)
            metrics = self._items(
                con,
                "SELECT run_uuid, key, CASE WHEN is_nan THEN 'nan' ELSE value END "
                "FROM latest_metrics",
                ids,
            )
            con.execute("COMMIT")
        return [
            Run(
                RunInfo(rid, name or "", status, start or 0, end, uri or "", stage),
                RunData(
                    tags.get(rid, {}),
                    params.get(rid, {}),
                    {k: float(v) for k, v in metrics.get(rid, {}).items()},
                ),
            )
            for rid, name, status, start, end, uri, stage in rows
        ]

    @staticmethod
    def _items(con: sqlite3.Connection, select: str, ids: list[str]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for i in range(0, len(ids), 500):  # under sqlite's limit of bound parameters
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for rid, key, value in con.execute(f"{select} WHERE run_uuid IN ({marks})", chunk):
                out.setdefault(rid, {})[key] = value
        return out


def sqlite_runs(uri: str) -> SqliteRuns | None:
    """The store at `uri` to read directly: a sqlite file of a schema this module knows;
    None for any other (read through MLflow's client). A missing file is read as empty."""
    if not uri.startswith("sqlite:///"):
        return None
    runs = SqliteRuns(Path(uri.removeprefix("sqlite:///")))
    if not runs.db.exists():
        return runs
    return runs if runs.schema() in KNOWN_SCHEMAS else None


class SweepView:
    """One sweep's runs in MLflow's sqlite store, read only."""

    def __init__(self, runs: SqliteRuns, sweep: str, experiment: str, uri: str) -> None:
        self._runs, self.sweep, self.experiment, self.uri = runs, sweep, experiment, uri
        self._experiment_id: str | None = None

    def experiment_id(self) -> str | None:
        if self._experiment_id is None and self._runs.db.exists():
            self._experiment_id = self._runs.experiment_id(self.experiment)
        return self._experiment_id

    def records(self) -> dict[str, TrialRecord]:
        eid = self.experiment_id()
        return {} if eid is None else latest_records(self._runs.trial_runs(eid, self.sweep))

    def record(self, run_id: str) -> TrialRecord:
        run = self._runs.run(run_id) if self._runs.db.exists() else None
        if run is None:
            raise LookupError(f"no run {run_id} in {self.uri}")
        return record_of(run)


def read_sweep(name: str, tracking_uri: str | None = None) -> SweepReads:
    """A recorded sweep by name, whatever experiment it lives in, read only; LookupError
    when there is none."""
    from scalelab.orchestrator.ledger import find_sweep

    uri = tracking_uri or workdir.tracking_uri()
    runs = sqlite_runs(uri)
    if runs is None:
        return find_sweep(name, uri)
    check_reachable(uri)
    found = runs.sweep_experiment(name) if runs.db.exists() else None
    if found is None:
        raise LookupError(unknown_sweep(name, uri))
    view = SweepView(runs, name, found[1], uri)
    view._experiment_id = found[0]
    return view


def sweep_names(tracking_uri: str | None = None) -> list[str]:
    """The names of the sweeps recorded in the tracking store, sorted (none: an empty list);
    on the default sqlite store without building MLflow's client."""
    uri = tracking_uri or workdir.tracking_uri()
    runs = sqlite_runs(uri)
    if runs is not None:
        return runs.sweep_names() if runs.db.exists() else []
    from scalelab.contract.runs import tag_filter
    from scalelab.orchestrator.ledger.connection import guarded_client

    check_reachable(uri)
    client = guarded_client(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    parents = client.search_runs(experiments, tag_filter(Tag.ROLE, Role.SWEEP), max_results=5000)
    return sorted({r.data.tags[Tag.SWEEP] for r in parents if Tag.SWEEP in r.data.tags})


def unknown_sweep(name: str, uri: str) -> str:
    """What to say of a sweep name the store does not hold: the closest recorded name, or
    where the recorded ones are listed."""
    from scalelab.contract.config import did_you_mean

    known = sweep_names(uri)
    hint = did_you_mean(name, known)
    if not hint:
        hint = "; `scalelab sweeps` lists the recorded ones" if known else " (none recorded yet)"
    return f"no sweep named {name!r} in {uri}{hint}"


def open_sweep(sweep: str, experiment: str, tracking_uri: str | None = None) -> SweepReads:
    """A sweep's runs in a named experiment (none yet: no records), read only."""
    from scalelab.orchestrator.ledger import Ledger

    uri = tracking_uri or workdir.tracking_uri()
    runs = sqlite_runs(uri)
    if runs is None:
        return Ledger(sweep, experiment, uri)
    return SweepView(runs, sweep, experiment, uri)
