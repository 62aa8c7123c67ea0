"""Differentiable SMC: the annealing transitions with resampling between them.

* :mod:`~numpyro_dais.engine.smc.smc` — the SMC sampler (``smc.run``), its genealogy and the
  standard error of ``log Ẑ``;
* :mod:`~numpyro_dais.engine.smc.resampling` — ancestor schemes, decision rules and gradient modes.
"""

from numpyro_dais.engine.smc.resampling import (
    GRADIENTS,
    RULES,
    SCHEMES,
    multinomial,
    straight_through_take,
    stratified,
    systematic,
)
from numpyro_dais.engine.smc.smc import founders, log_Z_se

__all__ = [
    "GRADIENTS",
    "RULES",
    "SCHEMES",
    "founders",
    "log_Z_se",
    "multinomial",
    "straight_through_take",
    "stratified",
    "systematic",
]
