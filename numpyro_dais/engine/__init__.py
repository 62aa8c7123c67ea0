"""Pure-JAX sampler engine: annealing path, transitions, weights, resampling, kernels.

Nothing in this package imports NumPyro. Every function is a pure function of arrays
(and of log-density callables ``z -> scalar``), safe under ``jit``, ``vmap`` and ``grad``,
except the two set-up helpers of :mod:`~numpyro_dais.engine.setup.preconditioning`
(``laplace``, ``whitened_curvature``), which run on the host in float64 NumPy once per guide.
The guides in :mod:`numpyro_dais` are thin NumPyro adapters over it.

By family, one folder each:

* **shared types** (here) — :mod:`~numpyro_dais.engine.base` (states, parameters, targets,
  outputs), :mod:`~numpyro_dais.engine.validation` (argument checks), and
  :mod:`~numpyro_dais.engine.samplers` (DAIS or SMC, by configuration);
* **annealing** (:mod:`numpyro_dais.engine.annealing`) — ``q0`` (``gaussian``), the annealing
  path (``path``), the HMC and Langevin kernels (``transitions``), the DAIS sampler
  (``dais``), the importance weights (``weights``), the DAIS₀ objective and transport check
  (``dais0``), uniform mini-batches (``minibatch``);
* **SMC** (:mod:`numpyro_dais.engine.smc`) — the SMC sampler (``smc``) and its resampling
  schemes, rules and gradients (``resampling``);
* **diagnostics** (:mod:`numpyro_dais.engine.diagnostics`) — PSIS and Pareto ``k̂``
  (``psis``), the stopping rule of a fit (``stopping``), the MALA check of ``q0`` (``mala``);
* **MCMC** (:mod:`numpyro_dais.engine.mcmc`) — the Metropolis-adjusted Langevin kernel and an
  ensemble of its chains adapted together (``mala``);
* **set-up** (:mod:`numpyro_dais.engine.setup`) — curvature and a mode (``curvature``), the
  whitened coordinates (``preconditioning``), the Gaussian VI refinement of a Laplace start
  (``refinement``);
* **particle VI** (:mod:`numpyro_dais.engine.vi`) — the GPVI objective (``gpvi``), RBF kernels
  and the KSD (``kernels``), the generator and helper networks (``networks``).

Each family's package exports its main names; a module's other functions (``dais.run``,
``gaussian.sample``, ...) are reached through the module. The shared types and the names a
configuration is built from are exported here.
"""

from numpyro_dais.engine.annealing.transitions import KERNELS
from numpyro_dais.engine.base import (
    AnnealParams,
    Kernel,
    ParticleState,
    Potential,
    ResamplingConfig,
    SamplerOutput,
    StepParams,
    Target,
    Trace,
    TransitionInfo,
)
from numpyro_dais.engine.samplers import Sampler
from numpyro_dais.engine.smc.resampling import RULES, SCHEMES
from numpyro_dais.engine.validation import SubsamplingNotSupportedError, check_choice

__all__ = [
    "AnnealParams",
    "KERNELS",
    "Kernel",
    "ParticleState",
    "Potential",
    "RULES",
    "ResamplingConfig",
    "SCHEMES",
    "Sampler",
    "SamplerOutput",
    "StepParams",
    "SubsamplingNotSupportedError",
    "Target",
    "Trace",
    "TransitionInfo",
    "check_choice",
]
