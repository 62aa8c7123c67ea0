"""The annealing sampler run on a guide's target, and the posterior queries built on it.

Each function takes the guide (read for its target, model view and sampler only: nothing
here calls back into it), the :class:`Fitted` parameters and the call's data. Particles
run in the whitened coordinates ``u`` and come back in ``z = m + L u``.

References: Geffner & Domke (2021); Zhang et al. (2021); Zenn & Bamler (2024), DAIS₀.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.engine import samplers
from numpyro_dais.engine.annealing import dais, gaussian, weights
from numpyro_dais.engine.diagnostics import psis
from numpyro_dais.engine.setup import preconditioning
from numpyro_dais.engine.smc import smc
from numpyro_dais.results import LogEvidence, SMCDiagnostics
from numpyro_dais.runtime.reporting import warn
from numpyro_dais.runtime.vectorise import jit_short_run, map_batched, map_chunks, shard_particles


class Fitted(NamedTuple):
    """A guide's parameters, as the sampler uses them."""

    q0: gaussian.Gaussian
    """``q0`` in the sampler's coordinates (``u`` when whitened, else ``z``)."""
    anneal: dais.AnnealParams
    """The annealing parameters."""
    affine: preconditioning.Affine | None
    """The whitening ``z = m + L u``, or ``None``."""
    model_params: dict
    """The model's ``numpyro.param`` values and the target's own (surrogate weights)."""


def in_z(affine, q0) -> gaussian.Gaussian:
    """``q0`` of the sampler's coordinates as a Gaussian of ``z``."""
    return q0 if affine is None else preconditioning.push(affine, q0)


def run(guide, rng_key, fitted: Fitted, args, kwargs, N, final, **options):
    """One particle system of ``N`` on the target built for this call, run in the whitened
    coordinates and returned in ``z`` (particles, and the final term without
    ``log |det L|``; weights are the same in both).

    ``options``: ``batch`` (the training step's opened plates), ``trace``, ``mesh`` (the
    particles split over its devices), ``sampler`` (``None``: the guide's own, for posterior
    queries), ``key_target`` (the key the target draws a mini-batch with; ``None``: split
    from ``rng_key``, else ``rng_key`` runs the sampler as it is).
    """
    out = run_whitened(guide, rng_key, fitted, args, kwargs, N, final, **options)
    return out_in_z(fitted.affine, out, options.get("mesh"))


def run_whitened(guide, rng_key, fitted: Fitted, args, kwargs, N, final, **options):
    """:func:`run`, its particles left in the sampler's coordinates (``u`` when whitened)."""
    key_target = options.get("key_target")
    if key_target is None:
        key_target, rng_key = jax.random.split(rng_key)
    q0, anneal, affine, params = fitted
    target = guide._target.build(
        guide._view, args, kwargs, params, key_target, final=final, batch=options.get("batch")
    )
    if affine is not None:
        target = preconditioning.whiten(target, affine)
    sampler = options.get("sampler") or guide._sampler
    return samplers.run(sampler, rng_key, q0, target, anneal, N, trace=options.get("trace", False))


def out_in_z(affine, out, mesh=None):
    """A sampler's output ``out`` of :func:`run_whitened` in ``z``; with a ``mesh``, its
    particles split over the mesh's devices."""
    if affine is not None:
        out = out._replace(
            z0=preconditioning.to_z(affine, out.z0),
            z=preconditioning.to_z(affine, out.z),
            log_final_target=out.log_final_target - preconditioning.log_abs_det(affine),
        )
    if mesh is None:
        return out
    particles = ("z0", "z", "log_weights", "log_final_target")
    return out._replace(**shard_particles({k: getattr(out, k) for k in particles}, mesh))


@functools.partial(jax.jit, static_argnums=3)
def q0_draws(rng_key, q0, affine, num_draws: int) -> jax.Array:
    """``num_draws`` draws of ``q0`` mapped to ``z`` by ``affine`` (``None``: none),
    ``(S, D)``: one compiled program per shape when called eagerly (``svi.init``'s draw),
    shared by every guide; inlined under ``jit``."""
    u = gaussian.sample(rng_key, q0, (num_draws,))
    return u if affine is None else preconditioning.to_z(affine, u)


