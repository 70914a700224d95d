"""Reading prepared tokens: memory-mapped shards cut into windows, the global sample order,
and each rank's slice of it.

A trial with seq_len L reads windows of L + 1 tokens at stride L (x = window[:-1],
y = window[1:]); window j starts at train token j * L. It uses the first
n = min(windows it needs, windows prepared) of them: a prefix of the prepared data, which
does not change when more is prepared later, so a trial reads the same windows whenever it
runs. The validation windows are the first ceil(val_tokens / L) windows of the validation
split (all of them, if a small source's split has fewer), which is fixed per (source,
tokenizer): every seed and trial of a sweep is evaluated on the same tokens.

The global sample order is a function of (data, seed, step) only. Position
p = step * global_batch + i reads window permute(p mod n; seed, epoch p div n), a keyed
pseudo-random permutation of [0, n) computed on the fly (a 4-round Feistel network with
cycle walking: no permutation array, whatever n is). Rank r takes its own slice of a step's
positions, so every world size reads the same global batches, and a run resumed on another
number of ranks continues the same sequence.

That n grows with the trial's budget, so trials of different budgets read different orders
from their first step. A wsd trial (jobs/schedule.py) reads the prefix-stable order instead,
which does not depend on its budget, so that trials differing only in their budget share
their data up to any step (orchestrator/plan/branching.py): positions [0, B) read a permutation
of windows [0, B), and each later block [B 2^(k-1), B 2^k) a permutation of those windows,
keyed by (seed, block); a trial of W windows uses the windows up to its block's end
(`prefix_stable_extent`), wrapped around the data when a finished source has fewer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from scalelab.jobs.data.batch import Batch
from scalelab.jobs.data.shards import Manifest

_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixing hash of uint64 values."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def permute(index: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """A bijection of [0, n) keyed by (seed, epoch), applied to `index` (values < n)."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)  # a 2^(2 half) domain: >= n, < 4n
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    keys = np.random.SeedSequence([seed, epoch]).generate_state(4, dtype=np.uint64)

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << shift) | right

    with np.errstate(over="ignore"):
        out = feistel(np.asarray(index, dtype=np.uint64))
        outside = out >= n
        while outside.any():  # cycle walking: a permutation of the domain restricted to [0, n)
            out[outside] = feistel(out[outside])
            outside = out >= n
    return out.astype(np.int64)


PREFIX_BLOCK = 1024  # windows in the first block of the prefix-stable order


