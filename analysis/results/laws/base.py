"""What a fit law is to the fitter (analysis/results/fit.py) and to every view of a fit.

A `Law` says its name (its key in `SweepFit.law_fits` and in `--json`), its form (a
printable formula) and its constants; how it fits one variant's trials (`fit`: a `LawFit`,
or `Skipped` with the reason, or an exception the fitter turns into a note); and what it
adds to `scalelab results fit`'s tables and the report (`sections`, `report_lines`), to
`--json` (`to_json`) and, if it can, to forecasts (`predict`). The defaults make a table of
the constants per variant and a JSON entry of them, so a new law need only fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

    from scalelab.analysis.scaling import Interval
    from scalelab.analysis.scaling.checks import FitCheck

    from ..fit import SweepFit
    from ..render import Rows

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class LawFit:
    """One law fitted to one variant's trials."""

    result: Any  # the law's own fit (an LsqFit, a Bootstrap, an IsoFlopFit, ...)
    constants: Mapping[str, Interval] = field(default_factory=dict)  # the default views'
    n_trials: int = 0  # the trials it went through
    check: FitCheck | None = None  # does it describe its points (analysis.scaling.checks)


@dataclass(frozen=True)
class Skipped:
    """A law that does not fit a variant, and why: the fitter notes '<label> of <variant>:
    <reason>'."""

    reason: str


@dataclass(frozen=True)
class FitOptions:
    """The fit's options a law may read (fit.fit_table's)."""

    level: float = 0.95
    n_resamples: int = 1000
    seed: int = 0
    resample: bool = True  # False: skip the bootstrap (the slow part)
    huber_delta: float | None = None
    isoflop_bin_width: float | None = None
    exclude_outliers: bool = False
    budgets: tuple[float, ...] | None = None

    @property
    def bootstrap(self) -> dict[str, Any] | None:
        """The bootstrap's options, or None when the fit asked for no resampling."""
        if not self.resample:
            return None
        return {"n_resamples": self.n_resamples, "level": self.level, "seed": self.seed}


@dataclass
class VariantTrials:
    """One variant's usable trials (FINISHED, finite loss), as a law fits them."""

    variant: str  # "<variant> without outliers" when a law refits without its flagged points
    table: pa.Table
    loss: str  # the loss column
    options: FitOptions
    fit: SweepFit  # the fit so far (a law may record beside its own results: L(C)'s frontier)
    attempt: Callable[[str, Callable[[], Any]], Any]  # a failure -> a note 'what: why', None

    @property
    def level(self) -> float:
        return self.options.level

    def column(self, name: str) -> np.ndarray:
        return self.table[name].to_numpy(zero_copy_only=False).astype(float)

    @property
    def losses(self) -> np.ndarray:
        return self.column(self.loss)

    @property
    def ids(self) -> list[str]:
        return self.table["trial_id"].to_pylist()

    def note(self, text: str) -> None:
        """A line for the fit's notes (said under the tables and in the report)."""
        self.fit.notes.append(text)


class Law:
    """A fit law (module doc). Subclass it, set the class attributes, write `fit`."""

    name: str = ""  # its key in SweepFit.law_fits and in --json
    form: str = ""  # e.g. "L = A·C^-alpha"
    params: tuple[str, ...] = ()  # its constants, as `LawFit.constants` names them
    label: str = ""  # how notes name it: '<label> of <variant>: ...' (default: the name)
    short: str = ""  # how the checks to read with care name it (default: the label)
    title: str = ""  # its table's title (default: '<label>: <form>')
    refit_without_outliers: bool = False  # with --exclude-outliers, refit without them

    def applies(self, trials: VariantTrials) -> bool:
        """Whether these are trials the law is fitted to at all (else it says nothing)."""
        return True

    def fit(self, trials: VariantTrials) -> LawFit | Skipped | None:
        """The law through one variant's trials. A ScalingError or ResultsError it raises
        becomes a note, as a Skipped's reason does."""
        raise NotImplementedError

    def after(self, fit: SweepFit, options: FitOptions, attempt: Callable[..., Any]) -> None:
        """Once every variant is fitted: anything drawn from all of them (L(N, D)'s
        compute-optimal allocation)."""

    def constants(self, fitted: LawFit, level: float) -> Mapping[str, Interval]:
        """Each constant with its interval at `level`."""
        return fitted.constants

    def results(self, fit: SweepFit) -> dict[str, LawFit]:
        """Its fits in `fit`, by variant."""
        return {v: r for v, r in fit.law_fits.get(self.name, {}).items() if r.result is not None}

    def sections(self, fit: SweepFit) -> list[tuple[str, Rows]]:
        """Its tables, as (title, (header, rows)): `results fit` prints them, the report
        writes them in Markdown. By default one row of constants per variant."""
        fitted = self.results(fit)
        checked = any(r.check is not None for r in fitted.values())
        head = ["variant", "law", *self.params, "trials"] + (["check"] if checked else [])
        rows = []
        for v, r in fitted.items():
            values = self.constants(r, fit.level)
            row = [v, self.form, *(_text(values.get(p)) for p in self.params), str(r.n_trials)]
            rows.append(row + ([r.check.summary() if r.check else ""] if checked else []))
        return [(self.title or f"{self.label or self.name}: {self.form}", (head, rows))]

    def report_lines(self, fit: SweepFit) -> list[str]:
        """Markdown the report adds after its tables (none by default)."""
        return []

    def to_json(self, fit: SweepFit) -> dict[str, Any]:
        """Its keys in `--json` (its own: not the fit's, as "gains", nor another law's): by
        default {name: {variant: its constants}}."""
        from ..json_values import interval

        out = {}
        for v, r in self.results(fit).items():
            values = self.constants(r, fit.level)
            entry: dict[str, Any] = {"form": self.form, "n_trials": r.n_trials}
            entry["constants"] = {p: interval(values[p]) for p in self.params if p in values}
            entry["check"] = r.check.to_dict() if r.check is not None else None
            out[v] = entry
        return {self.name: out}

    def predict(
        self, fitted: LawFit, *, n_params: np.ndarray, tokens: np.ndarray, flops: np.ndarray,
        level: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:  # fmt: skip
        """The loss of new runs with its prediction interval, (estimate, low, high), or None
        when the law does not forecast a run's loss."""
        return None


def _text(value: Interval | float | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, (int, float, np.floating)):
        return f"{value:.4g}"
    return str(value)
