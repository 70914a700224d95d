"""Training data of one trial: check the source, make it ready before any process group
exists, open it as samples, and read it in the global order.

- Language-model text (builtin:pydoc, local files, hf: datasets) is tokenised once per
  (source, tokenizer) into shared token shards (jobs/data/prepare.py, jobs/data/shards.py) and read
  as windows through jobs/data/reader.py.
- builtin:copy / builtin:sort (the TSA paper's tasks) are generated from (seed, index).
- builtin:classification is generated from the seed; labelled text for the classification
  encoder is tokenised into per-trial arrays (jobs/data/classification.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from scalelab.jobs.config import DataConfig, MissingData
from scalelab.jobs.data import classification as classification_data
from scalelab.jobs.data.batch import Batch
from scalelab.jobs.data.classification import LabelledData
from scalelab.jobs.data.reader import TokenWindows, TrainStream, val_batches
from scalelab.jobs.data.shards import read_manifest
from scalelab.jobs.data.sources import TextSource, resolve_source
from scalelab.jobs.data.tokenizers import Tokenizer, load_tokenizer
from scalelab.models.config import ModelConfig

__all__ = ["Batch", "TrainStream", "check_data", "open_data", "prepare", "val_batches"]


class SyntheticData:
    """The TSA paper's copy / sort tasks: sample i of a split is generated from (seed, i)."""

    VOCAB = 32
    fresh_examples = True  # every train position is a new example: no permutation needed

    def __init__(self, task: str, seq_len: int, seed: int, n_val: int) -> None:
        from scalelab.jobs.data.synthetic.sequence_tasks import sequence_task_batch

        self._make = sequence_task_batch
        self.task, self.n_src, self.seed, self.n_val = task, seq_len // 2, seed, n_val

    def n(self, split: str) -> int:
        return self.n_val if split == "val" else 2**62  # train: a fresh example per position

    def get(self, split: str, indices: np.ndarray) -> Batch:
        split_id = 1 if split == "val" else 0
        xs, ys = [], []
        for i in indices:
            rng = np.random.default_rng([self.seed, split_id, int(i)])
            x, y = self._make(self.task, 1, rng, seq_len=self.n_src, vocab_size=self.VOCAB)
            xs.append(x)
            ys.append(y)
        return Batch(np.concatenate(xs), np.concatenate(ys))


class ClassificationData:
    """BudgetFormer's synthetic easy/hard classification (jobs/data/synthetic/classification.py):
    a fixed train set and a fixed val set, each generated from the trial's seed."""

    N_TRAIN = 16384

    def __init__(
        self, seq_len: int, seed: int, n_val: int, vocab_size: int, n_classes: int
    ) -> None:
        from scalelab.jobs.data.synthetic.classification import make_classification

        kw = {"seq_len": seq_len, "n_classes": n_classes, "vocab_size": vocab_size}
        self.split = {
            "train": make_classification(self.N_TRAIN, seed=seed * 2, **kw),
            "val": make_classification(n_val, seed=seed * 2 + 1, **kw),
        }

    def n(self, split: str) -> int:
        return len(self.split[split].labels)

    def get(self, split: str, indices: np.ndarray) -> Batch:
        d = self.split[split]
        return Batch(d.tokens[indices].astype(np.int64), d.labels[indices].astype(np.int64))