def prefix_stable_extent(windows: int) -> int:
    """Windows a trial of `windows` training windows reads in the prefix-stable order: up
    to the end of the block that holds its last position."""
    return PREFIX_BLOCK << ((max(1, windows) - 1) // PREFIX_BLOCK).bit_length()


def prefix_stable_order(positions: np.ndarray, n: int, seed: int) -> np.ndarray:
    """The window each global position reads in the prefix-stable order over n windows."""
    blocks = np.array([(int(p) // PREFIX_BLOCK).bit_length() for p in positions], dtype=np.int64)
    out = np.empty_like(positions)
    for k in np.unique(blocks):
        here = blocks == k
        start = 0 if k == 0 else PREFIX_BLOCK << (int(k) - 1)
        size = PREFIX_BLOCK if k == 0 else start
        out[here] = start + permute(positions[here] - start, size, seed, int(k))
    return out % n


class TokenArray:
    """Shards as one read-only token array (memory-mapped; nothing is read until used)."""

    def __init__(self, paths: list[Path], counts: list[int], dtype: str) -> None:
        self.maps = [np.memmap(p, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(c,))
                     for p, c in zip(paths, counts, strict=True) if c]  # fmt: skip
        self.ends = np.cumsum([len(m) for m in self.maps], dtype=np.int64)
        self.size = int(self.ends[-1]) if len(self.ends) else 0

    def read(self, start: int, length: int) -> np.ndarray:
        k = int(np.searchsorted(self.ends, start, side="right"))
        pieces = []
        while length > 0:
            offset = start - (int(self.ends[k - 1]) if k else 0)
            piece = self.maps[k][offset : offset + length]
            pieces.append(piece)
            start, length, k = start + len(piece), length - len(piece), k + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class TokenWindows:
    """A prepared (source, tokenizer) seen as windows of seq_len + 1 tokens."""

    sized_by_budget = True  # n("train") follows the trial's windows (prefix_stable_order)

    def __init__(self, root: Path, manifest: Manifest, seq_len: int,
                 train_windows: int | None = None, val_tokens: int = 0) -> None:  # fmt: skip
        m, self.seq_len, self.meta = manifest, seq_len, manifest
        train = TokenArray([root / s.file for s in m.train], [s.tokens for s in m.train], m.dtype)
        val = TokenArray([root / m.validation.file], [m.validation.tokens], m.dtype)
        self.split = {"train": train, "val": val}
        available = max(0, (train.size - 1) // seq_len)
        if train_windows is not None and available < train_windows and not m.complete:
            raise ValueError(
                f"{root} holds {available:,} training windows of {seq_len + 1} tokens and "
                f"this trial needs {train_windows:,}; prepare more (scalelab data prepare)"
            )
        if available < 1:
            raise ValueError(
                f"data.source {m.source!r} has {train.size:,} training tokens: too few for "
                f"one window of {seq_len + 1} tokens"
            )
        self.n_train = available if train_windows is None else min(available, train_windows)
        self.n_val = max(0, (val.size - 1) // seq_len)
        wanted = -(-val_tokens // seq_len)  # more than a finished split holds: all of it
        if (wanted > self.n_val and not m.validation.complete) or self.n_val < 1:
            raise ValueError(
                f"data.val_tokens={val_tokens:,} asks for {wanted:,} validation windows of "
                f"{seq_len + 1} tokens, but the validation split of {m.source!r} "
                f"({m.validation.tokens:,} tokens: {m.validation.rule}) has {self.n_val:,}; "
                "lower data.val_tokens"
            )

    def n(self, split: str) -> int:
        return self.n_train if split == "train" else self.n_val

    def get(self, split: str, indices: np.ndarray) -> Batch:
        """Windows `indices` as (x, y), each its own C-contiguous int64 array, widened from
        the stacked windows' two overlapping views (views of one int64 window array would
        be strided, and a strided array is copied again on its way to a pinned buffer)."""
        tokens, L = self.split[split], self.seq_len
        w = np.stack([tokens.read(int(j) * L, L + 1) for j in indices])
        return Batch(w[:, :-1].astype(np.int64, order="C"), w[:, 1:].astype(np.int64, order="C"))


class Samples(Protocol):
    def n(self, split: str) -> int: ...
    def get(self, split: str, indices: np.ndarray) -> Batch: ...


class TrainStream:
    """The global sample order and this rank's slice of each step's global batch."""

    def __init__(
        self, data: Samples, seed: int, micro_batch: int, accum: int, rank: int, world: int,
        prefix_stable: bool = False,
    ) -> None:  # fmt: skip
        self.data, self.seed = data, seed
        self.prefix_stable = prefix_stable and getattr(data, "sized_by_budget", False)
        self.micro, self.accum, self.rank, self.world = micro_batch, accum, rank, world
        self.global_batch = micro_batch * accum * world

    def windows(self, positions: np.ndarray) -> np.ndarray:
        """The sample read at each global position: permuted within its epoch."""
        if getattr(self.data, "fresh_examples", False):  # generated: position i is example i
            return positions
        n = self.data.n("train")
        if self.prefix_stable:
            return prefix_stable_order(positions, n, self.seed)
        out = np.empty_like(positions)
        epochs = positions // n
        for e in np.unique(epochs):
            here = epochs == e
            out[here] = permute(positions[here] % n, n, self.seed, int(e))
        return out

    def micro_batches(self, step: int) -> list[Batch]:
        """This rank's `accum` micro-batches of optimizer step `step` (0-based)."""
        base = step * self.global_batch
        batches = []
        for a in range(self.accum):
            start = base + (a * self.world + self.rank) * self.micro
            positions = np.arange(start, start + self.micro, dtype=np.int64)
            batches.append(self.data.get("train", self.windows(positions)))
        return batches


def val_batches(
    data: Samples, val_tokens: int, seq_len: int, micro: int, rank: int, world: int
) -> list[Batch]:
    """This rank's share of the fixed validation set (the first ceil(val_tokens/seq_len)
    windows of the val split)."""
    n = min(data.n("val"), -(-val_tokens // seq_len))
    n = max(world, n // world * world)  # same batch count on every rank (ZeRO-3 gathers)
    mine = np.arange(rank, n, world) % data.n("val")
    return [data.get("val", mine[i : i + micro]) for i in range(0, len(mine), micro)]
