"""What `results import` questions in a file before its rows become trials (imports.py;
docs/results.md, "Importing results"): that the path is a file, that its text is UTF-8,
that a text value is text, that no row repeats another in every field read, that a
row's compute agrees with its N and D, and which runs agree in every coordinate but their
loss (replicates without a seed column, or a mistake: said, not refused).
"""

from __future__ import annotations

import codecs
import enum
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .tables import ResultsError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

FLOPS_PER_PARAM_TOKEN = 6.0  # C = 6 N D when the file gives only one of D and C
# A given C is refused when it is more than FLOPS_FACTOR times off 6ND either way. Honest
# counts differ from 6ND by less: attention adds 12·layers·context·width FLOPs a token
# (+38% at Chinchilla's smallest model, 44M at 2048 tokens of context), recomputed
# activations count 8ND, embeddings in or out of N move it by tens of percent at small
# sizes. Mistakes land far outside: forward-only FLOPs (2ND, 1/3), tokens in billions or
# FLOPs in PF-days (10^9, 8.64·10^19), the columns swapped.
FLOPS_FACTOR = 2.0
FLOPS_NOTED = 1.1  # a ratio further from 1 than this is said in the import's summary
WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
             (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))  # fmt: skip


# C0 and C1 controls, DEL, and the bidirectional marks and overrides ("Trojan source")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CONTROL_RE2 = (
    "[\\x00-\\x1f\\x7f-\\x{9f}\\x{61c}\\x{200e}\\x{200f}\\x{202a}-\\x{202e}\\x{2066}-\\x{2069}]"
)


class Duplicates(enum.StrEnum):
    """What to do with rows identical to an earlier one in every field read."""

    REFUSE = "refuse"  # list them, import nothing
    MERGE = "merge"  # one trial per set of identical rows (the first row's)
    KEEP = "keep"  # every row a trial of its own


def check_path(path: Path) -> None:
    """ResultsError unless `path` is a regular file."""
    if path.is_dir():
        raise ResultsError(
            f"{path}: a folder, not a file: name the CSV, Parquet or JSON Lines file in it"
        )
    if not path.exists():
        raise ResultsError(f"{path}: no such file")
    if not path.is_file():
        raise ResultsError(f"{path}: not a regular file")


