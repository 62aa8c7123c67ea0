"""The private half of :class:`~numpyro_dais.annealed.guide.AnnealedGuide`: what the guide
knows and the rooms do not.

:class:`BindingGuide` reads the parameter sites into a
:class:`~numpyro_dais.annealed.sampling.Fitted`, runs the set-up once (handing
:mod:`~numpyro_dais.annealed.setup` a plain :class:`~numpyro_dais.annealed.setup.Problem`,
and non-centring the hierarchy where it reports a funnel), fills in the training hooks of
:class:`~numpyro_dais.bridge.template.GuideTemplate`, and binds each call into one
:class:`~numpyro_dais.annealed.sampling.Call` (:meth:`BindingGuide._bind`) that the rooms
take; it owns the compiled programs, inside which a call is bound on the programs'
operands. Nothing it calls calls back into it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpyro

from numpyro_dais.annealed import objective, sampling, setup
from numpyro_dais.annealed.posterior import mala_draws, queries
from numpyro_dais.annealed.sampling import Call, Fitted
from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.autoguide import ContinuousGuide
from numpyro_dais.bridge.modelview import hierarchical_normal_sites


class BindingGuide(ContinuousGuide):
    """Parameters, set-up, the training hooks and the binding of each call of an annealed
    guide (the base of :class:`~numpyro_dais.annealed.guide.AnnealedGuide`, which sets the
    options and the target it reads)."""

    def _bind(self, fitted: Fitted, args, kwargs, batch=None, training=False) -> Call:
        """The :class:`~numpyro_dais.annealed.sampling.Call` of ``fitted`` on the data ``args,
        kwargs`` (and the model's mini-batch ``batch``): what every room takes. ``training``:
        the loss's call, run by the training sampler and reporting divergences."""
        bound = self._target.bind(self._view, args, kwargs, fitted.model_params, batch)
        sampler, info = self._sampler, None
        if training:
            sampler = self._train_sampler
            if self.report_divergences:
                eta_max = self._step_bounds[1]
                info = objective.step_info(self._sampler.kernel, self.curvature, eta_max)
        name = type(self).__name__
        return Call(
            fitted, bound, sampler, self.num_particles, self.K, name, self.mesh,
            self.sym_kl_weight, info,
        )  # fmt: skip

    def _bound_call(self, fn):
        """``fn(call, *rest)`` as a method of ``(fitted, args, kwargs, *rest)``: the call
        bound inside the program that runs it (the data are the program's operands)."""

        def bound(rng_key, fitted, args, kwargs, *rest):
            return fn(self._bind(fitted, args, kwargs), rng_key, *rest)

        bound.__name__ = f"_{fn.__name__}"
        return bound

    def _after_setup(self, args, kwargs):
        super()._after_setup(args, kwargs)
        target = self._target.setup(self._view, self.prototype_trace, args, kwargs, self.prefix)
        self._target = target
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

    def _set_up_problem(self, args, kwargs, params) -> setup.Problem:
        """What :mod:`numpyro_dais.annealed.setup` measures, in the guide's current view. The
        control variate's linearisation is kept for a target that takes one, on a model with
        no ``numpyro.param`` sites and no sites hidden from it (both would change that log
        joint after set-up, and bias the control variate)."""
        target = self._target
        linearise = (
            target.control_variate and not self._model_param_sites and not self._view.hidden_sites
        )
        bind = functools.partial(target.bind, self._view)  # the view of this set-up
        return setup.Problem(
            type(self).__name__,
            self._init_point,
            bind,
            args,
            kwargs,
            params,
            self._coordinate_site_sizes(),
            self.laplace_init,
            self.init_scale,
            linearise,
            target.supports_subsampling,
            self._refine_laplace,
            self.eta_init,
            self.eta_max,
            self._sampler.kernel.momentum,
        )

    def _set_up_from_curvature(self, args, kwargs, params):
        """Fix the whitening and ``(eta_init, eta_max)`` at set-up
        (:mod:`numpyro_dais.annealed.setup`), once; where the mode search runs into a
        funnel, non-centre the hierarchy (if allowed) and measure once more."""
        if self._step_bounds is not None:
            return
        problem = self._set_up_problem(args, kwargs, params)
        measured = setup.measure(problem)
        if measured.funnel is not None and self._noncentre_hierarchy(args, kwargs):
            problem = self._set_up_problem(args, kwargs, params)
            measured = setup.measure(problem)
        found = setup.finish(problem, measured)
        self._affine_start, self._step_bounds, self.curvature = found[:3]
        self.refinement = found.refined
        if self._target.control_variate:
            self._target = self._target.linearise(found.linear)

    def _guide_params(self):
        p, affine = self.prefix, self._affine_start
        init = self._init_point
        q0 = sampling.q0_sites(p, self.base_dist, init, self.init_scale, affine is not None)
        return q0, self._anneal_params(), sampling.preconditioner_sites(p, affine)

    def _anneal_params(self):
        momentum, D = self._sampler.kernel.momentum, self.latent_dim
        return sampling.anneal_sites(
            self.prefix, D, self.K, self._step_bounds, momentum, self.gamma_init
        )

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
            f"{type(self).__name__}: method={method!r} runs on the posterior of the data; pass "
            "the model's arguments, e.g. sample_posterior(key, params, X, y, method=...). "
            "method='q0' needs no data."
        )

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
        return sampling.draw(self._bind(fitted, args, kwargs), rng_key, method, 1)[0]

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
            return sampling.q0_draws(rng_key, q0, affine, 1)[0]
        loc = np.asarray(q0.loc)
        if affine is not None:
            loc = np.asarray(affine.loc) + np.asarray(affine.scale) @ loc
        return loc.astype(np.asarray(q0.loc).dtype)

    def _loss_term(self, rng_key, call, args, kwargs):
        bound = self._one_program_when_eager(self._bound, rng_key)
        z, log_weight, diverged = bound(rng_key, call.fitted, args, kwargs, call.batch)
        return z, log_weight - objective.divergence_brake(call.step_sizes, diverged)

    def _bound(self, rng_key, fitted, args, kwargs, batch):
        """:func:`numpyro_dais.annealed.objective.bound` of the call bound here: the target on
        the model's mini-batch, the training sampler."""
        return objective.bound(self._bind(fitted, args, kwargs, batch, training=True), rng_key)

    def _sample_posterior(self, rng_key, fitted, params, args, kwargs, plan, method):
        call = self._bind(fitted, args, kwargs)
        latents, log_w = sampling.weighted_draws(
            call, rng_key, method, plan.num_draws, plan.batch_size, plan.mesh
        )
        k = None if log_w is None else sampling.pooled_pareto_k(log_w)
        return self._finish_draws(latents, params, args, kwargs, plan), k

    def _mala(self, rng_key, fitted, params, args, kwargs, plan, return_pareto_k):
        """``sample_posterior(method="mala")``
        (:mod:`numpyro_dais.annealed.posterior.mala_draws`): the chains on the full-data
        posterior, their draws shaped, a warning if unsettled."""
        if self._target.supports_subsampling:
            raise ValueError(
                f"{type(self).__name__}: method='mala' runs Metropolis-adjusted chains on the "
                "full-data posterior, which this guide's mini-batch training never evaluates "
                "(a step would cost a pass over all the rows). Use method='importance' or "
                "'psis', whose weights correct the surrogate's dynamics."
            )
        if plan.batch_size is not None or plan.mesh is not None:
            raise ValueError(
                f"{type(self).__name__}: method='mala' runs its {mala_draws.NUM_CHAINS} chains "
                "at once on one device, so `batch_size` and `mesh` do not apply to it; leave "
                "them at None (they bound and split the annealed methods' draws)."
            )
        args, kwargs = self._data(args, kwargs, "mala")
        run = self._compiled(self._mala_program, "mala")
        start = mala_draws.first_start(self.latent_dim, fitted.q0.loc.dtype)
        runs = mala_draws.runs(plan.num_draws)
        names = self._coordinate_names()
        operands = (rng_key, fitted, params, args, kwargs, plan)
        draws, info, rounds = mala_draws.run_rounds(
            lambda start, index: run.run_for(runs, *operands, start, index), start, names
        )
        mala_draws.warn_if_doubtful(type(self).__name__, info, names, rounds)
        return (draws, None) if return_pareto_k else draws

    def _mala_program(self, rng_key, fitted, params, args, kwargs, plan, start, index):
        call = self._bind(fitted, args, kwargs)
        z, info, following = mala_draws.draw(call, rng_key, plan.num_draws, start, index)
        return self._finish_draws(z, params, args, kwargs, plan), info, following

    def _importance(self, rng_key, fitted, params, args, kwargs, num_systems):
        """:func:`numpyro_dais.annealed.posterior.queries.importance` through the guide's one
        program."""
        program = self._compiled(self._importance_chunk, "importance_chunk")
        return queries.importance(
            program, rng_key, self.K, num_systems, fitted, params, args, kwargs
        )

    def _importance_chunk(self, key_data, fitted, params, args, kwargs) -> queries.Systems:
        z, log_weights = queries.importance_chunk(self._bind(fitted, args, kwargs), key_data)
        return queries.Systems(z, self._constrain(z, params, args, kwargs), log_weights)
