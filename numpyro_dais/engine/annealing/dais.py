"""Differentiable annealed importance sampling: ``K`` transitions for ``N`` particles.

``lax.scan`` over the transitions, ``vmap`` over the particles (:func:`over_particles`). The same
:func:`init` and :func:`step` drive the SMC sampler in :mod:`~numpyro_dais.engine.smc.smc`, which
only adds resampling between steps; both samplers take a :class:`Target` and return a
:class:`SamplerOutput`, so a guide composes any target (full data, surrogate, mini-batch) with
either sampler.

References: Geffner & Domke (2021), "MCMC variational inference via uncorrected Hamiltonian
annealing"; Zhang et al. (2021), "Differentiable annealed importance sampling and the perils
of gradient noise"; Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling" (dynamics and final weight on different targets).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from numpyro_dais.engine.annealing import gaussian, weights
from numpyro_dais.engine.annealing.transitions import as_kernel, init_state
from numpyro_dais.engine.base import (
    AnnealParams,
    Kernel,
    ParticleState,
    Potential,
    SamplerOutput,
    StepParams,
    Target,
    Trace,
    TransitionInfo,
)


def over_particles(fn):
    """``jax.vmap(fn)`` over the leading (particle) axis of every argument, except that an
    axis of one particle runs ``fn`` unbatched (and puts the axis back on its outputs).

    A batched model can cost more than the same model on one point: under ``vmap`` a
    ``while`` loop runs a ``select`` over every carry each iteration, and the gradient of
    ``jax.experimental.ode.odeint`` (a ``custom_vjp`` adjoint solve) does not vectorise at
    all. With one particle (``num_particles=1``, the default) nothing is gained by the batch
    axis, so the program holds the unbatched model."""
    batched = jax.vmap(fn)

    def call(*args):
        if any(jnp.shape(x)[:1] != (1,) for x in jax.tree.leaves(args)):
            return batched(*args)
        out = fn(*jax.tree.map(lambda x: x[0], args))
        return jax.tree.map(lambda x: jnp.expand_dims(x, 0), out)

    return call


def omit_final(z):
    """A final term of 0: the weight leaves ``ℓ(z_K)`` to the caller (e.g. the model's own
    term of an ELBO)."""
    return jnp.zeros((), z.dtype)


def step_params(params: AnnealParams, k) -> StepParams:
    return StepParams(
        params.betas[k], params.betas[k + 1], params.step_sizes[k], params.mass, params.gamma
    )


def potential(q0: gaussian.Gaussian, target: Target) -> Potential:
    """The two ends of the annealing path: ``log q0`` and the dynamics' target."""
    return Potential(lambda z: gaussian.log_prob(q0, z), target.log_dynamics)


class Noise(NamedTuple):
    """The standard normal draws of one run of ``N`` particles in ``D`` dimensions."""

    z0: jax.Array  # (N, D) for z_0 = loc + L ε
    v0: jax.Array  # (N, D) for v_0 = sqrt(M) ε (HMC)
    moves: jax.Array  # (K, N, D) for the transitions, row k for transition k


def run_keys(rng_key):
    """``(noise_key, resampling_key)``: a run's two streams, split from its key. DAIS draws
    its :class:`Noise` from the first; SMC also resamples with the second, so an SMC run that
    never resamples uses exactly DAIS's random numbers."""
    noise_key, resampling_key = jax.random.split(rng_key)
    return noise_key, resampling_key


def draw_noise(rng_key, K: int, num_particles: int, dim: int) -> Noise:
    """All of a run's standard normal draws from one key, in one call.

    One call, not one per use: each call of a generator (a split too) adds a few hundred
    operations to the program that XLA compiles, and the transitions' scan then holds none."""
    eps = jax.random.normal(rng_key, (K + 2, num_particles, dim))
    return Noise(eps[0], eps[1], eps[2:])


def init(
    noise: Noise,
    q0: gaussian.Gaussian,
    potential: Potential,
    params: AnnealParams,
    kernel: Kernel,
    track: bool,
):
    """``z_0 ~ q0`` and ``v_0 ~ N(0, M)`` from ``noise`` for its ``N`` particles; returns the
    batched state."""
    z0 = gaussian.reparameterize(q0, noise.z0)
    if kernel.momentum:
        v0 = jnp.sqrt(params.mass) * noise.v0
    else:
        v0 = jnp.zeros_like(z0)
    with_grads = kernel.exact_energy
    return over_particles(
        lambda z, v: init_state(
            z, v, potential, with_values=track or with_grads, with_grads=with_grads
        )
    )(z0, v0)


