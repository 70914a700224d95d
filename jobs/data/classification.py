"""Labelled text for the classification encoder (model.task='classify').

Sources: a datasets hub name (hf:fancyzhx/ag_news, hf:stanfordnlp/snli, ...), local CSV /
JSONL / Parquet files with a text column and a label column, or builtin:topics (generated).
SNLI-style pairs: `text_pair_field` names the second column; the two are joined by
`pair_separator` and truncated longest-first. Invalid labels (missing, or negative such as
SNLI's -1 for "no gold label") are dropped and counted; string labels are mapped to
0..K-1 in sorted order.

Each example becomes seq_len tokens (truncated, then padded with 0) and its length; the
model gets pad_mask = position < length. Arrays are written once to
data_dir()/<hash of source, fields, tokenizer, split>/{train,val}_{tokens,lengths,labels}.npy
and memory-mapped by every trial that shares the key. Validation: the dataset's own
'validation' split, else its 'test' split, else a seeded val_fraction of train
(`data.val_split` overrides).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.contract.workdir import data_dir
from scalelab.jobs.config import DataConfig, MissingData
from scalelab.jobs.data.batch import Batch
from scalelab.jobs.data.tokenizers import Tokenizer

FORMAT = 1  # bump when the stored arrays change meaning
LOCAL_BUILDERS = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation",
               "valid": "validation", "dev": "validation", "test": "test"}  # fmt: skip
Columns = dict[str, list]  # one split: column name -> values


def hub_id(source: str) -> tuple[str, str | None]:
    """hf:<name> | hf:<owner>/<name> | hf:<owner>/<name>/<config> -> (path, config)."""
    parts = source.removeprefix("hf:").split("/")
    if len(parts) == 3:
        return "/".join(parts[:2]), parts[2]
    return "/".join(parts), None


def hub_offline() -> bool:
    return any(
        os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    )


def hub_error(cfg: DataConfig, e: Exception | str, why: str | None = None) -> MissingData:
    """A hub dataset that could not be loaded, and where to put it instead."""
    path, config = hub_id(cfg.source)
    why = why or (
        "HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set and it is not in the local cache"
        if hub_offline()
        else "the Hugging Face hub is unreachable or does not have it"
    )
    cause = e if isinstance(e, str) else f"{type(e).__name__}: {str(e)[:200]}"
    return MissingData(
        "data.source",
        f"data.source {cfg.source!r}: dataset {path!r}"
        + (f" (config {config!r})" if config else "")
        + f" could not be loaded: {why} ({cause}). Download it "
        f"on a connected machine into {data_dir() / 'hf-cache'} (or unset the offline "
        "variable), or give a local file instead: data.source: path/to/train.jsonl (or a "
        "folder with train.* and test.* files, .csv/.jsonl/.parquet) with data.text_field "
        "and data.label_field naming its columns",
    )


class _HonourOfflineEnv:
    """datasets reads HF_*_OFFLINE at import; honour the variables as they are now
    (`force`: offline whatever they say, to look in the local cache only)."""

    def __init__(self, force: bool = False) -> None:
        self.force = force

    def __enter__(self) -> None:
        import datasets.config
        import huggingface_hub.constants as hub

        self.saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)
        if self.force or hub_offline():
            datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True

    def __exit__(self, *exc: Any) -> None:
        import datasets.config
        import huggingface_hub.constants as hub

        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = self.saved


def check_hub(cfg: DataConfig, cache_only: bool = False) -> None:
    """Resolve a hub dataset (from the cache when offline, or when `cache_only`: no
    network at all) before any run is started; MissingData if it cannot be."""
    import datasets

    path, config = hub_id(cfg.source)
    try:
        with _HonourOfflineEnv(force=cache_only):
            datasets.load_dataset_builder(path, config, cache_dir=str(data_dir() / "hf-cache"))
    except Exception as e:
        raise hub_error(cfg, e) from None


def local_splits(files: list[Path]) -> dict[str, list[Path]]:
    """Files named train.* / validation.* (val, valid, dev) / test.* are those splits;
    otherwise every file is train."""
    if any(p.suffix not in LOCAL_BUILDERS for p in files):
        raise ValueError(
            f"classification data must be {', '.join(LOCAL_BUILDERS)} files, got "
            f"{sorted({p.suffix for p in files})}"
        )
    named = {p: SPLIT_NAMES.get(p.stem.lower()) for p in files}
    if "train" not in named.values():
        return {"train": files}
    if unnamed := [p.name for p, s in named.items() if s is None]:
        raise ValueError(
            f"files {unnamed} are not named train/validation/val/dev/test (next to train.*)"
        )
    splits: dict[str, list[Path]] = {}
    for p, s in named.items():
        splits.setdefault(s, []).append(p)
    return splits


def _load(cfg: DataConfig, kind: str, files: list[Path], seed: int) -> dict[str, Columns]:
    if kind == "topics":
        from scalelab.jobs.data.synthetic.topics import make_topics

        return {"train": make_topics(20_000, seed=1), "test": make_topics(2_000, seed=2)}
    import datasets

    cache = str(data_dir() / "hf-cache")
    if kind == "hub":
        path, config = hub_id(cfg.source)
        try:
            with _HonourOfflineEnv():
                dd = datasets.load_dataset(path, config, cache_dir=cache)
        except Exception as e:
            raise hub_error(cfg, e) from None
    else:
        splits = local_splits(files)
        builders = {LOCAL_BUILDERS[p.suffix] for p in files}
        if len(builders) > 1:
            raise ValueError(f"data.source {cfg.source!r}: mixes file types; use one kind")
        data_files = {s: [str(p) for p in ps] for s, ps in splits.items()}
        dd = datasets.load_dataset(builders.pop(), data_files=data_files, cache_dir=cache)
    out = {}
    for split, ds in dd.items():
        label_names = _class_names(ds, _label_field(cfg))
        cols = {}
        for field in _fields(cfg):
            if field not in ds.column_names:
                raise ValueError(
                    f"data: column {field!r} is not in split {split!r} of {cfg.source!r} "
                    f"(columns: {ds.column_names}); set data.text_field / "
                    "data.text_pair_field / data.label_field"
                )
            cols[field] = list(ds[field])
        if label_names:
            cols["__names__"] = label_names
        out[split] = cols
    return out


def _label_field(cfg: DataConfig) -> str:
    return cfg.label_field or "label"


def _fields(cfg: DataConfig) -> list[str]:
    return [f for f in (cfg.text_field, cfg.text_pair_field, _label_field(cfg)) if f]


def _class_names(ds: Any, field: str) -> list[str] | None:
    feature = ds.features.get(field)
    return list(getattr(feature, "names", None) or []) or None


def encode_labels(values: list, names: list[str] | None) -> tuple[np.ndarray, list[str] | None]:
    """int64 labels with -1 for invalid (missing, negative, or a string not in `names`);
    string labels become their index in sorted(set(...)) (or in `names` when given)."""
    if any(isinstance(v, str) for v in values):
        names = names or sorted({v for v in values if isinstance(v, str)})
        index = {n: i for i, n in enumerate(names)}
        return np.array([index.get(v, -1) if v is not None else -1 for v in values]), names
    labels = np.array([-1 if v is None else int(v) for v in values], dtype=np.int64)
    return np.where(labels < 0, -1, labels), names


def tokenize_examples(
    tok: Tokenizer, texts: list, pairs: list | None, seq_len: int, separator: str
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (n, seq_len) padded with 0, lengths (n,) >= 1); a pair is truncated
    longest-first so both fields keep as much as fits around the separator."""
    a = tok.encode_batch([t or "" for t in texts])
    b = tok.encode_batch([t or "" for t in pairs]) if pairs is not None else None
    sep = tok.encode_batch([separator])[0] if b is not None else []
    budget = seq_len - len(sep)
    dtype = np.uint16 if tok.vocab_size <= 2**16 else np.uint32
    tokens = np.zeros((len(a), seq_len), dtype=dtype)
    lengths = np.ones(len(a), dtype=np.uint32)  # an empty text still shows one (pad) token
    for i, first in enumerate(a):
        if b is None:
            ids = first[:seq_len]
        else:
            second = b[i]
            keep_b = len(second)
            if len(first) + keep_b > budget:
                keep_b = min(keep_b, max(budget // 2, budget - len(first)))
            ids = [*first[: budget - keep_b], *sep, *second[:keep_b]]
        tokens[i, : len(ids)] = ids
        lengths[i] = max(1, len(ids))
    return tokens, lengths


def check_fields(cfg: DataConfig, tok: Tokenizer) -> None:
    if cfg.text_pair_field is not None:
        sep = len(tok.encode_batch([cfg.pair_separator])[0])
        if cfg.seq_len < sep + 2:
            raise ValueError(
                f"data.seq_len={cfg.seq_len} leaves no room for two texts around the "
                f"{sep}-token pair_separator"
            )


def cache_key(cfg: DataConfig, kind: str, files: list[Path], seed: int, tok: Tokenizer) -> str:
    if kind == "local":
        source: Any = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    else:
        source = cfg.source
    key = {
        "format": FORMAT,
        "kind": "classification",
        "source": source,
        "fields": [cfg.text_field, cfg.text_pair_field, _label_field(cfg), cfg.pair_separator],
        "tokenizer": tok.fingerprint,
        "split": {"seq_len": cfg.seq_len, "val": cfg.val_split, "fraction": cfg.val_fraction,
                  "seed": seed},
    }  # fmt: skip
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def prepare(
    cfg: DataConfig, seed: int, n_classes: int, tok: Tokenizer, kind: str, files: list[Path]
) -> Path:
    """Tokenise labelled text into arrays once (call on one rank); return their folder."""
    root = data_dir() / cache_key(cfg, kind, files, seed, tok)
    if (root / "meta.json").exists():
        _check_classes(cfg, json.loads((root / "meta.json").read_text()), n_classes)
        return root
    splits = _load(cfg, kind, files, seed)
    train_name, val_name = _choose_splits(cfg, splits)
    names = splits[train_name].get("__names__")
    arrays, dropped = {}, {}
    for role, name in (("train", train_name), ("val", val_name)):
        if name is None:
            continue
        cols = splits[name]
        labels, names = encode_labels(cols[_label_field(cfg)], names)
        keep = labels >= 0
        dropped[role] = int((~keep).sum())
        pairs = cols[cfg.text_pair_field] if cfg.text_pair_field else None
        idx = np.flatnonzero(keep)
        tokens, lengths = tokenize_examples(
            tok,
            [cols[cfg.text_field][i] for i in idx],
            None if pairs is None else [pairs[i] for i in idx],
            cfg.seq_len,
            cfg.pair_separator,
        )
        arrays[role] = (tokens, lengths, labels[keep])
    if val_name is None:  # a fixed, seeded val_fraction of train
        tokens, lengths, labels = arrays["train"]
        n = len(labels)
        n_val = max(1, round(n * cfg.val_fraction))
        if n - n_val < 1:
            raise ValueError(f"data.source {cfg.source!r}: {n} labelled examples are too few")
        order = np.random.default_rng(seed).permutation(n)
        arrays = {r: (tokens[o], lengths[o], labels[o])
                  for r, o in (("train", order[n_val:]), ("val", order[:n_val]))}  # fmt: skip
    meta = {
        "kind": "classification",
        "seq_len": cfg.seq_len,
        "splits": {"train": train_name, "val": val_name or f"{train_name} (seeded fraction)"},
        "examples": {r: len(a[2]) for r, a in arrays.items()},
        "dropped_invalid_labels": dropped,
        "n_labels": int(max(int(a[2].max(initial=-1)) for a in arrays.values()) + 1),
        "label_names": names,
        "tokenizer": tok.fingerprint,
    }
    _check_classes(cfg, meta, n_classes)
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for role, (tokens, lengths, labels) in arrays.items():
        np.save(tmp / f"{role}_tokens.npy", tokens)
        np.save(tmp / f"{role}_lengths.npy", lengths)
        np.save(tmp / f"{role}_labels.npy", labels.astype(np.int64))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    try:
        tmp.rename(root)  # atomic: a half-written folder is never seen
    except OSError:  # someone else finished first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _choose_splits(cfg: DataConfig, splits: dict[str, Columns]) -> tuple[str, str | None]:
    if "train" not in splits:
        raise ValueError(f"data.source {cfg.source!r} has no 'train' split ({list(splits)})")
    if cfg.val_split is not None:
        if cfg.val_split == "train":
            return "train", None
        if cfg.val_split not in splits:
            raise ValueError(
                f"data.val_split {cfg.val_split!r} is not a split of {cfg.source!r} "
                f"({list(splits)})"
            )
        return "train", cfg.val_split
    return "train", next((s for s in ("validation", "test") if s in splits), None)


def _check_classes(cfg: DataConfig, meta: dict, n_classes: int) -> None:
    if meta["n_labels"] > n_classes:
        raise ValueError(
            f"data.source {cfg.source!r} has labels up to {meta['n_labels'] - 1} but "
            f"model.n_classes is {n_classes}; set model.n_classes >= {meta['n_labels']}"
        )


class LabelledData:
    """Memory-mapped tokenised examples: get() gives x (B, T), y (B,) and pad_mask (B, T)."""

    def __init__(self, root: Path) -> None:
        self.meta = json.loads((root / "meta.json").read_text())
        self.split = {
            role: tuple(
                np.load(root / f"{role}_{part}.npy", mmap_mode="r")
                for part in ("tokens", "lengths", "labels")
            )
            for role in ("train", "val")
        }

    def n(self, split: str) -> int:
        return len(self.split[split][2])

    def get(self, split: str, indices: np.ndarray) -> Batch:
        tokens, lengths, labels = self.split[split]
        x = tokens[indices].astype(np.int64)
        mask = np.arange(x.shape[1])[None, :] < lengths[indices].astype(np.int64)[:, None]
        return Batch(x, labels[indices].astype(np.int64), mask)
