"""The one NumPyro adapter over the annealing samplers.

:class:`AnnealedGuide` owns ``q0`` and the annealing parameters as ``numpyro.param`` sites,
a target (:mod:`numpyro_dais.annealed.targets`: what the dynamics follow and what the final weight
uses) and a sampler (:mod:`numpyro_dais.engine.samplers`: DAIS or SMC). ``AutoDAIS``,
``AutoDSMCS``, ``AutoSurrogateLikelihoodDAIS`` and ``AutoSurrogateLikelihoodDSMCS`` are
presets of it that only choose the target and the sampler.

References: Geffner & Domke (2021); Zhang et al. (2021); Zenn & Bamler (2024), DAIS₀, and
(2023), DSMCS; Jankowiak & Phan (2022), SL-DAIS.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais.annealed import options, sampling, setup, targets
from numpyro_dais.annealed.checking import SelfCheckingGuide
from numpyro_dais.annealed.options import Annealing, Resampling
from numpyro_dais.annealed.posterior import queries, selfcheck
from numpyro_dais.annealed.posterior.selfcheck import (
    CHAIN_MEAN_TOL,
    CHAIN_STD_RATIO_TOL,
    MEAN_SHIFT_TOL,
    STD_RATIO_TOL,
)
from numpyro_dais.bridge.checks import (
    check_batch_size,
    check_choice,
    check_mesh,
    check_positive_int,
)
from numpyro_dais.engine import samplers
from numpyro_dais.engine.annealing import dais
from numpyro_dais.results import LogEvidence, SMCDiagnostics, TransitionParams, TransportReport

BASE_DISTS, POSTERIOR_METHODS = options.BASE_DISTS, options.POSTERIOR_METHODS
SAMPLE_METHODS = options.SAMPLE_METHODS
SET_UP_RUNS = setup.SET_UP_RUNS


class AnnealedGuide(SelfCheckingGuide):
    """Annealing from a Gaussian ``q0`` to a target with ``K`` learnt transitions.

    Subclass it with a preset: ``defaults``, the option groups it takes with its defaults,
    and an ``__init__`` that parses the user's options and picks ``target`` (a
    :mod:`numpyro_dais.annealed.targets` object) and DAIS or SMC; the options are documented on
    :class:`~numpyro_dais.AutoDAIS`.
    """

    #: the option groups of a preset, with its defaults (:mod:`numpyro_dais.annealed.options`)
    defaults = (Annealing(noncentre=False),)
    #: the :class:`Annealing` options kept as attributes of the guide (besides the checks')
    _own_options = (
        *("K", "num_particles", "kernel", "base_dist", "eta_init", "eta_max", "gamma_init"),
        *("init_scale", "laplace_init", "noncentre", "posterior_method", "sym_kl_weight"),
    )
    #: refine the Laplace start by Gaussian VI on the start density at set-up (``False``
    #: where that density is the full data's, which a mini-batch guide must not sweep)
    _refine_laplace = True

    def __init__(self, model, target, annealing: Annealing, resampling: Resampling | None = None):
        """``target``: a :mod:`numpyro_dais.annealed.targets` object; ``annealing``, ``resampling``:
        the option groups that :func:`~numpyro_dais.bridge.options.parse` gave a preset
        (``resampling=None``: DAIS, else SMC)."""
        a = options.checked(annealing, type(self).__name__, target.supports_subsampling)
        for name in (*self._own_options, "report_divergences", "self_check", "mesh"):
            setattr(self, name, getattr(a, name))
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
        return targets.build(self._target.bind(self._view, args, kwargs, model_params), key)

    # -- posterior queries: each binds its call, the rooms do the rest ---------------------------

    def sample_posterior(
        self,
        rng_key,
        params,
        *args,
        sample_shape=(),
        method=None,
        batch_size=None,
        mesh=None,
        return_pareto_k=False,
        **kwargs,
    ):
        """Posterior draws, vectorised.

        :param method: ``"q0"`` (DAIS₀: draws of the trained ``q0``; needs no data),
            ``"dais"`` (end points ``z_K`` of the annealing), ``"importance"`` (an end point
            resampled by weight from each system of ``num_particles``), ``"psis"`` (the
            particles of ``S`` such systems pooled and ``S`` resampled by their
            PSIS-smoothed weights) or ``"mala"`` (Metropolis-adjusted Langevin chains from
            ``q0`` draws, preconditioned by ``q0``: the posterior's law in the limit, which
            corrects a ``q0`` too narrow for it; a ``RuntimeWarning`` when the chains had
            not settled; not with a surrogate's or a mini-batch's dynamics, nor with
            ``batch_size`` or ``mesh``). Defaults to the guide's ``posterior_method``. All
            but ``"q0"`` run on the posterior of the data passed here (the training data).
        :param batch_size: draws computed at once (bounds memory); ``None``: all at once.
        :param mesh: a :class:`jax.sharding.Mesh`: the draws (for ``"importance"``, the
            particle systems, one per draw) are split evenly over all its devices, so its
            size must divide the number of draws and ``batch_size``. Same draws as without
            it, for the same key. ``None``: one device.
        :param return_pareto_k: also return the Pareto ``k̂`` of the weights behind the
            draws (``"importance"``: every particle of every system, pooled; ``"dais"``: the
            end points'; ``None`` for ``"q0"``). Above ``min(1 − 1/log10 S, 0.7)`` the draws
            may be far from the posterior, and a ``RuntimeWarning`` says so either way
            (with ``num_particles=1`` the ``"importance"`` and ``"dais"`` draws are the end
            points, and the self-check judges them instead where its chains ran:
            ``self_check``); ``None`` for ``"mala"`` too.
        :return: dict of site values with leading shape ``sample_shape`` (and ``k̂``).
        """
        method = self.posterior_method if method is None else method
        check_choice("method", method, SAMPLE_METHODS)
        plan = self._draw_plan(sample_shape, batch_size, mesh)
        fitted = self._params_from(params)
        if method == "mala":
            return self._mala(rng_key, fitted, params, args, kwargs, plan, return_pareto_k)
        if method != "q0":
            args, kwargs = self._data(args, kwargs, method)
        else:
            self._check_q0_once(params)
        operands = (rng_key, fitted, args, kwargs)
        if method == "importance" and queries.applies(plan.batch_size, plan.mesh, *operands):
            out = self._importance(rng_key, fitted, params, args, kwargs, plan.num_draws)
            draws = self._shape_draws(out.draws, plan)
            k = sampling.pooled_pareto_k(out.log_weights)
        else:
            run = self._compiled(self._sample_posterior)
            runs = queries.runs(self.K, plan.num_draws, plan.batch_size, method)
            draws, k = run.run_for(runs, rng_key, fitted, params, args, kwargs, plan, method)
        if method != "q0":
            resampling, n = self._sampler.resampling is not None, plan.num_draws
            name, N = type(self).__name__, self.num_particles
            judged = self._end_points_judged(params, method)
            queries.warn_about_draws(name, draws, None if judged else k, method, n, N, resampling)
        return (draws, k) if return_pareto_k else draws

    def log_evidence(
        self, rng_key, params, *args, num_particles=1000, batch_size=None, mesh=None, **kwargs
    ) -> LogEvidence:
        """Estimate ``log Z = log p(x)`` from ``num_particles`` weighted particles (in systems
        of at most ``batch_size``), on the full data passed here.

        Returns ``LogEvidence(log_Z, ess, se, pareto_k)``. ``se`` is the standard error of ``log_Z``
        by the delta method on the weights (``se² ≈ (N / ess − 1) / (N − 1)`` for DAIS;
        for SMC the variance estimate of Lee & Whiteley (2018) through each system's
        genealogy, combined over the systems). The estimate is biased low by about
        ``se² / 2`` (Jensen). To compare two models, a difference of ``log_Z`` has standard
        error ``sqrt(se_1² + se_2²)``. Both ``ess`` and ``se`` are estimated from the weights
        themselves, so with an ``ess`` of a few the error bar is itself unreliable: use more
        particles. ``pareto_k`` judges the weights' tail (Vehtari et al. 2024): above
        ``min(1 − 1/log10 S, 0.7)`` (``S`` the particles of one system) the estimate is
        unreliable whatever ``se`` says. ``k̂`` of ``S`` weights is itself noisy (about
        ±0.15 at ``S = 1000``), so past that threshold the estimate is drawn again from four
        times the particles (a fresh sample, whose estimate is returned), and a
        ``RuntimeWarning`` names the fix only when its ``k̂`` is past the threshold too.

        ``mesh``: a :class:`jax.sharding.Mesh`; each system's particles are split evenly over
        all its devices (its size must divide ``num_particles`` and ``batch_size``), and XLA
        partitions the annealing. Same estimate as without it for the same key and
        ``batch_size`` (without ``mesh`` or ``batch_size``, DAIS's particles come from the
        importance draws' compiled program, systems of ``num_particles`` pooled). With
        resampling (SMC) a system spans the devices, so each resampling step gathers its
        weights across them.
        """
        num_particles = check_positive_int("num_particles", num_particles)
        batch_size = check_batch_size(batch_size)
        mesh = check_mesh(type(self).__name__, mesh, num_particles, batch_size)
        fitted = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        resampling = self._sampler.resampling is not None
        evidence = lambda key, n, b: self._log_evidence(
            key, fitted, params, args, kwargs, n, b, mesh
        )
        out = evidence(rng_key, num_particles, batch_size)
        if queries.confirm_heavy_tail(out.pareto_k, num_particles, batch_size, resampling):
            # k̂ of S weights is noisy near its threshold: a fresh sample of CONFIRM × S
            # weights confirms the tail (and warns) or replaces the estimate; one batch
            # stays one batch (the same random stream with or without a mesh)
            if batch_size is not None and batch_size >= num_particles:
                batch_size *= queries.CONFIRM
            num_particles *= queries.CONFIRM
            out = evidence(jax.random.fold_in(rng_key, 1), num_particles, batch_size)
        name = type(self).__name__
        queries.warn_about_evidence(name, out, num_particles, batch_size, resampling)
        return out

    def _log_evidence(self, rng_key, fitted, params, args, kwargs, num_particles, batch_size, mesh):
        """:class:`LogEvidence` of ``num_particles`` weights (no warning)."""
        operands = (rng_key, fitted, args, kwargs)
        if self._sampler.resampling is None and queries.applies(batch_size, mesh, *operands):
            # i.i.d. particles: the importance draws' compiled program, its systems pooled
            systems = math.ceil(num_particles / self.num_particles)
            out = self._importance(rng_key, fitted, params, args, kwargs, systems)
            return sampling.pooled_evidence(out.log_weights, num_particles)
        runs = queries.runs(self.K, num_particles, batch_size)
        return self._compiled(self._bound_call(sampling.log_evidence)).run_for(
            runs, rng_key, fitted, args, kwargs, num_particles, batch_size, mesh
        )

    def diagnostics(self, rng_key, params, *args, num_systems=None, **kwargs) -> SMCDiagnostics:
        """ESS per transition, resampling flags, ``log Ẑ`` and the Pareto ``k̂`` of each
        transition's incremental weights, for fresh particle systems of ``num_particles``,
        on the full data passed here.

        :param params: trained parameters (``svi_result.params``).
        :param num_systems: ``None`` for one system (shapes ``(K,)``, ``(K,)``, ``()``,
            ``(K,)``), or
            an int ``S`` for ``S`` independent systems (a leading ``(S,)`` axis).
        """
        fitted = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        if num_systems is not None:
            num_systems = check_positive_int("num_systems", num_systems)
        diagnose = self._compiled(self._bound_call(sampling.diagnostics))
        return diagnose.run_for(self.K, rng_key, fitted, args, kwargs, num_systems)

    def transition_params(self, params):
        """The learnt β schedule, step sizes, mass matrix and damping ``γ``, as a
        :class:`numpyro_dais.TransitionParams` (:func:`numpyro_dais.transition_params`; plot
        them with :func:`numpyro_dais.plot_transitions`).

        :param params: trained parameters (``svi_result.params``).
        """
        anneal = self._params_from(params).anneal
        return TransitionParams(
            betas=np.asarray(anneal.betas),
            step_sizes=np.asarray(anneal.step_sizes),
            mass=np.asarray(anneal.mass),
            gamma=float(anneal.gamma),
            eta_max=float(self._step_bounds[1]),
            kernel=self.kernel,
            coordinates=self._coordinate_names(),
        )

    def transport_check(
        self,
        rng_key,
        params,
        *args,
        num_samples=2000,
        mean_tol=MEAN_SHIFT_TOL,
        std_ratio_tol=STD_RATIO_TOL,
        chain_mean_tol=CHAIN_MEAN_TOL,
        chain_std_ratio_tol=CHAIN_STD_RATIO_TOL,
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
        ``(1 − ρ²)^{1/4}`` for correlation ``ρ``). The end points are ``K`` short steps
        from ``q0`` and can agree with a ``q0`` too narrow for the posterior, so where the
        dynamics run on the full-data posterior (AutoDAIS, AutoDSMCS) it also runs 256
        Metropolis-adjusted Langevin chains from ``q0`` draws (the ensemble of
        ``sample_posterior(method="mala")``), which leave the posterior invariant: ``q0``'s
        mean must stay within ``chain_mean_tol`` of their draws' sds
        (``chain_mean_shift``) and their std within ``[1 / chain_std_ratio_tol,
        chain_std_ratio_tol]`` times ``q0``'s (``chain_std_ratio``), or within 3 standard
        errors of that ratio where a coordinate's tails make its std noisy. The default
        tolerances were set from a labelled set of fits against NUTS
        (``benchmarks/self_check.py``). With ``warn=True`` a failed check also raises a
        ``UserWarning`` carrying the fix.
        """
        num_samples = check_positive_int("num_samples", num_samples, minimum=2)
        batch_size = check_batch_size(batch_size)
        fitted = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        if queries.applies(batch_size, None, rng_key, fitted, args, kwargs):
            end = self._importance(rng_key, fitted, params, args, kwargs, num_samples).z
        else:
            draw = self._compiled(self._bound_call(sampling.draw), "_draw")
            runs = queries.runs(self.K, num_samples, batch_size)
            end = draw.run_for(
                runs, rng_key, fitted, args, kwargs, "importance", num_samples, batch_size
            )
        check = selfcheck.end_point_check(fitted.affine, fitted.q0, end)
        chains = self._chains(rng_key, fitted, params, args, kwargs)
        return selfcheck.transport_verdict(
            self._subject(),
            check,
            mean_tol,
            std_ratio_tol,
            warn,
            chains,
            chain_mean_tol,
            chain_std_ratio_tol,
        )

    # -- q0 as an explicit posterior (DAIS₀) -----------------------------------------------------

    def get_base_dist(self):
        """The standard normal ``N(0, I_D)`` that :meth:`get_transform` maps to ``q0``."""
        self._check_set_up()
        return dist.Normal(jnp.zeros(self.latent_dim), 1.0).to_event(1)

    def get_transform(self, params):
        """The affine map from :meth:`get_base_dist` to ``q0`` (unconstrained space)."""
        return queries.q0_transform(self._q0_of_z(params))

    def get_posterior(self, params):
        """``q0`` in the unconstrained space, as a NumPyro distribution (a full-rank
        ``MultivariateNormal`` when whitened: a diagonal ``q0`` of ``u`` is one of ``z``)."""
        return queries.q0_distribution(self._q0_of_z(params))

    def median(self, params):
        """Posterior median, as a dict of site values: ``q0``'s mean, constrained, when
        ``posterior_method="q0"`` and no site runs non-centred; else the coordinate-wise
        median of :data:`SUMMARY_DRAWS` draws of ``posterior_method`` on the set-up data
        (fixed seed), so that it agrees with ``sample_posterior``."""
        self._check_set_up()
        if self.posterior_method != "q0" or self._view.noncentred:
            return self._summary(params, lambda x: jnp.nanmedian(x, axis=0))
        return self._transform(self._q0_of_z(params, check=True).loc)

    def quantiles(self, params, quantiles):
        """Posterior quantiles: ``q0``'s marginal normal quantiles, constrained, when
        ``posterior_method="q0"``; else coordinate-wise quantiles of the draws behind
        :meth:`median`.

        :param quantiles: array of quantiles in ``(0, 1)``, e.g. ``[0.05, 0.5, 0.95]``.
        :return: dict of site values with a leading axis over ``quantiles``.
        """
        q = queries.check_quantiles(quantiles)
        self._check_set_up()
        if self.posterior_method != "q0" or self._view.noncentred:
            return self._summary(params, lambda x: jnp.nanquantile(x, jnp.asarray(q), axis=0))
        return self._transform(queries.q0_quantiles(self._q0_of_z(params, check=True), q))


__all__ = ["AnnealedGuide", "init_to_uniform"]
