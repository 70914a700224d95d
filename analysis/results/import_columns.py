"""The rows `results import` reads, checked a column at a time (imports.py; docs/results.md,
"Importing results"): each field's column parsed once into an array of numbers (or of
text), each check a comparison over the whole array, and words only for the rows that are
listed. A row's problem is the first check it fails, in this order: N (given, a number,
positive and finite, a count from 1 to MAX_COUNT), D and C (each a number, positive; D a
count), one of D and C given, the loss, each score in its range, a loss or a score given,
C within 2x of 6·N·D, a D derived from C a count, the seed (an integer in int64), the
budget, and the text of the name, variant and size (UTF-8, at most MAX_TEXT characters).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .import_checks import CONTROL_RE2, FLOPS_FACTOR, FLOPS_PER_PARAM_TOKEN, flops_ratio, visible
from .import_scores import score_range

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

MAX_COUNT = 1e18  # the most parameters (N) or tokens (D) a row may give
MAX_TEXT = 256  # the most characters of a name, variant or size label
INT64 = 2.0**63


@dataclass(frozen=True)
class Numbers:
    """One field's column as numbers: `given` (not null, not blank), `number` (given and a
    number), `values` (NaN where no number), and the column as read, for the words."""

    raw: pa.Array | None
    given: np.ndarray
    number: np.ndarray
    values: np.ndarray

    def shown(self, i: int) -> str:
        return repr(self.raw[i].as_py()) if self.raw is not None else "None"


@dataclass(frozen=True)
class Texts:
    """One text field's column: `values` stripped and made visible (null where empty),
    `bad` (bytes that are not UTF-8), `long` (more than MAX_TEXT characters)."""

    raw: pa.Array | None
    values: pa.Array
    bad: np.ndarray
    long: np.ndarray


@dataclass(frozen=True)
class Checked:
    """Every row's values (good rows: where `problem` is -1) and the first problem of the
    others: `problem[i]` indexes `says`, each a function of the row giving its words."""

    n: int
    problem: np.ndarray
    says: tuple[Callable[[int], str], ...]
    numbers: dict[str, Numbers]
    texts: dict[str, Texts]
    tokens: np.ndarray  # D, or C / 6N
    flops: np.ndarray  # C, or 6ND
    ratios: np.ndarray  # C / 6ND where the row gives both, else NaN
    seed: np.ndarray = field(repr=False)

    def words(self, i: int) -> str:
        return self.says[self.problem[i]](i)


def _flat(col: Any) -> pa.Array:  # noqa: ANN401
    import pyarrow as pa

    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def numbers(col: Any, n: int) -> Numbers:  # noqa: ANN401
    """A column as numbers (Numbers); None: a field the file has no column for."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if col is None:
        return Numbers(None, np.zeros(n, bool), np.zeros(n, bool), np.full(n, np.nan))
    raw = _flat(col)
    arr = raw.dictionary_decode() if pa.types.is_dictionary(raw.type) else raw
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        try:
            given = arr.is_valid().to_numpy(zero_copy_only=False)
            values = pc.cast(arr, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            values = np.where(given, values, np.nan)
            return Numbers(raw, given, given.copy(), values)
        except (pa.ArrowException, OverflowError):
            pass  # a decimal past float64: each value on its own below
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        trimmed = pc.utf8_trim_whitespace(arr)
        given = pc.fill_null(pc.greater(pc.utf8_length(trimmed), 0), False)
        try:
            parsed = pc.cast(pc.if_else(given, trimmed, None), pa.float64())
            values = parsed.to_numpy(zero_copy_only=False)
            given = given.to_numpy(zero_copy_only=False)
            return Numbers(raw, given, given.copy(), np.where(given, values, np.nan))
        except pa.ArrowException:
            pass  # some value is no number (or one pyarrow spells differently): one by one
    return _numbers_one_by_one(raw, arr.to_pylist())


def _numbers_one_by_one(raw: pa.Array, values: list[Any]) -> Numbers:
    import numpy as np

    n = len(values)
    given, number, out = np.zeros(n, bool), np.zeros(n, bool), np.full(n, np.nan)
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            continue
        given[i] = True
        try:
            out[i] = float(v)
            number[i] = True
        except (TypeError, ValueError, OverflowError):
            pass
    return Numbers(raw, given, number, out)


def texts(col: Any, n: int) -> Texts:  # noqa: ANN401
    """A column as text (Texts); None: a field the file has no column for."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if col is None:
        return Texts(None, pa.nulls(n, pa.string()), np.zeros(n, bool), np.zeros(n, bool))
    raw = _flat(col)
    indices = None
    arr = raw
    if pa.types.is_dictionary(raw.type):  # clean each distinct value once
        indices, arr = raw.indices, raw.dictionary
    bad = np.zeros(len(arr), bool)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.string())
    else:
        values = arr.to_pylist()
        for i, v in enumerate(values):
            if isinstance(v, bytes):
                try:
                    values[i] = v.decode("utf-8")
                except UnicodeDecodeError:
                    values[i], bad[i] = None, True
            elif v is not None:
                values[i] = str(v)
        arr = pa.array(values, pa.string())
    arr = pc.utf8_trim_whitespace(arr)
    arr = pc.if_else(pc.fill_null(pc.greater(pc.utf8_length(arr), 0), False), arr, None)
    long = pc.fill_null(pc.greater(pc.utf8_length(arr), MAX_TEXT), False).to_numpy(
        zero_copy_only=False
    )
    arr = pc.if_else(pa.array(long), None, arr)  # refused below; never copied into rows
    odd = np.flatnonzero(pc.fill_null(pc.match_substring_regex(arr, CONTROL_RE2), False))
    if len(odd):  # escape sequences and the like: written as their escapes
        values = arr.to_pylist()
        for i in odd:
            values[i] = visible(values[i])
        arr = pa.array(values, pa.string())
    if indices is not None:  # a null index: an empty value, neither bad nor long
        at = pc.fill_null(indices.cast(pa.int64()), len(arr)).to_numpy(zero_copy_only=False)
        bad, long = np.r_[bad, False][at], np.r_[long, False][at]
        arr = arr.take(indices)
    return Texts(raw, arr, bad, long)


def check_rows(columns: dict[str, Any], n: int, scores: list[str]) -> Checked:
    """Every row checked (module doc); `columns`: field -> the file's column."""
    import numpy as np

    first = np.full(n, -1, np.int32)
    says: list[Callable[[int], str]] = []

    def check(mask: np.ndarray, say: Callable[[int], str]) -> None:
        first[mask & (first < 0)] = len(says)
        says.append(say)

    def positive(name: str, x: Numbers, count: bool = False) -> np.ndarray:
        check(x.given & ~x.number, lambda i: f"{name} {x.shown(i)} is not a number")
        with np.errstate(invalid="ignore"):
            ok = x.number & np.isfinite(x.values) & (x.values > 0)
            check(
                x.number & ~ok, lambda i: f"{name} {x.shown(i)}: expected a positive finite number"
            )
            if count:
                out = ok & ((x.values < 1) | (x.values > MAX_COUNT))
                check(
                    out,
                    lambda i: f"{name} {x.shown(i)}: expected a count from 1 to {MAX_COUNT:.0e}",
                )
        return ok

    nums = {f: numbers(columns.get(f), n) for f in ("N", "D", "C", "loss", "seed", "budget")}
    nums.update({s: numbers(columns[s], n) for s in scores})
    N, D, C, loss = nums["N"], nums["D"], nums["C"], nums["loss"]
    check(~N.given, lambda i: "N is missing")
    positive("N", N, count=True)
    positive("D", D, count=True)
    positive("C", C)
    check(~D.given & ~C.given, lambda i: "both D and C are missing")
    positive("loss", loss)
    any_score = np.zeros(n, bool)
    for s in scores:
        x = nums[s]
        ok, expected = score_range(s)
        check(x.given & ~x.number, lambda i, s=s, x=x: f"{s} {x.shown(i)} is not a number")
        with np.errstate(invalid="ignore"):
            check(
                x.number & ~ok(x.values),
                lambda i, s=s, x=x, e=expected: f"{s} {x.shown(i)}: expected {e}",
            )
        any_score |= x.given
    check(
        ~loss.given & ~any_score,
        lambda i: "loss is missing" + (" (and every score)" if scores else ""),
    )
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        both = D.given & C.given
        ratios = np.where(both, C.values / (FLOPS_PER_PARAM_TOKEN * N.values * D.values), np.nan)
        apart = both & ~((ratios >= 1 / FLOPS_FACTOR) & (ratios <= FLOPS_FACTOR))
        check(apart, lambda i: _ratio_words(N.values[i], D.values[i], C.values[i]))
        tokens = np.where(D.given, D.values, C.values / (FLOPS_PER_PARAM_TOKEN * N.values))
        derived = ~D.given & C.given & ((tokens < 1) | (tokens > MAX_COUNT) | np.isnan(tokens))
        check(derived, lambda i: f"C {C.shown(i)} gives D = C / 6N = {tokens[i]:.3g} tokens: "
                                 f"expected a count from 1 to {MAX_COUNT:.0e}")  # fmt: skip
        flops = np.where(C.given, C.values, FLOPS_PER_PARAM_TOKEN * N.values * D.values)
    S = nums["seed"]
    check(S.given & ~S.number, lambda i: f"seed {S.shown(i)} is not an integer")
    with np.errstate(invalid="ignore"):
        whole = S.number & np.isfinite(S.values) & (np.floor(S.values) == S.values)
        check(S.number & ~whole, lambda i: f"seed {S.shown(i)} is not an integer")
        wide = whole & ((S.values < -INT64) | (S.values >= INT64))
    check(wide, lambda i: f"seed {S.shown(i)}: beyond the 64-bit integer range")
    positive("budget", nums["budget"])
    txt = {f: texts(columns.get(f), n) for f in ("name", "variant", "size")}
    for f, t in txt.items():
        check(t.bad, lambda i, f=f, t=t: f"{f} {t.raw[i].as_py()!r} is not UTF-8 text")
        check(t.long, lambda i, f=f: f"{f}: longer than {MAX_TEXT} characters")
    seed = np.where(whole & ~wide, S.values, 0).astype(np.int64)
    return Checked(n, first, tuple(says), nums, txt, tokens, flops, ratios, seed)


def _ratio_words(n: float, d: float, c: float) -> str:
    try:
        flops_ratio(n, d, c)
    except ValueError as e:
        return str(e)
    return f"flops {c:.3g}: not within {FLOPS_FACTOR:g}x of 6·N·D"  # NaN: never reached
