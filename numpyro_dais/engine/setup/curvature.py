"""Curvature of a log density, for step sizes that respect the posterior's scale.

Leapfrog with unit mass is stable only for ``η < 2 / sqrt(λ_max)``, where ``λ_max`` is the
largest eigenvalue of the negative Hessian ``−∇²ℓ``; explicit Euler steps (Langevin) need
``δ < 2 / λ_max``. :func:`max_eigenvalue` estimates ``λ_max`` by power iteration on
Hessian-vector products, never forming the Hessian; where the Hessian is formed anyway (the
mode search), :func:`find_mode` reads it off exactly at the start (``Mode.start_curvature``).

A posterior far narrower than ``q0`` along a coordinate (an unscaled covariate) also defeats
the optimiser, which moves a parameter by about its learning rate per step:
the guides therefore start ``q0`` at the Laplace approximation around the mode that
:func:`find_mode` reaches, and work in the coordinates it whitens
(:mod:`.preconditioning`).

Reference: Leimkuhler & Reich (2004), "Simulating Hamiltonian Dynamics", ch. 2 (stability
of the Störmer-Verlet method).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


def _forward_over_reverse(log_density, z, v):
    return jax.jvp(jax.grad(log_density), (z,), (v,))[1]


def _reverse_over_reverse(log_density, z, v):
    return jax.grad(lambda x: jnp.vdot(jax.grad(log_density)(x), v))(z)


def hvp_fn(log_density: Callable, z: jax.Array, forward: bool = True) -> Callable:
    """``v -> ∇²ℓ(z) v`` for ``z, v`` of shape ``(D,)``: forward-over-reverse, or with
    ``forward=False`` reverse-over-reverse, for a ``ℓ`` that calls a ``jax.custom_vjp``
    function (e.g. ``jax.experimental.ode.odeint``), which has no forward-mode rule: JAX then
    raises a ``TypeError`` naming ``custom_vjp``, possibly only when a loop around the
    product is lowered, so a caller retries the whole program (see :func:`is_custom_vjp_error`)."""
    product = _forward_over_reverse if forward else _reverse_over_reverse
    return lambda v: product(log_density, z, v)


def is_custom_vjp_error(err: Exception) -> bool:
    """Whether ``err`` is JAX's refusal of forward mode through a ``custom_vjp`` function."""
    return isinstance(err, TypeError) and "custom_vjp" in str(err)


def forward_or_reverse(fn: Callable):
    """``fn(True)`` (forward-over-reverse Hessian-vector products), or ``fn(False)``
    (reverse-over-reverse) where the log density calls a ``custom_vjp`` function (ODE and
    implicit solvers), which refuses forward mode."""
    try:
        return fn(True)
    except TypeError as err:
        if not is_custom_vjp_error(err):
            raise
        return fn(False)


def hvp(log_density: Callable, z: jax.Array, v: jax.Array, forward: bool = True) -> jax.Array:
    """``∇²ℓ(z) v`` for ``z, v`` of shape ``(D,)`` (:func:`hvp_fn`)."""
    return hvp_fn(log_density, z, forward)(v)


def _power_iteration(rng_key, matvec, z, num_iters, blocks=False):
    """Rayleigh quotient ``vᵀAv`` of the dominant eigenvector of the symmetric ``A``; with
    ``blocks``, ``A`` is block diagonal over the rows of ``z (B, D)`` and each row is
    normalised apart: one quotient per block, ``(B,)``."""
    axis = -1 if blocks else None
    norm = lambda v: jnp.linalg.norm(v, axis=axis, keepdims=blocks)
    v = jax.random.normal(rng_key, jnp.shape(z), z.dtype)
    v = v / norm(v)

    def body(_, v):
        w = matvec(v)
        n = norm(w)
        return jnp.where(n > 0, w / jnp.where(n > 0, n, 1.0), v)

    v = jax.lax.fori_loop(0, num_iters, body, v)
    return jnp.sum(v * matvec(v), axis=axis)


