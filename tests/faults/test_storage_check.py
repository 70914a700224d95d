"""`storage:` is checked at `submit` and `submit --dry-run`, against a real S3-compatible
server on 127.0.0.1 (moto's): a bucket that does not exist is refused in one line before
anything is created. Before, a trial took it for empty storage (uploads only warned) and a
lost node's trial started again from step 0."""

from __future__ import annotations

from pathlib import Path

from faults.mlflow_kit import scalelab, sweep_yaml
from faults.s3_server import BUCKET, S3


def _sweep(tmp_path: Path, name: str, uri: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_yaml(name, seeds=1) + f'storage: "{uri}"\n')
    return path


def _nothing_created(home: Path) -> None:
    assert not (home / "trials").exists()
    db = home / "mlflow.db"
    if db.exists():
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{db}")
        experiments = [e.experiment_id for e in client.search_experiments()]
        assert client.search_runs(experiments) == []


def test_a_bucket_that_does_not_exist_is_refused_by_submit_and_dry_run(tmp_path, s3, aws):
    uri = s3.uri().replace(f"s3://{BUCKET}/", "s3://no-such-bucket/")
    sweep = _sweep(tmp_path, "no-bucket", uri)
    home = tmp_path / "home"

    for args in (["--dry-run"], ["--no-summary"]):
        refused = scalelab("submit", str(sweep), *args, home=home, timeout=120)

        assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        (line,) = lines
        assert line.startswith("error: sweep no-bucket: storage s3://no-such-bucket/"), line
        assert "bucket no-such-bucket does not exist" in line and "nothing submitted" in line
        _nothing_created(home)


def test_storage_that_works_passes_and_keeps_no_marker(tmp_path, s3: S3, aws):
    from scalelab.orchestrator.storage_check import storage_refusal

    uri = s3.uri()
    assert storage_refusal(uri) is None
    prefix = uri.split("?", 1)[0].removeprefix("s3://")
    assert s3.objects(prefix) == []  # the marker was deleted