def draw(guide, rng_key, fitted, args, kwargs, method, num_draws, batch_size=None, mesh=None):
    """``num_draws`` flat unconstrained draws ``(S, D)`` by ``method`` (``"q0"``, ``"dais"``
    or ``"importance"``); with a ``mesh``, the draws' axis is split over it."""
    out = weighted_draws(guide, rng_key, fitted, args, kwargs, method, num_draws, batch_size, mesh)
    return out[0]


def weighted_draws(guide, rng_key, fitted, args, kwargs, method, num_draws, batch_size, mesh):
    """:func:`draw`'s draws and the log weights of the particles behind them: ``(S,)`` for
    ``"dais"`` (each end point's), ``(S, num_particles)`` for ``"importance"`` and ``"psis"``
    (each system's), ``None`` for ``"q0"``.

    ``"psis"``: the ``S`` systems' ``S · N`` particles pooled, their log weights
    PSIS-smoothed (Vehtari et al. 2024) and ``S`` draws resampled from all of them by the
    smoothed weights (with replacement: duplicates where the weights are uneven)."""
    if method == "q0":
        return shard_particles(q0_draws(rng_key, fitted.q0, fitted.affine, num_draws), mesh), None
    if method == "dais":

        def end_points(key, n):  # a diverged particle's end point is no draw: NaN, reported
            out = run(guide, key, fitted, args, kwargs, n, "omit")
            finite = jnp.isfinite(out.log_weights)
            return jnp.where(finite[:, None], out.z, jnp.nan), out.log_weights

        return map_chunks(end_points, rng_key, num_draws, batch_size, mesh)

    if method == "psis":
        key_run, key_pick = jax.random.split(rng_key)

        def system(key):
            out = run(guide, key, fitted, args, kwargs, guide.num_particles, "target")
            return out.z, out.log_weights

        keys = jax.random.split(key_run, num_draws)
        z, log_w = map_batched(system, keys, batch_size, mesh)  # (S, N, D), (S, N)
        smoothed = psis.psis_smooth(jnp.reshape(log_w, -1)).log_weights
        idx = jax.random.categorical(key_pick, smoothed, shape=(num_draws,))
        pooled = jnp.reshape(z, (-1, z.shape[-1]))[idx]
        # every particle diverged: no draws (NaN, reported)
        pooled = jnp.where(jnp.isfinite(jnp.max(smoothed)), pooled, jnp.nan)
        return shard_particles(pooled, mesh), log_w

    importance = lambda key: importance_system(guide, key, fitted, args, kwargs)
    return map_batched(importance, jax.random.split(rng_key, num_draws), batch_size, mesh)


def importance_system(guide, key, fitted, args, kwargs):
    """One particle system of ``num_particles`` and one end point picked from it by final
    weight (SIR): ``(z (D,), log_weights (N,))``; ``z`` is NaN where every particle
    diverged (no draw, reported), not a diverged particle's end point."""
    key_run, key_pick = jax.random.split(key)
    out = run(guide, key_run, fitted, args, kwargs, guide.num_particles, "target")
    z = out.z[jax.random.categorical(key_pick, out.log_weights)]
    return jnp.where(jnp.isfinite(jnp.max(out.log_weights)), z, jnp.nan), out.log_weights


@jit_short_run
def pooled_pareto_k(log_weights):
    """Pareto ``k̂`` of all of ``log_weights`` pooled into one sample (compiled once per
    size, cheaply; inlined under an outer ``jit``)."""
    return psis.pareto_k(jnp.reshape(log_weights, -1)).k


def warn_if_not_finite(guide_name, draws, method, num_draws):
    """Warn when annealed draws are not finite (every particle of their system diverged),
    with the fix; nothing under ``jit``. Draws split over the devices of several processes
    are counted where they lie (a reduction every process runs), not fetched."""
    bad = 0
    for value in jax.tree.leaves(draws):
        if isinstance(value, jax.core.Tracer):
            return
        if getattr(value, "is_fully_addressable", True):
            finite = np.isfinite(np.asarray(value))
        else:  # split across processes: reduced where the draws lie
            finite = jnp.isfinite(value)
        rows = finite.reshape(num_draws, -1).all(axis=-1)
        bad = max(bad, num_draws - int(rows.sum()))
    if bad:
        warn(
            f"{guide_name}: {bad} of the {num_draws} {method!r} draws are not finite: every "
            "particle of their annealing diverged. The transitions are unstable for this "
            "posterior: train longer (the step sizes shorten after divergences), pass a "
            "smaller `eta_max`, or draw from q0 (method='q0').",
            RuntimeWarning,
        )