def check_utf8_bytes(path: Path, data: bytes) -> None:
    """ResultsError in one line unless the file's bytes are UTF-8 text (with or without its
    BOM): UTF-16 and UTF-32 named, an undecodable or NUL byte placed by line and byte."""
    for bom, name in WIDE_BOMS:
        if data.startswith(bom):
            raise ResultsError(f"{path}: {name} text: save it as UTF-8")
    start = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    wide = _wide_without_bom(data[start : start + 400])
    if wide:
        raise ResultsError(f"{path}: {wide} text: save it as UTF-8")
    try:
        data[start:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = start + e.start
        raise ResultsError(
            f"{path}:{_line_and_byte(data, at)} is not UTF-8: save the file as UTF-8"
        ) from None
    nul = data.find(b"\x00", start)
    if nul >= 0:
        raise ResultsError(f"{path}:{_line_and_byte(data, nul)} is NUL: not text")


def _wide_without_bom(head: bytes) -> str | None:
    """UTF-16 or UTF-32 text without a BOM, told by its zero bytes (ASCII in UTF-16 is half
    zeros, in UTF-32 three quarters); None for anything else."""
    if not head:
        return None
    zeros = head.count(0) / len(head)
    return "UTF-32" if zeros >= 0.6 else "UTF-16" if zeros >= 0.3 else None


def _line_and_byte(data: bytes, at: int) -> str:
    """'LINE: byte 0xE9 at byte K of the line' for the byte at offset `at` (K from 1)."""
    line = data.count(b"\n", 0, at) + 1
    column = at - data.rfind(b"\n", 0, at)
    return f"{line}: byte 0x{data[at]:02x} at byte {column} of the line"


def visible(text: str, keep: str = "") -> str:
    """`text` safe to print on a terminal and to store: each control character (an escape
    sequence's ESC, a BEL, a carriage return) and each bidirectional override written as
    its escape (`\\x1b`, `\\u202e`), except those in `keep`."""
    return _CONTROL.sub(lambda m: m[0] if m[0] in keep else ascii(m[0])[1:-1], text)


def first_copies(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `keys` (one row of integers per row read) equal to an earlier row, and
    for each the first row it equals."""
    import numpy as np

    order, starts = groups(keys)
    firsts = np.empty(len(keys), np.int64)
    firsts[order] = order[np.repeat(starts, np.diff(np.r_[starts, len(keys)]))]
    copies = np.flatnonzero(firsts != np.arange(len(keys)))
    return copies, firsts[copies]


def groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `keys` sorted (stably: equal rows in their order) and where each run of
    equal rows starts in that order."""
    import numpy as np

    if not len(keys):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(keys.T[::-1]) if keys.shape[1] else np.arange(len(keys))
    ranked = keys[order]
    new = np.r_[True, (ranked[1:] != ranked[:-1]).any(axis=1)]
    return order, np.flatnonzero(new)


def flops_ratio(n: float, d: float, c: float) -> float:
    """C / 6ND; ValueError when C is more than FLOPS_FACTOR off 6ND."""
    expected = FLOPS_PER_PARAM_TOKEN * n * d
    ratio = c / expected
    if not 1 / FLOPS_FACTOR <= ratio <= FLOPS_FACTOR:
        raise ValueError(
            f"flops {c:.3g} is {times(ratio)}x 6·N·D ({expected:.3g}): more than "
            f"{FLOPS_FACTOR:g}x apart; drop the flops or the tokens column to derive one "
            f"from the other"
        )
    return ratio


def flops_note(ratios: np.ndarray) -> str | None:
    """The import summary's words on C against 6ND when some row is over 10% off (`ratios`:
    C / 6ND of each row that gives both, NaN for the others)."""
    import numpy as np

    ratios = ratios[~np.isnan(ratios)]
    if not len(ratios) or ((ratios >= 1 / FLOPS_NOTED) & (ratios <= FLOPS_NOTED)).all():
        return None
    return f"flops are {times(ratios.min())}x to {times(ratios.max())}x 6·N·D (kept as given)"


def rival_note(trials: pa.Table) -> str | None:
    """The import summary's words on runs that share variant, N, D, seed and size but
    report different losses: replicates whose seeds the file does not give, or one run
    entered twice with a typo. Kept (the fit averages them as it does seeds)."""
    import numpy as np
    import pyarrow.compute as pc

    if not trials.num_rows:
        return None
    key = ("variant", "n_params", "tokens", "seed", "size")
    codes = [
        pc.fill_null(pc.dictionary_encode(trials[c]).combine_chunks().indices, -1).to_numpy()
        if c in ("variant", "size") else trials[c].to_numpy()
        for c in key
    ]  # fmt: skip
    loss = trials["final_val_loss"].to_numpy() + 0.0
    cells = np.stack(codes, axis=1)
    order, starts = groups(np.column_stack([cells, loss.view(np.int64)]))
    distinct = cells[order[starts]]  # one row per (cell, loss), sorted by cell
    split = np.r_[True, (distinct[1:] != distinct[:-1]).any(axis=1)]
    counts = np.diff(np.r_[np.flatnonzero(split), len(distinct)])
    rivals = distinct[split][counts > 1]
    if not len(rivals):
        return None
    at = int(np.flatnonzero((cells == rivals[0]).all(axis=1))[0])
    variant, n, d, seed = (trials[c][at].as_py() for c in key[:4])
    return (
        f"{len(rivals)} run(s) appear more than once with different losses (same variant, "
        f"N, D and seed; e.g. {variant} N={n:.4g} D={d:.4g} seed {seed}): kept as trials "
        "of their own; give a seed column if they are replicates"
    )


def times(ratio: float) -> str:
    """A ratio in 3 significant figures, whole below a million (1000, not 1e+03)."""
    shown = f"{ratio:.3g}"
    return str(round(ratio)) if "e+" in shown and ratio < 1e6 else shown
