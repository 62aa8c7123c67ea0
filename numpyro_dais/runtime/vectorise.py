"""Vectorised and compiled entry points: particles over a mesh, chunked maps, a jit cache."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.runtime import compilation


def shard_particles(tree, mesh):
    """Place the leading (particle) axis of every array in ``tree`` on all axes of ``mesh``
    (:func:`jax.lax.with_sharding_constraint`); XLA partitions the computation that produces
    them. ``mesh=None``: unchanged."""
    if mesh is None:
        return tree
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


def map_batched(fn, xs, batch_size=None, mesh=None):
    """``vmap(fn)(xs)``, or ``lax.map`` over chunks of ``batch_size`` to bound memory.
    With a ``mesh``, each chunk's leading axis is split over it (:func:`shard_particles`)."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if batch_size is None or batch_size >= n:
        return shard_particles(jax.vmap(fn)(xs), mesh)
    if mesh is None:
        return jax.lax.map(fn, xs, batch_size=int(batch_size))
    # lax.map(batch_size=b) spelt out, so that each vmapped chunk can be constrained
    b = int(batch_size)
    full = n // b * b
    head = jax.tree.map(lambda x: x[:full].reshape((n // b, b) + x.shape[1:]), xs)
    out = jax.lax.map(lambda x: shard_particles(jax.vmap(fn)(x), mesh), head)
    out = jax.tree.map(lambda x: x.reshape((full,) + x.shape[2:]), out)
    if full == n:
        return out
    tail = shard_particles(jax.vmap(fn)(jax.tree.map(lambda x: x[full:], xs)), mesh)
    return jax.tree.map(lambda a, c: jnp.concatenate([a, c]), out, tail)


def map_chunks(fn, rng_key, total: int, batch_size=None, mesh=None):
    """``fn(key, n)`` returns ``n`` items (leading axis); call it on chunks of at most
    ``batch_size`` with independent keys and concatenate the first ``total`` items. With a
    ``mesh``, each chunk's items are split over it (:func:`shard_particles`)."""
    size = total if batch_size is None else min(int(batch_size), total)
    keys = jax.random.split(rng_key, math.ceil(total / size))
    chunks = jax.lax.map(lambda k: shard_particles(fn(k, size), mesh), keys)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:total], chunks)


def jit_by_leaves(fn):
    """``jax.jit`` for functions of arbitrary arguments: array leaves are traced, every other
    leaf (ints, strings, …) is static. Compilations are cached per static configuration, so
    repeated ``sample_posterior`` calls do not re-trace the sampler.

    ``wrapped.run_for(scale, *args, **kwargs)``: the same call, by a program compiled for
    ``scale`` runs of its cost (:func:`numpyro_dais.runtime.compilation.run_for`);
    ``wrapped.prepare(scale, *args, **kwargs)`` compiles that program in the background for
    a later ``run_for`` on arguments of the same types
    (:func:`numpyro_dais.runtime.compilation.prepare`).
    ``wrapped.bind(*args, **kwargs)``: ``(key, jitted, dynamic)``, the call's static
    configuration, its ``jax.jit`` of the array leaves and those leaves, for a caller that
    lowers and compiles the program itself (``key`` is ``None`` where a static leaf is not
    hashable: no program)."""
    cache, programs = {}, {}

    def entry(args, kwargs):
        leaves, treedef = jax.tree.flatten((args, kwargs))
        is_array = tuple(isinstance(x, (jax.Array, np.ndarray)) for x in leaves)
        static = tuple(x for x, a in zip(leaves, is_array, strict=True) if not a)
        dynamic = [x for x, a in zip(leaves, is_array, strict=True) if a]
        try:
            key = (treedef, is_array, static)
            hash(key)
        except TypeError:  # unhashable static leaf: run without jit
            return None, None, None
        if key not in cache:

            def call(dynamic):
                dyn, stat = iter(dynamic), iter(static)
                full = [next(dyn) if a else next(stat) for a in is_array]
                a, k = jax.tree.unflatten(treedef, full)
                return fn(*a, **k)

            cache[key] = jax.jit(call)
        return key, cache[key], dynamic

    def wrapped(*args, **kwargs):
        key, jitted, dynamic = entry(args, kwargs)
        return fn(*args, **kwargs) if key is None else jitted(dynamic)

    def run_for(scale, *args, **kwargs):
        key, jitted, dynamic = entry(args, kwargs)
        if key is None:
            return fn(*args, **kwargs)
        return compilation.run_for(programs, key, jitted, dynamic, scale)

    def prepare(scale, *args, **kwargs):
        key, jitted, dynamic = entry(args, kwargs)
        if key is not None:
            compilation.prepare(programs, key, jitted, dynamic, scale)

    wrapped.cache = cache  # one compiled program per static configuration
    wrapped.prepare = prepare
    wrapped.run_for = run_for
    wrapped.bind = lambda *args, **kwargs: entry(args, kwargs)
    wrapped.programs = programs  # run_for's, per static configuration and input types
    return wrapped


def jit_short_run(fn):
    """:func:`jit_by_leaves` for a program whose every run is short next to its compilation
    (``run_for(0, …)``: on CPU compiled at the cheapest level,
    :mod:`numpyro_dais.runtime.compilation`); inlined under an outer ``jit``."""
    program = jit_by_leaves(fn)
    wrapped = functools.wraps(fn)(lambda *args, **kwargs: program.run_for(0, *args, **kwargs))
    wrapped.programs = program.programs
    return wrapped


class CompiledPrograms:
    """Mixin of a guide's compiled programs: each built once per guide by
    :func:`jit_by_leaves` (so repeated calls reuse its compilations) and left out when the
    guide is pickled."""

    def _compiled(self, fn, name=None):
        """``jit_by_leaves(fn)``, built once per guide under ``name`` (default
        ``fn.__name__``)."""
        attr = f"_jit_{name or fn.__name__}"
        if attr not in self.__dict__:
            self.__dict__[attr] = jit_by_leaves(fn)
        return self.__dict__[attr]

    def __getstate__(self):
        state = super().__getstate__()
        return {k: v for k, v in state.items() if not k.startswith("_jit_")}
