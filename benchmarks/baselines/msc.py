"""Markovian score climbing (MSC) with a mean-field Gaussian ``q``: a baseline for the benchmarks.

Naesseth, Lindsten & Blei (2020), "Markovian score climbing: variational inference with
KL(p||q)", Algorithm 1 with the conditional importance sampling (CIS) kernel: each chain
keeps a state ``z``; a step draws ``N − 1`` proposals from ``q``, puts ``z`` beside them,
picks one of the ``N`` by importance weight ``p/q`` as the new state, and takes an Adam
step on ``λ`` along ``(1/C) Σ_c ∇ log q_λ(z_c)`` (``C`` chains). With ``N = 1`` the chains
never move.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

_LOG_2PI = jnp.log(2.0 * jnp.pi)


class MSCResult(NamedTuple):
    loc: jax.Array  # (..., D)
    scale: jax.Array  # (..., D)


def _log_q(loc, log_scale, z, mask):
    lp = -0.5 * ((z - loc) / jnp.exp(log_scale)) ** 2 - log_scale - 0.5 * _LOG_2PI
    return jnp.sum(lp * mask, axis=-1)


def fit(
    rng_key,
    log_target,
    init_loc,
    init_scale,
    *,
    num_particles,
    num_chains,
    num_steps,
    learning_rate,
    num_checkpoints=1,
    mask=None,
):
    """Fit ``q = N(loc, diag(scale²))`` to ``exp(log_target)`` by MSC with a CIS kernel.

    :param log_target: ``z (D,) -> scalar`` unnormalised log density.
    :param mask: optional ``(D,)`` 0/1 vector; coordinates with 0 are left out of ``log q``
        (their parameters never move), so problems of different dimension can be padded
        to one ``D`` and vmapped.
    :return: :class:`MSCResult` with leading axis ``num_checkpoints`` (parameters after
        each equal chunk of steps).
    """
    D = jnp.shape(init_loc)[-1]
    mask = jnp.ones(D) if mask is None else mask
    params = (
        jnp.broadcast_to(init_loc, (D,)) * 1.0,
        jnp.log(jnp.broadcast_to(init_scale, (D,)) * 1.0),
    )
    opt = optax.adam(learning_rate)
    key_init, key_run = jax.random.split(rng_key)
    chains = params[0] + jnp.exp(params[1]) * jax.random.normal(key_init, (num_chains, D))

    def cis(key, z, loc, log_scale):
        props = loc + jnp.exp(log_scale) * jax.random.normal(key, (num_particles - 1, D))
        cand = jnp.concatenate([z[None], props])
        log_w = jax.vmap(log_target)(cand) - _log_q(loc, log_scale, cand, mask)
        log_w = jnp.where(jnp.isfinite(log_w), log_w, -jnp.inf)
        return cand[jax.random.categorical(jax.random.fold_in(key, 1), log_w)]

    def step(carry, key):
        params, opt_state, chains = carry
        chains = jax.vmap(cis, (0, 0, None, None))(
            jax.random.split(key, num_chains), chains, *params
        )

        def loss(p):
            return -jnp.mean(_log_q(p[0], p[1], chains, mask))

        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, chains), None

    def chunk(carry, keys):
        carry, _ = jax.lax.scan(step, carry, keys)
        return carry, carry[0]

    if num_steps % num_checkpoints:
        raise ValueError("num_steps must be a multiple of num_checkpoints")
    keys = jax.random.split(key_run, num_steps).reshape(num_checkpoints, -1, *key_run.shape)
    _, (locs, log_scales) = jax.lax.scan(chunk, (params, opt.init(params), chains), keys)
    return MSCResult(locs, jnp.exp(log_scales))
