"""The one NumPyro adapter over the annealing samplers.

:class:`AnnealedGuide` owns ``q0`` and the annealing parameters as ``numpyro.param`` sites,
a target (:mod:`numpyro_dais.targets`: what the dynamics follow and what the final weight
uses) and a sampler (:mod:`numpyro_dais.engine.samplers`: DAIS or SMC). ``AutoDAIS``,
``AutoDSMCS``, ``AutoSurrogateLikelihoodDAIS`` and ``AutoSurrogateLikelihoodDSMCS`` are
presets of it that only choose the target and the sampler.

References: Geffner & Domke (2021); Zhang et al. (2021); Zenn & Bamler (2023), DAIS₀ and
DSMCS; Jankowiak & Phan (2022), SL-DAIS.
"""

import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform, LowerCholeskyAffine
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais import _numpyro, _setup
from numpyro_dais._autoguide import ContinuousGuide
from numpyro_dais._checks import (
    check_batch_size,
    check_choice,
    check_mesh,
    check_positive_float,
    check_positive_int,
    check_sample_shape,
    check_step_sizes,
)
from numpyro_dais._reporting import report_diverged
from numpyro_dais._selfcheck import check_q0_once
from numpyro_dais._vectorise import jit_by_leaves, map_batched, map_chunks, shard_particles
from numpyro_dais.engine import dais, dais0, gaussian, preconditioning, samplers, smc, weights
from numpyro_dais.engine.annealing import betas_from_increments
from numpyro_dais.engine.transitions import KERNELS

POSTERIOR_METHODS = ("q0", "dais", "importance")
BASE_DISTS = ("diagonal", "cholesky")


class LogEvidence(NamedTuple):
    """Result of ``log_evidence``: an AIS (or SMC) estimate of ``log Z``, its ESS and its
    standard error."""

    log_Z: jax.Array
    """``()`` estimate of ``log Z = log p(x)`` (log-mean-exp of the weights)."""
    ess: jax.Array
    """``()`` effective sample size of those weights, in ``[1, num_particles]``."""
    se: jax.Array
    """``()`` standard error of ``log_Z`` (delta method on the weights, through the
    genealogy for SMC: :func:`numpyro_dais.engine.weights.log_mean_exp_se`); too small when
    ``ess`` is small."""


class TransportReport(NamedTuple):
    """Result of ``transport_check``: ``q0`` against the annealed end points."""

    ok: bool
    """``True`` when every coordinate is within both tolerances."""
    mean_shift: dict
    """``{site: array}`` ``(mean_q0 − mean_end) / std_end``, in the unconstrained space."""
    std_ratio: dict
    """``{site: array}`` ``std_q0 / std_end``, in the unconstrained space."""
    worst: str
    """The coordinate (e.g. ``"w[0]"``) with the largest standardised mean shift."""
    message: str
    """A one-paragraph verdict, with the fix when ``ok`` is ``False``."""


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


class SMCDiagnostics(NamedTuple):
    """Result of ``diagnostics``, per particle system."""

    ess: jax.Array
    """``(..., K)`` ESS of the weights after transition ``k``, in ``[1, N]``."""
    resampled: jax.Array
    """``(..., K)`` bool: resampled just before transition ``k`` (never for DAIS)."""
    log_Z: jax.Array
    """``(...,)`` the bound's value ``L = log Ẑ`` of each particle system."""


def preset_options(local_vars):
    """A preset's ``locals()`` without ``self``, ``model`` and ``__class__``: the options it
    hands on to :class:`AnnealedGuide` unchanged."""
    return {k: v for k, v in local_vars.items() if k not in ("self", "model", "__class__")}


def divergence_brake(step_sizes, fraction):
    """``f · (b − stop(b))``, ``b = −Σ_k log η_k``: zero in value; in gradient, a push of
    every step size down by ``f / η_k``, ``f`` the fraction of the step's particles that
    diverged (0 on a healthy step).

    A diverged particle is dropped from the bound, so the bound's gradient never learns that
    its steps were too long; worse, its non-finite values turn the shared parameters'
    gradients non-finite, which are then zeroed. Left alone, a run whose learnt steps drift
    into instability can lose every particle on every later step and stop learning with a
    non-finite loss. The brake acts on the step sizes as they were before the NaN guard, so
    it is the one gradient they get on such a step, and it shortens them until trajectories
    stay stable again."""
    brake = -jnp.sum(jnp.log(step_sizes))
    return jax.lax.stop_gradient(fraction) * (brake - jax.lax.stop_gradient(brake))


