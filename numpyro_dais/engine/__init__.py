"""Pure-JAX sampler engine: annealing path, transitions, weights, resampling, kernels.

Nothing in this package imports NumPyro. Every function is a pure function of arrays
(and of log-density callables ``z -> scalar``), safe under ``jit``, ``vmap`` and ``grad``,
except the two set-up helpers of :mod:`~numpyro_dais.engine.preconditioning`
(``laplace``, ``whitened_curvature``), which run on the host in float64 NumPy once per guide.
The guides in :mod:`numpyro_dais` are thin NumPyro adapters over it.
"""

from numpyro_dais.engine import (
    annealing,
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

__all__ = [
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
