"""Input checks shared by every fit: plain arrays in, clean float arrays out.

Policy for bad input (documented in docs/scaling.md):
- empty input, mismatched lengths, missing columns, non-finite or non-positive sizes,
  tokens or FLOPs: raise `ScalingError` naming what is wrong;
- non-finite losses (NaN/inf: a diverged or unfinished trial): dropped, with one
  `ScalingWarning` giving the count; if too few rows remain, `ScalingError`;
- too few distinct sizes/budgets for the fit's free constants: `ScalingError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class ScalingError(ValueError):
    """The data cannot support the requested fit; the message says what is missing."""


class ScalingWarning(UserWarning):
    """Rows were dropped (non-finite losses) before fitting."""


def column(table: Any, name: str) -> np.ndarray:
    """One column of a pyarrow Table, a pandas/polars frame or a mapping of arrays."""
    if isinstance(table, Mapping):
        names = list(table)
        values = table.get(name)
    else:
        names = list(getattr(table, "column_names", None) or getattr(table, "columns", []))
        values = table[name] if name in names else None
    if values is None:
        raise ScalingError(f"the results table has no column {name!r} (columns: {names})")
    if hasattr(values, "to_numpy"):
        try:
            values = values.to_numpy(zero_copy_only=False)  # pyarrow
        except TypeError:
            values = values.to_numpy()  # pandas / polars
    return np.asarray(values)


def has_column(table: Any, name: str) -> bool:
    if isinstance(table, Mapping):
        return name in table
    return name in list(getattr(table, "column_names", None) or getattr(table, "columns", []))


def clean(
    loss: Sequence[float] | np.ndarray,
    covariates: Mapping[str, Sequence[float] | np.ndarray],
    *,
    what: str,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Check shapes and values; drop rows whose loss is not finite (with a warning).

    `covariates` are positive quantities used on a log scale (N, D, C); `what` names the
    fit in messages.
    """
    y = np.asarray(loss, dtype=float).ravel()
    xs = {k: np.asarray(v, dtype=float).ravel() for k, v in covariates.items()}
    if y.size == 0:
        raise ScalingError(f"{what}: no trials (empty input)")
    for name, x in xs.items():
        if x.shape != y.shape:
            raise ScalingError(f"{what}: {name} has {x.size} values but loss has {y.size}")
        bad = ~np.isfinite(x) | (x <= 0)
        if bad.any():
            raise ScalingError(
                f"{what}: {name} must be finite and > 0; {int(bad.sum())} of {x.size} rows "
                f"are not (first bad value: {x[bad][0]!r})"
            )
    finite = np.isfinite(y)
    if not finite.all():
        n_bad = int((~finite).sum())
        if not finite.any():
            raise ScalingError(f"{what}: all {y.size} losses are NaN/inf (no finished trials)")
        warnings.warn(
            f"{what}: dropped {n_bad} of {y.size} trials with NaN/inf loss",
            ScalingWarning,
            stacklevel=3,
        )
        y = y[finite]
        xs = {k: x[finite] for k, x in xs.items()}
    if (y <= 0).any():
        raise ScalingError(f"{what}: losses must be > 0 (a log-space fit); got {y.min()!r}")
    return y, xs


def require_distinct(x: np.ndarray, k: int, *, what: str, name: str) -> None:
    """At least `k` distinct values of `name` (e.g. sizes), else `ScalingError`."""
    n = np.unique(x).size
    if n < k:
        raise ScalingError(
            f"{what}: needs at least {k} distinct {name} to fit its constants; got {n} "
            f"({'one size: no fit possible' if n == 1 else 'add more sizes'})"
        )
