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
(deterministic ADVI). That objective is deterministic, so it is fitted by L-BFGS with a
line search, not by a stochastic-gradient method; the refined start is ``z = m + L (μ + e^ρ
u)``. The fit starts from ``N(0, I)``, or from a shrunken copy (:data:`START_SCALES`) where
a joint mode far from the bulk is so sharp that the Laplace Gaussian's own draws reach
densities no step recovers from.

References: Giordano, Ingram & Broderick (2024), "Black box variational inference with a
deterministic objective: faster, more accurate, and even more black box" (DADVI: the ELBO
over a fixed set of draws); Nocedal & Wright (2006), *Numerical Optimization* (L-BFGS, the
zoom line search).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

#: ``max_i |r̄_i|`` above which the set-up refines: between the residuals of nearly Gaussian
#: posteriors (regressions, AR and GARCH series) and those of hierarchies, which are larger
#: by an order of magnitude (the values: the AutoDAIS guide's set-up section).
THRESHOLD = 3.0

#: isotropic scales ``s`` of the starts ``N(0, s² I)`` that :func:`refine` can take: the
#: Laplace Gaussian ``s = 1`` unless its sample-average ELBO is not finite or more than
#: :data:`SHRINK_MARGIN` nats per dimension below the best of them, then the best. A
#: hierarchy keeps ``s = 1`` (a fit from a shrunken start ends elsewhere); a posterior whose
#: joint mode lies far out in a heavy-tailed prior (a stochastic-volatility series' scale)
#: reaches its bulk only from a shrunken one (the AutoDAIS guide's set-up section).
START_SCALES = (1.0, 0.3, 0.1, 0.03, 0.01)
#: nats per dimension by which a shrunken start must beat the Laplace Gaussian's ELBO
SHRINK_MARGIN = 10.0
#: relative rise of ``−ELBO`` that the line search of :func:`refine` accepts as a decrease
#: near an optimum, where round-off hides one (Hager & Zhang 2006's approximate Wolfe
#: condition; optax's default)
APPROX_DECREASE_RTOL = 1e-6
#: curvature pairs that the L-BFGS of :func:`refine` keeps
LBFGS_MEMORY = 40
#: evaluations of the ELBO and its gradient that one line search of :func:`refine` may take
MAX_LINESEARCH_STEPS = 20
#: iterations in a row without progress (a decrease beyond round-off, or a new least error)
#: after which :func:`refine` stops
STALL_ITERS = 10


class Refinement(NamedTuple):
    """Result of :func:`refine`, in ``u``."""

    loc: jax.Array
    """``(D,)`` ``μ``, zeros when not refined."""
    log_scale: jax.Array
    """``(D,)`` ``ρ``, zeros when not refined."""
    residual: jax.Array
    """``()`` ``max_i |r̄_i|`` at ``N(0, I)`` (``inf`` when not finite)."""
    num_iters: jax.Array
    """``()`` L-BFGS iterations taken (0 with ``start_scale`` 1: the Laplace start is
    kept)."""
    gain: jax.Array
    """``()`` the sample-average ELBO gained over the fit's start (nats)."""
    start_scale: jax.Array
    """``()`` the ``s`` of the fit's start ``N(0, s² I)`` (:data:`START_SCALES`)."""
    num_evals: jax.Array
    """``()`` evaluations of the ELBO and its gradient, each over all the draws (the
    starts' included; 0 when not refined)."""
    converged: jax.Array
    """``()`` whether the fit ended within the tolerance of the optimum in its own units:
    the ELBO's gradient in ``μ`` times ``e^ρ``, its gradient in ``ρ``, and the last step, all
    below it in every coordinate."""


