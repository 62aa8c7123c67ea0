"""Gaussian VI refinement of a Laplace start, in its whitened coordinates.

In the coordinates ``u`` of a Laplace whitening the posterior is ``N(0, I)`` if it is
Gaussian, and then ``∇ℓ(ε) = −ε`` for every ``ε``. The residual ``r̄ = mean_s(∇ℓ(ε_s) + ε_s)``
over standard normal draws ``ε_s`` is therefore 0 for a Gaussian posterior (whatever the
draws) and grows with the gap between the mode's curvature and the posterior's bulk: it is
the gradient of the ELBO of ``N(0, I)`` in its mean. A hierarchy's joint mode, where the
group effects overfit and the group scale is far too large, gives residuals of tens of
standard deviations; a regression's, below 1.

When the largest ``|r̄_i|`` (:func:`residual`) exceeds a threshold, :func:`refine`
maximises the sample-average ELBO of ``N(μ, diag e^{2ρ})`` over the same fixed draws
(deterministic ADVI) with Adam; the refined start is ``z = m + L (μ + e^ρ u)``. Adam starts
from ``N(0, I)``, or from a shrunken copy (:data:`START_SCALES`) where a joint mode far from
the bulk is so sharp that the Laplace Gaussian's own draws reach densities no step recovers
from.

Reference: Giordano, Ingram & Broderick (2024), "Black box variational inference with a
deterministic objective: faster, more accurate, and even more black box" (DADVI: the ELBO
over a fixed set of draws).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

#: ``max_i |r̄_i|`` above which the set-up refines. Measured over 32 draws: nearly Gaussian
#: posteriors (regressions with flat priors, uncentred or collinear covariates; AR and GARCH
#: series) 0.15–1.4 (float32 round-off in ``∇ℓ`` of the collinear one), Neal's funnel 0;
#: hierarchies (eight schools, a radon model, hierarchical logistic and Poisson models, a
#: latent GP) 7–110.
THRESHOLD = 3.0

#: isotropic scales ``s`` of the starts ``N(0, s² I)`` that :func:`refine` can take: the
#: Laplace Gaussian ``s = 1`` unless its sample-average ELBO is not finite or more than
#: :data:`SHRINK_MARGIN` nats per dimension below the best of them, then the best. On the
#: hierarchies above a shrunken start is at most 1.3 nats per dimension better and the fit
#: from it ends elsewhere (eight schools' importance draws 0.43 instead of 0.11 in log sd
#: after training), so they keep ``s = 1``; a stochastic-volatility series with a
#: heavy-tailed prior on its volatility scale (joint mode at σ ≈ 15, the posterior's bulk at
#: 0.5) gives ``−6·10¹⁵`` at ``s = 1`` (float32), and Adam from there never reached the bulk:
#: q0 ended 58 posterior sds off after 5,000 training steps, and 0.11 from the best shrunken
#: start (float64).
START_SCALES = (1.0, 0.3, 0.1, 0.03, 0.01)
#: nats per dimension by which a shrunken start must beat the Laplace Gaussian's ELBO
SHRINK_MARGIN = 10.0


class Refinement(NamedTuple):
    """Result of :func:`refine`, in ``u``."""

    loc: jax.Array
    """``(D,)`` ``μ``, zeros when not refined."""
    log_scale: jax.Array
    """``(D,)`` ``ρ``, zeros when not refined."""
    residual: jax.Array
    """``()`` ``max_i |r̄_i|`` at ``N(0, I)`` (``inf`` when not finite)."""
    num_iters: jax.Array
    """``()`` Adam steps taken (0 with ``start_scale`` 1: the Laplace start is kept)."""
    gain: jax.Array
    """``()`` the sample-average ELBO gained over Adam's start (nats)."""
    start_scale: jax.Array
    """``()`` the ``s`` of Adam's start ``N(0, s² I)`` (:data:`START_SCALES`)."""


