"""The trials a fit may use: FINISHED, with a finite final loss (fit and forecast share it)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from scalelab.contract.runs import Status

from .tables import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa


def usable_trials(table: pa.Table, loss: str, notes: list[str]) -> pa.Table:
    """FINISHED trials with a finite loss; what is left out goes into `notes`."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        raise ResultsError("the sweep has no trials (empty sweep)")
    status = table["status"].to_pylist()
    not_done = [s for s in status if s != Status.FINISHED]
    if len(not_done) == len(status):
        counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(not_done).items()))
        raise ResultsError(f"no FINISHED trials yet ({counts}); nothing to fit")
    if not_done:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(Counter(not_done).items()))
        notes.append(f"left out {len(not_done)} trials that are not FINISHED ({counts})")
    done = table.filter(pc.equal(table["status"], Status.FINISHED))
    y = done[loss].to_numpy(zero_copy_only=False).astype(float)
    bad = ~np.isfinite(y)
    if bad.all():
        raise ResultsError(
            f"all {y.size} FINISHED trials have a NaN/missing {loss} (diverged?); nothing to fit"
        )
    if bad.any():
        ids = [done["trial_id"][int(i)].as_py() for i in np.flatnonzero(bad)]
        notes.append(
            f"left out {int(bad.sum())} FINISHED trials with NaN/missing {loss}: {', '.join(ids[:8])}"
            + (" ..." if len(ids) > 8 else "")
        )
        done = done.filter(np.isfinite(y))
    return done
