"""Scaling-law statistics over plain data (numpy arrays or a results table); no torch.

- `pareto_frontier`, `fit_power_law`: loss versus compute, L(C) = E + A C^-alpha
- `fit_chinchilla`: L(N, D) = E + A/N^alpha + B/D^beta (Approach 3) and N*(C), D*(C)
- `fit_isoflop`: parabolas in log N per budget (Approach 2)
- `bootstrap`: percentile intervals for every constant and derived number
- `compute_equivalent_gain`, `gains`: FLOPs multiplier of a variant against the baseline
- `paired_gain`: the same multiplier from trials that differ only in the variant
- `lsq` (least squares with the delta method), `checks` (does a fit describe its points:
  bounds, outliers, influence, intervals too wide), `forecast` (a run's loss with a
  prediction interval), `advice` (what to run next)
- `robust` (the Huber L(N, D) with its covariance, leave-one-size-out misfit and
  forward-chaining reach, the one
  L(N, D) of fit and forecast), `refine` (its batched warm-started refits)
- `compare_cells`, `pair_trials`: each variant against the baseline cell by cell (size,
  tokens, ...; means over seeds only) and the trials that pair up on cell and seed

See docs/scaling.md for the equations and definitions.
"""

from .bootstrap import Bootstrap, Interval, bootstrap
from .cells import CellComparison, Pairs, cell_means, compare_cells, pair_trials, swept_axes
from .chinchilla import ChinchillaFit, fit_chinchilla
from .data import ScalingError, ScalingWarning
from .gain import Gain, PairFit, Trials, compute_equivalent_gain, gains
from .isoflop import BudgetOptimum, IsoFlopFit, fit_isoflop
from .objective import HUBER_DELTA
from .paired import PairedGain, paired_gain
from .powerlaw import PowerLawFit, fit_power_law, pareto_frontier

__all__ = [
    "HUBER_DELTA",
    "Bootstrap",
    "BudgetOptimum",
    "CellComparison",
    "ChinchillaFit",
    "Gain",
    "Interval",
    "IsoFlopFit",
    "PairFit",
    "PairedGain",
    "Pairs",
    "PowerLawFit",
    "ScalingError",
    "ScalingWarning",
    "Trials",
    "bootstrap",
    "cell_means",
    "compare_cells",
    "compute_equivalent_gain",
    "fit_chinchilla",
    "fit_isoflop",
    "fit_power_law",
    "gains",
    "pair_trials",
    "paired_gain",
    "pareto_frontier",
    "swept_axes",
]
