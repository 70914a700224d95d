"""The fault suite: each test provokes one fault with the real component (a server stopped,
a process killed, a file corrupted, a hostile input) and checks that nothing is lost and
nobody is let in. docs/reliability.md lists what each test guarantees."""

import json
import shutil
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

import pytest

from scalelab.jobs.config import JobConfig


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)


# -- a trained trial with checkpoints, for the checkpoint faults ---------------------------
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID")


@dataclass(frozen=True)
class Trial:
    home: Path
    job: JobConfig
    losses: list[tuple[int, float]]  # (step, train/loss) of the uninterrupted run

    @property
    def dir(self) -> Path:
        return self.home / "trials" / self.job.trial_id

    @property
    def ckpt(self) -> Path:
        return self.dir / "ckpt"

    def re_record(self, path: Path) -> None:
        """Record `path`'s current size and SHA-256 in its checkpoint's marker, as a tamperer
        who knows the format would (a marker from before checksums has nothing to update)."""
        marker_file = path.parent / "COMPLETE"
        marker = json.loads(marker_file.read_text())
        if "files" in marker:
            data = path.read_bytes()
            marker["files"][path.name] = {"size": len(data), "sha256": sha256(data).hexdigest()}
            marker_file.write_text(json.dumps(marker))

    def curve(self, metric: str = "train/loss") -> list[tuple[int, float]]:
        rows = [json.loads(line) for line in (self.dir / "curves.jsonl").read_text().splitlines()]
        return [(r["step"], r["value"]) for r in rows if r["metric"] == metric]


def _isolated(mp: pytest.MonkeyPatch, home: Path, mlflow_uri: str) -> None:
    mp.setenv("SCALELAB_HOME", str(home))
    mp.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    mp.setenv("SCALELAB_EXPERIMENT", "tests-faults")
    for key in LAUNCHER_VARS:
        mp.delenv(key, raising=False)


@pytest.fixture(scope="session")
def checkpointed_trial(tmp_path_factory) -> Trial:
    """A finished nano ZeRO-2 trial (8 steps, checkpoints at steps 3, 6 and 8), trained
    once per session; tests get a copy (`trial_copy`)."""
    from scalelab.jobs.training.train import run

    root = tmp_path_factory.mktemp("checkpointed")
    # budget: RNG-driven Gumbel noise, so the RNG state must come back for equal losses
    train = {"tokens": 2048, "global_batch_tokens": 256, "lr": 3e-3, "log_interval": 1}
    train |= {"eval_interval": 4, "checkpoint_interval": 3, "keep_checkpoints": 3}
    job = JobConfig.model_validate(
        {
            "model": {"size": "nano", "vocab_size": 256, "block_size": 32, "budget": {}},
            "data": {"source": "builtin:pydoc", "seq_len": 32, "val_tokens": 256},
            "train": train,
            "deepspeed": {"zero_stage": 2},
        }
    )
    with pytest.MonkeyPatch.context() as mp:
        _isolated(mp, root / "home", f"sqlite:///{root / 'mlflow.db'}")
        assert run(job).status == "FINISHED"
    trial = Trial(root / "home", job, [])
    return Trial(trial.home, job, trial.curve())


@pytest.fixture
def trial_copy(checkpointed_trial, tmp_path, monkeypatch) -> Trial:
    """A private copy of `checkpointed_trial` that run(job) resumes (same MLflow store)."""
    home = tmp_path / "home"
    shutil.copytree(checkpointed_trial.home, home)
    uri = f"sqlite:///{checkpointed_trial.home.parent / 'mlflow.db'}"
    _isolated(monkeypatch, home, uri)
    return Trial(home, checkpointed_trial.job, checkpointed_trial.losses)


# -- object storage (`storage:`), for the remote checkpoint and data tests -----------------
@pytest.fixture(scope="session")
def s3():
    """One moto_server for the session (faults/s3_server.py); tests take prefixes of it."""
    from faults.s3_server import moto_server

    with moto_server() as server:
        yield server


@pytest.fixture
def aws(monkeypatch) -> None:
    from faults.s3_server import CREDENTIALS

    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
