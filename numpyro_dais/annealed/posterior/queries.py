"""The posterior queries of the annealed guides, as functions of a bound call: importance
draws in fixed chunks, the checks of draws and evidence, and ``q0`` as a NumPyro
distribution (DAIS₀).

The public methods of :class:`~numpyro_dais.annealed.guide.AnnealedGuide` check their
arguments, bind the call (:class:`~numpyro_dais.annealed.sampling.Call`) and hand it here and to
:mod:`numpyro_dais.annealed.sampling`.

Importance draws (``sample_posterior(method="importance")`` of any size, ``transport_check``
and the self-check behind the first ``q0`` draws, the summaries of a guide whose
``posterior_method`` is ``"importance"``, DAIS's ``log_evidence``) run particle systems
:data:`CHUNK` at a time through one compiled program per guide and data
(:func:`importance_chunk`), instead of compiling one program per number of draws; compiled
for the number of chunks a call runs (:func:`numpyro_dais.runtime.compilation.run_for`).
Each draw keeps its own key (``jax.random.split(rng_key, S)``), so the draws equal those of
one program over all ``S``.

References: Geffner & Domke (2021); Zenn & Bamler (2024), DAIS₀.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform, LowerCholeskyAffine

from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.sampling import Call
from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.engine.diagnostics import psis
from numpyro_dais.runtime.compilation import annealing_runs

#: draws behind ``median`` and ``quantiles`` when ``posterior_method`` is not ``"q0"``
SUMMARY_DRAWS = 2000
#: particle systems per call of the shared program (the self-check's draw count)
CHUNK = 256


class Systems(NamedTuple):
    """``S`` particle systems: ``z (S, D)`` one flat end point of each, picked by final
    weight (NaN where every particle diverged); ``draws`` the same constrained (a dict of
    site values, deterministic sites included); ``log_weights (S, N)`` each system's."""

    z: jax.Array
    draws: dict
    log_weights: jax.Array


def runs(K, num_systems, batch_size=None, method="importance"):
    """The loop bodies a query's program runs (:func:`numpyro_dais.runtime.compilation.run_for`):
    one for ``q0`` draws, else :func:`~numpyro_dais.runtime.compilation.annealing_runs`."""
    return 1 if method == "q0" else annealing_runs(K, num_systems, batch_size)


def applies(batch_size, mesh, *operands) -> bool:
    """Whether a query runs in chunks: not when the caller bounds memory (``batch_size``) or
    splits the draws over a ``mesh`` (their own programs), nor under an outer ``jit`` (any
    traced leaf of ``operands``: the key, the parameters, the data)."""
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(operands))
    return batch_size is None and mesh is None and not traced


def importance_chunk(call: Call, key_data):
    """``(z, log_weights)`` of the systems of the keys ``key_data`` (a chunk's): the body of
    the guide's one compiled program (which constrains ``z`` too)."""
    draw = lambda key: sampling.importance_system(call, key)
    return jax.vmap(draw)(jax.random.wrap_key_data(key_data))


def _key_data(rng_key, num_systems):
    """The keys of :func:`importance`'s systems, split once on the host for a multiple of
    ``CHUNK``."""
    total = math.ceil(num_systems / CHUNK) * CHUNK
    return total, np.asarray(jax.random.key_data(jax.random.split(rng_key, total)))


def prepare_importance(program, rng_key, K, num_systems: int, *operands) -> None:
    """Compile, in the background, the program that :func:`importance` with these arguments
    will run (``program.prepare``: :func:`numpyro_dais.runtime.compilation.prepare`)."""
    total, key_data = _key_data(rng_key, num_systems)
    program.prepare(runs(K, total, CHUNK), key_data[:CHUNK], *operands)


def importance(program, rng_key, K, num_systems: int, *operands) -> Systems:
    """:class:`Systems` for ``num_systems`` keys split from ``rng_key``, ``CHUNK`` per call
    of the guide's one compiled ``program`` (``program.run_for(runs, key_data,
    *operands)``, :func:`importance_chunk` with the draws constrained). The keys are split
    once on the host, for a multiple of ``CHUNK``: under JAX's default (partitionable)
    threefry the first ``num_systems`` equal ``jax.random.split(rng_key, num_systems)``. The
    chunks are joined on the host, so a new number of draws compiles nothing but the key
    split. Every chunk is dispatched before the first is fetched, so the device is not left
    idle between chunks."""
    total, key_data = _key_data(rng_key, num_systems)
    # compiled for the whole query's chunks of K transitions, asked with its first chunk
    first = runs(K, total, CHUNK)
    chunks = [
        program.run_for(first if i == 0 else 0, key_data[i : i + CHUNK], *operands)
        for i in range(0, total, CHUNK)
    ]
    chunks = jax.device_get(chunks)
    return jax.tree.map(lambda *xs: jnp.asarray(np.concatenate(xs)[:num_systems]), *chunks)


