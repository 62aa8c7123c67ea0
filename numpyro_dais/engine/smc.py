"""Differentiable SMC sampler (DSMCS): DAIS transitions with resampling between them.

One particle system of ``N`` particles (algorithms.md §4)::

    log W̄ = −log N;  L = 0
    for k = 1..K:
        if k ≥ 2 and decide(W̄): resample (z, v) by W̄;  log W̄ = −log N
        move with transition k;  s = logsumexp(log W̄ + log w̃_k);  L += s
        log W̄ = log W̄ + log w̃_k − s

``E[L] ≤ log Z``. The transitions, their keys and ``log w̃_k`` come from :mod:`.dais`, so a
run that never resamples moves the particles with exactly DAIS's random numbers and its
``L`` equals DAIS's ``log (1/N) Σ_i w_i``. Resampling draws from its own key stream.

Reference: Zenn & Bamler (2023), "Resampling gradients vanish in differentiable sequential
Monte Carlo samplers"; Del Moral, Doucet & Jasra (2006).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from numpyro_dais.engine import dais, gaussian, resampling, weights
from numpyro_dais.engine.annealing import log_gamma
from numpyro_dais.engine.transitions import KERNELS, ParticleState, Potential

#: folded into the run's key to derive the resampling key stream (disjoint from DAIS's)
_RESAMPLING_STREAM = 0x5EED5


class SMCOutput(NamedTuple):
    z0: jax.Array  # (N, D) initial particles, draws of q0
    z: jax.Array  # (N, D) final particles z_K
    log_weights: jax.Array  # (N,) final weights as L + log N + log W̄_K: log-mean-exp = L
    log_final_target: jax.Array  # (N,) ℓ(z_K)
    log_Z: jax.Array  # () L, the SMC estimate of log Z (E[L] ≤ log Z)
    ess: jax.Array  # (K,) ESS of W̄ after transition k (before any later resampling)
    resampled: jax.Array  # (K,) bool: resampled just before transition k (never for k = 1)
    ancestors: jax.Array  # (K, N) int32 ancestor of each slot before transition k
    log_increments: jax.Array  # (K, N) log w̃_k (non-finite entries set to -inf)
    num_nonfinite: jax.Array  # () most particles with a non-finite increment in one step


def resampling_keys(rng_key, K: int) -> jax.Array:
    """``(K, 2)`` keys ``(decide, ancestors)`` per transition, independent of DAIS's keys."""
    keys = jax.random.split(jax.random.fold_in(rng_key, _RESAMPLING_STREAM), 2 * K)
    return keys.reshape((K, 2) + keys.shape[1:])


def _resample(
    keys, state: ParticleState, log_W, k, scheme, rule, threshold, gradient, temperature, gap
):
    """Maybe resample before transition ``k`` (0-based); returns ``(state, log_W, a, flag)``."""
    N = log_W.shape[0]
    key_decide, key_ancestors = keys
    flag = (k > 0) & resampling.RULES[rule](key_decide, log_W, threshold)
    ancestors = resampling.SCHEMES[scheme](key_ancestors, log_W)
    uniform = jnp.full_like(log_W, -jnp.log(N))
    if gradient == "gst":
        taken = resampling.straight_through_take(state, ancestors, log_W, temperature, gap)
    else:
        taken = jax.tree.map(lambda x: x[ancestors], state)
    new_state = jax.tree.map(lambda a, b: jnp.where(flag, a, b), taken, state)
    new_log_W = jnp.where(flag, uniform, log_W)
    if gradient == "gst" and rule == "bernoulli":
        # the decision is a 2-way categorical too: straight-through on (resample, keep)
        p = jnp.clip(resampling.bernoulli_probability(log_W), 1e-6, 1.0 - 1e-6)
        b = resampling.gst_one_hot(
            jnp.where(flag, 0, 1), jnp.log(jnp.stack([p, 1.0 - p])), temperature, gap
        )[0]
        ds = b - jax.lax.stop_gradient(b)

        def mix(new, a, old):
            safe = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
            return new + ds * (safe(a) - safe(old))

        new_state = jax.tree.map(mix, new_state, taken, state)
        new_log_W = mix(new_log_W, uniform, log_W)
    identity = jnp.arange(N, dtype=jnp.int32)
    return new_state, new_log_W, jnp.where(flag, ancestors, identity), flag