#: the fix a heavy tail of weights calls for where the particles are never resampled
FIX_WITHOUT_RESAMPLING = (
    "more particles, a larger K, or a better-trained guide. A posterior with separated "
    "modes gives such tails too: q0 and its end points then cover only the modes q0 "
    "reaches (the draws stay there); AutoDSMCS, whose resampling carries particles "
    "between modes, reaches the others"
)


def warn_if_heavy_tailed(guide_name, k, num_draws, what, resampling=True):
    """Warn when the Pareto ``k̂`` of ``num_draws`` weights is above the reliable threshold
    (:func:`numpyro_dais.engine.diagnostics.psis.pareto_k_warning`); nothing under ``jit``, nor with
    20 draws or fewer (no tail to fit). ``resampling=False``: the guide never resamples its
    particles, and the fix also names the one that does."""
    if isinstance(k, jax.core.Tracer) or num_draws <= 20:
        return
    fit = psis.ParetoK(np.asarray(k), np.nan, np.nan, num_draws)
    message = psis.pareto_k_warning(fit, what, None if resampling else FIX_WITHOUT_RESAMPLING)
    if message is not None:
        warn(f"{guide_name}: {message}", RuntimeWarning)


def log_evidence(guide, rng_key, fitted, args, kwargs, num_particles, batch_size, mesh=None):
    """:class:`LogEvidence` from ``num_particles`` weights: pooled i.i.d. chunks for DAIS;
    independent systems of ``batch_size`` combined through their genealogies for SMC (``k̂``
    of each system's final weights, the largest reported)."""
    if guide._sampler.resampling is None:
        weights_of = lambda k, n: run(guide, k, fitted, args, kwargs, n, "target").log_weights
        return evidence_of(map_chunks(weights_of, rng_key, num_particles, batch_size, mesh))
    else:
        size = num_particles if batch_size is None else min(batch_size, num_particles)

        def system(key):
            out = run(guide, key, fitted, args, kwargs, size, "target")
            return shard_particles(out.log_weights, mesh), out.log_Z, smc.log_Z_se(out)

        keys = jax.random.split(rng_key, math.ceil(num_particles / size))
        log_w, log_Z, se = jax.lax.map(system, keys)
        k = jnp.max(psis.pareto_k(log_w).k)  # each system's final weights
        log_w, se = log_w.reshape(-1)[:num_particles], weights.combine_se(log_Z, se)
        return LogEvidence(weights.log_mean_exp(log_w), weights.ess(log_w), se, k)


@jit_short_run
def pooled_evidence(log_weights, num: int) -> LogEvidence:
    """:func:`evidence_of` the first ``num`` of ``log_weights`` (any shape) pooled: i.i.d.
    particles of several systems (compiled once per shape and ``num``, cheaply)."""
    return evidence_of(jnp.reshape(log_weights, -1)[:num])


def evidence_of(log_w) -> LogEvidence:
    """:class:`LogEvidence` of i.i.d. log weights ``(S,)``, each with expectation ``p(x)``."""
    se, k = weights.log_mean_exp_se(log_w), psis.pareto_k(log_w).k
    return LogEvidence(weights.log_mean_exp(log_w), weights.ess(log_w), se, k)


def diagnostics(guide, rng_key, fitted, args, kwargs, num_systems):
    """:class:`SMCDiagnostics` of one system (``num_systems=None``) or ``num_systems``."""

    def one(key):
        out = run(guide, key, fitted, args, kwargs, guide.num_particles, "target", trace=True)
        k = psis.pareto_k(out.trace.log_increments).k
        return SMCDiagnostics(out.trace.ess, out.trace.resampled, out.log_Z, k)

    if num_systems is None:
        return one(rng_key)
    return jax.vmap(one)(jax.random.split(rng_key, num_systems))
