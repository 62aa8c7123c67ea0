"""Metropolis-adjusted Langevin chains: a posterior check of a Gaussian ``q0`` that does not
trust the learnt transitions.

The annealed end points of a trained guide stay near ``q0`` by construction (``K`` short,
uncorrected steps), so they can agree with a ``q0`` that is too narrow for the posterior.
Chains of MALA started at ``q0`` draws, in the coordinates where ``q0`` is ``N(0, I)``,
leave the posterior exactly invariant; where the posterior is wider than ``q0``, their
spread grows past ``q0``'s within a few tens of steps.

Reference: Roberts & Tweedie (1996), "Exponential convergence of Langevin distributions and
their discrete approximations"; Roberts & Rosenthal (1998), step size ``∝ D^{-1/6}``.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.engine.mcmc.mala import default_step_size, masked_std, run_chain


class RelaxationCheck(NamedTuple):
    """``q0`` against the chains started at its draws, per coordinate of ``z``."""

    std_ratio: jax.Array
    """``(D,)`` chains' std over ``q0``'s marginal std (above 1: the posterior is wider)."""
    acceptance: jax.Array
    """``()`` the fraction of accepted proposals over all chains and steps."""
    finite_fraction: jax.Array
    """``()`` the fraction of chains whose log density stayed finite (the stds are theirs)."""


def relaxation_check(
    rng_key, q0: gaussian.Gaussian, log_target: Callable, num_chains: int, num_steps: int
) -> RelaxationCheck:
    """Run ``num_chains`` MALA chains of ``num_steps`` on ``log_target`` (``z (D,) -> ℓ(z)``)
    from draws of ``q0``, in ``q0``'s standard coordinates ``x`` (``z = loc + L x``), and
    compare their spread with ``q0``'s."""
    key_start, key_run = jax.random.split(rng_key)
    dim = q0.loc.shape[-1]

    def log_density(x):
        return log_target(gaussian.reparameterize(q0, x))

    x0 = jax.random.normal(key_start, (num_chains, dim), q0.loc.dtype)
    keys = jax.random.split(key_run, num_chains)
    chain = lambda x, k: run_chain(log_density, default_step_size(dim), x, k, num_steps)
    state, acceptance, _ = jax.vmap(chain)(x0, keys)
    z = jax.vmap(lambda x: gaussian.reparameterize(q0, x))(state.x)
    finite = jnp.isfinite(state.log_density) & jnp.all(jnp.isfinite(z), axis=-1)
    std, count = masked_std(z, finite)
    return RelaxationCheck(
        std_ratio=std / gaussian.marginal_std(q0),
        acceptance=jnp.mean(acceptance),
        finite_fraction=count / num_chains,
    )