def antithetic_draws(num_draws: int, dim: int, dtype, seed: int = 0) -> np.ndarray:
    """``(num_draws, dim)`` standard normal draws in ``±`` pairs (their mean is 0 up to
    round-off), made on the host (an eager ``jax.random.normal`` compiles for most of a
    second)."""
    half = np.random.default_rng(seed).standard_normal((num_draws // 2, dim))
    return np.concatenate([half, -half]).astype(dtype)


def _elbo(log_density: Callable, eps: jax.Array) -> Callable:
    """The sample-average ELBO of ``N(μ, diag e^{2ρ})`` over ``eps (S, D)``, a function of
    ``params (2 D,)``, ``μ`` then ``ρ``."""
    dim = eps.shape[-1]

    def elbo(params):
        loc, log_scale = params[:dim], params[dim:]
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
    dim = eps.shape[-1]
    value, grad = jax.value_and_grad(_elbo(log_density, eps))(jnp.zeros(2 * dim, eps.dtype))
    return _max_residual(value, grad[:dim], eps)


def _starts(value_and_grad: Callable, dim: int, dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(values (n,), grads (n, 2 D), params (n, 2 D))`` of ``f = −ELBO`` at the starts
    ``N(0, s² I)``, ``s`` in :data:`START_SCALES` (``n`` of them; ``params`` flat, ``μ``
    then ``ρ``): one program body for the choice of start, its gradient and the residual."""
    log_scales = jnp.log(jnp.asarray(START_SCALES, dtype))
    params = jnp.concatenate(
        [jnp.zeros((len(START_SCALES), dim), dtype), jnp.repeat(log_scales[:, None], dim, 1)], 1
    )
    values, grads = jax.lax.map(value_and_grad, params)
    return values, grads, params


def _choose_start(values: jax.Array, dim: int) -> jax.Array:
    """``()`` the index of the start in :data:`START_SCALES`, from ``f = −ELBO`` at each
    (``values``): the Laplace Gaussian's unless its ELBO is not finite or more than
    :data:`SHRINK_MARGIN` nats per dimension below the best, then the best."""
    elbos = jnp.where(jnp.isfinite(values), -values, -jnp.inf)
    best = jnp.argmax(elbos)
    keep = jnp.isfinite(elbos[0]) & (elbos[0] >= elbos[best] - SHRINK_MARGIN * dim)
    return jnp.where(keep, 0, best)


def _finite(value: jax.Array, grad: jax.Array) -> jax.Array:
    return jnp.isfinite(value) & jnp.all(jnp.isfinite(grad))


def _error(params: jax.Array, grad: jax.Array) -> jax.Array:
    """``()`` how far ``(μ, ρ) = params`` is from the optimum in the fit's own units, by
    ``∇f = grad``: the largest of ``|∂f/∂μ_i| e^{ρ_i}`` and ``|∂f/∂ρ_i|``. For a Gaussian
    target ``N(m, s²)`` (``e^ρ ≈ s``) the first is ``|μ_i − m_i| / s_i``, the second ``|e^{2ρ_i}
    / s_i² − 1|`` (up to the draws' second moment), whatever the scale ``s``: a raw gradient
    would leave a flat direction (a large ``s``) ``tol s²`` from its optimum."""
    dim = params.shape[-1] // 2
    return jnp.max(jnp.abs(jnp.concatenate([grad[:dim] * jnp.exp(params[dim:]), grad[dim:]])))


def _step(params: jax.Array, new: jax.Array) -> jax.Array:
    """``()`` the length of the step from ``params`` to ``new`` in ``new``'s own units: the
    largest of ``|Δμ_i| e^{−ρ_i}`` and ``|Δρ_i|``."""
    dim = params.shape[-1] // 2
    delta = jnp.abs(new - params)
    return jnp.max(jnp.concatenate([delta[:dim] * jnp.exp(-new[dim:]), delta[dim:]]))


class _Fit(NamedTuple):
    """A point of the fit, by the minimised ``f = −ELBO`` of flat ``(μ, ρ)``."""

    params: jax.Array
    """``(2 D,)`` the last point whose ``f`` and ``∇f`` were finite."""
    value: jax.Array
    """``()`` ``f`` there."""
    grad: jax.Array
    """``(2 D,)`` ``∇f`` there."""
    iters: jax.Array
    """``()`` iterations taken to it."""
    evals: jax.Array
    """``()`` evaluations of ``f`` and ``∇f`` so far."""
    error: jax.Array
    """``()`` :func:`_error` there (``nan`` where ``∇f`` is not finite)."""
    step: jax.Array
    """``()`` the length of the step to it in its own units (:func:`_step`; ``inf`` at the
    start)."""

    def converged(self, tol: float) -> jax.Array:
        """Within ``tol`` of the optimum by the gradient, and by the step that reached it: a
        quasi-Newton step near an optimum is about the distance to it, where the gradient
        alone can dip below ``tol`` mid-way along a direction of low curvature."""
        return (self.error < tol) & (self.step < tol)


def _lbfgs(f: Callable, fit: _Fit, max_evals: int, tol: float) -> _Fit:
    """L-BFGS on ``f`` from ``fit`` (``optax.lbfgs``: a zoom line search for the strong
    Wolfe conditions, or Hager & Zhang's approximate ones near an optimum where round-off
    hides a decrease), until converged or ``max_evals`` evaluations are spent.

    A line search that fails (no step, a step to where ``f`` or ``∇f`` is not finite, or a
    step that rises) moves nothing: the fit restarts from its point with an empty memory (a
    steepest-descent step), and stops when a restarted step fails too, or after
    :data:`STALL_ITERS` iterations in a row that neither lower ``f`` by more than its
    round-off nor reach a new least :func:`_error` (an optimum beyond where ``f`` is finite,
    approached by ever shorter steps). Memory: :data:`LBFGS_MEMORY`.

    Nocedal & Wright (2006), *Numerical Optimization*, algorithms 3.5–3.6 and 7.4–7.5."""
    linesearch = optax.scale_by_zoom_linesearch(
        max_linesearch_steps=MAX_LINESEARCH_STEPS, approx_dec_rtol=APPROX_DECREASE_RTOL
    )
    lbfgs = optax.lbfgs(memory_size=LBFGS_MEMORY, linesearch=linesearch)

    def cond(carry):
        fit, _, _, stalled, stop, _ = carry
        return ~fit.converged(tol) & ~stop & (stalled < STALL_ITERS) & (fit.evals < max_evals)

    def body(carry):
        fit, state, fresh, stalled, _, least = carry
        updates, state = lbfgs.update(
            fit.grad, state, fit.params, value=fit.value, grad=fit.grad, value_fn=f
        )
        value = optax.tree.get(state, "value")
        grad = optax.tree.get(state, "grad")
        evals = fit.evals + optax.tree.get(state, "num_linesearch_steps").astype(fit.evals.dtype)
        rise = value - fit.value - APPROX_DECREASE_RTOL * jnp.abs(fit.value)
        moved = jnp.any(updates != 0) & _finite(value, grad) & (rise <= 0)
        params = fit.params + updates
        error, step = _error(params, grad), _step(fit.params, params)
        new = _Fit(params, value, grad, fit.iters + 1, evals, error, step)
        # progress: f lower by more than its round-off, or the least error so far
        round_off = jnp.finfo(value.dtype).eps * jnp.maximum(jnp.abs(fit.value), 1.0)
        progress = moved & ((fit.value - value > round_off) | (new.error < least))
        stalled = jnp.where(progress, 0, stalled + 1)
        least = jnp.where(moved, jnp.minimum(least, new.error), least)
        fit = jax.tree.map(lambda n, o: jnp.where(moved, n, o), new, fit._replace(evals=evals))
        state = jax.tree.map(lambda s, s0: jnp.where(moved, s, s0), state, lbfgs.init(fit.params))
        return fit, state, ~moved, stalled, ~moved & fresh, least

    zero, false = jnp.zeros((), jnp.int32), jnp.zeros((), bool)
    init = (fit, lbfgs.init(fit.params), ~false, zero, false, fit.error)
    return jax.lax.while_loop(cond, body, init)[0]


def refine(
    log_density: Callable, eps: jax.Array, max_evals: int = 1000, tol: float = 0.01
) -> Refinement:
    """Fit ``N(μ, diag e^{2ρ})`` to ``ℓ`` (a log density of ``u (D,)``) by the ELBO over the
    draws ``eps (S, D)``, from ``N(0, s² I)``, ``s`` in :data:`START_SCALES` (``1`` unless
    its ELBO is not finite or far below a shrunken start's): a :class:`Refinement`.

    The objective is deterministic (the draws are fixed), so a quasi-Newton method with a
    line search fits it (Giordano et al. 2024 use a second-order method too): L-BFGS
    (:func:`_lbfgs`) until the fit is within ``tol`` of the optimum in its own units
    (:func:`_error`: ``tol`` standard deviations of a Gaussian target), out of ``max_evals``
    evaluations of the ELBO and its gradient (each ``S`` gradients of ``ℓ``). It keeps the
    last point whose objective and gradient were finite (none: the start, with 0
    iterations).
    """
    dim = eps.shape[-1]
    elbo = _elbo(log_density, eps)
    f = lambda params: -elbo(params)  # noqa: E731 (optax minimises)
    values, grads, params = _starts(jax.value_and_grad(f), dim, eps.dtype)
    # ∇f = −∇ELBO, and the residual is the ELBO's gradient in μ at N(0, I), the first start
    resid = _max_residual(-values[0], -grads[0, :dim], eps)
    start = _choose_start(values, dim)
    value, grad = values[start], grads[start]
    zero = jnp.zeros((), jnp.int32)
    evals = zero + len(START_SCALES)
    error = _error(params[start], grad)
    fit = _Fit(params[start], value, grad, zero, evals, error, jnp.asarray(jnp.inf, value.dtype))
    # a start whose ELBO or gradient is not finite is kept
    fit = jax.lax.cond(_finite(value, grad), lambda: _lbfgs(f, fit, max_evals, tol), lambda: fit)
    gain = jnp.where(jnp.isfinite(value), value - fit.value, 0.0)
    scale = jnp.asarray(START_SCALES, eps.dtype)[start]
    loc, log_scale = fit.params[:dim], fit.params[dim:]
    converged = fit.converged(tol)
    return Refinement(loc, log_scale, resid, fit.iters, gain, scale, fit.evals, converged)