def warn_about_draws(name, draws, k, method, num_draws, num_particles, resampling):
    """The warnings of guide ``name``'s annealed draws: not finite, or behind a heavy tail
    of weights (``num_particles`` per system; ``resampling``: whether the guide resamples;
    ``k=None``: the draws are judged otherwise, by the self-check)."""
    sampling.warn_if_not_finite(name, draws, method, num_draws)
    S = num_draws * (num_particles if method in ("importance", "psis") else 1)
    what = f"the weights behind the {method!r} draws (S = {S})"
    sampling.warn_if_heavy_tailed(name, k, S, what, resampling)


def _evidence_system(num_particles, batch_size, resampling):
    """The weights one ``k̂`` of ``log_evidence`` is fitted to."""
    return min(batch_size, num_particles) if resampling and batch_size else num_particles


#: the factor by which ``log_evidence`` draws more particles to confirm a heavy tail
CONFIRM = 4


def confirm_heavy_tail(k, num_particles, batch_size, resampling) -> bool:
    """Whether ``log_evidence``'s ``k̂`` (host value) is past its threshold for its ``S``
    weights and a fresh sample of :data:`CONFIRM` times the particles would judge more
    weights. ``k̂`` of ``S`` weights has a standard error of about ``(1 + k) / √M`` (``M``
    the tail draws, ``3√S``): 0.15 at ``S = 1000``, where the threshold is 0.67, so a light
    tail (``k`` near 0.4) passes it by chance now and then; a heavy one stays past it at
    ``4S``. Not under ``jit``, nor where the systems' size is ``batch_size`` (SMC: more
    particles would only add systems)."""
    system = _evidence_system(num_particles, batch_size, resampling)
    if isinstance(k, jax.core.Tracer) or system <= 20 or system != num_particles:
        return False
    return psis.unreliable(k, system)


def warn_about_evidence(name, evidence, num_particles, batch_size, resampling):
    """The warning of guide ``name``'s ``log_evidence`` whose weights have a heavy tail."""
    system = _evidence_system(num_particles, batch_size, resampling)
    what = f"log_evidence's weights (S = {system})"
    sampling.warn_if_heavy_tailed(name, evidence.pareto_k, system, what, resampling)


def q0_transform(q0: gaussian.Gaussian):
    """The affine map from ``N(0, I_D)`` to ``q0`` (a Gaussian of ``z``)."""
    if gaussian.is_diagonal(q0):
        return AffineTransform(q0.loc, q0.scale, domain=constraints.real_vector)
    return LowerCholeskyAffine(q0.loc, q0.scale)


def q0_distribution(q0: gaussian.Gaussian):
    """``q0`` (a Gaussian of ``z``) as a NumPyro distribution (a full-rank
    ``MultivariateNormal`` when whitened: a diagonal ``q0`` of ``u`` is one of ``z``)."""
    if gaussian.is_diagonal(q0):
        return dist.Normal(q0.loc, q0.scale).to_event(1)
    return dist.MultivariateNormal(q0.loc, scale_tril=q0.scale)


def q0_quantiles(q0: gaussian.Gaussian, q):
    """``q0``'s marginal normal quantiles ``q`` of each flat coordinate, ``(len(q), D)``."""
    normal_q = dist.Normal(0.0, 1.0).icdf(jnp.asarray(q))
    return q0.loc + normal_q[..., None] * gaussian.marginal_std(q0)


def check_quantiles(quantiles):
    """``quantiles`` as a float array, checked to lie strictly inside ``(0, 1)``."""
    q = np.asarray(quantiles, dtype=float)
    if not np.all((q > 0) & (q < 1)):
        raise ValueError(
            f"`quantiles` must lie strictly inside (0, 1), got {quantiles!r}; q0 is a "
            "Gaussian, whose 0 and 1 quantiles are infinite."
        )
    return q
