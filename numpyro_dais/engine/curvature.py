"""Curvature of a log density, for step sizes that respect the posterior's scale.

Leapfrog with unit mass is stable only for ``η < 2 / sqrt(λ_max)``, where ``λ_max`` is the
largest eigenvalue of the negative Hessian ``−∇²ℓ``; explicit Euler steps (Langevin) need
``δ < 2 / λ_max``. :func:`max_eigenvalue` estimates ``λ_max`` by power iteration on
Hessian-vector products (forward-over-reverse), never forming the Hessian; where the Hessian
is formed anyway (the Laplace start), :func:`max_eigenvalue_dense` reads it off exactly.

A posterior far narrower than ``q0`` along a coordinate (an unscaled covariate) also defeats
the optimiser, which moves a parameter by about its learning rate per step:
:func:`regularised_covariance` turns the Hessian into a Laplace covariance, the unit in
which ``q0``'s location is optimised, and :func:`newton_mode` starts it at a mode.

Reference: Leimkuhler & Reich (2004), "Simulating Hamiltonian Dynamics", ch. 2 (stability
of the Störmer-Verlet method).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def hvp(log_density: Callable, z: jax.Array, v: jax.Array) -> jax.Array:
    """``∇²ℓ(z) v`` for ``z, v`` of shape ``(D,)``."""
    return jax.jvp(jax.grad(log_density), (z,), (v,))[1]


def _power_iteration(rng_key, matvec, z, num_iters):
    """Rayleigh quotient ``vᵀAv`` of the dominant eigenvector of the symmetric ``A``."""
    v = jax.random.normal(rng_key, jnp.shape(z), z.dtype)
    v = v / jnp.linalg.norm(v)

    def body(_, v):
        w = matvec(v)
        norm = jnp.linalg.norm(w)
        return jnp.where(norm > 0, w / norm, v)

    v = jax.lax.fori_loop(0, num_iters, body, v)
    return jnp.vdot(v, matvec(v))


def max_eigenvalue(rng_key, log_density: Callable, z: jax.Array, num_iters: int = 20):
    """Largest eigenvalue of the potential's Hessian ``−∇²ℓ(z)``, shape ``()``, at least 0.

    Power iteration finds the eigenvalue ``λ_1`` of largest magnitude. Where it is negative
    (``ℓ`` convex along some direction, e.g. between the modes of a mixture), which does not
    limit the step size, a second power iteration on ``−∇²ℓ − λ_1 I`` finds the largest
    eigenvalue. A lower estimate (power iteration converges from below), error
    ``O((λ_2 / λ_1)^{2i})`` after ``i = num_iters`` steps. Non-finite curvature (``z`` outside
    the model's domain) gives ``inf``.
    """
    key_first, key_shifted = jax.random.split(rng_key)
    potential_hvp = lambda v: -hvp(log_density, z, v)
    lam = _power_iteration(key_first, potential_hvp, z, num_iters)
    shifted = _power_iteration(key_shifted, lambda v: potential_hvp(v) - lam * v, z, num_iters)
    lam = jnp.where(lam < 0, shifted + lam, lam)
    return jnp.where(jnp.isfinite(lam), jnp.maximum(lam, 0.0), jnp.inf)


def max_eigenvalue_dense(neg_hess: np.ndarray) -> float:
    """Largest eigenvalue of a formed potential Hessian ``−∇²ℓ`` ``(D, D)``, at least 0,
    ``inf`` when it is not finite: :func:`max_eigenvalue` without its iteration error."""
    h = np.asarray(neg_hess, np.float64)
    if not np.all(np.isfinite(h)):
        return np.inf
    return max(float(np.linalg.eigvalsh((h + h.T) / 2)[-1]), 0.0)


def neg_hessian(log_density: Callable, z: jax.Array, batch_size: int = 32) -> jax.Array:
    """The potential's Hessian ``−∇²ℓ(z)``, shape ``(D, D)``: one Hessian-vector product per
    column, ``batch_size`` at a time (the memory of ``batch_size`` gradients, not ``D``);
    symmetric up to round-off."""
    D = jnp.shape(z)[0]
    return jax.lax.map(
        lambda e: -hvp(log_density, z, e), jnp.eye(D, dtype=z.dtype), batch_size=min(batch_size, D)
    )


def regularised_covariance(neg_hess: np.ndarray, scale: float) -> np.ndarray:
    """``Σ = (H₊ + I / scale²)⁻¹``, shape ``(D, D)``, float64 on the host: the Laplace
    covariance of the posterior at a point with ``−∇²ℓ = H``, its negative eigenvalues
    (``ℓ`` convex there, e.g. between modes) set to 0 and regularised by a Gaussian of
    standard deviation ``scale``; ``scale² I`` where ``H`` is 0, ``H⁻¹`` where it dominates."""
    vectors, precision = _regularised_eigh(np.asarray(neg_hess, np.float64), scale, np)
    return (vectors / precision) @ vectors.T


def _regularised_eigh(neg_hess, scale: float, xp):
    """Eigenvectors ``(D, D)`` and eigenvalues ``(D,)`` of the regularised precision
    ``H₊ + I / scale²``, with ``xp`` = NumPy (host, float64) or ``jax.numpy`` (traced)."""
    eigenvalues, vectors = xp.linalg.eigh((neg_hess + neg_hess.T) / 2)
    return vectors, xp.maximum(eigenvalues, 0.0) + 1.0 / scale**2


def newton_mode(
    log_density: Callable,
    z: jax.Array,
    scale: float,
    max_iters: int = 20,
    max_halvings: int = 10,
    tol: float = 1e-2,
    curvature_density: Callable | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Regularised Newton ascent from ``z`` (D,) towards a mode of ``ℓ``: ``(z*, −∇²ℓ(z*))``,
    shapes ``(D,)`` and ``(D, D)``.

    Each iteration forms the Hessian at the current point, takes the step ``t·Σ∇ℓ`` with
    ``Σ = (H₊ + I / scale²)⁻¹`` (:func:`regularised_covariance`: a Levenberg-Marquardt
    damping that also bounds the step where ``ℓ`` is flat or convex) and the largest
    ``t ∈ {1, 1/2, …, 2^-max_halvings}`` that raises ``ℓ``. It stops when the Newton
    decrement ``∇ℓᵀΣ∇ℓ / 2`` (the rise the quadratic model predicts) is below ``tol`` nats,
    when no step raises ``ℓ`` (or ``ℓ`` or the step is not finite), or after
    ``max_iters`` iterations. One step is not enough far from the mode: where a logistic
    likelihood saturates, the Hessian there is far smaller than at the mode.

    ``curvature_density``: the Hessians (and the one returned) are of this density instead
    (quasi-Newton: e.g. a cheap surrogate of ``ℓ`` with the same curvature); the mode is
    ``ℓ``'s either way.
    """

    def solve(neg_hess, g):  # Σ∇ℓ, Σ as in regularised_covariance
        vectors, precision = _regularised_eigh(neg_hess, scale, jnp)
        return vectors @ ((vectors.T @ g) / precision)

    def linearise(z):
        value, g = jax.value_and_grad(log_density)(z)
        neg_hess = neg_hessian(curvature_density or log_density, z)
        step = solve(neg_hess, g)
        return value, neg_hess, step, 0.5 * jnp.vdot(g, step)

    ts = 0.5 ** jnp.arange(max_halvings + 1, dtype=z.dtype)

    def body(carry):  # one linearisation per iteration, so the Hessian is compiled once
        i, z, _, _ = carry
        value, neg_hess, step, decrement = linearise(z)
        candidates = z + ts[:, None] * step
        values = jax.vmap(log_density)(candidates)
        better = jnp.isfinite(values) & (values > value) & jnp.all(jnp.isfinite(step))
        moves = jnp.any(better) & (decrement > tol)
        z = jnp.where(moves, candidates[jnp.argmax(better)], z)
        return i + 1, z, neg_hess, ~moves

    D = jnp.shape(z)[0]
    carry = (0, z, jnp.zeros((D, D), z.dtype), jnp.zeros((), bool))
    # the Hessian returned is at the last point linearised: the end point unless the
    # iterations ran out (then one step before it)
    _, z, neg_hess, _ = jax.lax.while_loop(lambda c: (c[0] < max_iters) & ~c[3], body, carry)
    return z, neg_hess
