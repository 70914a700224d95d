"""What `results import` questions in a file before its rows become trials (imports.py;
docs/results.md, "Importing results"): that the path is a file, that its text is UTF-8,
that a text value is text, that no row repeats another in every field read, that a
row's compute agrees with its N and D, and which runs agree in every coordinate but their
loss (replicates without a seed column, or a mistake: said, not refused).
"""

from __future__ import annotations

import codecs
import enum
from pathlib import Path
from typing import Any

from .store import ResultsError

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


def check_utf8(path: Path) -> None:
    """ResultsError in one line unless the file is UTF-8 text (with or without its BOM):
    UTF-16 and UTF-32 named, an undecodable or NUL byte placed by line and byte."""
    data = path.read_bytes()
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


def text(value: Any, field: str) -> str | None:
    """A text field's value, stripped; None when empty. Bytes (a Parquet binary column)
    are decoded as UTF-8, never shown as b'...' (ValueError when they are not UTF-8)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{field} {value!r} is not UTF-8 text") from None
    if value is None:
        return None
    return str(value).strip() or None


def repeats(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Each row identical to an earlier one in every field read -> the first such row."""
    first: dict[str, int] = {}
    found: dict[int, int] = {}
    for i, row in enumerate(rows):
        key = repr(sorted(row.items()))
        if key in first:
            found[i] = first[key]
        else:
            first[key] = i
    return found


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


def flops_note(ratios: list[float]) -> str | None:
    """The import summary's words on C against 6ND when some row is over 10% off."""
    if not ratios or all(1 / FLOPS_NOTED <= r <= FLOPS_NOTED for r in ratios):
        return None
    return f"flops are {times(min(ratios))}x to {times(max(ratios))}x 6·N·D (kept as given)"


def rival_note(trials: list[dict[str, Any]]) -> str | None:
    """The import summary's words on runs that share variant, N, D, seed and size but
    report different losses: replicates whose seeds the file does not give, or one run
    entered twice with a typo. Kept (the fit averages them as it does seeds)."""
    losses: dict[tuple[Any, ...], set[float]] = {}
    for t in trials:
        key = (t["variant"], t["n_params"], t["tokens"], t["seed"], t.get("size"))
        losses.setdefault(key, set()).add(t["final_val_loss"])
    rivals = [k for k, v in losses.items() if len(v) > 1]
    if not rivals:
        return None
    variant, n, d, seed, _ = rivals[0]
    return (
        f"{len(rivals)} run(s) appear more than once with different losses (same variant, "
        f"N, D and seed; e.g. {variant} N={n:.4g} D={d:.4g} seed {seed}): kept as trials "
        "of their own; give a seed column if they are replicates"
    )


def times(ratio: float) -> str:
    """A ratio in 3 significant figures, whole below a million (1000, not 1e+03)."""
    shown = f"{ratio:.3g}"
    return str(round(ratio)) if "e+" in shown and ratio < 1e6 else shown
