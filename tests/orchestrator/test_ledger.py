"""The MLflow ledger: SCHEDULED child runs up front, no duplicates, write-once claims."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import sweep_yaml
from faults.mlflow_kit import MlflowServer

from scalelab.contract.trial_time import parse_timestamp
from scalelab.orchestrator.ledger import Ledger
from scalelab.orchestrator.plan.expand import expand
from scalelab.orchestrator.plan.spec import parse_spec


def _sweep(name: str, seeds: int = 3):
    spec, source = parse_spec(sweep_yaml(name, seeds=seeds))
    return spec, expand(spec, source)


def test_sync_creates_scheduled_runs_once(work_home, sweep_name):
    spec, trials = _sweep(sweep_name)
    ledger = Ledger(spec.name)
    recs = ledger.sync(spec, trials)
    assert set(recs) == {t.trial_id for t in trials}
    run = ledger.client.get_run(recs[trials[0].trial_id].run_id)
    assert run.info.status == "SCHEDULED"
    assert run.data.tags["mlflow.parentRunId"] == ledger.parent_id
    assert run.data.tags["scalelab.variant"] == "dense" and run.data.tags["scalelab.size"] == "nano"
    assert run.data.params["model.size"] == "nano"
    again = Ledger(spec.name).sync(spec, trials)  # a second driver, later
    assert {t: r.run_id for t, r in again.items()} == {t: r.run_id for t, r in recs.items()}
    parent = ledger.client.get_run(ledger.parent_id)
    assert parent.info.run_name == f"sweep:{spec.name}"


def test_the_experiment_holds_a_view_of_the_trials_by_variant(work_home, sweep_name):
    """What the MLflow UI shows of a sweep is the experiment's own (docs/monitoring.md): its
    kind, a saved view with the swept settings, val/loss, FLOPs and tokens as columns and the
    runs grouped by variant, and each trial in its variant's colour."""
    text = sweep_yaml(sweep_name, seeds=2, extra="variants: [dense, hadamard]")
    spec, source = parse_spec(text)
    trials = expand(spec, source)
    ledger = Ledger(spec.name)
    recs = ledger.sync(spec, trials)
    tags = ledger.client.get_experiment(ledger.experiment_id()).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.scalelab-trials"])
    state = json.loads(view["state"])
    assert view["name"] and isinstance(view["createdAt"], int)
    columns = state["selectedColumns"]
    assert {"tags.`scalelab.variant`", "params.`seed`", "metrics.`val/loss`",
            "metrics.`compute/tokens`"} <= set(columns)  # fmt: skip
    assert "metrics.`compute/flops`" not in columns  # a raw integer cut to the column's width
    assert columns[-1] == "tags.`scalelab.run_s`"  # the run time, not MLflow's Duration
    assert state["columnOrder"][0] == "metrics.`val/loss`"  # the first column after the name
    assert set(state["columnOrder"]) == set(columns)
    assert "chartsSearchFilter" not in state  # no chart hidden behind a search
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "scalelab.variant"}]
    assert state["runsHiddenMode"] == "SHOW_ALL"  # every trial in the charts, not ten
    _assert_loss_charts_first(state)
    colour = {}
    for rec in recs.values():
        run = ledger.client.get_run(rec.run_id).data.tags
        colour.setdefault(run["scalelab.variant"], set()).add(run["mlflow.runColor"])
    assert all(len(c) == 1 for c in colour.values())  # one colour per variant
    assert colour["dense"] != colour["hadamard"]
    Ledger(spec.name).sync(spec, trials)  # a second submit keeps the view as it was
    again = ledger.client.get_experiment(ledger.experiment_id()).tags
    assert (
        again["mlflow.sharedViewState.scalelab-trials"]
        == tags["mlflow.sharedViewState.scalelab-trials"]
    )


def _assert_loss_charts_first(state: dict) -> None:
    """The charts the view opens on, as MLflow 3.17's chart cards: val/loss against GFLOPs on
    log axes (the x-axis is step = GFLOPs: MLflow logs an x-axis only when it is the step),
    then val/loss and train/loss against compute/flops (a linear x, log y), in the sections
    val then train, kept in that order (MLflow sorts them alphabetically otherwise)."""
    first, val_flops, train_flops = state["compareRunCharts"]
    assert first["type"] == "LINE" and first["metricKey"] == "val/loss_at_gflop"
    assert first["xAxisKey"] == "step" and not first["useGlobalXaxisKey"]
    assert first["xAxisScaleType"] == "log" and first["scaleType"] == "log"
    assert "val/loss" in first["displayName"] and "GFLOP" in first["displayName"]
    for chart, metric in ((val_flops, "val/loss"), (train_flops, "train/loss")):
        assert chart["metricKey"] == metric and chart["selectedMetricKeys"] == [metric]
        assert chart["xAxisKey"] == "metric" and chart["selectedXAxisMetricKey"] == "compute/flops"
        assert chart["scaleType"] == "log" and not chart["useGlobalXaxisKey"]
    sections = state["compareRunSections"]
    assert [s["name"] for s in sections] == ["val", "train"] and state["isAccordionReordered"]
    by_id = {s["uuid"]: s["name"] for s in sections}
    assert [by_id[c["metricSectionId"]] for c in state["compareRunCharts"]] == [
        "val",
        "val",
        "train",
    ]
    assert len({c["uuid"] for c in state["compareRunCharts"]}) == 3


