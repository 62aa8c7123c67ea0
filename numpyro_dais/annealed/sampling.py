"""One call of an annealed guide, bound; the sampler run on its target, and the posterior
queries built on it.

Every public method of :class:`~numpyro_dais.annealed.guide.AnnealedGuide` (the training call,
``sample_posterior``, ``log_evidence``, ``diagnostics``, ``transport_check``) reads its
parameters (the sites of :func:`q0_sites`, :func:`anneal_sites`,
:func:`preconditioner_sites`) into a :class:`Fitted` and binds them, with the call's data,
into one immutable :class:`Call`. Each function here and in the other rooms
(:mod:`~numpyro_dais.annealed.objective`, :mod:`~numpyro_dais.annealed.posterior.queries`,
:mod:`~numpyro_dais.annealed.posterior.selfcheck`) takes that call, keys and counts, and never the
guide. Particles run in the whitened coordinates ``u`` and come back in ``z = m + L u``.

References: Geffner & Domke (2021); Zhang et al. (2021); Zenn & Bamler (2024), DAIS₀.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import constraints

from numpyro_dais.annealed import targets
from numpyro_dais.engine import samplers
from numpyro_dais.engine.annealing import dais, gaussian, weights
from numpyro_dais.engine.annealing.path import betas_from_increments
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


class Call(NamedTuple):
    """One call of an annealed guide, bound once by the public method that makes it."""

    fitted: Fitted
    """The call's parameters."""
    target: targets.Bound
    """The target bound to the call's data, ``fitted.model_params`` and mini-batch."""
    sampler: samplers.Sampler
    """The sampler the call runs (the training one for the loss, with its gradient mode)."""
    num_particles: int
    """``N``, the particles of one system."""
    K: int
    """The transitions."""
    name: str
    """The guide's class name, for messages."""
    mesh: object = None
    """The training particles' mesh (``None``: one device)."""
    sym_kl_weight: float = 0.0
    """The DAIS₀ term's weight ``w``."""
    divergence_info: str | None = None
    """What the step sizes are and how to fix them, for the training's divergence report;
    ``None``: divergences are not reported."""


def _float():
    """JAX's default float dtype (float32, or float64 under ``jax_enable_x64``), for the
    parameters' initial values, made on the host (no eager device operation to compile)."""
    return np.dtype(jnp.result_type(float))


@jax.jit
def _betas_and_mass(increments, mass):
    """``(betas (K + 1,), mass (D,))`` from the trained ``increments`` and mass matrix: one
    compiled program when a guide runs eagerly (``svi.init``), inlined under ``jit``. Only
    ``η/√m`` enters the position update, so an unnormalised mass matrix would let training
    undo the ``eta_max`` cap: its geometric mean is kept at 1."""
    return betas_from_increments(increments), mass / jnp.exp(jnp.mean(jnp.log(mass)))


def q0_sites(prefix, base_dist, init, init_scale, whitened) -> gaussian.Gaussian:
    """``q0`` in the coordinates the sampler runs in, as the sites ``{prefix}_z_0_loc`` and
    ``{prefix}_z_0_scale`` (or ``_scale_tril``): ``u`` (``whitened``, starting at ``N(0,
    I)``, the Laplace approximation) or ``z`` (starting at ``init`` with ``init_scale``)."""
    D = init.shape[0]
    if whitened:
        loc, scale = np.zeros(D, _float()), 1.0
    else:
        loc, scale = init, init_scale
    loc = numpyro.param(f"{prefix}_z_0_loc", loc)
    if base_dist == "diagonal":
        scale = numpyro.param(
            f"{prefix}_z_0_scale", np.full(D, scale, _float()), constraint=constraints.positive
        )
    else:
        scale = numpyro.param(
            f"{prefix}_z_0_scale_tril",
            np.eye(D, dtype=_float()) * scale,
            constraint=constraints.scaled_unit_lower_cholesky,
        )
    return gaussian.Gaussian(loc, scale)


