"""Checkpoints written while training goes on (train.async_checkpoint; issue 26, 6c): the
writer's work (writing, flushing, hashing, the marker) runs on its own thread; the marker
waits for every rank's files; and a trial checkpointed that way resumes bit for bit."""

import json
import shutil
import threading
import time

import pytest
import torch
from two_ranks import train_on_two_ranks

from scalelab.contract.workdir import RESULT_FILE
from scalelab.jobs.training import checkpoint
from scalelab.jobs.training.async_save import DIGESTS, BackgroundWriter
from scalelab.jobs.training.distributed import DistEnv
from scalelab.jobs.training.train import run


def _env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank, world, rank, world, "127.0.0.1", 0, "none", "cpu", False)


def test_the_writer_writes_hashes_and_marks_off_the_calling_thread(tmp_path):
    tag_dir = tmp_path / "ckpt" / "step00000001"
    tag_dir.mkdir(parents=True)
    live = torch.arange(6.0)
    files = [(tag_dir / "a.pt", {"w": live.clone()}), (tag_dir / "b.pt", [live.clone()])]
    committed, release = threading.Event(), threading.Event()
    seen: dict = {}

    def commit(records: dict) -> None:
        seen.update(records, thread=threading.current_thread().name)
        committed.set()
        release.wait()

    writer = BackgroundWriter(timeout_s=60)
    writer.start(_env(0, 1), tag_dir, files, commit)
    assert committed.wait(30)  # marked while this thread is free (the commit still waits)
    assert seen.pop("thread") != threading.current_thread().name
    release.set()
    writer.wait()
    assert seen == checkpoint.checksums.digests(tag_dir, ["a.pt", "b.pt"])
    assert torch.equal(torch.load(tag_dir / "a.pt")["w"], live)
    assert not list(tag_dir.glob("digests.*"))  # merged into the record


def test_the_marker_waits_for_every_ranks_files(tmp_path):
    """Rank 0 of 2 whose partner never finishes: no marker, and the failure is raised."""
    ckpt = tmp_path / "ckpt"
    tag_dir = ckpt / "step00000001"
    tag_dir.mkdir(parents=True)
    writer = BackgroundWriter(timeout_s=0.5)
    commit = lambda files: checkpoint.commit(ckpt, tag_dir, 2, files, {"step": 1}, keep=2)  # noqa: E731
    writer.start(_env(0, 2), tag_dir, [(tag_dir / "model.pt", {"w": torch.ones(2)})], commit)
    with pytest.raises(RuntimeError, match="saving checkpoint") as failed:
        writer.wait()
    assert DIGESTS.format(rank=1) in str(failed.value.__cause__)
    assert not (tag_dir / checkpoint.MARKER).exists()
    assert checkpoint.latest(ckpt) is None


def test_a_save_abandoned_when_training_fails_is_never_marked(tmp_path):
    """Rank 0 of 2 waiting for its partner's records when training fails: abandon() ends
    the wait at once (not after the process group's timeout) and leaves no marker."""
    ckpt = tmp_path / "ckpt"
    tag_dir = ckpt / "step00000001"
    tag_dir.mkdir(parents=True)
    writer = BackgroundWriter(timeout_s=600)
    commit = lambda files: checkpoint.commit(ckpt, tag_dir, 2, files, {"step": 1}, keep=2)  # noqa: E731
    writer.start(_env(0, 2), tag_dir, [(tag_dir / "model.pt", {"w": torch.ones(2)})], commit)
    deadline = time.monotonic() + 60
    while not (tag_dir / DIGESTS.format(rank=0)).exists():  # its own files are written
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    writer.abandon()
    assert time.monotonic() - t0 < 5
    assert not (tag_dir / checkpoint.MARKER).exists()
    writer.wait()  # nothing is raised for an abandoned save


@pytest.mark.slow
def test_an_async_checkpoint_of_the_ladders_setting_resumes_bit_for_bit(home, tiny_job, curve):
    job = tiny_job(train__dtype="bf16", deepspeed__zero_stage=1, train__tokens=1024,
                   train__checkpoint_interval=2, train__async_checkpoint=True)  # fmt: skip
    assert run(job).status == "FINISHED"
    losses = curve(home, job.trial_id, "train/loss")
    ckpt = home / "trials" / job.trial_id / "ckpt"
    for tag_dir in checkpoint.complete_checkpoints(ckpt):
        assert checkpoint.verify(tag_dir) == ""  # every file as recorded
        assert not list(tag_dir.glob("digests.*"))
    marker = json.loads((ckpt / "step00000002" / checkpoint.MARKER).read_text())
    assert marker["state"]["step"] == 2  # the state of its step, not of a later one
    shutil.rmtree(ckpt / "step00000004")
    (ckpt.parent / RESULT_FILE).unlink()

    resumed = run(job)

    assert resumed.status == "FINISHED" and resumed.steps == 4
    assert curve(home, job.trial_id, "train/loss") == losses


@pytest.mark.slow
@pytest.mark.distributed
def test_the_ladders_setting_on_two_ranks_trains_as_a_synchronous_save_and_resumes(
    home, tmp_path, tiny_job, curve
):
    """As the ladders run it (sweeps/hadamard.yaml: ZeRO-1 bf16, one optimizer shard per
    rank): rank 0 marks a checkpoint once both ranks' writers have recorded their files,
    training is the synchronous save's, and the trial resumes bit for bit."""
    ladder = dict(train__dtype="bf16", deepspeed__zero_stage=1, deepspeed__micro_batch_size=2,
                  train__tokens=1024, train__checkpoint_interval=2)  # fmt: skip
    job, synchronous = tiny_job(**ladder, train__async_checkpoint=True), tiny_job(**ladder)
    other = tmp_path / "sync"
    results = train_on_two_ranks([(home, job), (other, synchronous)], tmp_path)
    assert [r["status"] for r in results] == ["FINISHED", "FINISHED"]
    losses = curve(home, job.trial_id, "train/loss")
    assert losses == curve(other, job.trial_id, "train/loss")
    ckpt = home / "trials" / job.trial_id / "ckpt"
    for tag_dir in checkpoint.complete_checkpoints(ckpt):
        assert checkpoint.verify(tag_dir) == ""
        recorded = json.loads((tag_dir / checkpoint.MARKER).read_text())["files"]
        assert {f"rng_rank{r}.pt" for r in (0, 1)} <= set(recorded)
        assert len([name for name in recorded if name.endswith("optim_states.pt")]) == 2
    shutil.rmtree(ckpt / "step00000004")
    (ckpt.parent / RESULT_FILE).unlink()

    (resumed,) = train_on_two_ranks([(home, job)], tmp_path)

    assert resumed["status"] == "FINISHED" and resumed["steps"] == 4
    assert curve(home, job.trial_id, "train/loss") == losses
