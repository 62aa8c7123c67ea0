"""RBF kernels with the median bandwidth, for particle VI.

``k(x′, x) = exp(−‖x′ − x‖² / h)`` with ``h = median_{i,j} ‖x′_j − x_i‖² / log(N·N′)``,
recomputed for every batch and never differentiated (Liu & Wang, 2016, SVGD).
"""

import jax
import jax.numpy as jnp


def pairwise_sq_dists(x_prime: jax.Array, x: jax.Array) -> jax.Array:
    """``‖x′_j − x_i‖²`` for ``x′ (N′, d)``, ``x (N, d)``: shape ``(N′, N)``."""
    diff = x_prime[:, None, :] - x[None, :, :]
    return jnp.sum(diff * diff, axis=-1)


def median_bandwidth(x_prime: jax.Array, x: jax.Array) -> jax.Array:
    """``h = median ‖x′_j − x_i‖² / log(N·N′)`` (stop-gradient, floored away from 0)."""
    n_prime, n = x_prime.shape[0], x.shape[0]
    sq = jax.lax.stop_gradient(pairwise_sq_dists(x_prime, x))
    log_nn = jnp.log(jnp.maximum(n * n_prime, 2.0))
    return jnp.maximum(jnp.median(sq) / log_nn, jnp.finfo(sq.dtype).tiny ** 0.5)


class RBF:
    """``K (N′, N)`` with ``K[j, i] = k(x′_j, x_i)`` and ``∇_{x′_j} k(x′_j, x_i) (N′, N, d)``."""

    def __init__(self, x_prime: jax.Array, x: jax.Array, h=None):
        self.h = median_bandwidth(x_prime, x) if h is None else h
        self.diff = x_prime[:, None, :] - x[None, :, :]  # (N′, N, d)
        self.K = jnp.exp(-jnp.sum(self.diff**2, axis=-1) / self.h)  # (N′, N)

    @property
    def grad_first(self) -> jax.Array:
        """``∇_{x′_j} k(x′_j, x_i) = −(2/h)(x′_j − x_i) k``, shape ``(N′, N, d)``."""
        return -2.0 / self.h * self.diff * self.K[..., None]


def ksd_u_statistic(x: jax.Array, score: jax.Array) -> jax.Array:
    """Squared kernel Stein discrepancy of the particles ``x (N, d)`` to ``p``.

    ``score = ∇ log p(x) (N, d)``. U-statistic over pairs ``j ≠ j′`` with the RBF kernel
    and the median bandwidth of ``x`` (Liu, Lee & Jordan, 2016; Chwialkowski et al., 2016).
    Unbiased, so it may be slightly negative; its expectation is 0 iff ``q = p``.
    """
    n, d = x.shape
    kern = RBF(x, x)
    h, diff, K = kern.h, kern.diff, kern.K  # diff[j, j′] = x_j − x_j′
    r2 = jnp.sum(diff**2, axis=-1)
    ss = score @ score.T
    s_d = jnp.einsum("jd,jkd->jk", score, diff)  # s_jᵀ (x_j − x_k)
    d_s = jnp.einsum("jkd,kd->jk", diff, score)  # (x_j − x_k)ᵀ s_k
    u = K * (ss + 2.0 / h * s_d - 2.0 / h * d_s + 2.0 * d / h - 4.0 * r2 / h**2)
    off = 1.0 - jnp.eye(n, dtype=x.dtype)
    return jnp.sum(u * off) / (n * (n - 1))
