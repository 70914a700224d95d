"""Checkpoints and metric spools in object storage (`storage:`; issue 32), against a real
S3-compatible server on 127.0.0.1 (moto's `moto_server`, a subprocess): a trial whose
node never saw its files resumes from the storage with the uninterrupted run's losses and
its unsent metrics; an upload cut short before its marker, and an object that does not
match its checksum, are never taken as checkpoints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from faults.s3_server import S3, free_port

from scalelab.contract.workdir import RESULT_FILE
from scalelab.jobs.training.remote_checkpoints import Storage

OPTIMIZER_STATES = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _tags(s3: S3, storage: Storage) -> dict[str, list[str]]:
    """Each remote checkpoint folder and the objects in it."""
    out: dict[str, list[str]] = {}
    for path in s3.objects(f"{storage.root}/checkpoints"):
        tag, name = path.split("/")[-2:]
        out.setdefault(tag, []).append(name)
    return {t: sorted(names) for t, names in sorted(out.items())}


def _uploaded(trial, s3: S3, tags: tuple[str, ...], uri: str | None = None) -> Storage:
    """`trial`'s checkpoints `tags` uploaded by the product's own upload."""
    storage = Storage(uri or s3.uri(), trial.job.trial_id)
    for tag in tags:
        storage.upload(trial.ckpt / tag, keep=3)
    assert _tags(s3, storage).keys() == set(tags)
    return storage


def _flip_a_byte(data: bytes) -> bytes:  # same size: only the checksum can tell
    flipped = bytearray(data)
    flipped[len(flipped) * 3 // 4] ^= 0x01
    return bytes(flipped)


@pytest.mark.slow
def test_a_trial_whose_node_never_saw_its_files_resumes_from_object_storage(
    trial_copy, s3, aws, monkeypatch, caplog
):
    """The first node resumes the trial at step 3 with MLflow out of its reach (every write
    stays spooled) and uploads its checkpoints 6 and 8 as it writes them (asynchronously:
    on the checkpoint writer's thread); the upload of step 8 is cut short before its
    marker. Then the node goes, with the trial folder: the next node downloads step 6,
    trains steps 7-8 with the uninterrupted run's losses (saving synchronously: step 8 is
    uploaded again), and sends the first node's spool, so MLflow gets every step."""
    from mlflow import MlflowClient

    from scalelab.jobs.training.train import run

    trial = trial_copy
    job = trial.job.model_copy(update={"storage": s3.uri()})
    storage = Storage(job.storage, job.trial_id)
    for tag in ("step00000006", "step00000008"):
        shutil.rmtree(trial.ckpt / tag)
    (trial.dir / RESULT_FILE).unlink()
    store = os.environ["MLFLOW_TRACKING_URI"]
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("tests-faults")
    run_id = client.create_run(experiment.experiment_id).info.run_id

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nobody
    monkeypatch.setenv("SCALELAB_TRACKING_FINISH_TIMEOUT_S", "0")
    async_train = job.train.model_copy(update={"async_checkpoint": True})
    first = run(job.model_copy(update={"train": async_train}), run_id)
    assert first.status == "FINISHED" and first.metrics_pending > 0
    remote = _tags(s3, storage)
    assert list(remote) == ["step00000003", "step00000006", "step00000008"][1:]
    assert remote["step00000008"] == sorted(p.name for p in (trial.ckpt / "step00000008").iterdir())

    s3.fs.delete_file(f"{storage.root}/checkpoints/step00000008/COMPLETE")  # cut short
    shutil.rmtree(trial.dir)  # a node that never saw the trial's files
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.delenv("SCALELAB_TRACKING_FINISH_TIMEOUT_S")
    second = run(job, run_id)

    assert second.status == "FINISHED" and second.steps == 8
    assert trial.curve() == trial.losses[6:]  # steps 7-8, as the uninterrupted run's
    # resumed at step 6, not trained from the start (which would have saved step 3 too)
    assert sorted(p.name for p in trial.ckpt.glob("step*")) == ["step00000006", "step00000008"]
    assert any("step00000008" in r.getMessage() and "no marker" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    tags = client.get_run(run_id).data.tags
    assert "step00000008 skipped: no marker" in tags["scalelab.checkpoints_skipped"]
    sent = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    assert sent == trial.losses  # steps 1-6 only ever were in the first node's spool
    remote = _tags(s3, storage)  # step 8 uploaded anew, complete
    assert remote.keys() == {"step00000006", "step00000008"}
    assert "COMPLETE" in remote["step00000008"]


def test_an_upload_killed_before_its_marker_is_never_a_checkpoint(trial_copy, s3, aws, tmp_path):
    """A process uploading step 8 is killed (SIGKILL) after some of its objects: its
    optimizer file is a pipe nobody writes, so the upload stops there, after the files
    sorted before it and before the marker. The resume fetches step 6."""
    uri = s3.uri()
    storage = _uploaded(trial_copy, s3, ("step00000006",), uri)
    tag_dir = tmp_path / "step00000008"
    shutil.copytree(trial_copy.ckpt / tag_dir.name, tag_dir)
    (tag_dir / OPTIMIZER_STATES).unlink()
    os.mkfifo(tag_dir / OPTIMIZER_STATES)
    upload = (
        "import sys, pathlib; from scalelab.jobs.training.remote_checkpoints import Storage; "
        "Storage(sys.argv[1], sys.argv[2]).upload(pathlib.Path(sys.argv[3]), keep=3)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", upload, uri, trial_copy.job.trial_id, str(tag_dir)]
    )
    before_the_pipe = ["mp_rank_00_model_states.pt", "rng_rank0.pt"]
    try:
        deadline = time.time() + 120
        while not set(before_the_pipe) <= set(_tags(s3, storage).get(tag_dir.name, [])):
            assert proc.poll() is None and time.time() < deadline, "the upload did not get there"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    assert _tags(s3, storage)[tag_dir.name] == before_the_pipe  # and no marker
    node = tmp_path / "node" / "ckpt"

    skipped = storage.fetch(node)

    assert [p.name for p in node.iterdir() if p.name.startswith("step")] == ["step00000006"]
    assert skipped == ["remote step00000008 skipped: no marker (an upload cut short)"]
    for path in (trial_copy.ckpt / "step00000006").iterdir():
        assert (node / "step00000006" / path.name).read_bytes() == path.read_bytes()


