"""Tokenised shards, the per-rank stream, and tokenizers (offline)."""

import base64

import numpy as np
import pytest

from jobs.config import DataConfig
from jobs.data import TrainStream, open_data, prepare, val_batches
from jobs.tokenizers import load_tokenizer
from models.config import ModelConfig

MODEL = ModelConfig(size="nano", vocab_size=256, block_size=64)


def test_shards_are_reused_and_split_disjointly(home):
    cfg = DataConfig(seq_len=32)
    root = prepare(cfg, seed=0, model=MODEL)
    mtime = (root / "train.bin").stat().st_mtime_ns
    assert prepare(cfg, seed=0, model=MODEL) == root  # same key: reused, not rewritten
    assert (root / "train.bin").stat().st_mtime_ns == mtime
    assert prepare(cfg, seed=1, model=MODEL) != root  # the split depends on the seed
    data = open_data(cfg, 0, root, MODEL)
    train = {bytes(w) for w in np.asarray(data.split["train"])}
    val = {bytes(w) for w in np.asarray(data.split["val"])}
    assert data.n("train") + data.n("val") == data.meta["windows"]
    assert data.n("val") == round(data.meta["windows"] * cfg.val_fraction)
    assert len(train & val) < 0.1 * len(val)  # distinct windows (pydoc repeats a few phrases)
    text = bytes(np.asarray(data.split["train"][0], dtype=np.uint8)).decode("utf-8", "replace")
    assert len(text) == 33


def test_ranks_slice_one_global_batch(home):
    cfg = DataConfig(seq_len=16)
    data = open_data(cfg, 0, prepare(cfg, seed=0, model=MODEL), MODEL)
    single = TrainStream(data, 0, micro_batch=8, accum=1, rank=0, world=1)
    ranks = [TrainStream(data, 0, micro_batch=2, accum=2, rank=r, world=2) for r in (0, 1)]
    for step in (0, 5):
        whole = {bytes(row) for row in single.micro_batches(step)[0].x}
        parts = {bytes(row) for s in ranks for b in s.micro_batches(step) for row in b.x}
        assert whole == parts and len(whole) == 8
    first = TrainStream(data, 0, 8, 1, 0, 1).micro_batches(3)[0].x  # a fresh stream (resume)
    assert np.array_equal(first, single.micro_batches(3)[0].x)


def test_validation_budget_is_fixed(home):
    cfg = DataConfig(seq_len=16, val_tokens=160)
    data = open_data(cfg, 0, prepare(cfg, seed=0, model=MODEL), MODEL)
    one = val_batches(data, 160, 16, 4, rank=0, world=1)
    assert sum(len(b.x) for b in one) == 10
    two = [val_batches(data, 160, 16, 4, rank=r, world=2) for r in (0, 1)]
    assert sum(len(b.x) for bs in two for b in bs) == 10


def test_local_jsonl_source(home, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(f'{{"body": "document number {i} " }}' * 1 for i in range(200)))
    cfg = DataConfig(source=str(path), text_field="body", seq_len=16)
    data = open_data(cfg, 0, prepare(cfg, 0, MODEL), MODEL)
    assert data.n("train") > 0
    with pytest.raises(ValueError, match="not a column"):
        prepare(DataConfig(source=str(path), seq_len=16), 0, MODEL)


def test_local_tiktoken_file(tmp_path):
    path = tmp_path / "bytes.tiktoken"
    path.write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    tok = load_tokenizer(str(path))
    assert tok.vocab_size == 257 and tok.eot == 256
    assert tok.encode_batch(["hi"]) == [[ord("h"), ord("i")]]


def test_synthetic_sort_task_is_deterministic(home):
    cfg = DataConfig(source="builtin:sort", seq_len=20)
    job_model = ModelConfig(size="nano", vocab_size=32, block_size=32)
    data = open_data(cfg, 7, prepare(cfg, 7, job_model), job_model)
    a, b = data.get("train", np.arange(4)), data.get("train", np.arange(4))
    assert np.array_equal(a.x, b.x)
    assert np.array_equal(np.sort(a.x[:, :10], axis=1), a.y[:, 10:])  # the answer is sorted
    assert (a.y[:, :10] == -100).all()


def test_classification_source_needs_classify_model():
    with pytest.raises(ValueError, match="task='classify'"):
        prepare(
            DataConfig(source="builtin:classification"), 0, ModelConfig(size="nano", vocab_size=32)
        )
