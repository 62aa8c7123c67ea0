"""The one NumPyro adapter over the annealing samplers.

:class:`AnnealedGuide` owns ``q0`` and the annealing parameters as ``numpyro.param`` sites,
a target (:mod:`numpyro_dais.annealed.targets`: what the dynamics follow and what the final weight
uses) and a sampler (:mod:`numpyro_dais.engine.samplers`: DAIS or SMC). ``AutoDAIS``,
``AutoDSMCS``, ``AutoSurrogateLikelihoodDAIS`` and ``AutoSurrogateLikelihoodDSMCS`` are
presets of it that only choose the target and the sampler.

References: Geffner & Domke (2021); Zhang et al. (2021); Zenn & Bamler (2024), DAIS₀, and
(2023), DSMCS; Jankowiak & Phan (2022), SL-DAIS.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais.annealed import objective, sampling, setup
from numpyro_dais.annealed.options import Annealing, Resampling
from numpyro_dais.annealed.queries import POSTERIOR_METHODS, PosteriorQueries
from numpyro_dais.annealed.sampling import Fitted
from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.autoguide import ContinuousGuide
from numpyro_dais.bridge.checks import (
    check_bool,
    check_choice,
    check_mesh,
    check_positive_float,
    check_positive_int,
    check_step_sizes,
)
from numpyro_dais.bridge.modelview import hierarchical_normal_sites
from numpyro_dais.engine import samplers
from numpyro_dais.engine.annealing import dais, gaussian, transitions
from numpyro_dais.engine.annealing.path import betas_from_increments
from numpyro_dais.engine.setup import preconditioning
from numpyro_dais.runtime import compilation
from numpyro_dais.runtime.vectorise import jit_by_leaves

BASE_DISTS = ("diagonal", "cholesky")

#: Loop bodies a set-up program runs, for its compilation level
#: (:func:`numpyro_dais.runtime.compilation.run_for`): the mode search's Newton iterations times its
#: Hessian's columns (its body ran about 340 times on a logistic GLMM, D = 71, 2,000 rows);
#: the model's gradients, so counted at
#: 1 / :data:`~numpyro_dais.runtime.compilation.GRADIENT_WORK_DISCOUNT`.
SET_UP_RUNS = 300 / compilation.GRADIENT_WORK_DISCOUNT


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


class AnnealedGuide(PosteriorQueries, ContinuousGuide):
    """Annealing from a Gaussian ``q0`` to a target with ``K`` learnt transitions.

    Subclass it with a preset: ``defaults``, the option groups it takes with its defaults,
    and an ``__init__`` that parses the user's options and picks ``target`` (a
    :mod:`numpyro_dais.annealed.targets` object) and DAIS or SMC; the options are documented on
    :class:`~numpyro_dais.AutoDAIS`.
    """

    #: the option groups of a preset, with its defaults (:mod:`numpyro_dais.annealed.options`)
    defaults = (Annealing(noncentre=False),)
    #: refine the Laplace start by Gaussian VI on the start density at set-up (``False``
    #: where that density is the full data's, which a mini-batch guide must not sweep)
    _refine_laplace = True

    def __init__(self, model, target, annealing: Annealing, resampling: Resampling | None = None):
        """``target``: a :mod:`numpyro_dais.annealed.targets` object; ``annealing``, ``resampling``:
        the option groups that :func:`~numpyro_dais.annealed.options.parse` gave a preset
        (``resampling=None``: DAIS, else SMC)."""
        a = annealing
        self.K = check_positive_int("K", a.K)
        self.num_particles = check_positive_int("num_particles", a.num_particles)
        self.mesh = check_mesh(type(self).__name__, a.mesh, self.num_particles, None)
        check_choice("kernel", a.kernel, transitions.KERNELS)
        check_choice("base_dist", a.base_dist, BASE_DISTS)
        check_choice("posterior_method", a.posterior_method, POSTERIOR_METHODS)
        check_step_sizes(a.eta_init, a.eta_max)
        if not 0 < a.gamma_init < 1:
            raise ValueError(f"`gamma_init` must lie in (0, 1), got {a.gamma_init!r}.")
        self.init_scale = check_positive_float("init_scale", a.init_scale)
        self.laplace_init = check_bool("laplace_init", a.laplace_init)
        self.self_check = check_bool("self_check", a.self_check)
        valid = a.noncentre == "auto" or isinstance(a.noncentre, bool | np.bool_)
        if not valid or (a.noncentre and target.supports_subsampling):
            raise ValueError(
                "`noncentre` must be 'auto' (non-centre a hierarchy whose centred posterior "
                "has no mode), True (always) or False (never), got "
                f"{a.noncentre!r}; the mini-batch guides take False only."
            )
        sym_kl_weight = a.sym_kl_weight
        if sym_kl_weight is None:
            sym_kl_weight = 1.0 if a.posterior_method == "q0" else 0.0
        if isinstance(sym_kl_weight, bool) or not (
            np.isfinite(sym_kl_weight) and sym_kl_weight >= 0
        ):
            raise ValueError(
                "`sym_kl_weight` must be a finite number >= 0 (0: q0 trained on the bound "
                f"alone), got {sym_kl_weight!r}."
            )
        self.sym_kl_weight = float(sym_kl_weight)
        for name in ("kernel", "base_dist", "eta_init", "eta_max", "gamma_init", "noncentre"):
            setattr(self, name, getattr(a, name))
        self.posterior_method = a.posterior_method
        self.report_divergences = a.report_divergences
        for name, value in resampling._asdict().items() if resampling else ():
            setattr(self, name, value)
        config, train_config = resampling.configs() if resampling else (None, None)
        # names (kernel, resampling scheme and rule) resolved to functions once, here
        self._sampler = samplers.resolve(samplers.Sampler(a.kernel, config))
        self._train_sampler = samplers.resolve(samplers.Sampler(a.kernel, train_config))
        self.curvature = None  # λ behind the default step sizes, measured at set-up
        self._step_bounds = None  # (eta_init, eta_max) in use, fixed at set-up
        self._affine_start = None  # the Laplace whitening z = m + L u found at set-up
        self.refinement = None  # its Gaussian VI refinement at set-up (engine.setup.refinement)
        self._target = target
        super().__init__(
            model,
            prefix=a.prefix,
            init_loc_fn=a.init_loc_fn,
            forward_mode_differentiation=a.forward_mode_differentiation,
        )

    @property
    def supports_subsampling(self):
        return self._target.supports_subsampling

    @property
    def target(self):
        """The target object (:mod:`numpyro_dais.annealed.targets`): what the dynamics follow."""
        return self._target

    def annealing_target(self, params, *args, rng_key=None, **kwargs) -> dais.Target:
        """The engine's :class:`~numpyro_dais.engine.base.Target` for ``params`` and the data
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

    def _after_setup(self, args, kwargs):
        super()._after_setup(args, kwargs)
        self._target.setup(self._view, self.prototype_trace, args, kwargs, self.prefix)
        if self.noncentre is True:
            self._noncentre_hierarchy(args, kwargs)

    def _noncentre_hierarchy(self, args, kwargs) -> bool:
        """Run the hierarchy's Normal sites (those whose scale is a function of other latent
        sites) non-centred from now on, if ``noncentre`` allows it and any exist; whether it
        switched. Their flat coordinates then hold the noise ``u`` of ``value = loc + scale
        · u`` (Gorinova et al. 2020), in which a centred hierarchy's funnel is gone."""
        if not self.noncentre or self._view.noncentred:
            return False
        sites = hierarchical_normal_sites(self._view.model, args, kwargs)
        sites = tuple(name for name in sites if name in self._view.transforms)  # this guide's
        if sites:
            self._view = self._view._replace(noncentred=sites)
        return bool(sites)

    def _set_up_from_curvature(self, args, kwargs, params):
        """Fix the whitening and ``(eta_init, eta_max)`` at set-up
        (:mod:`numpyro_dais.annealed.setup`), once."""
        if self._step_bounds is not None:
            return
        found = setup.set_up(self, args, kwargs, params)
        self._affine_start, self._step_bounds, self.curvature = found[:3]
        self.refinement = found.refined
        if self._target.control_variate:
            self._target.linearise(found.linear)

    def _linearises(self) -> bool:
        """Whether the set-up keeps the full-data log joint's value and gradient at its mode
        for the target's control variate: a target that takes one, on a model with no
        ``numpyro.param`` sites and no sites hidden from it (both would change that log
        joint after set-up, and bias the control variate)."""
        return (
            self._target.control_variate
            and not self._model_param_sites
            and not self._view.hidden_sites
        )

    def _on_dynamics(self, fn, args, kwargs, params, key, *operands, runs=SET_UP_RUNS):
        """``fn(dynamics, start, *operands)`` for the dynamics' log density on this call's
        data and the density whose mode ``q0`` starts at (``target.start``: the full-data log joint,
        for the mini-batch guides too), as one compiled program (the set-up runs eagerly, where each
        operation of the model would otherwise be compiled on its own), compiled for a run of
        ``runs`` loop bodies (:func:`numpyro_dais.runtime.compilation.run_for`; :data:`SET_UP_RUNS`,
        the mode search's, unless given)."""

        def call(args, kwargs, params, operands):
            view, target = self._view, self._target
            dynamics = target.dynamics(view, args, kwargs, params, key)
            return fn(dynamics, target.start(view, args, kwargs, params, key), *operands)

        return jit_by_leaves(call).run_for(runs, args, kwargs, params, operands)

    # -- parameters -------------------------------------------------------------------------

    def _q0(self) -> gaussian.Gaussian:
        """``q0`` in the coordinates the sampler runs in: ``u`` (whitened, starting at
        ``N(0, I)``, the Laplace approximation) or, without a Laplace start, ``z`` (starting
        at the initial point with ``init_scale``)."""
        p, D = self.prefix, self.latent_dim
        if self._affine_start is None:
            loc, scale = numpyro_private.init_latent(self), self.init_scale
        else:
            loc, scale = np.zeros(D, _float()), 1.0
        loc = numpyro.param(f"{p}_z_0_loc", loc)
        if self.base_dist == "diagonal":
            scale = numpyro.param(
                f"{p}_z_0_scale", np.full(D, scale, _float()), constraint=constraints.positive
            )
        else:
            scale = numpyro.param(
                f"{p}_z_0_scale_tril",
                np.eye(D, dtype=_float()) * scale,
                constraint=constraints.scaled_unit_lower_cholesky,
            )
        return gaussian.Gaussian(loc, scale)

    def _preconditioner(self) -> preconditioning.Affine | None:
        """The whitening ``z = m + L u`` fixed at set-up, as parameter sites
        ``{prefix}_preconditioner_loc`` ``(D,)``, ``{prefix}_preconditioner_scale``
        ``(D, D)`` and ``{prefix}_preconditioner_log_det`` ``()`` that training never moves
        (their gradient is stopped: zero), so that ``params`` alone define the trained guide
        and a saved state resumes exactly."""
        if self._affine_start is None:
            return None
        p = self.prefix
        fields = zip(preconditioning.Affine._fields, self._affine_start, strict=True)
        return preconditioning.Affine(
            *(
                jax.lax.stop_gradient(
                    numpyro.param(f"{p}_preconditioner_{name}", np.asarray(value, _float()))
                )
                for name, value in fields
            )
        )

    def _anneal_params(self) -> dais.AnnealParams:
        p, D, K = self.prefix, self.latent_dim, self.K
        increments = numpyro.param(
            f"{p}_beta_increments", np.ones(K, _float()), constraint=constraints.positive
        )
        # before set-up (params given from outside) the bounds do not matter: substituted
        eta_init, eta_max = self._step_bounds or (0.01, 0.1)
        step_sizes = numpyro.param(
            f"{p}_step_size",
            np.full(K, eta_init, _float()),
            constraint=constraints.interval(0.0, eta_max),
        )
        if self._sampler.kernel.momentum:
            mass = numpyro.param(
                f"{p}_mass_matrix", np.ones(D, _float()), constraint=constraints.positive
            )
            gamma = numpyro.param(
                f"{p}_gamma", self.gamma_init, constraint=constraints.interval(0.0, 1.0)
            )
        else:  # the Langevin kernel has no momentum
            mass, gamma = np.ones(D, _float()), np.zeros((), _float())
        betas, mass = _betas_and_mass(increments, mass)
        return dais.AnnealParams(betas, step_sizes, mass, gamma)

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
        # the control variate's sites: for training only (params saved without them draw)
        make = lambda: (self._guide_params(), self._model_params())  # noqa: E731
        self._check_params(params, make, self._target.control_variate_names)
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

    def _run(self, rng_key, fitted: Fitted, args, kwargs, N, final, **options):
        """:func:`numpyro_dais.annealed.sampling.run` of this guide."""
        return sampling.run(self, rng_key, fitted, args, kwargs, N, final, **options)

    # -- training call (the hooks of ContinuousGuide._latent_sample) ----------------------------

    def _read_params(self, args, kwargs) -> Fitted:
        params = self._model_params()
        self._set_up_from_curvature(args, kwargs, params)
        # the target's sites that its set-up creates (a control variate's linearisation)
        added = {k: v for k, v in self._target.param_sites().items() if k not in params}
        params.update(
            {name: numpyro.param(name, value, **kw) for name, (value, kw) in added.items()}
        )
        return Fitted(*self._guide_params(), params)

    def _posterior_draw(self, rng_key, fitted, args, kwargs):
        method = self.posterior_method
        if method != "q0":
            args, kwargs = self._data(args, kwargs, method)
        return self._draw(rng_key, fitted, args, kwargs, method, 1)[0]

    def _in_loss(self, fitted, args, kwargs) -> objective.LossCall:
        step_sizes = fitted.anneal.step_sizes  # before the NaN guard: for the divergence brake
        q0, anneal, params = self._bound_safe((fitted.q0, fitted.anneal, fitted.model_params))
        # Open the subsample plates of the model that the loss runs, drawn in O(B) (numpyro
        # effects: not in `_bound`); the ELBO replays them into the model. With N > 1 the
        # bound's final term uses the batch too; with one particle the model's own term is
        # the final term. Either way the target's control variate corrects the final term
        # on these rows. The plates are opened only where the loss's model is known.
        loss_model = numpyro_private.enclosing_loss_model()
        batch = None
        if self.num_particles > 1 or loss_model is not None:
            batch = self._target.bound_batch(self._view, args, kwargs, loss_model)
        fitted = Fitted(q0, anneal, fitted.affine, params)
        return objective.LossCall(fitted, step_sizes, batch)

    def _init_draw(self, rng_key, call, args, kwargs):
        """``svi.init`` keeps the latent value only to trace the model once: ``q0``'s mean
        in ``z``, computed on the host where the parameters are concrete (no program to
        compile for it), else a ``q0`` draw."""
        q0, affine = call.fitted.q0, call.fitted.affine
        leaves = jax.tree.leaves((q0.loc, affine))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return self._draw(rng_key, call.fitted, args, kwargs, "q0", 1)[0]
        loc = np.asarray(q0.loc)
        if affine is not None:
            loc = np.asarray(affine.loc) + np.asarray(affine.scale) @ loc
        return loc.astype(np.asarray(q0.loc).dtype)

    def _loss_term(self, rng_key, call, args, kwargs):
        bound = self._one_program_when_eager(self._bound, rng_key)
        z, log_weight, diverged = bound(rng_key, call.fitted, args, kwargs, call.batch)
        return z, log_weight - objective.divergence_brake(call.step_sizes, diverged)

    def _bound(self, rng_key, fitted, args, kwargs, batch):
        """:func:`numpyro_dais.annealed.objective.bound` of this guide."""
        return objective.bound(self, rng_key, fitted, args, kwargs, batch)


__all__ = ["AnnealedGuide", "init_to_uniform"]
