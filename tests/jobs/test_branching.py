"""A wsd cooldown branch seeded by its trunk gives the numbers of the same trial trained
alone from step 0 (orchestrator/plan/branching.py, jobs/training/branch_seed.py)."""

import pytest
from mlflow.tracking import MlflowClient

from scalelab.contract.runs import Tag
from scalelab.jobs.config import BranchSeed
from scalelab.jobs.training.checkpoint import complete_checkpoints, read_state
from scalelab.jobs.training.train import run

METRICS = ("train/loss", "val/loss", "train/lr", "compute/flops")


def _wsd(tiny_job, tokens, **kw):
    return tiny_job(train__schedule="wsd", train__tokens=tokens, train__warmup_steps=2,
                    train__cooldown_fraction=0.25, train__eval_interval=2, **kw)  # fmt: skip


def test_a_branch_trains_its_cooldown_only_and_matches_the_trial_alone(
    home, mlflow_uri, tiny_job, curve, tmp_path, monkeypatch
):
    short = _wsd(tiny_job, 1024)  # 4 steps: cooldown from step 3
    trunk = _wsd(tiny_job, 2048, train__branch_seeds=[BranchSeed(step=3, trial_id=short.trial_id)])
    assert trunk.trial_id == _wsd(tiny_job, 2048).trial_id  # seeds are placement
    assert run(trunk).status == "FINISHED"
    seeded = complete_checkpoints(home / "trials" / short.trial_id / "ckpt")
    assert [p.name for p in seeded] == ["step00000003"]
    branched = run(short)
    assert branched.status == "FINISHED" and branched.steps == 4 and branched.tokens == 1024
    final = complete_checkpoints(home / "trials" / short.trial_id / "ckpt")[-1]
    assert read_state(final)["branched_from"] == {"trial_id": trunk.trial_id, "step": 3}
    tags = MlflowClient(mlflow_uri).get_run(branched.run_id).data.tags
    assert tags[Tag.BRANCHED_FROM] == f"{trunk.trial_id}@3"
    history = MlflowClient(mlflow_uri).get_metric_history(branched.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 5))  # the trunk's part too
    alone = _matches_alone(short, branched, home, curve, tmp_path, monkeypatch)
    assert branched.flops == pytest.approx(alone.flops)  # it reports the whole trial's compute


def test_a_shorter_trial_seeds_a_longer_one_that_then_matches_the_trial_alone(
    home, mlflow_uri, tiny_job, curve, tmp_path, monkeypatch
):
    """A halving search's direction (orchestrator/plan/halving.py): the rung's short trial
    seeds the next rung's long one at its own cooldown start, where both have trained the
    same steps; the long one trains only the rest and ends as it would alone."""
    long = _wsd(tiny_job, 2048)  # 8 steps: cooldown from step 6
    short = _wsd(tiny_job, 1024, train__branch_seeds=[BranchSeed(step=3, trial_id=long.trial_id)])
    assert run(short).status == "FINISHED"
    assert [p.name for p in complete_checkpoints(home / "trials" / long.trial_id / "ckpt")] == [
        "step00000003"
    ]
    resumed = run(long)
    assert resumed.status == "FINISHED" and resumed.steps == 8
    final = complete_checkpoints(home / "trials" / long.trial_id / "ckpt")[-1]
    assert read_state(final)["branched_from"] == {"trial_id": short.trial_id, "step": 3}
    _matches_alone(long, resumed, home, curve, tmp_path, monkeypatch)


def _matches_alone(job, seeded, home, curve, tmp_path, monkeypatch):
    """`job`, trained again from step 0 in a fresh work directory, logs the same curves and
    ends at the same loss as `seeded` did; returns that run's result."""
    got = {m: curve(home, job.trial_id, m) for m in METRICS}
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "alone"))
    alone = run(job)
    want = {m: curve(tmp_path / "alone", job.trial_id, m) for m in METRICS}
    for m in METRICS:
        assert [s for s, _ in got[m]] == [s for s, _ in want[m]], m
        assert [v for _, v in got[m]] == pytest.approx([v for _, v in want[m]], rel=1e-6), m
    assert seeded.final_val_loss == pytest.approx(alone.final_val_loss, rel=1e-6)
    return alone


def test_a_seed_for_a_trial_the_sweep_no_longer_lists_is_removed_and_nothing_trained_is(
    home, tiny_job
):
    """A halving rung seeds every rate's next-rung trial before the next rung drops half
    of them (orchestrator/tuned_run.py): the seeds of the dropped ones go once the search
    has ended; the rung's own folders, a seed still listed, and a trial that has trained
    from its seed stay."""
    from scalelab.orchestrator.plan.expand import Trial
    from scalelab.orchestrator.tuned_run import discard_unused_seeds

    def listed(job):
        return Trial(job, job.trial_id, "dense", "nano", 0, 0, job.train.tokens, 0.0)

    kept, dropped = _wsd(tiny_job, 2048), _wsd(tiny_job, 3072)
    seeds = [
        BranchSeed(step=3, trial_id=kept.trial_id),
        BranchSeed(step=3, trial_id=dropped.trial_id),
    ]
    short = _wsd(tiny_job, 1024, train__branch_seeds=seeds)
    assert run(short).status == "FINISHED"

    def folder(job):
        return home / "trials" / job.trial_id

    assert all(complete_checkpoints(folder(job) / "ckpt") for job in (kept, dropped))

    assert discard_unused_seeds([listed(short), listed(kept)]) == [dropped.trial_id]
    assert not folder(dropped).exists()
    assert [p.name for p in complete_checkpoints(folder(kept) / "ckpt")] == ["step00000003"]
    assert (folder(short) / "result.json").exists()
    assert run(kept).status == "FINISHED"  # trained on from its seed
    assert discard_unused_seeds([listed(short)]) == []  # no longer a seed alone: kept
    assert (folder(kept) / "result.json").exists()
