"""Labelled text for the classification encoder: local files, pairs, invalid labels, the
offline hub error, and real training jobs (dense and BudgetFormer) that learn a task."""

import json
import random

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from scalelab.jobs.config import DataConfig, JobConfig
from scalelab.jobs.data.trial import TrainStream, open_data, prepare, val_batches
from scalelab.jobs.training.train import run
from scalelab.models.config import ModelConfig

# Each class has a keyword whose letters no filler word uses: learnable from bytes alone.
KEYWORDS = ["sport", "money", "world", "quiz"]
FILLER = ["a", "bad", "cab", "deaf", "face", "bead", "head", "chef", "fig", "hagged"]


def keyword_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(len(KEYWORDS))
        words = rng.choices(FILLER, k=rng.randint(2, 5))  # varying length: padding matters
        words.insert(rng.randint(0, len(words)), KEYWORDS[label])
        rows.append({"sentence": " ".join(words), "topic": label})
    return rows


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def classify_model(**kw) -> ModelConfig:
    spec = {"size": "nano", "vocab_size": 256, "block_size": 32, "task": "classify", "n_classes": 4}
    return ModelConfig(**(spec | kw))


def test_encoder_learns_a_local_jsonl_dataset_dense_and_with_budget(home, tmp_path, curve):
    """curves.jsonl holds the same points the tracker sends to MLflow (jobs/tracking/tracker.py)."""
    source = write_jsonl(tmp_path / "keywords.jsonl", keyword_rows(1200, seed=0))
    for budget in (None, {}):
        job = JobConfig.model_validate({
            "model": classify_model(budget=budget).model_dump(),
            "data": {"source": source, "text_field": "sentence", "label_field": "topic",
                     "seq_len": 32, "val_fraction": 0.1, "val_tokens": 32 * 120},
            "train": {"tokens": 32 * 32 * 60, "global_batch_tokens": 32 * 32, "lr": 3e-3,
                      "log_interval": 10, "eval_interval": 30, "checkpoint_interval": 1000,
                      "divergence_factor": 1e6},
        })  # fmt: skip
        result = run(job)
        assert result.status == "FINISHED", result.reason
        accuracy = curve(home, job.trial_id, "val/accuracy")
        assert [s for s, _ in accuracy] == [30, 60]
        assert accuracy[-1][1] > 0.8, (job.model.variant, accuracy)  # chance: 0.25
        if budget is not None:
            s_mean = [v for _, v in curve(home, job.trial_id, "budget/s_mean")]
            active = [v for _, v in curve(home, job.trial_id, "budget/heads_active")]
            assert len(s_mean) == len(active) == 6
            assert all(0 < v < 1 for v in s_mean + active)


def test_pairs_are_joined_by_the_separator_and_truncated_longest_first(home, tmp_path):
    lines = ["premise,hypothesis,label", "a cat sat,a cat is sitting,0",
             "x" * 40 + ",short,1", "p,q,2"]  # fmt: skip
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    cfg = DataConfig(source=str(tmp_path / "pairs.csv"), text_field="premise",
                     text_pair_field="hypothesis", pair_separator=" || ", seq_len=32,
                     val_split="train", val_fraction=0.3)  # fmt: skip
    model = ModelConfig(size="nano", vocab_size=256, block_size=32, task="classify", n_classes=3)
    data = open_data(cfg, 0, prepare(cfg, 0, model), model)
    texts = {}
    for split in ("train", "val"):
        b = data.get(split, np.arange(data.n(split)))
        assert b.pad_mask.shape == b.x.shape == (data.n(split), 32)
        for row, mask, label in zip(b.x, b.pad_mask, b.y, strict=True):
            assert np.array_equal(mask, np.arange(32) < mask.sum()) and (row[~mask] == 0).all()
            texts[int(label)] = bytes(row[mask].astype(np.uint8)).decode()
    assert texts[0] == "a cat sat || a cat is sitting"
    assert texts[1] == "x" * 23 + " || short"  # only the longer field was cut, to fit 32
    assert texts[2] == "p || q"