def preconditioner_sites(prefix, affine) -> preconditioning.Affine | None:
    """The whitening ``z = m + L u`` fixed at set-up (``affine``, ``None``: none), as sites
    ``{prefix}_preconditioner_loc`` ``(D,)``, ``{prefix}_preconditioner_scale`` ``(D, D)`` and
    ``{prefix}_preconditioner_log_det`` ``()`` that training never moves (their gradient is
    stopped: zero), so that ``params`` alone define the trained guide and a saved state
    resumes exactly."""
    if affine is None:
        return None
    fields = zip(preconditioning.Affine._fields, affine, strict=True)
    return preconditioning.Affine(
        *(
            jax.lax.stop_gradient(
                numpyro.param(f"{prefix}_preconditioner_{name}", np.asarray(value, _float()))
            )
            for name, value in fields
        )
    )


def anneal_param_sites(prefix, D, K, step_bounds, momentum, gamma_init, lead=()) -> tuple:
    """The annealing parameters' sites, raw: ``(increments (*lead, K), step_sizes (*lead,
    K), mass (*lead, D), gamma lead)`` from ``{prefix}_beta_increments``, ``_step_size``
    (capped at ``step_bounds[1]``) and, for a kernel with ``momentum``, ``_mass_matrix`` and
    ``_gamma`` (else constants). ``lead``: one set per member (Semi-DAIS's per-member
    parameters)."""
    p, dtype = prefix, _float()
    increments = numpyro.param(
        f"{p}_beta_increments", np.ones((*lead, K), dtype), constraint=constraints.positive
    )
    # before set-up (params given from outside) the bounds do not matter: substituted
    eta_init, eta_max = step_bounds or (0.01, 0.1)
    step_sizes = numpyro.param(
        f"{p}_step_size",
        np.full((*lead, K), eta_init, dtype),
        constraint=constraints.interval(0.0, eta_max),
    )
    if not momentum:  # the Langevin kernel has no momentum
        return increments, step_sizes, np.ones((*lead, D), dtype), np.zeros(lead, dtype)
    mass = numpyro.param(
        f"{p}_mass_matrix", np.ones((*lead, D), dtype), constraint=constraints.positive
    )
    gamma = numpyro.param(
        f"{p}_gamma", np.full(lead, gamma_init, dtype), constraint=constraints.interval(0.0, 1.0)
    )
    return increments, step_sizes, mass, gamma


def anneal_sites(prefix, D, K, step_bounds, momentum, gamma_init) -> dais.AnnealParams:
    """The annealing parameters as sites (:func:`anneal_param_sites`), with the betas and
    the normalised mass matrix derived from them."""
    increments, step_sizes, mass, gamma = anneal_param_sites(
        prefix, D, K, step_bounds, momentum, gamma_init
    )
    betas, mass = _betas_and_mass(increments, mass)
    return dais.AnnealParams(betas, step_sizes, mass, gamma)


def in_z(affine, q0) -> gaussian.Gaussian:
    """``q0`` of the sampler's coordinates as a Gaussian of ``z``."""
    return q0 if affine is None else preconditioning.push(affine, q0)


def run(call: Call, rng_key, N, final, trace=False, mesh=None):
    """One particle system of ``N`` on the call's target, run in the whitened coordinates
    and returned in ``z`` (particles, and the final term without ``log |det L|``; weights
    are the same in both). ``trace``: keep the per-transition trace; ``mesh``: the particles
    split over its devices. The key the target draws a mini-batch with is split from
    ``rng_key``."""
    key_target, rng_key = jax.random.split(rng_key)
    out = run_whitened(call, rng_key, key_target, N, final, trace)
    return out_in_z(call.fitted.affine, out, mesh)


def run_whitened(call: Call, rng_key, key_target, N, final, trace=False):
    """:func:`run` with the target's key ``key_target`` given, its particles left in the
    sampler's coordinates (``u`` when whitened)."""
    q0, anneal, affine, _ = call.fitted
    target = targets.build(call.target, key_target, final)
    if affine is not None:
        target = preconditioning.whiten(target, affine)
    return samplers.run(call.sampler, rng_key, q0, target, anneal, N, trace=trace)


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


def draw(call: Call, rng_key, method, num_draws, batch_size=None, mesh=None):
    """``num_draws`` flat unconstrained draws ``(S, D)`` by ``method`` (``"q0"``, ``"dais"``
    or ``"importance"``); with a ``mesh``, the draws' axis is split over it."""
    out = weighted_draws(call, rng_key, method, num_draws, batch_size, mesh)
    return out[0]


