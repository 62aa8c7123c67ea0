"""Annealed importance sampling: ``q0``, the annealing path, the transitions, the DAIS
sampler, its importance weights and the DAIS₀ objective of ``q0``.

* :mod:`~numpyro_dais.engine.annealing.gaussian` — the base distribution ``q0 = N(loc, Σ0)``;
* :mod:`~numpyro_dais.engine.annealing.path` — the annealing path ``log γ_k`` and the schedule
  ``β``;
* :mod:`~numpyro_dais.engine.annealing.transitions` — one uncorrected HMC or Langevin transition
  (``KERNELS``);
* :mod:`~numpyro_dais.engine.annealing.dais` — ``K`` transitions for ``N`` particles (``dais.run``);
* :mod:`~numpyro_dais.engine.annealing.weights` — log-mean-exp bounds, normalised weights, the ESS,
  divergences;
* :mod:`~numpyro_dais.engine.annealing.dais0` — the symmetrised KL of ``q0`` and the transport
  check;
* :mod:`~numpyro_dais.engine.annealing.minibatch` — uniform mini-batch indices in ``O(B)``.
"""

from numpyro_dais.engine.annealing.dais import omit_final, over_particles
from numpyro_dais.engine.annealing.dais0 import (
    TransportCheck,
    draws_check,
    symmetrized_kl,
    transport_check,
)
from numpyro_dais.engine.annealing.gaussian import Gaussian
from numpyro_dais.engine.annealing.minibatch import without_replacement
from numpyro_dais.engine.annealing.path import betas_from_increments, log_gamma
from numpyro_dais.engine.annealing.transitions import KERNELS, as_kernel, hmc, langevin
from numpyro_dais.engine.annealing.weights import (
    diverged,
    ess,
    log_mean_exp,
    log_mean_exp_se,
    log_normalize,
)

__all__ = [
    "Gaussian",
    "KERNELS",
    "TransportCheck",
    "as_kernel",
    "betas_from_increments",
    "diverged",
    "ess",
    "hmc",
    "langevin",
    "log_gamma",
    "log_mean_exp",
    "log_mean_exp_se",
    "log_normalize",
    "omit_final",
    "over_particles",
    "symmetrized_kl",
    "transport_check",
    "draws_check",
    "without_replacement",
]
