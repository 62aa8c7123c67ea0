"""Curvature of a log density, for step sizes that respect the posterior's scale.

Leapfrog with unit mass is stable only for ``η < 2 / sqrt(λ_max)``, where ``λ_max`` is the
largest eigenvalue of the negative Hessian ``−∇²ℓ``; explicit Euler steps (Langevin) need
``δ < 2 / λ_max``. :func:`max_eigenvalue` estimates ``|λ|_max`` by power iteration on
Hessian-vector products (forward-over-reverse), never forming the Hessian.

Reference: Leimkuhler & Reich (2004), "Simulating Hamiltonian Dynamics", ch. 2 (stability
of the Störmer-Verlet method).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp


def hvp(log_density: Callable, z: jax.Array, v: jax.Array) -> jax.Array:
    """``∇²ℓ(z) v`` for ``z, v`` of shape ``(D,)``."""
    return jax.jvp(jax.grad(log_density), (z,), (v,))[1]


def max_eigenvalue(rng_key, log_density: Callable, z: jax.Array, num_iters: int = 20):
    """Largest ``|eigenvalue|`` of ``∇²ℓ(z)`` by ``num_iters`` power iterations, shape ``()``.

    A lower estimate of ``λ_max`` (power iteration converges from below); the iterate that
    has converged after ``i`` steps has error ``O((λ_2 / λ_1)^{2i})``. Non-finite curvature
    (``z`` outside the model's domain) gives ``inf``.
    """
    v = jax.random.normal(rng_key, jnp.shape(z), z.dtype)
    v = v / jnp.linalg.norm(v)

    def body(_, carry):
        v, _ = carry
        w = hvp(log_density, z, v)
        lam = jnp.linalg.norm(w)
        return jnp.where(lam > 0, w / lam, v), lam

    _, lam = jax.lax.fori_loop(0, num_iters, body, (v, jnp.zeros((), z.dtype)))
    return jnp.where(jnp.isfinite(lam), lam, jnp.inf)
