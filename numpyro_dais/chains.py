"""Independent fits of one guide, trained in one vmapped program: the chains that
:func:`~numpyro_dais.to_inference_data` exports and ArviZ's ``r_hat`` compares."""

import jax
import jax.numpy as jnp
from numpyro.infer.svi import SVIRunResult


def run_chains(
    svi,
    rng_key,
    num_steps,
    *args,
    num_chains=4,
    init_params=None,
    stable_update=False,
    **kwargs,
):
    """``svi.run`` for ``num_chains`` independent keys at once (one compiled ``vmap`` over the
    chains of a ``lax.scan`` over the steps; no progress bar).

    Returns an ``SVIRunResult`` whose ``params`` is a list with one parameter dict per chain
    (what :func:`~numpyro_dais.to_inference_data` takes as chains), ``state`` the final
    ``SVIState`` stacked over the chains and ``losses`` an array ``(num_chains, num_steps)``.

    Starting points: ``svi.init`` runs once (the guides' set-up, e.g. the mode search, is
    done once), and every chain starts from its parameters with its own key, so the chains
    differ by the optimiser's noise only. ``r_hat`` then says whether the stochastic
    optimisation has settled on one answer; to also catch fits that end in different modes,
    pass dispersed starts: ``init_params``, a list of ``num_chains`` dicts of (unconstrained,
    as ``svi.init`` takes them) parameters, one per chain.

    :param svi: a ``numpyro.infer.SVI``.
    :param rng_key: a JAX key; chain ``c`` uses ``jax.random.split(rng_key, num_chains)[c]``.
    :param int num_steps: optimisation steps per chain.
    :param args: the model's arguments.
    :param int num_chains: independent fits ``C``.
    :param init_params: ``None`` or a list of ``C`` dicts, as ``svi.init``'s ``init_params``.
    :param bool stable_update: use ``svi.stable_update`` (skip non-finite steps).
    :param kwargs: the model's keyword arguments.
    """
    if int(num_chains) != num_chains or num_chains < 1:
        raise ValueError(f"`num_chains` must be a positive integer, got {num_chains!r}.")
    keys = jax.random.split(rng_key, num_chains)
    if init_params is None:
        state = svi.init(keys[0], *args, **kwargs)
        states = [state._replace(rng_key=k) for k in keys]
    else:
        if len(init_params) != num_chains:
            raise ValueError(f"{len(init_params)} `init_params` for {num_chains} chains.")
        states = [
            svi.init(k, *args, init_params=p, **kwargs)
            for k, p in zip(keys, init_params, strict=True)
        ]
    state = jax.tree.map(lambda *x: jnp.stack(x), *states)
    update = svi.stable_update if stable_update else svi.update

    def one_chain(state):
        return jax.lax.scan(lambda s, _: update(s, *args, **kwargs), state, None, length=num_steps)

    state, losses = jax.jit(jax.vmap(one_chain))(state)
    params = jax.vmap(svi.get_params)(state)
    chains = [jax.tree.map(lambda x, c=c: x[c], params) for c in range(num_chains)]
    return SVIRunResult(chains, state, losses)
