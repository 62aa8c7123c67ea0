"""Differentiable SMC sampler (DSMCS): DAIS transitions with resampling between them.

One particle system of ``N`` particles::

    log W̄ = −log N;  L = 0
    for k = 1..K:
        if k ≥ 2 and decide(W̄): resample (z, v) by W̄;  log W̄ = −log N
        move with transition k;  s = logsumexp(log W̄ + log w̃_k);  L += s
        log W̄ = log W̄ + log w̃_k − s

``E[L] ≤ log Z``. The transitions, their keys and ``log w̃_k`` come from :mod:`..annealing.dais`, so
a run that never resamples moves the particles with exactly DAIS's random numbers and its ``L``
equals DAIS's ``log (1/N) Σ_i w_i``. Resampling draws from its own key stream. When the
:class:`~numpyro_dais.engine.base.Target` has its own final term (SL-DAIS), the last increment uses
it in place of the dynamics' target at ``z_K``.

Reference: Zenn & Bamler (2023), "Resampling gradients vanish in differentiable sequential
Monte Carlo samplers"; Del Moral, Doucet & Jasra (2006).
"""

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from numpyro_dais.engine.annealing import dais, gaussian, weights
from numpyro_dais.engine.annealing.path import log_gamma
from numpyro_dais.engine.annealing.transitions import as_kernel
from numpyro_dais.engine.base import Kernel, ParticleState, ResamplingConfig
from numpyro_dais.engine.smc import resampling


def resampling_keys(rng_key, K: int) -> jax.Array:
    """``(K, 2)`` keys ``(decide, ancestors)`` per transition, from the run's resampling key
    (:func:`..annealing.dais.run_keys`)."""
    keys = jax.random.split(rng_key, 2 * K)
    return keys.reshape((K, 2) + keys.shape[1:])


def _resample(keys, state: ParticleState, log_W, k, config: ResamplingConfig):
    """Maybe resample before transition ``k`` (0-based); returns ``(state, log_W, a, flag)``."""
    N = log_W.shape[0]
    key_decide, key_ancestors = keys
    gradient, temperature, gap = config.gradient, config.gst_temperature, config.gst_gap
    flag = (k > 0) & config.when(key_decide, log_W, config.ess_threshold)
    ancestors = config.scheme(key_ancestors, log_W)
    uniform = jnp.full_like(log_W, -jnp.log(N))
    if gradient == "gst":
        taken = resampling.straight_through_take(state, ancestors, log_W, temperature, gap)
    else:
        taken = jax.tree.map(lambda x: x[ancestors], state)
    new_state = jax.tree.map(lambda a, b: jnp.where(flag, a, b), taken, state)
    new_log_W = jnp.where(flag, uniform, log_W)
    if gradient == "gst" and config.when is resampling.bernoulli:
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
    target: dais.Target,
    params: dais.AnnealParams,
    num_particles: int,
    *,
    kernel: "str | Kernel" = "hmc",
    resampling_config: ResamplingConfig | None = None,
) -> dais.SamplerOutput:
    """Run ``K`` transitions for one system of ``N = num_particles`` particles.

    A move whose energy error on ``γ_k`` is far beyond a stable integrator's
    (:func:`..annealing.weights.diverged`) or whose increment is not finite gives that particle
    weight 0 (it is resampled away); ``num_diverged`` is the most such particles in one step.
    ``resampling_config``: a :class:`ResamplingConfig`; ``None``: the defaults.
    """
    kernel = as_kernel(kernel)
    resampling_config = resampling.resolve(resampling_config or ResamplingConfig())
    K, N = params.K, num_particles
    pot = dais.potential(q0, target)
    noise_key, resampling_key = dais.run_keys(rng_key)
    noise = dais.draw_noise(noise_key, K, N, q0.loc.shape[-1])
    state = dais.init(noise, q0, pot, params, kernel, True)
    z0 = state.z
    log_W = jnp.full((N,), -jnp.log(N), z0.dtype)
    final = target.log_final

    def body(carry, xs):
        state, log_W, log_Z = carry
        move_noise, res_keys, k = xs
        if resampling_config.when is resampling.never:
            ancestors, flag = jnp.arange(N, dtype=jnp.int32), jnp.zeros((), bool)
        else:
            state, log_W, ancestors, flag = _resample(res_keys, state, log_W, k, resampling_config)
        step = dais.step_params(params, k)
        new, info = dais.move(move_noise, state, step, pot, kernel, True)
        # energy error of the move at γ_k (the tracked values make it free)
        energy = (
            log_gamma(step.beta, new.log_q0, new.log_target)
            - log_gamma(step.beta, state.log_q0, state.log_target)
            + info.delta
        )
        bad = weights.diverged(energy, jnp.abs(state.log_target) + jnp.abs(state.log_q0))
        log_inc, num_bad = weights.mask_nonfinite(jnp.where(bad, jnp.nan, info.log_increment))
        s = logsumexp(log_W + log_inc)
        log_W = log_W + log_inc - s
        out = (weights.ess(log_W), flag, ancestors, log_inc, num_bad)
        return (new, log_W, log_Z + s), out

    xs = (noise.moves, resampling_keys(resampling_key, K), jnp.arange(K))
    (state, log_W, log_Z), (ess, flags, ancestors, log_incs, num_bad) = jax.lax.scan(
        body, (state, log_W, jnp.zeros((), z0.dtype)), xs
    )
    if final is None:
        log_final_target = state.log_target
    else:
        # the last increment ends on the final target instead of ℓ̃:
        # log W̄_{K−1} + log w̃_K' = log W̄_K + s_K + (final − ℓ̃)(z_K)
        log_final_target = dais.over_particles(final)(state.z)
        swap, _ = weights.mask_nonfinite(log_W + log_final_target - state.log_target)
        s = logsumexp(swap)
        log_Z, log_W = log_Z + s, swap - s
        log_incs = log_incs.at[-1].add(log_final_target - state.log_target)
        ess = ess.at[-1].set(weights.ess(log_W))
    return dais.SamplerOutput(
        z0=z0,
        z=state.z,
        log_weights=log_Z + jnp.log(N) + log_W,
        log_final_target=log_final_target,
        log_Z=log_Z,
        ess=ess[-1],
        num_diverged=jnp.max(num_bad),
        trace=dais.Trace(ess, flags, ancestors, log_incs),
    )


def founders(ancestors: jax.Array) -> jax.Array:
    """``(N,)`` index of the initial particle each final particle descends from, given the
    ``(K, N)`` ancestors of a run (``trace.ancestors``; identity where it did not resample)."""
    N = ancestors.shape[-1]
    back = lambda f, a: (a[f], None)
    f, _ = jax.lax.scan(back, jnp.arange(N, dtype=ancestors.dtype), ancestors, reverse=True)
    return f


def log_Z_se(out: dais.SamplerOutput) -> jax.Array:
    """``()`` standard error of ``out.log_Z`` from one run, through its genealogy: the
    variance estimate of Lee & Whiteley (2018) (:func:`..annealing.weights.log_mean_exp_se`). A run
    without a trace (DAIS) is the i.i.d. case."""
    if out.trace is None:
        return weights.log_mean_exp_se(out.log_weights)
    return weights.log_mean_exp_se(
        out.log_weights, founders(out.trace.ancestors), jnp.sum(out.trace.resampled)
    )
