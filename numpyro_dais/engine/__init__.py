"""Pure-JAX sampler engine: annealing path, transitions, weights, resampling, kernels.

Nothing in this package imports NumPyro. Every function is a pure function of arrays
(and of log-density callables ``z -> scalar``), safe under ``jit``, ``vmap`` and ``grad``,
except the two set-up helpers of :mod:`~numpyro_dais.engine.preconditioning`
(``laplace``, ``whitened_curvature``), which run on the host in float64 NumPy once per guide.
The guides in :mod:`numpyro_dais` are thin NumPyro adapters over it.

By family:

* **shared types** — :mod:`.base` (states, parameters, targets, outputs), :mod:`.validation`;
* **annealing and SMC** — :mod:`.gaussian` (``q0``), :mod:`.annealing` (the path),
  :mod:`.transitions` (HMC and Langevin kernels), :mod:`.dais` and :mod:`.smc` (the two
  samplers), :mod:`.samplers` (either, by configuration), :mod:`.resampling`,
  :mod:`.weights`, :mod:`.psis`, :mod:`.dais0` (the DAIS₀ objective and transport check),
  :mod:`.curvature` and :mod:`.preconditioning` (the set-up), :mod:`.minibatch`;
* **particle VI** — :mod:`.gpvi`, :mod:`.kernels` (RBF, KSD), :mod:`.networks`.

The shared types and the names a configuration is built from are exported here too.
"""

from numpyro_dais.engine import (
    annealing,
    base,
    curvature,
    dais,
    dais0,
    gaussian,
    gpvi,
    kernels,
    minibatch,
    networks,
    psis,
    resampling,
    samplers,
    smc,
    transitions,
    validation,
    weights,
)
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
from numpyro_dais.engine.resampling import RULES, SCHEMES
from numpyro_dais.engine.samplers import Sampler
from numpyro_dais.engine.transitions import KERNELS

__all__ = [
    # shared types and configuration
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
    "Target",
    "Trace",
    "TransitionInfo",
    # modules
    "base",
    "annealing",
    "curvature",
    "dais",
    "dais0",
    "gaussian",
    "gpvi",
    "kernels",
    "minibatch",
    "networks",
    "psis",
    "resampling",
    "samplers",
    "smc",
    "transitions",
    "validation",
    "weights",
]
