"""Training data: sources, tokenisation into packed memmap shards, and the per-rank stream.

Text is tokenised once into fixed windows of seq_len + 1 tokens (uint16 when the vocabulary
fits, else uint32), split into train/val windows by a seeded permutation, and stored under
data_dir()/<hash of source, tokenizer, split>/; later trials with the same key reuse them.

Sample order is a pure function of (seed, global sample position): epoch e visits the
train windows in permutation(seed, e). A step consumes `global_batch` consecutive positions
and rank r takes its own slice, so any world size sees the same global batch, and resuming
at step s continues exactly where the stream stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobs import classification_data
from jobs.classification_data import LabelledData, hub_id
from jobs.config import DataConfig
from jobs.paths import data_dir
from jobs.tokenizers import Tokenizer, load_tokenizer
from models.config import ModelConfig

TEXT_SUFFIXES = {
    ".txt": "text", ".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"
}  # fmt: skip
SYNTHETIC = ("builtin:copy", "builtin:sort")


@dataclass(frozen=True)
class Batch:
    x: np.ndarray  # (B, T) int64 inputs
    y: np.ndarray  # (B, T) int64 targets (-100 = no loss); (B,) class labels
    pad_mask: np.ndarray | None = None  # (B, T) bool, True = real token (classification)


# ----------------------------------------------------------------------------- sources


def resolve_source(cfg: DataConfig) -> tuple[str, list[Path]]:
    """(kind, files) for a source, or a clear error before anything runs.
    kind: 'pydoc' | 'synthetic' | 'classification' | 'topics' | 'local' | 'hub'."""
    src = cfg.source
    if src == "builtin:pydoc":
        return "pydoc", []
    if src in SYNTHETIC:
        return "synthetic", []
    if src == "builtin:classification":
        return "classification", []
    if src == "builtin:topics":
        return "topics", []
    if src.startswith("hf:"):
        return "hub", []
    if src.startswith("builtin:"):
        raise ValueError(
            f"unknown builtin data source {src!r}; allowed: builtin:pydoc, "
            + ", ".join(SYNTHETIC)
            + ", builtin:classification, builtin:topics"
        )
    path = Path(src).expanduser()
    if not path.exists():
        raise ValueError(
            f"data.source {src!r}: no such file or folder (give a local .txt/.jsonl/.parquet "
            "file or folder, builtin:pydoc, builtin:copy, builtin:sort, or hf:<dataset>)"
        )
    files = (
        sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES) if path.is_dir() else [path]
    )
    if not files or any(p.suffix not in TEXT_SUFFIXES for p in files):
        raise ValueError(
            f"data.source {src!r}: need files ending in {', '.join(TEXT_SUFFIXES)}, found "
            f"{[p.name for p in files][:5] or 'none'}"
        )
    return "local", files


def _documents(cfg: DataConfig, kind: str, files: list[Path]) -> list[str]:
    if kind == "pydoc":
        from pydoc_data.topics import topics

        return [topics[k] for k in sorted(topics)]
    import datasets

    cache = str(data_dir() / "hf-cache")
    if kind == "hub":
        name, config = hub_id(cfg.source)
        try:
            ds = datasets.load_dataset(name, config or None, split="train", cache_dir=cache)
        except Exception as e:
            raise ValueError(f"data.source {cfg.source!r} could not be loaded: {e}") from None
    else:
        builder = TEXT_SUFFIXES[files[0].suffix]
        if any(TEXT_SUFFIXES[p.suffix] != builder for p in files):
            raise ValueError(f"data.source {cfg.source!r}: mixes file types; use one kind")
        extra = {"sample_by": "document"} if builder == "text" else {}
        ds = datasets.load_dataset(
            builder, data_files=[str(p) for p in files], split="train", cache_dir=cache, **extra
        )
    if cfg.text_field not in ds.column_names:
        raise ValueError(
            f"data.text_field {cfg.text_field!r} is not a column of {cfg.source!r} "
            f"(columns: {ds.column_names})"
        )
    return list(ds[cfg.text_field])


def _source_fingerprint(cfg: DataConfig, kind: str, files: list[Path]) -> str:
    if kind == "local":
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        return json.dumps(stats)
    return cfg.source


# ----------------------------------------------------------------------------- datasets


class WindowData:
    """Packed token windows on disk: train.bin / val.bin memmaps of shape (n, seq_len+1)."""

    def __init__(self, root: Path, seq_len: int) -> None:
        meta = json.loads((root / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
        width = seq_len + 1
        self.split = {
            name: np.memmap(root / f"{name}.bin", dtype=dtype, mode="r").reshape(-1, width)
            for name in ("train", "val")
        }
        self.meta = meta

    def n(self, split: str) -> int:
        return self.split[split].shape[0]

    def get(self, split: str, indices: np.ndarray) -> Batch:
        w = self.split[split][indices].astype(np.int64)
        return Batch(w[:, :-1], w[:, 1:])


class SyntheticData:
    """The TSA paper's copy / sort tasks: sample i of a split is generated from (seed, i)."""

    VOCAB = 32

    def __init__(self, task: str, seq_len: int, seed: int, n_val: int) -> None:
        from jobs.synthetic.sequence_tasks import sequence_task_batch

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
    """BudgetFormer's synthetic easy/hard classification (jobs/synthetic/classification.py):
    a fixed train set and a fixed val set, each generated from the trial's seed."""

    N_TRAIN = 16384

    def __init__(
        self, seq_len: int, seed: int, n_val: int, vocab_size: int, n_classes: int
    ) -> None:
        from jobs.synthetic.classification import make_classification

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


