"""Checks of a fit and its draws: the Pareto ``k̂`` of importance weights, when to stop
training, and whether ``q0`` holds up under a chain that does not trust the transitions.

* :mod:`~numpyro_dais.engine.diagnostics.psis` — Pareto smoothed importance sampling and ``k̂``;
* :mod:`~numpyro_dais.engine.diagnostics.stopping` — the stopping rule on a noisy objective's trend;
* :mod:`~numpyro_dais.engine.diagnostics.mala` — Metropolis-adjusted Langevin chains from ``q0``
  draws.
"""

from numpyro_dais.engine.diagnostics.mala import RelaxationCheck, relaxation_check
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
    "RelaxationCheck",
    "Rule",
    "RuleState",
    "WindowStats",
    "converged",
    "pareto_k",
    "pareto_k_warning",
    "psis_smooth",
    "relaxation_check",
]
