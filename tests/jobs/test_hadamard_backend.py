"""Which Hadamard kernel a trial ran reaches its run (tag scalelab.hadamard_backend) and its
log; the backend setting is placement, not identity; Triton's cache on a SLURM node."""

import os

import pytest
from mlflow import MlflowClient

from scalelab.contract.runs import Tag
from scalelab.jobs.training.train import run
from scalelab.kernels import backend
from scalelab.kernels.backend import HadamardBackendWarning


@pytest.fixture(autouse=True)
def fresh_choices():
    backend.forget()
    yield
    backend.forget()


def test_the_backend_setting_keeps_the_trial_id(tiny_job):
    ids = {
        tiny_job(model__hadamard=settings).trial_id
        for settings in ({}, {"backend": "auto"}, {"backend": "triton"}, {"backend": "torch"})
    }
    legacy = tiny_job(model__attn_out="hadamard").trial_id
    assert ids == {legacy} and legacy != tiny_job().trial_id


@pytest.mark.slow
def test_a_fallback_is_tagged_on_the_trial_s_run_and_logged(
    home, tiny_job, mlflow_uri, monkeypatch, capfd
):
    """A Triton kernel that fails to compile (forced: no GPU here) on a tensor that claims
    the Triton path: the trial trains on the torch path and says so."""

    def broken(*args, **kwargs):
        raise RuntimeError("PassManager::run failed (forced compile failure)")

    monkeypatch.setattr(backend, "triton_eligible", lambda x: True)
    monkeypatch.setattr(backend, "run_triton", broken)
    with pytest.warns(HadamardBackendWarning, match="forced compile failure"):
        result = run(tiny_job(model__hadamard={}, train__tokens=256 * 2))
    assert result.status == "FINISHED" and result.steps == 2
    tag = MlflowClient(mlflow_uri).get_run(result.run_id).data.tags[Tag.HADAMARD_BACKEND]
    assert tag.startswith("torch (auto fell back from triton: 64 float32 cpu: the Triton kernel")
    assert "forced compile failure" in tag
    assert f"rank 0: Hadamard transform on {tag}" in capfd.readouterr().err  # the trial's log


def test_the_triton_cache_is_node_local_unless_the_user_chose_one(monkeypatch, tmp_path):
    from scalelab.jobs.environ import node_local_triton_cache

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert node_local_triton_cache() == str(tmp_path / f"scalelab-triton-{os.getuid()}")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.delenv("TMPDIR")
    assert node_local_triton_cache() == f"/tmp/scalelab-triton-{os.getuid()}"
    monkeypatch.setenv("TRITON_CACHE_DIR", "/scratch/mine")
    assert node_local_triton_cache() == "/scratch/mine"
    assert os.environ["TRITON_CACHE_DIR"] == "/scratch/mine"