class AnnealedGuide(ContinuousGuide):
    """Annealing from a Gaussian ``q0`` to a target with ``K`` learnt transitions.

    Subclass it with a preset ``__init__`` that picks ``target`` (a
    :mod:`numpyro_dais.targets` object) and ``resampling`` (``None``: DAIS; a
    :class:`~numpyro_dais.engine.smc.ResamplingConfig`: SMC); the options are documented on
    :class:`~numpyro_dais.AutoDAIS`.
    """

    _options = ContinuousGuide._options + (
        "K",
        "num_particles",
        "kernel",
        "base_dist",
        "eta_init",
        "eta_max",
        "gamma_init",
        "init_scale",
        "laplace_init",
        "posterior_method",
        "sym_kl_weight",
        "report_divergences",
        "self_check",
        "mesh",
    )

    def __init__(
        self,
        model,
        target,
        resampling=None,
        train_resampling=None,
        *,
        K,
        num_particles,
        kernel,
        base_dist,
        eta_init,
        eta_max,
        gamma_init,
        prefix,
        init_loc_fn,
        init_scale,
        laplace_init,
        posterior_method,
        sym_kl_weight,
        report_divergences,
        self_check,
        mesh,
        forward_mode_differentiation,
    ):
        self.K = check_positive_int("K", K)
        self.num_particles = check_positive_int("num_particles", num_particles)
        self.mesh = check_mesh(type(self).__name__, mesh, self.num_particles, None)
        check_choice("kernel", kernel, KERNELS)
        check_choice("base_dist", base_dist, BASE_DISTS)
        check_choice("posterior_method", posterior_method, POSTERIOR_METHODS)
        check_step_sizes(eta_init, eta_max)
        if not 0 < gamma_init < 1:
            raise ValueError(f"`gamma_init` must lie in (0, 1), got {gamma_init!r}.")
        self.init_scale = check_positive_float("init_scale", init_scale)
        if not isinstance(laplace_init, bool | np.bool_):
            raise TypeError(f"`laplace_init` must be True or False, got {laplace_init!r}.")
        self.laplace_init = bool(laplace_init)
        if sym_kl_weight is None:
            sym_kl_weight = 1.0 if posterior_method == "q0" else 0.0
        if isinstance(sym_kl_weight, bool) or not (
            np.isfinite(sym_kl_weight) and sym_kl_weight >= 0
        ):
            raise ValueError(
                "`sym_kl_weight` must be a finite number >= 0 (0: q0 trained on the bound "
                f"alone), got {sym_kl_weight!r}."
            )
        self._sampler = samplers.Sampler(kernel, resampling)
        samplers.check(self._sampler)
        self._train_sampler = samplers.Sampler(kernel, train_resampling or resampling)
        samplers.check(self._train_sampler)
        self.kernel = kernel
        self.base_dist = base_dist
        self.eta_init = eta_init
        self.eta_max = eta_max
        self.gamma_init = gamma_init
        self.posterior_method = posterior_method
        self.sym_kl_weight = float(sym_kl_weight)
        self.report_divergences = report_divergences
        if not isinstance(self_check, bool | np.bool_):
            raise TypeError(f"`self_check` must be True or False, got {self_check!r}.")
        self.self_check = bool(self_check)
        self.curvature = None  # λ behind the default step sizes, measured at set-up
        self._step_bounds = None  # (eta_init, eta_max) in use, fixed at set-up
        self._affine_start = None  # the Laplace whitening z = m + L u found at set-up
        self._target = target
        super().__init__(
            model,
            prefix=prefix,
            init_loc_fn=init_loc_fn,
            forward_mode_differentiation=forward_mode_differentiation,
        )

    @property
    def supports_subsampling(self):
        return self._target.supports_subsampling

    @property
    def target(self):
        """The target object (:mod:`numpyro_dais.targets`): what the dynamics follow."""
        return self._target

    def annealing_target(self, params, *args, rng_key=None, **kwargs) -> dais.Target:
        """The engine's :class:`~numpyro_dais.engine.dais.Target` for ``params`` and the data
        ``*args, **kwargs``: ``log_dynamics(z)`` is what the transitions follow (the full or
        surrogate log joint, or a mini-batch drawn with ``rng_key``) and ``log_final(z)``
        (``None``: the same) the full-data term of the weight. For inspection and tests;
        ``z`` is flat and unconstrained, as in ``get_posterior``.
        """
        model_params = self._params_from(params).model_params
        if not args and not kwargs and not self._target.dynamics_need_data:
            args, kwargs = self._setup_args
        key = jax.random.key(0) if rng_key is None else rng_key
        return self._target.build(self._view, args, kwargs, model_params, key)

    # -- set-up -------------------------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        self._target.setup(self._view, self.prototype_trace, args, kwargs, self.prefix)

    def _set_up_from_curvature(self, args, kwargs, params):
        """Fix the whitening and ``(eta_init, eta_max)`` at set-up (:mod:`numpyro_dais._setup`),
        once."""
        if self._step_bounds is not None:
            return
        setup = _setup.set_up(self, args, kwargs, params)
        self._affine_start, self._step_bounds, self.curvature = setup

    def _on_dynamics(self, fn, args, kwargs, params, key, *operands):
        """``fn(dynamics, start, *operands)`` for the dynamics' log density on this call's
        data and the density whose mode ``q0`` starts at (``target.start``: the full-data
        log joint, for the mini-batch guides too), as one compiled program (the set-up runs
        eagerly, where each operation of the model would otherwise be compiled on its own)."""

        def call(args, kwargs, params, operands):
            view, target = self._view, self._target
            dynamics = target.dynamics(view, args, kwargs, params, key)
            return fn(dynamics, target.start(view, args, kwargs, params, key), *operands)

        return jit_by_leaves(call)(args, kwargs, params, operands)

    def _step_info(self):
        """What the step sizes are and how to fix them, for divergence warnings."""
        eta_max = self._step_bounds[1]
        power = "1 / sqrt(λ)" if self.kernel == "hmc" else "1 / λ"
        if self.curvature is None:
            return (
                f"The step sizes are capped at eta_max = {eta_max:.3g} (given): lower "
                "`eta_max` and `eta_init`, or leave both unset to derive them from the "
                "posterior's curvature."
            )
        return (
            f"The curvature measured at set-up, λ ≈ {self.curvature:.3g}, set eta_max = "
            f"{power} = {eta_max:.3g}; the posterior is stiffer than at the initial point: "
            "pass a smaller `eta_max` (and `eta_init`), or start nearer the posterior "
            "(`init_loc_fn=init_to_median`)."
        )

    # -- parameters -------------------------------------------------------------------------

    def _q0(self) -> gaussian.Gaussian:
        """``q0`` in the coordinates the sampler runs in: ``u`` (whitened, starting at
        ``N(0, I)``, the Laplace approximation) or, without a Laplace start, ``z`` (starting
        at the initial point with ``init_scale``)."""
        p, D = self.prefix, self.latent_dim
        if self._affine_start is None:
            loc, scale = _numpyro.init_latent(self), self.init_scale
        else:
            loc, scale = jnp.zeros(D), 1.0
        loc = numpyro.param(f"{p}_z_0_loc", loc)
        if self.base_dist == "diagonal":
            scale = numpyro.param(
                f"{p}_z_0_scale", jnp.full(D, scale), constraint=constraints.positive
            )
        else:
            scale = numpyro.param(
                f"{p}_z_0_scale_tril",
                scale * jnp.eye(D),
                constraint=constraints.scaled_unit_lower_cholesky,
            )
        return gaussian.Gaussian(loc, scale)

    def _preconditioner(self) -> preconditioning.Affine | None:
        """The whitening ``z = m + L u`` fixed at set-up, as parameter sites
        ``{prefix}_preconditioner_loc`` ``(D,)`` and ``{prefix}_preconditioner_scale_tril``
        ``(D, D)`` that training never moves (their gradient is stopped: zero), so that
        ``params`` alone define the trained guide and a saved state resumes exactly."""
        if self._affine_start is None:
            return None
        p, dtype = self.prefix, jnp.result_type(float)
        loc, scale_tril = (jnp.asarray(a, dtype) for a in self._affine_start)
        return preconditioning.Affine(
            jax.lax.stop_gradient(numpyro.param(f"{p}_preconditioner_loc", loc)),
            jax.lax.stop_gradient(numpyro.param(f"{p}_preconditioner_scale_tril", scale_tril)),
        )

    def _anneal_params(self) -> dais.AnnealParams:
        p, D, K = self.prefix, self.latent_dim, self.K
        increments = numpyro.param(
            f"{p}_beta_increments", jnp.ones(K), constraint=constraints.positive
        )
        # before set-up (params given from outside) the bounds do not matter: substituted
        eta_init, eta_max = self._step_bounds or (0.01, 0.1)
        step_sizes = numpyro.param(
            f"{p}_step_size", jnp.full(K, eta_init), constraint=constraints.interval(0.0, eta_max)
        )
        if self.kernel == "hmc":
            mass = numpyro.param(f"{p}_mass_matrix", jnp.ones(D), constraint=constraints.positive)
            # Only η/√m enters the position update, so an unnormalised mass matrix would let
            # training undo the `eta_max` cap: keep its geometric mean at 1.
            mass = mass / jnp.exp(jnp.mean(jnp.log(mass)))
            gamma = numpyro.param(
                f"{p}_gamma", self.gamma_init, constraint=constraints.interval(0.0, 1.0)
            )
        else:  # the Langevin kernel has no momentum
            mass, gamma = jnp.ones(D), jnp.zeros(())
        return dais.AnnealParams(betas_from_increments(increments), step_sizes, mass, gamma)

    def _guide_params(self):
        return self._q0(), self._anneal_params(), self._preconditioner()

    def _model_params(self):
        """The model's current parameters and the target's own (e.g. surrogate weights)."""
        own = {
            name: numpyro.param(name, value, **kw)
            for name, (value, kw) in self._target.param_sites().items()
        }
        return {**super()._model_params(), **own}

    def _model_params_from(self, params):
        own = {k: jnp.asarray(params[k]) for k in self._target.param_sites() if k in params}
        return {**super()._model_params_from(params), **own}

    def _params_from(self, params) -> Fitted:
        """The :class:`Fitted` parameters in an SVI ``params`` dict, checked first."""
        self._check_params(params, lambda: (self._guide_params(), self._model_params()))
        q0, anneal, affine = self._substituted(self._guide_params, params)
        return Fitted(q0, anneal, affine, self._model_params_from(params))

    # -- the sampler on a target -----------------------------------------------------------------

    def _data(self, args, kwargs, method):
        """The arguments a ``method`` runs on: the call's, or (for a target that needs no data)
        those of set-up when the call has none. A model set up without arguments (a fixed
        target) needs none."""
        if args or kwargs or not any(self._setup_args):
            if method != "dais" or self._target.dynamics_need_data:
                self._check_has_observations(args, kwargs, method)
            return args, kwargs
        if method == "dais" and not self._target.dynamics_need_data:
            return self._setup_args
        raise ValueError(
            f"{type(self).__name__}: method={method!r} runs the annealing on the data; pass "
            "the model's arguments, e.g. sample_posterior(key, params, X, y, method=...). "
            "method='q0' needs no data."
        )

    def _run(
        self,
        rng_key,
        fitted: Fitted,
        args,
        kwargs,
        N,
        final,
        batch=None,
        trace=False,
        mesh=None,
        sampler=None,
        key_target=None,
    ):
        """One particle system of ``N`` on the target built for this call, run in the
        whitened coordinates and returned in ``z`` (particles, and the final term without
        ``log |det L|``; weights are the same in both); with a ``mesh``,
        its particles split over the mesh's devices (:func:`shard_particles`). ``sampler``:
        ``None`` for the guide's own (posterior draws, evidence, diagnostics).
        ``key_target``: the key the target draws with (a mini-batch); ``None``: split from
        ``rng_key``, else ``rng_key`` runs the sampler as it is."""
        if key_target is None:
            key_target, key_run = jax.random.split(rng_key)
        else:
            key_run = rng_key
        q0, anneal, affine, params = fitted
        target = self._target.build(
            self._view, args, kwargs, params, key_target, final=final, batch=batch
        )
        if affine is not None:
            target = preconditioning.whiten(target, affine)
        out = samplers.run(sampler or self._sampler, key_run, q0, target, anneal, N, trace=trace)
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

    # -- training call ----------------------------------------------------------------------------

    def _sample_latent(self, *args, **kwargs):
        kwargs.pop("sample_shape", None)
        rng_key = numpyro.prng_key()
        params = self._model_params()
        self._set_up_from_curvature(args, kwargs, params)
        q0, anneal, affine = self._guide_params()
        if not _numpyro.in_loss():
            # e.g. Predictive: draw as sample_posterior does
            method = self.posterior_method
            if method != "q0":
                args, kwargs = self._data(args, kwargs, method)
            fitted = Fitted(q0, anneal, affine, params)
            return self._draw(rng_key, fitted, args, kwargs, method, 1)[0]
        step_sizes = anneal.step_sizes  # before the NaN guard: for the divergence brake
        q0, anneal, params = self._bound_safe((q0, anneal, params))
        fitted = Fitted(q0, anneal, affine, params)
        # Open the subsample plates of the model that the loss runs, drawn in O(B) (numpyro
        # effects: not in `_bound`); the ELBO replays them into the model. With N > 1 the
        # bound's final term uses the batch too; with one particle the model's own term is
        # the final term, and the plates only spare the model its slow draw, so they are
        # opened only where the loss's model is known.
        loss_model = _numpyro.enclosing_loss_model()
        batch = None
        if self.num_particles > 1 or loss_model is not None:
            opened = self._target.bound_batch(self._view, args, kwargs, loss_model)
            batch = opened if self.num_particles > 1 else None
        if _numpyro.in_svi_init():  # only params and a latent value are kept: a q0 draw
            _numpyro.emit_log_weight(f"{self.prefix}_log_weight", jnp.zeros(()))
            return self._draw(rng_key, fitted, args, kwargs, "q0", 1)[0]
        bound = self._one_program_when_eager(self._bound, rng_key)
        z, log_weight, diverged = bound(rng_key, fitted, args, kwargs, batch)
        log_weight = log_weight - divergence_brake(step_sizes, diverged)
        _numpyro.emit_log_weight(f"{self.prefix}_log_weight", log_weight)
        return z

    def _bound(self, rng_key, fitted, args, kwargs, batch):
        """One particle ``z*`` for the model and the log weight ``ℓ(z*) − objective`` that
        makes the ELBO equal the objective (the bound plus the symmetrised-KL term)."""
        # one split for every key of the step (each split is a generator in the program)
        key_target, key_run, key_sym, key_pick = jax.random.split(rng_key, 4)
        N = self.num_particles
        final = "omit" if N == 1 else "target"  # N = 1: the model's own term supplies ℓ(z_K)
        out = self._run(
            key_run,
            fitted,
            args,
            kwargs,
            N,
            final,
            batch,
            mesh=self.mesh,
            sampler=self._train_sampler,
            key_target=key_target,
        )
        objective = out.log_Z + self._sym_kl_term(fitted, args, kwargs, out, key_sym)
        if self.report_divergences:  # adds 0.0: the loss keeps the check in the program
            name, info = type(self).__name__, self._step_info()
            objective += report_diverged(name, out.num_diverged, N, info)
        # Hand one particle to the model, picked by its weight (so the model's deterministic
        # sites see a posterior-like draw). The factor makes the ELBO equal the objective:
        # ELBO = ℓ(z*) − (ℓ(z*) − objective).
        if N == 1:
            idx = 0
        else:
            idx = jax.random.categorical(key_pick, jax.lax.stop_gradient(out.log_weights))
        return out.z[idx], out.log_final_target[idx] - objective, out.num_diverged / N

    def _sym_kl_term(self, fitted, args, kwargs, out, rng_key):
        """``−(w / K) · Ĵ`` with value 0: only its gradient in ``q0``'s location counts.

        ``Ĵ`` estimates ``KL(q0 ‖ p) + KL(p ‖ q0)`` (:func:`engine.dais0.symmetrized_kl`).
        The term anchors the location, where learnt transitions make the bound flat; the
        scale follows the bound alone, whose finite-K optimum sits nearer the posterior's
        marginal stds than the symmetrised-KL fit does. The model's parameters, the scale,
        the particles and the weights are held fixed in it, so the transitions and the
        model see only the bound.
        """
        if not self.sym_kl_weight:
            return 0.0
        q0 = fitted.q0
        fixed = jax.lax.stop_gradient(fitted.model_params)
        dynamics = self._target.dynamics(self._view, args, kwargs, fixed, rng_key)
        # in z, where `out` is (the symmetrised KL is invariant under the whitening)
        located = self._in_z(fitted.affine, q0._replace(scale=jax.lax.stop_gradient(q0.scale)))
        z0 = located.loc + jax.lax.stop_gradient(out.z0 - located.loc)  # moves with the loc
        J = dais0.symmetrized_kl(
            lambda z: gaussian.log_prob(located, z), dynamics, z0, out.z, out.log_weights
        )
        return -(self.sym_kl_weight / self.K) * (J - jax.lax.stop_gradient(J))

    # -- posterior access -----------------------------------------------------------------------

    @staticmethod
    def _in_z(affine, q0) -> gaussian.Gaussian:
        """``q0`` of the sampler's coordinates as a Gaussian of ``z``."""
        return q0 if affine is None else preconditioning.push(affine, q0)

    def _draw(self, rng_key, fitted, args, kwargs, method, num_draws, batch_size=None, mesh=None):
        """``num_draws`` flat unconstrained draws ``(S, D)`` by ``method``; with a ``mesh``,
        the draws' axis is split over it."""
        if method == "q0":
            u = gaussian.sample(rng_key, fitted.q0, (num_draws,))
            z = u if fitted.affine is None else preconditioning.to_z(fitted.affine, u)
            return shard_particles(z, mesh)
        if method == "dais":

            def run(key, n):  # a diverged particle's end point is no draw: NaN, reported
                out = self._run(key, fitted, args, kwargs, n, "omit")
                return jnp.where(jnp.isfinite(out.log_weights)[:, None], out.z, jnp.nan)

            return map_chunks(run, rng_key, num_draws, batch_size, mesh)

        def importance(key):
            key_run, key_pick = jax.random.split(key)
            out = self._run(key_run, fitted, args, kwargs, self.num_particles, "target")
            z = out.z[jax.random.categorical(key_pick, out.log_weights)]
            # every particle diverged: no draw (NaN, reported), not a diverged particle's z
            return jnp.where(jnp.isfinite(jnp.max(out.log_weights)), z, jnp.nan)

        return map_batched(importance, jax.random.split(rng_key, num_draws), batch_size, mesh)

    def sample_posterior(
        self,
        rng_key,
        params,
        *args,
        sample_shape=(),
        method=None,
        batch_size=None,
        mesh=None,
        **kwargs,
    ):
        """Posterior draws, vectorised.

        :param method: ``"q0"`` (DAIS₀: draws of the trained ``q0``; needs no data),
            ``"dais"`` (end points ``z_K`` of the annealing) or ``"importance"`` (an end point
            resampled by weight from each system of ``num_particles``). Defaults to the
            guide's ``posterior_method``. The last two anneal to the posterior of the data
            passed here (the training data).
        :param batch_size: draws computed at once (bounds memory); ``None``: all at once.
        :param mesh: a :class:`jax.sharding.Mesh`: the draws (for ``"importance"``, the
            particle systems, one per draw) are split evenly over all its devices, so its
            size must divide the number of draws and ``batch_size``. Same draws as without
            it, for the same key. ``None``: one device.
        :return: dict of site values with leading shape ``sample_shape``.
        """
        method = self.posterior_method if method is None else method
        check_choice("method", method, POSTERIOR_METHODS)
        sample_shape = check_sample_shape(sample_shape)
        batch_size = check_batch_size(batch_size)
        mesh = check_mesh(
            type(self).__name__, mesh, self._num_draws(sample_shape), batch_size, "draws"
        )
        fitted = self._params_from(params)
        if method != "q0":
            args, kwargs = self._data(args, kwargs, method)
        else:
            check_q0_once(self, params)
        draws = self._compiled(self._sample_posterior)(
            rng_key,
            fitted,
            params,
            args,
            kwargs,
            sample_shape,
            method,
            batch_size,
            mesh,
        )
        if method != "q0":
            self._warn_if_not_finite(draws, method, self._num_draws(sample_shape))
        return draws

    def _warn_if_not_finite(self, draws, method, num_draws):
        """Warn when annealed draws are not finite (every particle of their system diverged),
        with the fix; nothing under ``jit``."""
        bad = 0
        for value in jax.tree.leaves(draws):
            if isinstance(value, jax.core.Tracer):
                return
            finite = np.isfinite(np.asarray(value)).reshape(num_draws, -1)
            bad = max(bad, int(np.sum(~np.all(finite, axis=-1))))
        if bad:
            warnings.warn(
                f"{type(self).__name__}: {bad} of the {num_draws} {method!r} draws are not "
                "finite: every "
                "particle of their annealing diverged. The transitions are unstable for this "
                "posterior: train longer (the step sizes shorten after divergences), pass a "
                "smaller `eta_max`, or draw from q0 (method='q0').",
                RuntimeWarning,
                stacklevel=3,
            )

    def _sample_posterior(
        self, rng_key, fitted, params, args, kwargs, sample_shape, method, batch_size, mesh=None
    ):
        n = self._num_draws(sample_shape)
        latents = self._draw(rng_key, fitted, args, kwargs, method, n, batch_size, mesh)
        return self._reshape_draws(
            self._constrain(latents, params, args, kwargs, batch_size), sample_shape
        )

    def log_evidence(
        self, rng_key, params, *args, num_particles=1000, batch_size=None, mesh=None, **kwargs
    ) -> LogEvidence:
        """Estimate ``log Z = log p(x)`` from ``num_particles`` weighted particles (in systems
        of at most ``batch_size``), on the full data passed here.

        Returns ``LogEvidence(log_Z, ess, se)``. ``se`` is the standard error of ``log_Z``
        by the delta method on the weights (``se² ≈ (N / ess − 1) / (N − 1)`` for DAIS;
        for SMC the variance estimate of Lee & Whiteley (2018) through each system's
        genealogy, combined over the systems). The estimate is biased low by about
        ``se² / 2`` (Jensen). To compare two models, a difference of ``log_Z`` has standard
        error ``sqrt(se_1² + se_2²)``. Both ``ess`` and ``se`` are estimated from the weights
        themselves, so with an ``ess`` of a few the error bar is itself unreliable: use more
        particles.

        ``mesh``: a :class:`jax.sharding.Mesh`; each system's particles are split evenly over
        all its devices (its size must divide ``num_particles`` and ``batch_size``), and XLA
        partitions the annealing. Same estimate as without it, for the same key. With
        resampling (SMC) a system spans the devices, so each resampling step gathers its
        weights across them.
        """
        num_particles = check_positive_int("num_particles", num_particles)
        batch_size = check_batch_size(batch_size)
        mesh = check_mesh(type(self).__name__, mesh, num_particles, batch_size)
        state = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        return self._compiled(self._log_evidence)(
            rng_key, state, args, kwargs, num_particles, batch_size, mesh
        )

    def _log_evidence(self, rng_key, fitted, args, kwargs, num_particles, batch_size, mesh=None):
        run = lambda k, n: self._run(k, fitted, args, kwargs, n, "target").log_weights
        if self._sampler.resampling is None:  # i.i.d. weights: pool every chunk
            log_w = map_chunks(run, rng_key, num_particles, batch_size, mesh)
            se = weights.log_mean_exp_se(log_w)
        else:  # independent systems of `size`: each one's genealogy, combined
            size = num_particles if batch_size is None else min(batch_size, num_particles)

            def system(key):
                out = self._run(key, fitted, args, kwargs, size, "target")
                return shard_particles(out.log_weights, mesh), out.log_Z, smc.log_Z_se(out)

            keys = jax.random.split(rng_key, math.ceil(num_particles / size))
            log_w, log_Z, se = jax.lax.map(system, keys)
            log_w, se = log_w.reshape(-1)[:num_particles], weights.combine_se(log_Z, se)
        return LogEvidence(weights.log_mean_exp(log_w), weights.ess(log_w), se)

    def diagnostics(self, rng_key, params, *args, num_systems=None, **kwargs) -> SMCDiagnostics:
        """ESS per transition, resampling flags and ``log Ẑ`` of fresh particle systems of
        ``num_particles``, on the full data passed here.

        :param params: trained parameters (``svi_result.params``).
        :param num_systems: ``None`` for one system (shapes ``(K,)``, ``(K,)``, ``()``), or
            an int ``S`` for ``S`` independent systems (a leading ``(S,)`` axis).
        """
        fitted = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        if num_systems is not None:
            num_systems = check_positive_int("num_systems", num_systems)
        diagnose = self._compiled(self._diagnostics)
        return diagnose(rng_key, fitted, args, kwargs, num_systems)

    def _diagnostics(self, rng_key, fitted, args, kwargs, num_systems):
        def one(key):
            out = self._run(key, fitted, args, kwargs, self.num_particles, "target", trace=True)
            return SMCDiagnostics(out.trace.ess, out.trace.resampled, out.log_Z)

        if num_systems is None:
            return one(rng_key)
        return jax.vmap(one)(jax.random.split(rng_key, num_systems))

    def transition_params(self, params):
        """The learnt β schedule, step sizes, mass matrix and damping ``γ``, as a
        :class:`numpyro_dais.TransitionParams` (:func:`numpyro_dais.transition_params`; plot
        them with :func:`numpyro_dais.plot_transitions`).

        :param params: trained parameters (``svi_result.params``).
        """
        from numpyro_dais.diagnostics import transition_params

        return transition_params(self, params)

    def transport_check(
        self,
        rng_key,
        params,
        *args,
        num_samples=2000,
        mean_tol=0.5,
        std_ratio_tol=2.0,
        batch_size=None,
        warn=True,
        **kwargs,
    ) -> TransportReport:
        """Check that ``q0`` (DAIS₀) agrees with the importance-resampled end points.

        Learnt transitions can *transport* a misplaced ``q0`` to the posterior: the bound
        is then tight and the end points right, but ``q0`` draws are not. This draws
        ``num_samples`` end points (``method="importance"``, so it needs the data) and
        compares each unconstrained coordinate: the mean shift in end-point standard
        deviations must stay below ``mean_tol`` and the std ratio within
        ``[1 / std_ratio_tol, std_ratio_tol]`` (a diagonal ``q0`` fitted by the
        symmetrised KL is narrower than the marginals of a correlated posterior: ratio
        ``(1 − ρ²)^{1/4}`` for correlation ``ρ``). With ``warn=True`` a failed check also
        raises a ``UserWarning`` carrying the fix.
        """
        num_samples = check_positive_int("num_samples", num_samples, minimum=2)
        fitted = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        end = self._compiled(self._draw)(
            rng_key,
            fitted,
            args,
            kwargs,
            "importance",
            num_samples,
            check_batch_size(batch_size),
        )
        check = dais0.transport_check(self._in_z(fitted.affine, fitted.q0), end)
        shift, ratio = np.asarray(check.mean_shift), np.exp(np.asarray(check.log_std_ratio))
        names = self._coordinate_names()
        bad_mean = np.abs(shift) > mean_tol
        bad_std = (ratio > std_ratio_tol) | (ratio < 1.0 / std_ratio_tol)
        ok = not bool(np.any(bad_mean | bad_std))
        i = int(np.argmax(np.abs(shift)))
        j = int(np.argmax(np.abs(np.log(ratio))))
        summary = (
            f"largest mean shift {shift[i]:+.2f} end-point sds at {names[i]}, "
            f"largest std ratio {ratio[j]:.2f} at {names[j]}"
        )
        if ok:
            message = f"{type(self).__name__}: q0 agrees with the annealed end points ({summary})."
        else:
            fix = (
                f"raise `sym_kl_weight` (now {self.sym_kl_weight:g}) or train longer"
                if self.sym_kl_weight
                else "train with `sym_kl_weight=1` (the default for posterior_method='q0')"
            )
            message = (
                f"{type(self).__name__}: q0 disagrees with the annealed end points ("
                f"{summary}; tolerances {mean_tol:g} sds and a ratio of {std_ratio_tol:g}). "
                "The transitions carry particles to the posterior instead of refining q0, "
                "so q0 draws (DAIS₀, median, quantiles) are not a faithful posterior. "
                f"Fix: {fix}; or use sample_posterior(..., method='importance'), whose "
                "draws are the end points checked here."
            )
            if np.any(bad_std) and not np.any(bad_mean) and self.base_dist == "diagonal":
                message += (
                    " Only the spread disagrees: for a strongly correlated posterior use "
                    "base_dist='cholesky'."
                )
            if warn:
                warnings.warn(message, UserWarning, stacklevel=2)
        unpack = lambda x: {k: np.asarray(v) for k, v in self._view.unpack(x).items()}
        return TransportReport(ok, unpack(shift), unpack(ratio), names[i], message)

    # -- q0 as an explicit posterior (DAIS₀) -----------------------------------------------------

    def get_base_dist(self):
        """The standard normal ``N(0, I_D)`` that :meth:`get_transform` maps to ``q0``."""
        self._check_set_up()
        return dist.Normal(jnp.zeros(self.latent_dim), 1.0).to_event(1)

    def _q0_of_z(self, params, check=False) -> gaussian.Gaussian:
        """The trained ``q0`` as a Gaussian of the flat unconstrained ``z``; ``check``: used
        as the posterior, so checked once (:mod:`numpyro_dais._selfcheck`)."""
        fitted = self._params_from(params)
        if check:
            check_q0_once(self, params)
        return self._in_z(fitted.affine, fitted.q0)

    def get_transform(self, params):
        """The affine map from :meth:`get_base_dist` to ``q0`` (unconstrained space)."""
        q0 = self._q0_of_z(params)
        if gaussian.is_diagonal(q0):
            return AffineTransform(q0.loc, q0.scale, domain=constraints.real_vector)
        return LowerCholeskyAffine(q0.loc, q0.scale)

    def get_posterior(self, params):
        """``q0`` in the unconstrained space, as a NumPyro distribution (a full-rank
        ``MultivariateNormal`` when whitened: a diagonal ``q0`` of ``u`` is one of ``z``)."""
        q0 = self._q0_of_z(params)
        if gaussian.is_diagonal(q0):
            return dist.Normal(q0.loc, q0.scale).to_event(1)
        return dist.MultivariateNormal(q0.loc, scale_tril=q0.scale)

    def median(self, params):
        """Posterior median from ``q0`` (its mean, constrained), as a dict of site values."""
        return self._transform(self._q0_of_z(params, check=True).loc)

    def quantiles(self, params, quantiles):
        """Posterior quantiles from ``q0`` (marginal normal quantiles, constrained).

        :param quantiles: array of quantiles in ``(0, 1)``, e.g. ``[0.05, 0.5, 0.95]``.
        :return: dict of site values with a leading axis over ``quantiles``.
        """
        q = np.asarray(quantiles, dtype=float)
        if not np.all((q > 0) & (q < 1)):
            raise ValueError(
                f"`quantiles` must lie strictly inside (0, 1), got {quantiles!r}; q0 is a "
                "Gaussian, whose 0 and 1 quantiles are infinite."
            )
        q0 = self._q0_of_z(params, check=True)
        normal_q = dist.Normal(0.0, 1.0).icdf(jnp.asarray(q))
        return self._transform(q0.loc + normal_q[..., None] * gaussian.marginal_std(q0))


__all__ = [
    "AnnealedGuide",
    "LogEvidence",
    "SMCDiagnostics",
    "TransportReport",
    "init_to_uniform",
    "preset_options",
]
