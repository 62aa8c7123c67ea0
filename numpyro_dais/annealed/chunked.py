"""Importance draws in fixed chunks: one compiled program per guide and data.

Every query that draws end points by weight (``sample_posterior(method="importance")`` of
any size, ``transport_check`` and the self-check behind the first ``q0`` draws, the
summaries of a guide whose ``posterior_method`` is ``"importance"``) runs particle systems
``CHUNK`` at a time through the same program, instead of compiling one program per number
of draws; compiled for the number of chunks a call runs
(:func:`numpyro_dais.runtime.compilation.run_for`). Each draw keeps its own key
(``jax.random.split(rng_key, S)``), so the draws equal those of one program over all ``S``.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.annealed import sampling

#: particle systems per call of the shared program (the self-check's draw count)
CHUNK = 256


class Systems(NamedTuple):
    """``S`` particle systems: ``z (S, D)`` one flat end point of each, picked by final
    weight (NaN where every particle diverged); ``draws`` the same constrained (a dict of
    site values, deterministic sites included); ``log_weights (S, N)`` each system's."""

    z: jax.Array
    draws: dict
    log_weights: jax.Array


def applies(batch_size, mesh, *operands) -> bool:
    """Whether a query runs in chunks: not when the caller bounds memory (``batch_size``) or
    splits the draws over a ``mesh`` (their own programs), nor under an outer ``jit`` (any
    traced leaf of ``operands``: the key, the parameters, the data)."""
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(operands))
    return batch_size is None and mesh is None and not traced


def _program(guide, key_data, fitted, params, args, kwargs) -> Systems:
    draw = lambda key: sampling.importance_system(guide, key, fitted, args, kwargs)
    z, log_weights = jax.vmap(draw)(jax.random.wrap_key_data(key_data))
    return Systems(z, guide._constrain(z, params, args, kwargs), log_weights)


def importance(guide, rng_key, fitted, params, args, kwargs, num_systems: int) -> Systems:
    """:class:`Systems` for ``num_systems`` keys split from ``rng_key``, ``CHUNK`` per call
    of the guide's one compiled program. The keys are split once on the host, for a multiple
    of ``CHUNK``: under JAX's default (partitionable) threefry the first ``num_systems`` equal
    ``jax.random.split(rng_key, num_systems)``. The chunks are joined on the host, so a new
    number of draws compiles nothing but the key split. Every chunk is dispatched before the
    first is fetched, so the device is not left idle between chunks."""
    total = math.ceil(num_systems / CHUNK) * CHUNK
    key_data = np.asarray(jax.random.key_data(jax.random.split(rng_key, total)))
    program = guide._compiled(functools.partial(_program, guide), "importance_chunk")
    # compiled for the whole query's chunks of K transitions, asked with its first chunk
    runs = guide._annealing_runs(total, CHUNK)
    chunks = [
        program.run_for(
            runs if i == 0 else 0, key_data[i : i + CHUNK], fitted, params, args, kwargs
        )
        for i in range(0, total, CHUNK)
    ]
    chunks = jax.device_get(chunks)
    return jax.tree.map(lambda *xs: jnp.asarray(np.concatenate(xs)[:num_systems]), *chunks)
