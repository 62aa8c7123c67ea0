"""The annealing path ``log γ_k(z) = (1 − β_k) log q0(z) + β_k ℓ(z)``.

Reference: Neal (2001), "Annealed importance sampling" (geometric path).
"""

import jax
import jax.numpy as jnp


def betas_from_increments(increments: jax.Array) -> jax.Array:
    """Schedule ``0 = β_0 < β_1 < … < β_K = 1`` from ``K`` positive increments.

    Returns shape ``(K + 1,)``: ``β_k = Σ_{j≤k} inc_j / Σ_j inc_j`` with a leading 0.
    """
    cumulative = jnp.cumsum(increments)
    return jnp.concatenate([jnp.zeros((1,), cumulative.dtype), cumulative / cumulative[-1]])


def log_gamma(beta, log_q0, log_target):
    """``log γ_β = (1 − β) log q0 + β ℓ`` from already evaluated terms (any shape)."""
    return (1.0 - beta) * log_q0 + beta * log_target
