"""Differentiable annealed importance sampling: ``K`` transitions for ``N`` particles.

``lax.scan`` over the transitions, ``vmap`` over the particles (algorithms.md §1). The
same :func:`init` and :func:`step` drive the SMC sampler in :mod:`.smc`, which only adds
resampling between steps.

Reference: Geffner & Domke (2021); Zhang et al. (2021); Zenn & Bamler (2023), DAIS₀.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from numpyro_dais.engine import gaussian, weights
from numpyro_dais.engine.transitions import (
    KERNELS,
    ParticleState,
    Potential,
    StepParams,
    TransitionInfo,
    init_state,
)


class AnnealParams(NamedTuple):
    """Learnable annealing parameters shared by all particles."""

    betas: jax.Array  # (K + 1,) 0 = β_0 < … < β_K = 1
    step_sizes: jax.Array  # (K,)
    mass: jax.Array  # (D,) diagonal mass matrix (ignored by Langevin)
    damping: jax.Array  # () ρ (ignored by Langevin)

    @property
    def K(self) -> int:
        return self.step_sizes.shape[0]


class DAISOutput(NamedTuple):
    z0: jax.Array  # (N, D) initial particles, draws of q0
    z: jax.Array  # (N, D) final particles z_K
    log_weights: jax.Array  # (N,) log w_i (non-finite entries set to -inf)
    log_q0_z0: jax.Array  # (N,) log q0(z_0)
    log_final_target: jax.Array  # (N,) the final term of log w (ℓ(z_K) by default)
    deltas: jax.Array  # (K, N) Δ_k
    log_increments: jax.Array | None  # (K, N) log w̃_k if tracked, else None
    ess: jax.Array  # () effective sample size of the final weights
    num_nonfinite: jax.Array  # () diverged particles (non-finite weight or energy blow-up)


def step_params(params: AnnealParams, k) -> StepParams:
    return StepParams(
        params.betas[k], params.betas[k + 1], params.step_sizes[k], params.mass, params.damping
    )


def init(
    rng_key,
    q0: gaussian.Gaussian,
    potential: Potential,
    params: AnnealParams,
    num_particles: int,
    kernel: str,
    track: bool,
):
    """Draw ``z_0 ~ q0`` and ``v_0 ~ N(0, M)`` for ``N`` particles; returns the batched state."""
    key_z, key_v = jax.random.split(rng_key)
    z0 = gaussian.sample(key_z, q0, (num_particles,))
    if kernel == "hmc":
        v0 = jnp.sqrt(params.mass) * jax.random.normal(key_v, z0.shape)
    else:
        v0 = jnp.zeros_like(z0)
    with_grads = kernel == "langevin"
    return jax.vmap(
        lambda z, v: init_state(
            z, v, potential, with_values=track or with_grads, with_grads=with_grads
        )
    )(z0, v0)


def step(
    rng_key, state: ParticleState, step: StepParams, potential: Potential, kernel: str, track: bool
) -> tuple[ParticleState, TransitionInfo]:
    """Apply transition ``k`` to every particle of a batched state (vmapped kernel)."""
    keys = jax.random.split(rng_key, state.z.shape[0])
    transition = KERNELS[kernel]
    return jax.vmap(lambda key, s: transition(key, s, step, potential, track))(keys, state)


def step_keys(rng_key, K: int):
    """Keys ``(init_key, (K,) transition keys)``; shared by DAIS and SMC so that an SMC run
    that never resamples uses exactly the same random numbers as DAIS."""
    init_key, transitions_key = jax.random.split(rng_key)
    return init_key, jax.random.split(transitions_key, K)


def run(
    rng_key,
    q0: gaussian.Gaussian,
    potential: Potential,
    params: AnnealParams,
    num_particles: int,
    *,
    kernel: str = "hmc",
    track_increments: bool = False,
    log_final_target: Callable | None = None,
) -> DAISOutput:
    """Run ``K`` transitions for ``N = num_particles`` particles.

    ``log w_i = log_final_target(z_K) − log q0(z_0) + Σ_k Δ_k``, where
    ``log_final_target`` defaults to ``potential.log_target`` (SL-DAIS passes the
    mini-batch estimate). ``track_increments=True`` also returns the per-step incremental
    weights ``log w̃_k`` (one extra evaluation of ``ℓ`` per step for HMC), whose sum
    telescopes to ``log w`` when the final target equals the dynamics target.
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}.")
    init_key, keys = step_keys(rng_key, params.K)
    state = init(init_key, q0, potential, params, num_particles, kernel, track_increments)
    z0 = state.z
    log_q0_z0 = jax.vmap(potential.log_q0)(z0)

    def body(state, xs):
        key, k = xs
        state, info = step(key, state, step_params(params, k), potential, kernel, track_increments)
        return state, info

    state, infos = jax.lax.scan(body, state, (keys, jnp.arange(params.K)))
    return finalize(z0, log_q0_z0, state, infos, potential, log_final_target, track_increments)


def finalize(
    z0,
    log_q0_z0,
    state: ParticleState,
    infos: TransitionInfo,
    potential: Potential,
    log_final_target: Callable | None,
    track: bool,
) -> DAISOutput:
    """Assemble :class:`DAISOutput` from the final state and the stacked step infos."""
    if log_final_target is None and track:
        final = state.log_target  # already evaluated at z_K by the last step
    else:
        final = jax.vmap(log_final_target or potential.log_target)(state.z)
    deltas = jnp.sum(infos.delta, axis=0)
    log_w = final - log_q0_z0 + deltas
    # the energy check: ℓ(z_K) − ℓ(z_0) + Σ Δ_k on the dynamics' target (values only)
    dyn_final = final if log_final_target is None else jax.vmap(potential.log_target)(state.z)
    dyn_start = jax.vmap(potential.log_target)(z0)
    bad = weights.diverged(
        dyn_final - dyn_start + deltas, jnp.abs(dyn_start) + jnp.abs(log_q0_z0)
    ) | ~jnp.isfinite(log_w)
    log_w = jnp.where(bad, -jnp.inf, log_w)
    num_nonfinite = jnp.sum(bad)
    return DAISOutput(
        z0=z0,
        z=state.z,
        log_weights=log_w,
        log_q0_z0=log_q0_z0,
        log_final_target=final,
        deltas=infos.delta,
        log_increments=infos.log_increment if track else None,
        ess=weights.ess(log_w),
        num_nonfinite=num_nonfinite,
    )
