"""Importance weights: log-mean-exp bounds, normalised weights, the ESS and the standard
error of ``log Ẑ``.

All functions reduce over ``axis`` (the particle axis) and are safe for ``-inf`` entries
(a particle with zero weight) as long as one entry is finite.
"""

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp


def log_mean_exp(log_w: jax.Array, axis: int = -1) -> jax.Array:
    """``log (1/N) Σ_i exp(log_w_i)`` with a max-shifted logsumexp."""
    return logsumexp(log_w, axis=axis) - jnp.log(log_w.shape[axis])


def log_normalize(log_w: jax.Array, axis: int = -1) -> jax.Array:
    """Log normalised weights ``log W_i = log w_i − logsumexp(log w)``."""
    return log_w - logsumexp(log_w, axis=axis, keepdims=True)


def ess(log_w: jax.Array, axis: int = -1) -> jax.Array:
    """Effective sample size ``1 / Σ_i W_i²`` in ``[1, N]`` from unnormalised log weights."""
    log_W = log_normalize(log_w, axis=axis)
    return jnp.exp(-logsumexp(2.0 * log_W, axis=axis))


def log_mean_exp_se(
    log_w: jax.Array, founders: jax.Array | None = None, num_resampled=0
) -> jax.Array:
    """Standard error of ``log_mean_exp(log_w)`` as an estimate of ``log Z``; ``log_w (N,)``.

    Delta method, ``se(log Ẑ) ≈ sd(Ẑ) / Ẑ``, with the variance estimate of Lee & Whiteley
    (2018, "Variance estimation in the particle filter"; adaptive resampling as in Du &
    Guyader 2021): with normalised weights ``W_i`` and ``R = num_resampled`` resampling
    events,

        se² = 1 − (N / (N − 1))^{R + 1} (1 − Σ_e (Σ_{i: f_i = e} W_i)²),

    where ``f_i = founders[i]`` is the initial particle that particle ``i`` descends from.
    Without resampling (``founders=None``, ``R = 0``) this is the i.i.d. case,
    ``se² = (N Σ_i W_i² − 1) / (N − 1) = (N / ESS − 1) / (N − 1)``: the sample standard
    deviation of the weights over ``√N`` times their mean. Like the ESS it is estimated from
    the weights, so it is too small while a heavy tail of the weights is unsampled
    (ESS ≪ N). Needs ``N ≥ 2``.
    """
    N = log_w.shape[-1]
    W = jnp.exp(log_normalize(log_w))
    if founders is not None:
        W = jax.ops.segment_sum(W, founders, num_segments=N)
    factor = (N / (N - 1.0)) ** (jnp.asarray(num_resampled, W.dtype) + 1.0)
    rel_var = 1.0 - factor * (1.0 - jnp.sum(W**2))
    return jnp.sqrt(jnp.maximum(rel_var, 0.0))


def combine_se(log_Z: jax.Array, se: jax.Array) -> jax.Array:
    """Standard error of ``log mean_b Ẑ_b`` from ``B`` independent estimates ``log Ẑ_b (B,)``
    with standard errors ``se (B,)`` (delta method): ``se² = Σ_b W_b² se_b²``, ``W_b ∝ Ẑ_b``."""
    W = jnp.exp(log_normalize(log_Z))
    return jnp.sqrt(jnp.sum((W * se) ** 2))


def mask_nonfinite(log_w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replace non-finite log weights (NaN, ``+inf``, diverged trajectories) by ``-inf``.

    Returns ``(masked_log_w, num_nonfinite)``. ``-inf`` entries drop out of every
    logsumexp above; gradients through the masked entries are zero in value but may still
    carry NaN from the trajectory, see :func:`zero_nonfinite_grads`.
    """
    finite = jnp.isfinite(log_w)
    return jnp.where(finite, log_w, -jnp.inf), jnp.sum(~finite)


#: energy error (nats) beyond which a trajectory counts as diverged, NUTS's threshold
MAX_ENERGY_ERROR = 1000.0


def diverged(energy_change: jax.Array, energy_scale: jax.Array) -> jax.Array:
    """Diverged trajectories: a non-finite energy change, or a loss of energy beyond
    ``MAX_ENERGY_ERROR + 10 · |energy_scale|`` nats.

    A stable leapfrog integrator loses ``O(η²)`` of the energy scale (``|energy_scale|``,
    e.g. ``|ℓ(z_0)| + |log q0(z_0)|`` at the start); an unstable one loses it geometrically,
    by orders of magnitude, while the log weights can stay finite in float32 (−1e18), so
    that a finite-only check never fires and gradients of 1e19 overflow the optimiser.
    """
    limit = MAX_ENERGY_ERROR + 10.0 * jnp.abs(energy_scale)
    return ~jnp.isfinite(energy_change) | (energy_change < -limit)


@jax.custom_vjp
def zero_nonfinite_grads(tree):
    """Identity whose backward pass replaces NaN/inf cotangents by 0, entry by entry.

    Applied to the differentiable inputs of a bound, it stops one diverged particle from
    turning the whole parameter update into NaN.
    """
    return tree


def _zero_nonfinite_fwd(tree):
    return tree, None


def _zero_nonfinite_bwd(_, cotangent):
    return (jax.tree.map(lambda g: jnp.where(jnp.isfinite(g), g, 0.0), cotangent),)


zero_nonfinite_grads.defvjp(_zero_nonfinite_fwd, _zero_nonfinite_bwd)
