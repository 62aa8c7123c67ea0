"""Gaussian VI refinement of a Laplace start, in its whitened coordinates.

In the coordinates ``u`` of a Laplace whitening the posterior is ``N(0, I)`` if it is
Gaussian, and then ``∇ℓ(ε) = −ε`` for every ``ε``. The residual ``r̄ = mean_s(∇ℓ(ε_s) + ε_s)``
over standard normal draws ``ε_s`` is therefore 0 for a Gaussian posterior (whatever the
draws) and grows with the gap between the mode's curvature and the posterior's bulk: it is
the gradient of the ELBO of ``N(0, I)`` in its mean. A hierarchy's joint mode, where the
group effects overfit and the group scale is far too large, gives residuals of tens of
standard deviations; a regression's, below 1.

When the largest ``|r̄_i|`` exceeds a threshold, :func:`refine` maximises the sample-average
ELBO of ``N(μ, diag e^{2ρ})`` over the same fixed draws (deterministic ADVI) with Adam; the
refined start is ``z = m + L (μ + e^ρ u)``.

Reference: Giordano, Ingram & Broderick (2024), "Black box variational inference with a
deterministic objective: faster, more accurate, and even more black box" (DADVI: the ELBO
over a fixed set of draws).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

#: ``max_i |r̄_i|`` above which :func:`refine` fits. Measured over 32 draws: nearly Gaussian
#: posteriors (regressions with flat priors, uncentred or collinear covariates; AR and GARCH
#: series) 0.15–1.4 (float32 round-off in ``∇ℓ`` of the collinear one), Neal's funnel 0;
#: hierarchies (eight schools, a radon model, hierarchical logistic and Poisson models, a
#: latent GP) 7–110.
THRESHOLD = 3.0


class Refinement(NamedTuple):
    """Result of :func:`refine`, in ``u``."""

    loc: jax.Array
    """``(D,)`` ``μ``, zeros when not refined."""
    log_scale: jax.Array
    """``(D,)`` ``ρ``, zeros when not refined."""
    residual: jax.Array
    """``()`` ``max_i |r̄_i|`` at ``N(0, I)`` (``inf`` when not finite)."""
    num_iters: jax.Array
    """``()`` Adam steps taken (0: the start was kept)."""
    gain: jax.Array
    """``()`` the sample-average ELBO gained over ``N(0, I)`` (nats)."""


def residual(log_density: Callable, eps: jax.Array) -> jax.Array:
    """``()`` ``max_i |r̄_i|``, ``r̄ = mean_s(∇ℓ(ε_s) + ε_s)`` over ``eps (S, D)`` (``inf``
    when not finite): the trigger of :func:`refine`, which computes it too, on its own."""
    grads = jax.vmap(jax.grad(log_density))(eps)
    r = jnp.max(jnp.abs(jnp.mean(grads + eps, axis=0)))
    return jnp.where(jnp.isfinite(r), r, jnp.inf)


def refine(
    log_density: Callable,
    eps: jax.Array,
    threshold: float = THRESHOLD,
    max_iters: int = 1000,
    learning_rate: float = 0.1,
    tol: float = 0.05,
) -> Refinement:
    """Fit ``N(μ, diag e^{2ρ})`` to ``ℓ`` (a log density of ``u (D,)``) by the ELBO over the
    draws ``eps (S, D)``, if the residual at ``N(0, I)`` exceeds ``threshold``.

    Adam's learning rate decays from ``learning_rate`` to a hundredth of it over ``max_iters``
    steps; it stops early when every gradient coordinate is below ``tol`` (``tol`` standard
    deviations of a Gaussian target from its optimum), and keeps the last point whose
    objective and gradient were finite.
    """

    def elbo(params):
        loc, log_scale = params
        values = jax.vmap(log_density)(loc + jnp.exp(log_scale) * eps)
        return jnp.mean(values) + jnp.sum(log_scale)

    value_and_grad = jax.value_and_grad(elbo)
    schedule = optax.cosine_decay_schedule(learning_rate, max_iters, alpha=0.01)
    adam = optax.adam(schedule)
    dim = eps.shape[-1]
    zeros = jnp.zeros(dim, eps.dtype)
    params = (zeros, zeros)
    mean_eps = jnp.mean(eps, axis=0)

    def body(carry):
        i, params, best, state, start, residual, gain, _ = carry
        value, grads = value_and_grad(params)
        finite = jnp.isfinite(value) & jnp.all(jnp.isfinite(jnp.stack(grads)))
        first = jnp.where(finite, jnp.max(jnp.abs(grads[0] + mean_eps)), jnp.inf)
        residual, start = jnp.where(i == 0, first, residual), jnp.where(i == 0, value, start)
        active = finite & (residual > threshold) & jnp.isfinite(residual)
        small = jnp.all(jnp.abs(jnp.stack(grads)) < tol)
        # Adam ascends: optax minimises, so the gradient's sign is flipped
        updates, state = adam.update(jax.tree.map(jnp.negative, grads), state, params)
        best = jax.tree.map(lambda p, b: jnp.where(finite, p, b), params, best)
        gain = jnp.where(finite, value - start, gain)
        moves = active & ~small
        params = jax.tree.map(lambda p, u: jnp.where(moves, p + u, p), params, updates)
        return i + 1, params, best, state, start, residual, gain, ~moves

    zero = jnp.zeros((), eps.dtype)
    inf = jnp.asarray(jnp.inf, eps.dtype)
    init = (jnp.zeros((), jnp.int32), params, params, adam.init(params), zero, inf, zero)
    carry = jax.lax.while_loop(
        lambda c: (c[0] <= max_iters) & ~c[7], body, init + (jnp.zeros((), bool),)
    )
    i, _, best, _, _, residual, gain, _ = carry
    return Refinement(best[0], best[1], residual, i - 1, gain)