def move(
    noise, state: ParticleState, step: StepParams, potential: Potential, kernel: Kernel, track: bool
) -> tuple[ParticleState, TransitionInfo]:
    """Apply transition ``k`` to every particle of a batched state (vmapped kernel), with
    ``noise (N, D)`` standard normal draws."""
    move_one = kernel.transition
    return over_particles(lambda xi, s: move_one(xi, s, step, potential, track))(noise, state)


def step(
    rng_key,
    state: ParticleState,
    step: StepParams,
    potential: Potential,
    kernel: Kernel,
    track: bool,
) -> tuple[ParticleState, TransitionInfo]:
    """:func:`move` with standard normal noise drawn from ``rng_key``."""
    return move(jax.random.normal(rng_key, state.z.shape), state, step, potential, kernel, track)


def run(
    rng_key,
    q0: gaussian.Gaussian,
    target: Target,
    params: AnnealParams,
    num_particles: int,
    *,
    kernel: "str | Kernel" = "hmc",
    track_increments: bool = False,
) -> SamplerOutput:
    """Run ``K`` transitions for ``N = num_particles`` particles.

    ``log w_i = log_final(z_K) − log q0(z_0) + Σ_k Δ_k``. A particle whose weight is not
    finite, or whose energy on the dynamics' target fell far beyond a stable integrator's
    error (:func:`.weights.diverged`), gets weight 0. ``track_increments=True`` also records
    the incremental weights ``log w̃_k`` (one extra evaluation of ``ℓ`` per step for HMC),
    whose sum telescopes to ``log w`` when the final target is the dynamics' target.
    ``kernel``: a :class:`~.transitions.Kernel` or its name in ``transitions.KERNELS``.
    """
    kernel = as_kernel(kernel)
    pot = potential(q0, target)
    noise_key, _ = run_keys(rng_key)
    noise = draw_noise(noise_key, params.K, num_particles, q0.loc.shape[-1])
    state = init(noise, q0, pot, params, kernel, track_increments)
    z0 = state.z
    log_q0_z0 = over_particles(pot.log_q0)(z0)

    def body(state, xs):
        noise, k = xs
        return move(noise, state, step_params(params, k), pot, kernel, track_increments)

    ell_0 = state.log_target  # ℓ(z_0) where the kernel evaluated it (Langevin, tracking)
    state, infos = jax.lax.scan(body, state, (noise.moves, jnp.arange(params.K)))

    # the states carry ℓ(z_k) when Langevin or tracking; HMC evaluates it at the midpoints
    exact = kernel.exact_energy or track_increments
    if target.log_final is None and exact:
        final = state.log_target  # already evaluated at z_K by the last step
    else:
        final = over_particles(target.log_final or target.log_dynamics)(state.z)
    deltas = jnp.sum(infos.delta, axis=0)
    log_w = final - log_q0_z0 + deltas
    # The energy check on the dynamics' target, ℓ̃(end) − ℓ̃(start) + Σ Δ_k, from values the
    # transitions computed with their gradients; for HMC between the first and the last
    # leapfrog midpoint, which differs from z_0 → z_K by O(η ∇ℓ·v), far inside the limit.
    if exact:
        start, end = ell_0, state.log_target
    else:
        start, end = infos.log_target_eval[0], infos.log_target_eval[-1]
    energy = jax.lax.stop_gradient(end - start + deltas)
    scale = jax.lax.stop_gradient(jnp.abs(start) + jnp.abs(log_q0_z0))
    bad = weights.diverged(energy, scale) | ~jnp.isfinite(log_w)
    log_w = jnp.where(bad, -jnp.inf, log_w)
    trace = None
    if track_increments:
        N = num_particles
        trace = Trace(
            ess=jax.vmap(weights.ess)(jnp.cumsum(infos.log_increment, axis=0)),
            resampled=jnp.zeros(params.K, bool),
            ancestors=jnp.tile(jnp.arange(N, dtype=jnp.int32), (params.K, 1)),
            log_increments=infos.log_increment,
        )
    return SamplerOutput(
        z0=z0,
        z=state.z,
        log_weights=log_w,
        log_final_target=final,
        log_Z=weights.log_mean_exp(log_w),
        ess=weights.ess(log_w),
        num_diverged=jnp.sum(bad),
        trace=trace,
    )