def test_every_object_but_the_marker_is_not_a_checkpoint_either(trial_copy, s3, aws, tmp_path):
    storage = _uploaded(trial_copy, s3, ("step00000006", "step00000008"))
    s3.fs.delete_file(f"{storage.root}/checkpoints/step00000008/COMPLETE")
    node = tmp_path / "node" / "ckpt"

    skipped = storage.fetch(node)

    assert [p.name for p in node.iterdir() if p.name.startswith("step")] == ["step00000006"]
    assert skipped == ["remote step00000008 skipped: no marker (an upload cut short)"]


def test_a_remote_object_that_does_not_match_its_checksum_is_refused(
    trial_copy, s3, aws, tmp_path, caplog
):
    storage = _uploaded(trial_copy, s3, ("step00000006", "step00000008"))
    bad = f"{storage.root}/checkpoints/step00000008/{OPTIMIZER_STATES}"
    with s3.fs.open_input_stream(bad) as f:
        data = f.read()
    with s3.fs.open_output_stream(bad) as f:
        f.write(_flip_a_byte(data))
    node = tmp_path / "node" / "ckpt"

    skipped = storage.fetch(node)

    assert [p.name for p in node.iterdir() if p.name.startswith("step")] == ["step00000006"]
    assert len(skipped) == 1 and skipped[0].startswith("remote step00000008 skipped: ")
    assert OPTIMIZER_STATES in skipped[0] and "different SHA-256" in skipped[0]
    assert sum("step00000008" in r.getMessage() for r in caplog.records) == 1  # one line


