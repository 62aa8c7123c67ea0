"""Importance weights: log-mean-exp bounds, normalised weights and the ESS.

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
