"""One annealing transition for one particle: uncorrected HMC or overdamped Langevin.

Each kernel maps ``(noise, state, step) -> (state, info)``, ``noise`` a standard normal draw
of the position's shape (drawn by the caller, for all transitions at once), where
``info.delta`` is the log-density ratio of the auxiliary move (``Δ_k``) and
``info.log_increment`` is the incremental weight ``log w̃_k`` (0 unless tracked).
Kernels act on a single particle; callers ``vmap`` them over the particle axis.

References: Geffner & Domke (2021), "MCMC variational inference via uncorrected
Hamiltonian annealing"; Zenn & Bamler (2024), App. C.2, for the Langevin kernel.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from numpyro_dais.engine.annealing.path import log_gamma
from numpyro_dais.engine.base import Kernel, ParticleState, Potential, StepParams, TransitionInfo
from numpyro_dais.engine.validation import check_choice


def _value_and_grad(potential: Potential, z):
    log_q0, grad_q0 = jax.value_and_grad(potential.log_q0)(z)
    log_t, grad_t = jax.value_and_grad(potential.log_target)(z)
    return log_q0, log_t, grad_q0, grad_t


def init_state(z, v, potential: Potential, with_values: bool, with_grads: bool):
    """State at ``z_0``; evaluates ``log q0``/``ℓ`` (and gradients) only when asked."""
    zero, zeros = jnp.zeros(()), jnp.zeros_like(z)
    if with_grads:
        log_q0, log_t, grad_q0, grad_t = _value_and_grad(potential, z)
        return ParticleState(z, v, log_q0, log_t, grad_q0, grad_t)
    if with_values:
        return ParticleState(z, v, potential.log_q0(z), potential.log_target(z), zeros, zeros)
    return ParticleState(z, v, zero, zero, zeros, zeros)


def leapfrog(z, v, grad_log_gamma: Callable, step_size, mass, has_aux=False):
    """Drift–kick–drift with ``M = diag(mass)``: a volume-preserving map ``(z, v) -> (z', v̂)``.

    ``has_aux``: ``grad_log_gamma`` returns ``(gradient, aux)`` and the map returns
    ``(z', v̂, aux)``."""
    z_half = z + 0.5 * step_size * v / mass
    grad, aux = grad_log_gamma(z_half) if has_aux else (grad_log_gamma(z_half), None)
    v_hat = v + step_size * grad
    z_new = z_half + 0.5 * step_size * v_hat / mass
    return (z_new, v_hat, aux) if has_aux else (z_new, v_hat)


def kinetic_log_density(v, mass):
    """``log N(v; 0, diag(mass))`` up to the constant shared by every momentum."""
    return -0.5 * jnp.sum(v**2 / mass)


def hmc(noise, state: ParticleState, step: StepParams, potential: Potential, track: bool):
    """Uncorrected HMC step: leapfrog at ``γ_k``, then partial momentum refresh.

    ``Δ_k = log N(v̂_k; 0, M) − log N(v_{k-1}; 0, M)``; the refresh
    ``v_k = γ v̂_k + sqrt(1 − γ²) ξ``, ``ξ ~ N(0, M)``, leaves ``N(0, M)`` invariant.
    """

    def grad_log_gamma(z):
        g_q0 = jax.grad(potential.log_q0)(z)
        ell, g_t = jax.value_and_grad(potential.log_target)(z)
        return (1.0 - step.beta) * g_q0 + step.beta * g_t, ell

    z, v_hat, ell_mid = leapfrog(
        state.z, state.v, grad_log_gamma, step.step_size, step.mass, has_aux=True
    )
    delta = kinetic_log_density(v_hat, step.mass) - kinetic_log_density(state.v, step.mass)
    xi = jnp.sqrt(step.mass) * noise
    v = step.gamma * v_hat + jnp.sqrt(1.0 - step.gamma**2) * xi
    new = init_state(z, v, potential, with_values=track, with_grads=False)
    log_inc = _increment(state, new, step, delta) if track else jnp.zeros(())
    return new, TransitionInfo(delta, log_inc, ell_mid)


def langevin(noise, state: ParticleState, step: StepParams, potential: Potential, track: bool):
    """Unadjusted (overdamped) Langevin step at ``γ_k`` with its reverse-kernel ratio.

    ``z_k = z + δ ∇log γ_k(z) + sqrt(2δ) ξ`` and
    ``Δ_k = log N(z; z_k + δ ∇log γ_k(z_k), 2δ) − log N(z_k; z + δ ∇log γ_k(z), 2δ)``.
    """
    delta_t, beta = step.step_size, step.beta
    drift_prev = (1.0 - beta) * state.grad_log_q0 + beta * state.grad_log_target
    mean_fwd = state.z + delta_t * drift_prev
    z = mean_fwd + jnp.sqrt(2.0 * delta_t) * noise
    new = init_state(z, state.v, potential, with_values=True, with_grads=True)
    drift_new = (1.0 - beta) * new.grad_log_q0 + beta * new.grad_log_target
    mean_bwd = z + delta_t * drift_new
    log_bwd = -jnp.sum((state.z - mean_bwd) ** 2) / (4.0 * delta_t)
    log_fwd = -jnp.sum((z - mean_fwd) ** 2) / (4.0 * delta_t)
    delta = log_bwd - log_fwd
    log_inc = _increment(state, new, step, delta) if track else jnp.zeros(())
    return new, TransitionInfo(delta, log_inc, new.log_target)


def _increment(old: ParticleState, new: ParticleState, step: StepParams, delta):
    """``log w̃_k = log γ_k(z_k) − log γ_{k-1}(z_{k-1}) + Δ_k``."""
    return (
        log_gamma(step.beta, new.log_q0, new.log_target)
        - log_gamma(step.beta_prev, old.log_q0, old.log_target)
        + delta
    )


KERNELS = {
    "hmc": Kernel(hmc, momentum=True, exact_energy=False),
    "langevin": Kernel(langevin, momentum=False, exact_energy=True),
}


def check_kernel(kernel: "str | Kernel"):
    """Raise ``ValueError`` naming ``kernel`` unless it is a :class:`Kernel` or one of
    :data:`KERNELS`."""
    if not isinstance(kernel, Kernel):
        check_choice("kernel", kernel, KERNELS)


def as_kernel(kernel: "str | Kernel") -> Kernel:
    """The :class:`Kernel` named by ``kernel`` (a name of :data:`KERNELS`), checked; a
    :class:`Kernel` as it is. Resolve names once, where a configuration is built."""
    check_kernel(kernel)
    return kernel if isinstance(kernel, Kernel) else KERNELS[kernel]