def check_data(cfg: DataConfig, model: ModelConfig) -> Tokenizer | None:
    """Every input error a data config can have, raised before any process group starts."""
    kind, files = resolve_source(cfg)
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
    tok = load_tokenizer(cfg.tokenizer)
    if tok.vocab_size > vocab_size:
        raise ValueError(
            f"tokenizer {cfg.tokenizer!r} has {tok.vocab_size} tokens but model.vocab_size is "
            f"{vocab_size}; set model.vocab_size >= {tok.vocab_size}"
        )
    if model.task == "classify":
        classification_data.check_fields(cfg, tok)
        if kind == "hub":
            classification_data.check_hub(cfg)
        if kind == "local":
            classification_data.local_splits(files)
    return tok


def shard_key(cfg: DataConfig, seed: int, tok: Tokenizer) -> str:
    kind, files = resolve_source(cfg)
    key = {
        "source": _source_fingerprint(cfg, kind, files),
        "text_field": cfg.text_field,
        "tokenizer": tok.fingerprint,
        "split": {"seq_len": cfg.seq_len, "val_fraction": cfg.val_fraction, "seed": seed},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def prepare(cfg: DataConfig, seed: int, model: ModelConfig) -> Path | None:
    """Tokenise into shards once (call on one rank); return their folder (None: synthetic)."""
    tok = check_data(cfg, model)
    if tok is None:
        return None
    if model.task == "classify":
        kind, files = resolve_source(cfg)
        return classification_data.prepare(cfg, seed, model.n_classes, tok, kind, files)
    root = data_dir() / shard_key(cfg, seed, tok)
    if (root / "meta.json").exists():
        return root
    kind, files = resolve_source(cfg)
    docs = _documents(cfg, kind, files)
    sep = [tok.eot] if tok.eot is not None else tok.encode_batch(["\n\n"])[0]
    ids = [i for doc in tok.encode_batch(docs) for i in (*doc, *sep)]
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    width = cfg.seq_len + 1
    n = len(ids) // width  # non-overlapping windows: no token is in both train and val
    n_val = max(1, round(n * cfg.val_fraction))
    if n - n_val < 1:
        raise ValueError(
            f"data.source {cfg.source!r} has {len(ids)} tokens: too few for windows of "
            f"{width} tokens with a validation split"
        )
    windows = np.asarray(ids[: n * width], dtype=dtype).reshape(n, width)
    order = np.random.default_rng(seed).permutation(n)
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    windows[order[n_val:]].tofile(tmp / "train.bin")
    windows[order[:n_val]].tofile(tmp / "val.bin")
    meta = {"dtype": np.dtype(dtype).name, "tokens": len(ids), "windows": n, "val_windows": n_val}
    (tmp / "meta.json").write_text(json.dumps({**meta, "tokenizer": tok.fingerprint}))
    try:
        tmp.rename(root)  # atomic: a half-written shard folder is never seen
    except OSError:  # someone else finished first; theirs is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return root


Data = WindowData | SyntheticData | ClassificationData | LabelledData


def open_data(cfg: DataConfig, seed: int, root: Path | None, model: ModelConfig) -> Data:
    n_val = -(-cfg.val_tokens // cfg.seq_len)
    if cfg.source == "builtin:classification":
        return ClassificationData(cfg.seq_len, seed, n_val, model.vocab_size, model.n_classes)
    if model.task == "classify":
        return LabelledData(root)
    if root is None:
        return SyntheticData(cfg.source.removeprefix("builtin:"), cfg.seq_len, seed, n_val)
    return WindowData(root, cfg.seq_len)


# ----------------------------------------------------------------------------- streams


class TrainStream:
    """The global sample order and this rank's slice of each step's global batch."""

    def __init__(
        self,
        data: Data,
        seed: int,
        micro_batch: int,
        accum: int,
        rank: int,
        world: int,
    ) -> None:
        self.data, self.seed = data, seed
        self.micro, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        self.global_batch = micro_batch * accum * world
        self._perm_epoch, self._perm = -1, None

    def _index(self, positions: np.ndarray) -> np.ndarray:
        n = self.data.n("train")
        if isinstance(self.data, SyntheticData):
            return positions
        out = np.empty_like(positions)
        for j, p in enumerate(positions):
            epoch = int(p) // n
            if epoch != self._perm_epoch:
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(n)
                self._perm_epoch = epoch
            out[j] = self._perm[int(p) % n]
        return out

    def micro_batches(self, step: int) -> list[Batch]:
        """This rank's `accum` micro-batches of optimizer step `step` (0-based)."""
        base = step * self.global_batch
        batches = []
        for a in range(self.accum):
            start = base + (a * self.world + self.rank) * self.micro
            batches.append(
                self.data.get("train", self._index(np.arange(start, start + self.micro)))
            )
        return batches


def val_batches(
    data: Data, val_tokens: int, seq_len: int, micro: int, rank: int, world: int
) -> list[Batch]:
    """This rank's share of the fixed validation set (the first ceil(val_tokens/seq_len)
    windows of the val split)."""
    n = min(data.n("val"), -(-val_tokens // seq_len))
    n = max(world, n // world * world)  # same batch count on every rank (ZeRO-3 gathers)
    mine = np.arange(rank, n, world) % data.n("val")
    return [data.get("val", mine[i : i + micro]) for i in range(0, len(mine), micro)]
