"""The base distribution ``q0 = N(loc, Σ0)``, diagonal or Cholesky-factored.

``scale`` is either a ``(D,)`` vector of standard deviations (``Σ0 = diag(scale²)``) or a
``(D, D)`` lower-triangular factor ``L`` (``Σ0 = L Lᵀ``).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

_LOG_2PI = jnp.log(2.0 * jnp.pi)


class Gaussian(NamedTuple):
    loc: jax.Array  # (D,)
    scale: jax.Array  # (D,) standard deviations, or (D, D) lower Cholesky factor


def is_diagonal(q0: Gaussian) -> bool:
    return jnp.ndim(q0.scale) == 1


def sample(rng_key, q0: Gaussian, sample_shape=()) -> jax.Array:
    """Reparameterised draws, shape ``sample_shape + (D,)``."""
    return reparameterize(q0, jax.random.normal(rng_key, tuple(sample_shape) + jnp.shape(q0.loc)))


def reparameterize(q0: Gaussian, eps: jax.Array) -> jax.Array:
    """``loc + L eps``: draws of ``q0`` from standard normal ``eps (..., D)``."""
    if is_diagonal(q0):
        return q0.loc + q0.scale * eps
    return q0.loc + eps @ q0.scale.T


def log_prob(q0: Gaussian, z: jax.Array) -> jax.Array:
    """``log q0(z)`` for ``z`` of shape ``(..., D)``; returns shape ``(...)``."""
    diff = z - q0.loc
    if is_diagonal(q0):
        white = diff / q0.scale
        log_det = jnp.sum(jnp.log(q0.scale))
    else:
        flat = jnp.reshape(diff, (-1, diff.shape[-1]))
        white = solve_triangular(q0.scale, flat.T, lower=True).T.reshape(diff.shape)
        log_det = jnp.sum(jnp.log(jnp.diagonal(q0.scale)))
    dim = jnp.shape(z)[-1]
    return -0.5 * jnp.sum(white**2, axis=-1) - log_det - 0.5 * dim * _LOG_2PI


def marginal_std(q0: Gaussian) -> jax.Array:
    """Per-coordinate standard deviation, shape ``(D,)``."""
    if is_diagonal(q0):
        return q0.scale
    return jnp.sqrt(jnp.sum(q0.scale**2, axis=-1))