def antithetic_draws(num_draws: int, dim: int, dtype, seed: int = 0) -> np.ndarray:
    """``(num_draws, dim)`` standard normal draws in ``±`` pairs (their mean is 0 up to
    round-off), made on the host (an eager ``jax.random.normal`` compiles for most of a
    second)."""
    half = np.random.default_rng(seed).standard_normal((num_draws // 2, dim))
    return np.concatenate([half, -half]).astype(dtype)


def _elbo(log_density: Callable, eps: jax.Array) -> Callable:
    """The sample-average ELBO of ``N(μ, diag e^{2ρ})`` over ``eps (S, D)``, a function of
    ``(μ, ρ)``."""

    def elbo(params):
        loc, log_scale = params
        values = jax.vmap(log_density)(loc + jnp.exp(log_scale) * eps)
        return jnp.mean(values) + jnp.sum(log_scale)

    return elbo


def _max_residual(value: jax.Array, grad_loc: jax.Array, eps: jax.Array) -> jax.Array:
    """``max_i |r̄_i|`` from the ELBO's value and gradient in ``μ`` at ``N(0, I)`` (``mean_s
    ∇ℓ(ε_s)``): ``r̄`` adds ``mean_s ε_s``, so it is exactly 0 for a standard normal ``ℓ``;
    ``inf`` when either is not finite."""
    r = jnp.max(jnp.abs(grad_loc + jnp.mean(eps, axis=0)))
    return jnp.where(jnp.isfinite(r) & jnp.isfinite(value), r, jnp.inf)


def residual(log_density: Callable, eps: jax.Array) -> jax.Array:
    """``()`` ``max_i |r̄_i|``, ``r̄ = mean_s(∇ℓ(ε_s) + ε_s)`` over ``eps (S, D)`` (``inf``
    when not finite): whether to :func:`refine`."""
    zeros = jnp.zeros(eps.shape[-1], eps.dtype)
    value, grads = jax.value_and_grad(_elbo(log_density, eps))((zeros, zeros))
    return _max_residual(value, grads[0], eps)


def refine(
    log_density: Callable,
    eps: jax.Array,
    max_iters: int = 1000,
    learning_rate: float = 0.1,
    tol: float = 0.05,
) -> Refinement:
    """Fit ``N(μ, diag e^{2ρ})`` to ``ℓ`` (a log density of ``u (D,)``) by the ELBO over the
    draws ``eps (S, D)``, from ``N(0, s² I)``, ``s`` in :data:`START_SCALES` (``1`` unless
    its ELBO is not finite or far below a shrunken start's).

    Adam's learning rate decays from ``learning_rate`` to a hundredth of it over ``max_iters``
    steps; it stops early when every gradient coordinate is below ``tol`` (``tol`` standard
    deviations of a Gaussian target from its optimum), and keeps the last point whose
    objective and gradient were finite (none: the start, with 0 steps).
    """
    elbo = _elbo(log_density, eps)
    value_and_grad = jax.value_and_grad(elbo)
    adam = optax.adam(optax.cosine_decay_schedule(learning_rate, max_iters, alpha=0.01))
    zeros = jnp.zeros(eps.shape[-1], eps.dtype)
    log_scales = jnp.log(jnp.asarray(START_SCALES, eps.dtype))
    starts = jax.lax.map(lambda rho: elbo((zeros, zeros + rho)), log_scales)
    starts = jnp.where(jnp.isfinite(starts), starts, -jnp.inf)
    best = jnp.argmax(starts)
    margin = SHRINK_MARGIN * eps.shape[-1]
    start = jnp.where(jnp.isfinite(starts[0]) & (starts[0] >= starts[best] - margin), 0, best)
    params = (zeros, zeros + log_scales[start])

    def body(carry):
        i, params, best, state, start, gain, _ = carry
        value, grads = value_and_grad(params)
        finite = jnp.isfinite(value) & jnp.all(jnp.isfinite(jnp.stack(grads)))
        start = jnp.where(i == 0, value, start)  # the ELBO the gain is measured from
        # Adam ascends: optax minimises, so the gradient's sign is flipped
        updates, state = adam.update(jax.tree.map(jnp.negative, grads), state, params)
        best = jax.tree.map(lambda p, b: jnp.where(finite, p, b), params, best)
        gain = jnp.where(finite, value - start, gain)
        moves = finite & ~jnp.all(jnp.abs(jnp.stack(grads)) < tol)
        params = jax.tree.map(lambda p, u: jnp.where(moves, p + u, p), params, updates)
        return i + 1, params, best, state, start, gain, ~moves

    zero = jnp.zeros((), eps.dtype)
    init = (jnp.zeros((), jnp.int32), params, params, adam.init(params), zero, zero)
    carry = jax.lax.while_loop(
        lambda c: (c[0] <= max_iters) & ~c[6], body, init + (jnp.zeros((), bool),)
    )
    i, _, best, _, _, gain, _ = carry
    scale = jnp.exp(log_scales[start])
    return Refinement(best[0], best[1], residual(log_density, eps), i - 1, gain, scale)
