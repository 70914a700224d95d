"""Prepared token data in object storage (`storage:`; issue 32), against a real S3-compatible
server on 127.0.0.1 (moto's, faults/s3_server.py): data prepared and uploaded on one node
reaches a trial on a node that never saw it byte for byte; an upload cut short before its
manifest, and a shard that does not match its manifest, are never taken as data (the
trial prepares its own, as without `storage`)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scalelab.cli.main import app
from scalelab.jobs.config import JobConfig
from scalelab.jobs.data.prepare import prepare_source
from scalelab.jobs.data.remote_data import RemoteData
from scalelab.jobs.data.shards import DEFAULT_SHARD_TOKENS, read_manifest
from scalelab.jobs.data.sources import TextSource
from scalelab.jobs.data.trial import prepare

SHARD_TOKENS = 4096  # the uploaded dataset's; a trial preparing its own uses the default
JOB = JobConfig.model_validate({
    "model": {"size": "nano", "vocab_size": 256, "block_size": 32},
    "data": {"source": "builtin:pydoc", "seq_len": 32, "val_tokens": 256},
    "train": {"tokens": 2048, "global_batch_tokens": 256},
})  # fmt: skip
WINDOWS = 64  # 8 steps of 8 windows: 2,049 tokens, well inside the uploaded 20,480


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name != "lock"}


def _pushed(
    s3, tmp_path: Path, monkeypatch, cut: bool = False
) -> tuple[str, Path, dict[str, bytes]]:
    """builtin:pydoc prepared on a first node and uploaded by `scalelab data prepare
    --storage` (`cut`: uploaded by the same code but cut short at shard 3, a file that is
    gone); then that node's data folder is gone and the second node's is empty."""
    uri = s3.uri()
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "node1"))
    done = CliRunner().invoke(app, [
        "data", "prepare", "builtin:pydoc", "--tokenizer", "byte", "--max-tokens", "20000",
        "--shard-tokens", str(SHARD_TOKENS), "--workers", "0", *([] if cut else ["--storage", uri]),
    ])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert cut or "uploaded to s3://" in done.output
    (root,) = (tmp_path / "node1").iterdir()
    first = _files(root)
    if cut:
        (root / "train-000003.bin").unlink()
        with pytest.raises(FileNotFoundError):
            RemoteData(uri, root.name).push(root)
    shutil.rmtree(tmp_path / "node1")
    monkeypatch.setenv("SCALELAB_DATA", str(tmp_path / "node2"))
    return uri, root, first


def _remote(uri: str, folder: str) -> str:
    return f"{uri.split('?')[0].removeprefix('s3://')}/data/{folder}"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("here", ["nothing", "fewer tokens"])
def test_a_node_without_the_data_fetches_it_byte_identical(s3, aws, tmp_path, monkeypatch, here):
    """`fewer tokens`: the node prepared 1 shard itself and the trial needs 12,801 tokens:
    the fetch keeps that shard and adds the 4 others (preparing on would stop at 4)."""
    uri, first, files = _pushed(s3, tmp_path, monkeypatch)
    remote = _remote(uri, first.name)
    assert s3.objects(remote) == sorted(files)  # every listed file and the manifest
    windows = WINDOWS
    if here == "fewer tokens":
        source = TextSource.open("builtin:pydoc", "text")
        _, m = prepare_source(source, "byte", max_tokens=4096, workers=0, shard_tokens=SHARD_TOKENS)
        assert len(m.train) == 1
        windows = 400

    root = prepare(JOB.data, JOB.seed, JOB.model, windows, storage=uri)

    assert root == tmp_path / "node2" / first.name
    assert _files(root) == files  # all 5 uploaded shards, not what it would prepare here
    again = prepare(JOB.data, JOB.seed, JOB.model, windows, storage=uri)  # the second call
    assert again == root and _files(root) == files


def test_an_upload_cut_before_its_manifest_is_not_data(s3, aws, tmp_path, monkeypatch, caplog):
    uri, first, _ = _pushed(s3, tmp_path, monkeypatch, cut=True)
    shards = [f"train-00000{i}.bin" for i in range(3)]
    assert s3.objects(_remote(uri, first.name)) == shards  # sorted before it; no manifest

    root = prepare(JOB.data, JOB.seed, JOB.model, WINDOWS, storage=uri)

    assert read_manifest(root).shard_tokens == DEFAULT_SHARD_TOKENS  # prepared here
    assert [w for w in _warnings(caplog) if "data in" in w] == [
        f"data in {uri.split('?')[0]}/data/{first.name} not used (preparing it here): "
        "no manifest.json (an upload cut short)"
    ]


@pytest.mark.parametrize("damage", ["a flipped byte", "cut short"])
def test_a_remote_shard_that_does_not_match_its_manifest_is_refused(
    s3, aws, tmp_path, monkeypatch, caplog, damage
):
    uri, first, _ = _pushed(s3, tmp_path, monkeypatch)
    bad = f"{_remote(uri, first.name)}/train-000002.bin"
    with s3.fs.open_input_stream(bad) as f:
        data = bytearray(f.read())
    if damage == "a flipped byte":
        data[len(data) // 2] ^= 0x01
    else:
        del data[-2:]
    with s3.fs.open_output_stream(bad) as f:
        f.write(bytes(data))

    root = prepare(JOB.data, JOB.seed, JOB.model, WINDOWS, storage=uri)

    assert read_manifest(root).shard_tokens == DEFAULT_SHARD_TOKENS  # prepared here
    assert "train-000002.bin" not in _files(root) and not (root / ".remote").exists()
    (line,) = [w for w in _warnings(caplog) if "data in" in w]
    expected = "different SHA-256" if damage == "a flipped byte" else "8190 bytes, its manifest"
    assert "train-000002.bin" in line and expected in line, line