def test_concurrent_syncs_leave_one_run_per_trial(work_home, sweep_name):
    spec, trials = _sweep(sweep_name, seeds=4)
    results = {}

    def drive(i: int) -> None:
        results[i] = Ledger(spec.name).sync(spec, trials)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {t: r.run_id for t, r in results[0].items()} == {
        t: r.run_id for t, r in results[1].items()
    }
    ledger = Ledger(spec.name)
    runs = ledger.search(
        f"tags.`scalelab.sweep` = '{spec.name}' and tags.`scalelab.role` = 'trial'"
    )
    assert len(runs) == len(trials)  # the losers' runs were deleted
    parents = ledger.search(
        f"tags.`scalelab.sweep` = '{spec.name}' and tags.`scalelab.role` = 'sweep'"
    )
    assert len(parents) == 1


def test_drivers_that_save_the_view_at_once_all_succeed(work_home, sweep_name):
    """Submits at once all find no saved view and all write it: a loser's write hits the
    experiment tag's unique key in the real store, and it must take the winner's view as its
    own (only the times differ), not fail the submit. A barrier lines the writes up."""
    text = sweep_yaml(sweep_name, seeds=2, extra="variants: [dense, hadamard]")
    spec, source = parse_spec(text)
    trials = expand(spec, source)
    drivers = [Ledger(spec.name) for _ in range(6)]
    eid = drivers[0].experiment_id(create=True)
    at_once = threading.Barrier(len(drivers))
    errors: list[BaseException] = []

    def line_up(ledger: Ledger) -> None:
        write = ledger.client.set_experiment_tag

        def lined_up(*args):
            if args[1].startswith("mlflow.sharedViewState."):
                at_once.wait(timeout=30)
            return write(*args)

        ledger.client.set_experiment_tag = lined_up  # the real store's write, lined up

    def drive(ledger: Ledger) -> None:
        try:
            ledger.describe_experiment(spec, trials)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for d in drivers:
        line_up(d)
    drivers[0].describe_experiment(spec, [])  # the experiment's kind, so only the view races
    for _ in range(3):  # the race is the store's own (select, then insert): line it up thrice
        threads = [threading.Thread(target=drive, args=(d,)) for d in drivers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        tags = drivers[0].client.get_experiment(eid).tags
        assert "mlflow.sharedViewState.scalelab-trials" in tags
        drivers[0].client.delete_experiment_tag(eid, "mlflow.sharedViewState.scalelab-trials")


def test_only_one_driver_wins_a_claim(work_home, sweep_name):
    spec, trials = _sweep(sweep_name, seeds=1)
    a, b = Ledger(spec.name), Ledger(spec.name)
    rec = a.sync(spec, trials)[trials[0].trial_id]
    a.heartbeat()
    b.find_parent()
    rec_b = b.record(rec.run_id)
    assert a.claim(rec)
    assert not b.claim(rec_b)  # a is alive: b backs off
    # b raced on a stale view of the run (it did not see a's claim): the store refuses it
    stale = b.record(rec.run_id)
    stale.params = {}
    assert not b.claim(stale)
    assert a.record(rec.run_id).claim == (0, a.driver_id)


def test_a_dead_drivers_claim_lapses(work_home, sweep_name):
    spec, trials = _sweep(sweep_name, seeds=1)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # a process that has exited
    import socket

    ghost = Ledger(spec.name, driver_id=f"{socket.gethostname()}:{pid}:abcdef")
    rec = ghost.sync(spec, trials)[trials[0].trial_id]
    ghost.heartbeat()
    assert ghost.claim(rec)
    alive = Ledger(spec.name)
    alive.find_parent()
    fresh = alive.record(rec.run_id)
    assert alive.claim(fresh)
    assert alive.record(rec.run_id).claim == (1, alive.driver_id)


def test_start_run_moves_the_placeholders_start_to_its_launch(work_home, sweep_name):
    """On the sqlite store the placeholder stays the trial's run: its start time (the UI's
    Created, and where its Duration starts) becomes the launch, in one statement."""
    spec, trials = _sweep(sweep_name, seeds=1)
    ledger = Ledger(spec.name)
    placeholder = ledger.sync(spec, trials)[trials[0].trial_id]
    assert ledger.claim(placeholder)
    time.sleep(0.01)  # a start time that moved is later
    started = ledger.start_runs([placeholder], [{"scalelab.attempts": "1"}])[0]
    run = ledger.client.get_run(placeholder.run_id)
    assert started.run_id == placeholder.run_id
    assert run.data.tags["scalelab.started"].endswith("Z")  # a time people read: UTC, ISO 8601
    assert run.info.start_time == parse_timestamp(run.data.tags["scalelab.started"])
    assert run.info.start_time == started.start_time > placeholder.start_time
    assert run.info.end_time is None and run.info.status == "SCHEDULED"
    assert run.data.tags["scalelab.attempts"] == "1"  # the launch's own tags, in that write
    assert run.data.params == ledger.record(placeholder.run_id).params  # the claim kept
    assert {r.run_id for r in ledger.records().values()} == {placeholder.run_id}
    assert started.launched and not placeholder.launched


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """A real `mlflow server` over its own sqlite store: its API cannot move a start time."""
    store = tmp_path_factory.mktemp("served") / "mlflow.db"
    server = MlflowServer(f"sqlite:///{store}").start()
    yield server.uri
    server.stop()


def test_on_a_tracking_server_start_run_replaces_the_placeholder_with_a_run_made_now(
    work_home, sweep_name, tracking_server, monkeypatch
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_server)
    spec, trials = _sweep(sweep_name, seeds=1)
    ledger = Ledger(spec.name)
    placeholder = ledger.sync(spec, trials)[trials[0].trial_id]
    assert ledger.claim(placeholder)
    started = ledger.start_run(placeholder)
    run = ledger.client.get_run(started.run_id)
    assert run.info.start_time == parse_timestamp(run.data.tags["scalelab.started"])
    assert run.info.start_time > placeholder.start_time
    assert run.info.status == "SCHEDULED" and run.info.run_name == placeholder.name
    assert run.data.params == placeholder.params  # science params and the claim
    assert {k: run.data.tags[k] for k in placeholder.tags} == placeholder.tags  # parent too
    assert ledger.client.get_run(placeholder.run_id).info.lifecycle_stage == "deleted"
    assert {r.run_id for r in ledger.records().values()} == {started.run_id}
    assert started.launched and not placeholder.launched


class _Snapshot(Ledger):
    """`scalelab cancel`'s ledger, which read the runs before the driver started a trial."""

    def __init__(self, sweep: str) -> None:
        super().__init__(sweep)
        self.snapshot = super().records()

    def records(self):
        return self.snapshot


class _CancelledWhileStarting(Ledger):
    """A driver's real ledger where that cancel lands inside start_run: on the placeholder,
    after it was copied, before it is deleted."""

    cancel: Ledger

    def set_status(self, run_id: str, status: str) -> None:
        if not getattr(self, "cancelled_once", False):
            self.cancelled_once = True
            self.cancel.request_cancel()
        super().set_status(run_id, status)


class _StartedWhileCancelling(Ledger):
    """`scalelab cancel`'s real ledger where the driver's start_run replaces a trial's run
    between the cancel reading the runs and writing the tag."""

    driver: Ledger

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        if not getattr(self, "started_once", False):
            self.started_once = True
            self.driver.start_run(self.driver.records()[self.trial_id])
        super().set_tags(run_id, tags)


def test_a_cancel_racing_a_trials_start_lands_on_its_live_run(
    work_home, sweep_name, tracking_server, monkeypatch
):
    """Where the start replaces the run (a tracking server): a cancel on the placeholder
    is carried over, and one that read the placeholder follows the trial to its new run."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_server)
    spec, trials = _sweep(sweep_name, seeds=1)
    tid = trials[0].trial_id
    driver = _CancelledWhileStarting(spec.name)
    placeholder = driver.sync(spec, trials)[tid]
    driver.cancel = _Snapshot(spec.name)
    started = driver.start_run(placeholder)
    assert started.cancelled and driver.cancelled_run_ids() == {started.run_id}

    spec, trials = _sweep(sweep_name + "-2", seeds=1)
    tid = trials[0].trial_id
    driver = Ledger(spec.name)
    driver.sync(spec, trials)
    cancel = _StartedWhileCancelling(spec.name)
    cancel.driver, cancel.trial_id = driver, tid
    touched = cancel.request_cancel()
    live = driver.records()[tid]
    assert touched == [live.run_id] and live.cancelled and live.status == "KILLED"
    assert driver.cancelled_run_ids() == {live.run_id}


def _padded(name: str, seeds: int, length: int) -> str:
    """The tiny sweep's YAML, padded with a comment to `length` characters."""
    text = sweep_yaml(name, seeds=seeds)
    return text + "#" + "x" * (length - len(text) - 2) + "\n"


def test_resume_reads_the_yaml_of_the_last_submit_whatever_its_length(work_home, sweep_name):
    """Issue 33, item 3: past 8,000 characters the YAML tag was not updated and `resume`
    read the older one (grown from 1 to 3 seeds, it ran 1 of 3)."""
    from scalelab.orchestrator import door

    for seeds, length in ((1, 7_900), (3, 8_100), (2, 30_000), (1, 500)):
        text = _padded(sweep_name, seeds, length)
        spec, _ = parse_spec(text)
        Ledger(spec.name).ensure_parent(spec, spec_yaml=text, spec_path="/gone/sweep.yaml")
        again = door.recorded(sweep_name)
        assert again.text == text and len(again.trials) == seeds and not again.notes
    tags = door.find(sweep_name).parent_tags()
    assert tags["scalelab.spec_yaml"] == text  # one that fits a tag reads as one in the UI


def test_resume_reads_overrides_longer_than_a_tag(work_home, sweep_name):
    """Issue 33, item 4: the overrides tag was cut at 8,000 characters, and every later
    `resume` raised JSONDecodeError."""
    import json

    from scalelab.orchestrator import door

    text = sweep_yaml(sweep_name, seeds=1)
    overrides = ["description=" + "a long note " * 900]  # 10,800 characters
    spec, _ = parse_spec(text, overrides=overrides)
    Ledger(spec.name).ensure_parent(spec, spec_yaml=text, overrides=json.dumps(overrides))
    again = door.recorded(sweep_name)
    assert list(again.overrides) == overrides and again.spec.description == spec.description


def test_a_damaged_record_is_refused_not_read(work_home, sweep_name):
    from scalelab.orchestrator import door

    text = _padded(sweep_name, 2, 20_000)
    spec, _ = parse_spec(text)
    ledger = Ledger(spec.name)
    ledger.ensure_parent(spec, spec_yaml=text)
    ledger.set_tags(ledger.parent_id, {"scalelab.spec_yaml.1": "x"})
    with pytest.raises(door.SweepRefused, match="damaged .* submit the sweep file again"):
        door.recorded(sweep_name)


def _beat_from_another_host(ledger: Ledger, driver_id: str, clock_offset_s: float) -> None:
    """The heartbeat a driver on another host writes, stamped by that host's clock."""
    import json
    import time

    beat = json.dumps({"t": time.time() + clock_offset_s, "host": "another-host", "pid": 1})
    ledger.client.set_tag(ledger.parent_id, "scalelab.driver." + driver_id.replace(":", "_"), beat)


def _claimed_by_another_host(sweep_name: str, clock_offset_s: float):
    spec, trials = _sweep(sweep_name, seeds=1)
    ghost_id = "another-host:1:aaaaaa"
    ghost = Ledger(spec.name, driver_id=ghost_id)
    run_id = ghost.sync(spec, trials)[trials[0].trial_id].run_id
    _beat_from_another_host(ghost, ghost_id, clock_offset_s)
    assert ghost.claim(ghost.record(run_id))
    reader = Ledger(spec.name, lease_s=1.5)
    reader.find_parent()
    return ghost, ghost_id, reader, run_id


def test_a_dead_driver_on_a_host_whose_clock_runs_ahead_loses_its_claim_after_a_lease(
    work_home, sweep_name
):
    """Issue 33, item 9: its trials were kept for the skew plus the lease (an hour here)."""
    import time

    from scalelab.orchestrator.ledger import Liveness

    _, ghost_id, reader, run_id = _claimed_by_another_host(sweep_name, clock_offset_s=3000)
    assert reader.liveness(ghost_id, reader.parent_tags()) is Liveness.UNKNOWN
    assert not reader.claim(reader.record(run_id))  # not watched for a lease yet
    time.sleep(1.6)  # a lease without a beat, on the reader's own clock
    assert reader.liveness(ghost_id, reader.parent_tags()) is Liveness.DEAD
    assert reader.claim(reader.record(run_id))


def test_a_live_driver_on_a_host_whose_clock_runs_behind_keeps_its_claim(work_home, sweep_name):
    """Its beats looked a lease old at once: before, another driver took its trials."""
    import time

    from scalelab.orchestrator.ledger import Liveness

    ghost, ghost_id, reader, run_id = _claimed_by_another_host(sweep_name, clock_offset_s=-600)
    for _ in range(4):  # it beats every lease / 4, as a driver does
        assert not reader.claim(reader.record(run_id))
        time.sleep(0.4)
        _beat_from_another_host(ghost, ghost_id, clock_offset_s=-600)
    assert reader.liveness(ghost_id, reader.parent_tags()) is Liveness.ALIVE
    assert not reader.claim(reader.record(run_id))
    assert reader.record(run_id).claim == (0, ghost_id)
