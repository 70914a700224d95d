"""Scaling-law statistics over plain data (numpy arrays or a results table); no torch.

- `pareto_frontier`, `fit_power_law`: loss versus compute, L(C) = E + A C^-alpha
- `fit_chinchilla`: L(N, D) = E + A/N^alpha + B/D^beta (Approach 3) and N*(C), D*(C)
- `fit_isoflop`: parabolas in log N per budget (Approach 2)
- `bootstrap`: percentile intervals for every constant and derived number
- `compute_equivalent_gain`, `gains`: FLOPs multiplier of a variant against the baseline
- `compare_sizes`: loss, parameter and FLOPs differences at each size

See docs/scaling.md for the equations and definitions.
"""

from .bootstrap import Bootstrap, Interval, bootstrap
from .chinchilla import ChinchillaFit, fit_chinchilla
from .compare import SizeComparison, compare_sizes
from .data import ScalingError, ScalingWarning
from .gain import Gain, PairFit, Trials, compute_equivalent_gain, gains
from .isoflop import BudgetOptimum, IsoFlopFit, fit_isoflop
from .objective import HUBER_DELTA
from .powerlaw import PowerLawFit, fit_power_law, pareto_frontier

__all__ = [
    "HUBER_DELTA",
    "Bootstrap",
    "BudgetOptimum",
    "ChinchillaFit",
    "Gain",
    "Interval",
    "IsoFlopFit",
    "PairFit",
    "PowerLawFit",
    "ScalingError",
    "ScalingWarning",
    "SizeComparison",
    "Trials",
    "bootstrap",
    "compare_sizes",
    "compute_equivalent_gain",
    "fit_chinchilla",
    "fit_isoflop",
    "fit_power_law",
    "gains",
    "pareto_frontier",
]