def run(
    rng_key,
    q0: gaussian.Gaussian,
    potential: Potential,
    params: dais.AnnealParams,
    num_particles: int,
    *,
    kernel: str = "hmc",
    resampling_scheme: str = "multinomial",
    resample_when: str = "bernoulli",
    ess_threshold: float = 0.5,
    resampling_gradient: str = "stop",
    gst_temperature: float = 0.1,
    gst_gap: float = 1.0,
) -> SMCOutput:
    """Run ``K`` transitions for one system of ``N = num_particles`` particles.

    :param resampling_scheme: ``"multinomial"``, ``"systematic"`` or ``"stratified"``.
    :param resample_when: ``"always"``, ``"ess"`` (ESS < ``ess_threshold`` · N),
        ``"bernoulli"`` (with probability ``1 − (ESS − 1)/(N − 1)``) or ``"never"``.
    :param resampling_gradient: ``"stop"`` (default: ancestor choice carries no gradient)
        or ``"gst"`` (gapped straight-through, Fan et al. 2022, with ``gst_temperature``
        and ``gst_gap``; for ``"bernoulli"`` the decision gets a straight-through term too).
    """
    if kernel not in KERNELS:
        raise ValueError(f"`kernel` must be one of {sorted(KERNELS)}, got {kernel!r}.")
    resampling.check_options(
        resampling_scheme,
        resample_when,
        ess_threshold,
        resampling_gradient,
        gst_temperature,
        gst_gap,
    )
    K, N = params.K, num_particles
    init_key, move_keys = dais.step_keys(rng_key, K)
    state = dais.init(init_key, q0, potential, params, N, kernel, True)
    z0 = state.z
    log_W = jnp.full((N,), -jnp.log(N), z0.dtype)

    def body(carry, xs):
        state, log_W, log_Z = carry
        move_key, res_keys, k = xs
        if resample_when == "never":
            ancestors, flag = jnp.arange(N, dtype=jnp.int32), jnp.zeros((), bool)
        else:
            state, log_W, ancestors, flag = _resample(
                res_keys,
                state,
                log_W,
                k,
                resampling_scheme,
                resample_when,
                ess_threshold,
                resampling_gradient,
                gst_temperature,
                gst_gap,
            )
        step = dais.step_params(params, k)
        new, info = dais.step(move_key, state, step, potential, kernel, True)
        # energy error of the move at γ_k (the tracked values make it free)
        energy = (
            log_gamma(step.beta, new.log_q0, new.log_target)
            - log_gamma(step.beta, state.log_q0, state.log_target)
            + info.delta
        )
        bad = weights.diverged(energy, jnp.abs(state.log_target) + jnp.abs(state.log_q0))
        state = new
        log_inc, num_bad = weights.mask_nonfinite(jnp.where(bad, jnp.nan, info.log_increment))
        s = logsumexp(log_W + log_inc)
        log_W = log_W + log_inc - s
        return (state, log_W, log_Z + s), (weights.ess(log_W), flag, ancestors, log_inc, num_bad)

    xs = (move_keys, resampling_keys(rng_key, K), jnp.arange(K))
    (state, log_W, log_Z), (ess, flags, ancestors, log_incs, num_bad) = jax.lax.scan(
        body, (state, log_W, jnp.zeros((), z0.dtype)), xs
    )
    return SMCOutput(
        z0=z0,
        z=state.z,
        log_weights=log_Z + jnp.log(N) + log_W,
        log_final_target=state.log_target,
        log_Z=log_Z,
        ess=ess,
        resampled=flags,
        ancestors=ancestors,
        log_increments=log_incs,
        num_nonfinite=jnp.max(num_bad),
    )