def max_eigenvalue(
    rng_key,
    log_density: Callable,
    z: jax.Array,
    num_iters: int = 20,
    forward: bool = True,
    blocks: bool = False,
):
    """Largest eigenvalue of the potential's Hessian ``−∇²ℓ(z)``, shape ``()``, at least 0.
    With ``blocks=True``, ``z`` is ``(B, D)`` and ``ℓ`` a sum of terms each of one row of
    ``z`` (a block-diagonal Hessian): the largest eigenvalue of each block, ``(B,)``, from
    one power iteration on all the blocks at once.

    Power iteration finds the eigenvalue ``λ_1`` of largest magnitude. Where it is negative
    (``ℓ`` convex along some direction, e.g. between the modes of a mixture), which does not
    limit the step size, a second power iteration on ``−∇²ℓ − λ_1 I`` finds the largest
    eigenvalue. A lower estimate (power iteration converges from below), error
    ``O((λ_2 / λ_1)^{2i})`` after ``i = num_iters`` steps. Non-finite curvature (``z`` outside
    the model's domain) gives ``inf``.
    """
    key_first, key_shifted = jax.random.split(rng_key)
    shape = jnp.shape(z)
    product = hvp_fn(lambda f: log_density(jnp.reshape(f, shape)), jnp.ravel(z), forward)
    potential_hvp = lambda v: -jnp.reshape(product(jnp.ravel(v)), shape)
    lam = _power_iteration(key_first, potential_hvp, z, num_iters, blocks)
    lam_rows = lam[..., None] if blocks else lam
    shifted = _power_iteration(
        key_shifted, lambda v: potential_hvp(v) - lam_rows * v, z, num_iters, blocks
    )
    lam = jnp.where(lam < 0, shifted + lam, lam)
    return jnp.where(jnp.isfinite(lam), jnp.maximum(lam, 0.0), jnp.inf)


def neg_hessian(
    log_density: Callable, z: jax.Array, batch_size: int = 32, forward: bool = True
) -> jax.Array:
    """The potential's Hessian ``−∇²ℓ(z)``, shape ``(D, D)``: one Hessian-vector product per
    column, ``batch_size`` at a time (the memory of ``batch_size`` gradients, not ``D``);
    symmetric up to round-off."""
    D = jnp.shape(z)[0]
    product = hvp_fn(log_density, z, forward)
    return jax.lax.map(
        lambda e: -product(e), jnp.eye(D, dtype=z.dtype), batch_size=min(batch_size, D)
    )


class Mode(NamedTuple):
    """Result of :func:`find_mode`."""

    z: jax.Array
    """``(D,)`` the point reached."""
    neg_hessian: jax.Array
    """``(D, D)`` the potential's Hessian ``−∇²ℓ`` (of ``curvature_density``) at the last
    point linearised: ``z`` itself, unless the iterations ran out (then one step before)."""
    decrement: jax.Array
    """``()`` the Newton decrement ``gᵀ|H|⁻¹g / 2`` there: the rise (nats) that the local
    quadratic model still predicts; about ``d² / 2`` for a point ``d`` posterior standard
    deviations (in the Hessian's metric) from the mode of a Gaussian."""
    num_iters: jax.Array
    """``()`` iterations taken."""
    rise: jax.Array
    """``()`` ``ℓ(z) − ℓ(z_start)``, the log density gained from the start."""
    start_curvature: jax.Array
    """``()`` the largest eigenvalue of ``−∇²ℓ`` at the start (at least 0; ``inf`` when not
    finite): what power iteration would estimate there, without its error."""
    converged: jax.Array
    """``()`` bool: ``decrement ≤ tol`` at a maximum (no negative curvature of ``ℓ``)."""


#: damping of each candidate step of :func:`find_mode`, relative to the largest curvature
DAMPINGS = (1e-12, 1e-9, 1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4)


def find_mode(
    log_density: Callable,
    z: jax.Array,
    max_iters: int = 500,
    tol: float = 1e-4,
    curvature_density: Callable | None = None,
    forward: bool = True,
) -> Mode:
    """Damped saddle-free Newton ascent from ``z (D,)`` to a mode of ``ℓ``.

    Each iteration forms the Hessian ``H = −∇²ℓ`` (``D`` Hessian-vector products) and tries
    the steps ``s_j = (|H| + μ_j c I)⁻¹ ∇ℓ``, ``c = max(λ_max, ‖∇ℓ‖)``, for all the
    dampings ``μ_j`` of :data:`DAMPINGS` at once (a Levenberg-Marquardt trust region: small
    ``μ`` is Newton's step, large ``μ`` a short gradient step), and takes the least damped
    one whose rise is at least a tenth of what its quadratic model predicts. ``|H|``, the
    Hessian with its eigenvalues replaced by their magnitudes, climbs out of saddles and
    convex regions instead of being drawn to them. Newton's step is invariant to linear
    changes of coordinates, so an uncentred or badly scaled covariate (curvatures spread over many
    orders of magnitude) costs no more iterations than a standardised one, where a
    first-order method crawls along the narrow ridge. It stops when the Newton decrement
    falls to ``tol`` nats, when no step rises, or after ``max_iters`` iterations (most
    posteriors need under 20; a flat-prior regression on collinear predictors, whose flattest
    direction is 10⁸ times flatter than its steepest, a few hundred).

    ``curvature_density``: the Hessians (and the one returned) are of this density instead
    (quasi-Newton: a cheap surrogate of ``ℓ`` with the same curvature); the mode is ``ℓ``'s.
    ``forward``: as for :func:`hvp_fn`.

    References: Nocedal & Wright (2006), "Numerical Optimization", ch. 4 (trust regions);
    Dauphin et al. (2014), "Identifying and attacking the saddle point problem" (``|H|``).

    Matrix products run at full float32 precision (``jax.default_matmul_precision``): an
    accelerator's default (TF32 on recent NVIDIA GPUs, 10-bit mantissas) leaves the Newton
    steps of a badly conditioned problem too inexact to converge.
    """
    with jax.default_matmul_precision("highest"):
        return _find_mode(log_density, z, max_iters, tol, curvature_density, forward)