def test_the_storage_setting_is_checked_and_reaches_every_trial(tmp_path):
    from pydantic import ValidationError

    from scalelab.orchestrator.plan.expand import expand
    from scalelab.orchestrator.plan.spec import SweepSpec

    base = {"model": {"size": "nano", "vocab_size": 256, "block_size": 32},
            "data": {"seq_len": 32}, "train": {"tokens": 2048, "global_batch_tokens": 256}}  # fmt: skip
    spec = SweepSpec.model_validate(
        {"name": "s", "base": base, "grid": {"seed": [0, 1]}, "storage": "s3://b/p"}
    )
    trials = expand(spec)
    assert [t.job.storage for t in trials] == ["s3://b/p", "s3://b/p"]
    plain = expand(spec.model_copy(update={"storage": None}))
    assert [t.trial_id for t in plain] == [t.trial_id for t in trials]  # not the identity
    for bad in ("bucket/prefix", "s3://b/p?secret_key=x", "s3:///p"):
        with pytest.raises(ValidationError):
            SweepSpec.model_validate({"name": "s", "base": base, "storage": bad})


def _spooled_remotely(trial, s3: S3) -> tuple[Storage, str, str]:
    """A run whose whole curve waits in the trial's spool (nothing sent), uploaded by the
    product's own upload; then the node goes with the trial's spool and result, keeping its
    checkpoints (the resume trains nothing: step 8 is the last). Returns (storage, its URI,
    run id)."""
    from mlflow import MlflowClient

    from scalelab.jobs.tracking.outbox import Outbox
    from scalelab.jobs.tracking.tracker import read_curve

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("tests-faults")
    run_id = client.create_run(experiment.experiment_id).info.run_id
    Outbox(trial.dir, run_id).copy_curve(read_curve(trial.dir))
    uri = s3.uri()
    storage = Storage(uri, trial.job.trial_id)
    storage.upload_spools(trial.dir)
    assert {f"{run_id}/sent", f"{run_id}/spool.jsonl"} <= set(s3.objects(f"{storage.root}/outbox"))
    shutil.rmtree(trial.dir / "outbox")
    (trial.dir / RESULT_FILE).unlink()
    return storage, uri, run_id


def test_a_corrupt_remote_sent_object_is_skipped_and_the_trial_finishes(
    trial_copy, s3, aws, caplog
):
    """The `sent` object of a remote spool is garbage: before, every attempt of the trial
    failed on it (ValueError); now it is one warning line and the whole spool is sent."""
    from mlflow import MlflowClient

    from scalelab.jobs.training.train import run

    storage, uri, run_id = _spooled_remotely(trial_copy, s3)
    with s3.fs.open_output_stream(f"{storage.root}/outbox/{run_id}/sent") as f:
        f.write(b"\x00\xffnot an offset")
    job = trial_copy.job.model_copy(update={"storage": uri})

    result = run(job, run_id)

    assert result.status == "FINISHED" and result.metrics_pending == 0
    warned = [r.getMessage() for r in caplog.records if "outbox" in r.getMessage()]
    assert len(warned) == 1 and f"{run_id}/sent skipped" in warned[0], warned
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    sent = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    assert sent == trial_copy.losses  # every point, once


def test_a_corrupt_remote_spool_is_skipped_and_the_trial_finishes(trial_copy, s3, aws, caplog):
    from scalelab.jobs.training.train import run

    storage, uri, run_id = _spooled_remotely(trial_copy, s3)
    with s3.fs.open_output_stream(f"{storage.root}/outbox/{run_id}/spool.jsonl") as f:
        f.write(b'{"kind": "metric", "key": "train/loss"}\n')  # a write without its point
    job = trial_copy.job.model_copy(update={"storage": uri})

    result = run(job, run_id)

    assert result.status == "FINISHED"
    warned = [r.getMessage() for r in caplog.records if "outbox" in r.getMessage()]
    assert len(warned) == 1 and "spool.jsonl skipped: line 1 is not a spool write" in warned[0]