def weighted_draws(call: Call, rng_key, method, num_draws, batch_size, mesh):
    """:func:`draw`'s draws and the log weights of the particles behind them: ``(S,)`` for
    ``"dais"`` (each end point's), ``(S, num_particles)`` for ``"importance"`` and ``"psis"``
    (each system's), ``None`` for ``"q0"``.

    ``"psis"``: the ``S`` systems' ``S · N`` particles pooled, their log weights
    PSIS-smoothed (Vehtari et al. 2024) and ``S`` draws resampled from all of them by the
    smoothed weights (with replacement: duplicates where the weights are uneven)."""
    if method == "q0":
        q0, affine = call.fitted.q0, call.fitted.affine
        return shard_particles(q0_draws(rng_key, q0, affine, num_draws), mesh), None
    if method == "dais":

        def end_points(key, n):  # a diverged particle's end point is no draw: NaN, reported
            out = run(call, key, n, "omit")
            finite = jnp.isfinite(out.log_weights)
            return jnp.where(finite[:, None], out.z, jnp.nan), out.log_weights

        return map_chunks(end_points, rng_key, num_draws, batch_size, mesh)

    if method == "psis":
        key_run, key_pick = jax.random.split(rng_key)

        def system(key):
            out = run(call, key, call.num_particles, "target")
            return out.z, out.log_weights

        keys = jax.random.split(key_run, num_draws)
        z, log_w = map_batched(system, keys, batch_size, mesh)  # (S, N, D), (S, N)
        smoothed = psis.psis_smooth(jnp.reshape(log_w, -1)).log_weights
        idx = jax.random.categorical(key_pick, smoothed, shape=(num_draws,))
        pooled = jnp.reshape(z, (-1, z.shape[-1]))[idx]
        # every particle diverged: no draws (NaN, reported)
        pooled = jnp.where(jnp.isfinite(jnp.max(smoothed)), pooled, jnp.nan)
        return shard_particles(pooled, mesh), log_w

    importance = lambda key: importance_system(call, key)
    return map_batched(importance, jax.random.split(rng_key, num_draws), batch_size, mesh)


def importance_system(call: Call, key):
    """One particle system of ``num_particles`` and one end point picked from it by final
    weight (SIR): ``(z (D,), log_weights (N,))``; ``z`` is NaN where every particle
    diverged (no draw, reported), not a diverged particle's end point."""
    key_run, key_pick = jax.random.split(key)
    out = run(call, key_run, call.num_particles, "target")
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
    (:func:`numpyro_dais.engine.diagnostics.psis.pareto_k_warning`); nothing under ``jit``,
    with 20 draws or fewer (no tail to fit), or for ``k=None`` (judged otherwise).
    ``resampling=False``: the guide never resamples its particles, and the fix also names
    the one that does."""
    if k is None or isinstance(k, jax.core.Tracer) or num_draws <= 20:
        return
    fit = psis.ParetoK(np.asarray(k), np.nan, np.nan, num_draws)
    message = psis.pareto_k_warning(fit, what, None if resampling else FIX_WITHOUT_RESAMPLING)
    if message is not None:
        warn(f"{guide_name}: {message}", RuntimeWarning)


def log_evidence(call: Call, rng_key, num_particles, batch_size, mesh=None):
    """:class:`LogEvidence` from ``num_particles`` weights: pooled i.i.d. chunks for DAIS;
    independent systems of ``batch_size`` combined through their genealogies for SMC (``k̂``
    of each system's final weights, the largest reported)."""
    if call.sampler.resampling is None:
        weights_of = lambda k, n: run(call, k, n, "target").log_weights
        return evidence_of(map_chunks(weights_of, rng_key, num_particles, batch_size, mesh))
    else:
        size = num_particles if batch_size is None else min(batch_size, num_particles)

        def system(key):
            out = run(call, key, size, "target")
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


def diagnostics(call: Call, rng_key, num_systems):
    """:class:`SMCDiagnostics` of one system (``num_systems=None``) or ``num_systems``."""

    def one(key):
        out = run(call, key, call.num_particles, "target", trace=True)
        k = psis.pareto_k(out.trace.log_increments).k
        return SMCDiagnostics(out.trace.ess, out.trace.resampled, out.log_Z, k)

    if num_systems is None:
        return one(rng_key)
    return jax.vmap(one)(jax.random.split(rng_key, num_systems))
