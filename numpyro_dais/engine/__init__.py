"""Pure-JAX sampler engine: annealing path, transitions, weights, resampling, kernels.

Nothing in this package imports NumPyro. Every function is a pure function of arrays
(and of log-density callables ``z -> scalar``), safe under ``jit``, ``vmap`` and ``grad``.
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
