"""Checks of a fit and its draws: the Pareto ``k̂`` of importance weights and when to stop
training.

* :mod:`~numpyro_dais.engine.diagnostics.psis` — Pareto smoothed importance sampling and ``k̂``;
* :mod:`~numpyro_dais.engine.diagnostics.stopping` — the stopping rule on a noisy objective's trend.
"""

from numpyro_dais.engine.diagnostics.psis import (
    K_BAD,
    K_GOOD,
    PSIS,
    ParetoK,
    pareto_k,
    pareto_k_warning,
    psis_smooth,
)
from numpyro_dais.engine.diagnostics.stopping import Rule, RuleState, WindowStats, converged

__all__ = [
    "K_BAD",
    "K_GOOD",
    "PSIS",
    "ParetoK",
    "Rule",
    "RuleState",
    "WindowStats",
    "converged",
    "pareto_k",
    "pareto_k_warning",
    "psis_smooth",
]