def check_data(cfg: DataConfig, model: ModelConfig, hub: bool = True) -> Tokenizer | None:
    """Every input error a data config can have, raised before any process group starts;
    data that is not here (MissingData) is raised after the config's own errors. `hub`:
    also resolve a hub dataset (a sweep's dry-run checks those in parallel, with a
    time-out: orchestrator/plan/data_availability.py)."""
    try:
        kind, files = resolve_source(cfg.source)
        missing = None
    except MissingData as e:  # a local path: check the rest of the config first
        kind, files, missing = "local", [], e
    vocab_size = model.vocab_size
    if kind in ("classification", "topics") and model.task != "classify":
        raise ValueError(f"data.source {cfg.source!r} goes with model.task='classify'")
    if model.task == "classify" and kind in ("pydoc", "synthetic"):
        raise ValueError(
            f"model.task='classify' needs labelled data, not {cfg.source!r}: "
            "builtin:classification, builtin:topics, hf:<dataset> or local "
            ".csv/.jsonl/.parquet files with data.text_field and data.label_field"
        )
    if kind == "classification":
        if vocab_size > 65536:
            raise ValueError("builtin:classification: use a small model.vocab_size (e.g. 32)")
        return None
    if kind == "synthetic":
        if cfg.seq_len % 2:
            raise ValueError(f"data.seq_len must be even for {cfg.source} (got {cfg.seq_len})")
        if vocab_size < SyntheticData.VOCAB:
            raise ValueError(f"{cfg.source} needs model.vocab_size >= {SyntheticData.VOCAB}")
        return None
    tok = load_tokenizer(cfg.tokenizer, cfg.tokenizer_file)
    if tok.vocab_size > vocab_size:
        raise ValueError(
            f"tokenizer {cfg.tokenizer!r} has {tok.vocab_size} tokens but model.vocab_size is "
            f"{vocab_size}; set model.vocab_size >= {tok.vocab_size}"
        )
    if model.task == "classify":
        classification_data.check_fields(cfg, tok)
    if missing is not None:
        raise missing
    if model.task == "classify":
        if kind == "hub" and hub:
            classification_data.check_hub(cfg)
        if kind == "local":
            classification_data.local_splits(files)
    return tok


def train_windows(tokens: int, global_batch_tokens: int, seq_len: int) -> int:
    """Windows of seq_len + 1 tokens a trial of `tokens` training tokens reads: its steps
    (jobs/token_budget.py's total_steps) x the sequences of one step."""
    return max(1, math.ceil(tokens / global_batch_tokens)) * (global_batch_tokens // seq_len)


def tokens_needed(cfg: DataConfig, windows: int | None) -> tuple[int | None, int]:
    """(train, validation) tokens that `windows` training windows and cfg.val_tokens read."""
    val_windows = -(-cfg.val_tokens // cfg.seq_len)
    train = None if windows is None else windows * cfg.seq_len + 1
    return train, val_windows * cfg.seq_len + 1


def prepare(
    cfg: DataConfig,
    seed: int,
    model: ModelConfig,
    train_windows: int | None = None,
    storage: str | None = None,
) -> Path | None:
    """Make the data ready and return its folder (None: generated data). Text is prepared
    once per (source, tokenizer), under a file lock, until it holds `train_windows`
    windows of seq_len + 1 tokens (None: the whole source) and the validation tokens;
    with `storage` (the job's), what `scalelab data prepare --storage` put there is
    fetched first (jobs/data/remote_data.py). Call it on every rank before any process
    group exists: no rank waits in a collective while another tokenises."""
    from scalelab.jobs.data.prepare import dataset_root, enough, prepare_source

    tok = check_data(cfg, model)
    if tok is None:
        return None
    kind, files = resolve_source(cfg.source)
    if model.task == "classify":
        return classification_data.prepare(cfg, seed, model.n_classes, tok, kind, files)
    source = TextSource.open(cfg.source, cfg.text_field)
    train, val = tokens_needed(cfg, train_windows)
    root = dataset_root(source, cfg.tokenizer)
    if enough(read_manifest(root), train, val):
        return root  # ready: no lock, nothing to do
    if storage:
        from scalelab.jobs.data.remote_data import fetch

        fetch(storage, root, train, val)
        if enough(read_manifest(root), train, val):
            return root
    return prepare_source(
        source, cfg.tokenizer, cfg.tokenizer_file, max_tokens=train, val_tokens=val
    )[0]


Data = TokenWindows | SyntheticData | ClassificationData | LabelledData


def open_data(
    cfg: DataConfig,
    seed: int,
    root: Path | None,
    model: ModelConfig,
    train_windows: int | None = None,
) -> Data:
    """The trial's samples; text reads the first `train_windows` windows (None: all)."""
    n_val = -(-cfg.val_tokens // cfg.seq_len)
    if cfg.source == "builtin:classification":
        return ClassificationData(cfg.seq_len, seed, n_val, model.vocab_size, model.n_classes)
    if model.task == "classify":
        return LabelledData(root)
    if root is None:
        return SyntheticData(cfg.source.removeprefix("builtin:"), cfg.seq_len, seed, n_val)
    manifest = read_manifest(root)
    if manifest is None:
        raise ValueError(f"{root} has no manifest.json: prepare the data first")
    return TokenWindows(root, manifest, cfg.seq_len, train_windows, cfg.val_tokens)