def _find_mode(log_density, z, max_iters, tol, curvature_density, forward) -> Mode:
    curvature_density = curvature_density or log_density
    dampings = jnp.asarray(DAMPINGS, z.dtype)
    index = jnp.arange(len(DAMPINGS))
    tiny = jnp.finfo(z.dtype).tiny

    def body(carry):  # one linearisation per iteration: the Hessian is compiled once
        i, z, last_hess, stats, (start_curvature, start_value, _), _, back = carry
        z_back, value_back, floor, taken = back
        value, g = jax.value_and_grad(log_density)(z)
        neg_hess = neg_hessian(curvature_density, z, forward=forward)
        eigenvalues, vectors = jnp.linalg.eigh((neg_hess + neg_hess.T) / 2)
        magnitudes = jnp.abs(eigenvalues)
        c = vectors.T @ g
        decrement = 0.5 * jnp.sum(c**2 / (magnitudes + DAMPINGS[0] * jnp.max(magnitudes) + tiny))
        finite = jnp.isfinite(value) & jnp.all(jnp.isfinite(g)) & jnp.all(jnp.isfinite(neg_hess))
        decrement = jnp.where(finite, decrement, jnp.inf)
        # relative to the gradient too: where the likelihood saturates its curvature vanishes
        # and even λ_max-scaled damping would leave a step far too long to rise
        scale = jnp.maximum(jnp.max(magnitudes), jnp.linalg.norm(g))
        a = c[None, :] / (magnitudes[None, :] + dampings[:, None] * scale + tiny)  # (J, D)
        predicted = a @ c - 0.5 * (a**2) @ magnitudes
        steps = a @ vectors.T
        rise = jax.vmap(log_density)(z + steps) - value
        good = jnp.isfinite(rise) & (rise > 0) & (rise >= 0.1 * predicted)
        good = good & jnp.all(jnp.isfinite(steps), axis=-1) & (index >= floor)
        moves = jnp.any(good) & finite & (decrement > tol)
        j = jnp.argmax(good).astype(jnp.int32)
        top = jnp.where(finite, jnp.maximum(eigenvalues[-1], 0.0), jnp.inf)
        start = (jnp.where(i == 0, top, start_curvature), jnp.where(i == 0, value, start_value))
        # a maximum, not a minimum or saddle: no curvature of the wrong sign beyond round-off
        concave = eigenvalues[0] >= -1e-6 * jnp.max(magnitudes)
        # a step can land where ℓ is finite and higher but its derivatives overflow (an
        # exp-link likelihood far out): back to the point it left, and a shorter step from it
        back_off = ~finite & (i > 0)
        retry = back_off & (taken + 1 < len(DAMPINGS))
        z_next = jnp.where(moves, z + steps[j], z)
        value_next = jnp.where(moves, value + rise[j], value)  # ℓ at the new z
        keep = lambda new, old: jnp.where(back_off, old, new)  # noqa: E731
        out = (
            keep(z_next, z_back),
            keep(neg_hess, last_hess),
            jax.tree.map(keep, (decrement, (decrement <= tol) & concave), stats),
            (*start, keep(value_next, value_back)),
            ~(moves | retry),
            jax.tree.map(
                keep, (z, value, jnp.zeros_like(floor), j), (z_back, value_back, taken + 1, taken)
            ),
        )
        return i + 1, *out

    # ℓ is evaluated (and traced) only in the body: the start's and the end point's values are
    # carried (the end point's is the accepted step's rise over the last linearisation's)
    D = jnp.shape(z)[0]
    no, zero, none = jnp.zeros((), bool), jnp.zeros((), z.dtype), jnp.zeros((), jnp.int32)
    init = (none, z, jnp.zeros((D, D), z.dtype))
    init += ((jnp.asarray(jnp.inf, z.dtype), no), (zero, zero, zero), no, (z, zero, none, none))
    i, z, neg_hess, (decrement, converged), values, _, _ = jax.lax.while_loop(
        lambda c: (c[0] < max_iters) & ~c[5], body, init
    )
    start_curvature, start_value, end_value = values
    return Mode(z, neg_hess, decrement, i, end_value - start_value, start_curvature, converged)