def test_invalid_labels_are_dropped_and_counted_and_string_labels_mapped(home, tmp_path):
    folder = tmp_path / "nli"
    folder.mkdir()
    rows = [{"text": f"example {i}", "label": ["entail", "neutral", None, "contra"][i % 4]}
            for i in range(40)]  # fmt: skip
    write_jsonl(folder / "train.jsonl", rows)
    write_jsonl(folder / "test.jsonl", [{"text": "t", "label": lab} for lab in
                                        ("neutral", "unseen", "contra")])  # fmt: skip
    cfg = DataConfig(source=str(folder), seq_len=16)
    model = ModelConfig(size="nano", vocab_size=256, block_size=16, task="classify", n_classes=3)
    root = prepare(cfg, 0, model)
    meta = json.loads((root / "meta.json").read_text())
    assert meta["splits"] == {"train": "train", "val": "test"}  # the dataset's own split
    assert meta["dropped_invalid_labels"] == {"train": 10, "val": 1}
    assert meta["examples"] == {"train": 30, "val": 2}
    assert meta["label_names"] == ["contra", "entail", "neutral"]
    data = open_data(cfg, 0, root, model)
    assert sorted(data.get("val", np.arange(2)).y) == [0, 2]
    with pytest.raises(ValueError, match="n_classes >= 3"):
        prepare(cfg, 0, model.model_copy(update={"n_classes": 2}))
    # SNLI's integer -1 ("no gold label") is dropped the same way
    write_jsonl(tmp_path / "snli.jsonl", [{"text": "s", "label": lab} for lab in (0, -1, 2, 1, -1)])
    cfg = DataConfig(source=str(tmp_path / "snli.jsonl"), seq_len=16, val_fraction=0.2)
    meta = json.loads((prepare(cfg, 0, model) / "meta.json").read_text())
    assert meta["dropped_invalid_labels"] == {"train": 2}
    assert sum(meta["examples"].values()) == 3


def test_ranks_slice_the_global_batch_and_resume_at_the_same_examples(home, tmp_path):
    source = write_jsonl(tmp_path / "k.jsonl", keyword_rows(100, seed=1))
    cfg = DataConfig(source=source, text_field="sentence", label_field="topic", seq_len=16)
    model = classify_model()
    data = open_data(cfg, 3, prepare(cfg, 3, model), model)
    one = TrainStream(data, 3, micro_batch=8, accum=1, rank=0, world=1)
    two = [TrainStream(data, 3, micro_batch=2, accum=2, rank=r, world=2) for r in (0, 1)]
    for step in (0, 13):  # step 13 is past the first epoch of 95 train examples
        whole = one.micro_batches(step)[0]
        rows = {(bytes(x), int(y)) for x, y in zip(whole.x, whole.y, strict=True)}
        parts = {(bytes(x), int(y)) for s in two for b in s.micro_batches(step)
                 for x, y in zip(b.x, b.y, strict=True)}  # fmt: skip
        assert rows == parts
    resumed = TrainStream(data, 3, 8, 1, 0, 1).micro_batches(13)[0]
    assert np.array_equal(resumed.x, one.micro_batches(13)[0].x)
    assert np.array_equal(resumed.pad_mask, one.micro_batches(13)[0].pad_mask)
    assert sum(len(b.y) for b in val_batches(data, 16 * 100, 16, 4, 0, 1)) == data.n("val") == 5


def test_hub_offline_error_is_clear_and_comes_before_mlflow(home, monkeypatch, mlflow_uri):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("SCALELAB_EXPERIMENT", "tests-offline-hub")
    job = JobConfig.model_validate({
        "model": classify_model(n_classes=3).model_dump(),
        "data": {"source": "hf:stanfordnlp/snli", "text_field": "premise",
                 "text_pair_field": "hypothesis", "seq_len": 32},
        "train": {"tokens": 1024, "global_batch_tokens": 256},
    })  # fmt: skip
    with pytest.raises(ValueError) as err:
        run(job)
    msg = str(err.value)
    assert "'stanfordnlp/snli'" in msg and "HF_DATASETS_OFFLINE" in msg
    assert "local file" in msg and "data.label_field" in msg
    assert MlflowClient(mlflow_uri).get_experiment_by_name("tests-offline-hub") is None
    assert not (home / "trials").exists()


def test_classification_needs_labelled_data():
    model = classify_model()
    with pytest.raises(ValueError, match="needs labelled data"):
        prepare(DataConfig(source="builtin:pydoc"), 0, model)
