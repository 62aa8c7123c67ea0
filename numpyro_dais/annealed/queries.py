"""The posterior queries of the annealed guides: draws, evidence, diagnostics, the transport
check and ``q0`` as an explicit posterior (DAIS₀).

:class:`PosteriorQueries` is a mixin of :class:`numpyro_dais.annealed.guide.AnnealedGuide`: each
public method checks its arguments, reads the guide's
:class:`~numpyro_dais.annealed.sampling.Fitted` parameters once and hands them to
:mod:`numpyro_dais.annealed.sampling`.

References: Geffner & Domke (2021); Zenn & Bamler (2024), DAIS₀.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform, LowerCholeskyAffine

from numpyro_dais.annealed import chunked, sampling
from numpyro_dais.annealed.selfcheck import (
    CHAIN_STD_RATIO_TOL,
    MEAN_SHIFT_TOL,
    STD_RATIO_TOL,
    check_q0_once,
    end_point_check,
    run_chains,
    transport_verdict,
)
from numpyro_dais.bridge.checks import (
    check_batch_size,
    check_choice,
    check_mesh,
    check_positive_int,
)
from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.results import LogEvidence, SMCDiagnostics, TransitionParams, TransportReport
from numpyro_dais.runtime.compilation import annealing_runs

POSTERIOR_METHODS = ("q0", "dais", "importance", "psis")
#: draws behind ``median`` and ``quantiles`` when ``posterior_method`` is not ``"q0"``
SUMMARY_DRAWS = 2000


class PosteriorQueries:
    """Posterior draws, ``log_evidence``, ``diagnostics``, ``transition_params``,
    ``transport_check`` and ``q0`` as a NumPyro distribution, for an annealed guide."""

    def _draw(self, rng_key, fitted, args, kwargs, method, num_draws, batch_size=None, mesh=None):
        """:func:`numpyro_dais.annealed.sampling.draw` of this guide."""
        return sampling.draw(
            self, rng_key, fitted, args, kwargs, method, num_draws, batch_size, mesh
        )

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
            resampled by weight from each system of ``num_particles``) or ``"psis"`` (the
            particles of ``S`` such systems pooled and ``S`` resampled by their
            PSIS-smoothed weights). Defaults to the guide's ``posterior_method``. All but
            ``"q0"`` anneal to the posterior of the data passed here (the training data).
        :param batch_size: draws computed at once (bounds memory); ``None``: all at once.
        :param mesh: a :class:`jax.sharding.Mesh`: the draws (for ``"importance"``, the
            particle systems, one per draw) are split evenly over all its devices, so its
            size must divide the number of draws and ``batch_size``. Same draws as without
            it, for the same key. ``None``: one device.
        :param return_pareto_k: also return the Pareto ``k̂`` of the weights behind the
            draws (``"importance"``: every particle of every system, pooled; ``"dais"``: the
            end points'; ``None`` for ``"q0"``). Above ``min(1 − 1/log10 S, 0.7)`` the draws
            may be far from the posterior, and a ``RuntimeWarning`` says so either way.
        :return: dict of site values with leading shape ``sample_shape`` (and ``k̂``).
        """
        method = self.posterior_method if method is None else method
        check_choice("method", method, POSTERIOR_METHODS)
        plan = self._draw_plan(sample_shape, batch_size, mesh)
        fitted = self._params_from(params)
        if method != "q0":
            args, kwargs = self._data(args, kwargs, method)
        else:
            check_q0_once(self, params)
        operands = (rng_key, fitted, args, kwargs)
        if method == "importance" and chunked.applies(plan.batch_size, plan.mesh, *operands):
            out = chunked.importance(self, rng_key, fitted, params, args, kwargs, plan.num_draws)
            draws = self._shape_draws(out.draws, plan)
            k = sampling.pooled_pareto_k(out.log_weights)
        else:
            run = self._compiled(self._sample_posterior)
            runs = self._annealing_runs(plan.num_draws, plan.batch_size, method)
            draws, k = run.run_for(runs, rng_key, fitted, params, args, kwargs, plan, method)
        if method != "q0":
            n = plan.num_draws
            sampling.warn_if_not_finite(type(self).__name__, draws, method, n)
            S = n * (self.num_particles if method in ("importance", "psis") else 1)
            what = f"the weights behind the {method!r} draws (S = {S})"
            resampling = self._sampler.resampling is not None
            sampling.warn_if_heavy_tailed(type(self).__name__, k, S, what, resampling)
        return (draws, k) if return_pareto_k else draws

    def _annealing_runs(self, num_systems, batch_size=None, method="importance"):
        """The loop bodies a query's program runs
        (:func:`numpyro_dais.runtime.compilation.run_for`): one for ``q0`` draws, else
        :func:`~numpyro_dais.runtime.compilation.annealing_runs`."""
        return 1 if method == "q0" else annealing_runs(self.K, num_systems, batch_size)

    def _sample_posterior(self, rng_key, fitted, params, args, kwargs, plan, method):
        latents, log_w = sampling.weighted_draws(
            self, rng_key, fitted, args, kwargs, method, plan.num_draws, plan.batch_size, plan.mesh
        )
        k = None if log_w is None else sampling.pooled_pareto_k(log_w)
        return self._finish_draws(latents, params, args, kwargs, plan), k

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
        unreliable whatever ``se`` says, and a ``RuntimeWarning`` names the fix.

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
        state = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        operands = (rng_key, state, args, kwargs)
        if self._sampler.resampling is None and chunked.applies(batch_size, mesh, *operands):
            # i.i.d. particles: the importance draws' compiled program, its systems pooled
            systems = math.ceil(num_particles / self.num_particles)
            out = chunked.importance(self, rng_key, state, params, args, kwargs, systems)
            out = sampling.pooled_evidence(out.log_weights, num_particles)
        else:
            runs = self._annealing_runs(num_particles, batch_size)
            out = self._compiled(self._log_evidence).run_for(
                runs, rng_key, state, args, kwargs, num_particles, batch_size, mesh
            )
        resampled = self._sampler.resampling is not None and batch_size is not None
        system = min(batch_size, num_particles) if resampled else num_particles
        sampling.warn_if_heavy_tailed(
            type(self).__name__,
            out.pareto_k,
            system,
            f"log_evidence's weights (S = {system})",
            self._sampler.resampling is not None,
        )
        return out

    def _log_evidence(self, rng_key, fitted, args, kwargs, num_particles, batch_size, mesh=None):
        return sampling.log_evidence(
            self, rng_key, fitted, args, kwargs, num_particles, batch_size, mesh
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
        diagnose = self._compiled(self._diagnostics)
        return diagnose.run_for(self.K, rng_key, fitted, args, kwargs, num_systems)

    def _diagnostics(self, rng_key, fitted, args, kwargs, num_systems):
        return sampling.diagnostics(self, rng_key, fitted, args, kwargs, num_systems)

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
        dynamics run on the full-data posterior (AutoDAIS, AutoDSMCS) it also runs 64
        Metropolis-adjusted Langevin chains of 100 steps from ``q0`` draws, which leave the
        posterior invariant, and their std must stay within ``[1 / chain_std_ratio_tol,
        chain_std_ratio_tol]`` times ``q0``'s (``chain_std_ratio``). The default
        tolerances were set from a labelled set of fits against NUTS
        (``benchmarks/self_check.py``), where no right ``q0`` failed the check. With
        ``warn=True`` a failed check also raises a ``UserWarning`` carrying the fix.
        """
        num_samples = check_positive_int("num_samples", num_samples, minimum=2)
        batch_size = check_batch_size(batch_size)
        fitted = self._params_from(params)
        args, kwargs = self._data(args, kwargs, "importance")
        if chunked.applies(batch_size, None, rng_key, fitted, args, kwargs):
            out = chunked.importance(self, rng_key, fitted, params, args, kwargs, num_samples)
            end = out.z
        else:
            draw = self._compiled(self._draw)
            runs = self._annealing_runs(num_samples, batch_size)
            end = draw.run_for(
                runs, rng_key, fitted, args, kwargs, "importance", num_samples, batch_size
            )
        check = end_point_check(fitted.affine, fitted.q0, end)
        chains = run_chains(self, rng_key, fitted, args, kwargs)
        return transport_verdict(
            self, check, mean_tol, std_ratio_tol, warn, chains, chain_std_ratio_tol
        )

    # -- q0 as an explicit posterior (DAIS₀) -----------------------------------------------------

    def get_base_dist(self):
        """The standard normal ``N(0, I_D)`` that :meth:`get_transform` maps to ``q0``."""
        self._check_set_up()
        return dist.Normal(jnp.zeros(self.latent_dim), 1.0).to_event(1)

    def _q0_of_z(self, params, check=False) -> gaussian.Gaussian:
        """The trained ``q0`` as a Gaussian of the flat unconstrained ``z``; ``check``: used
        as the posterior, so checked once (:mod:`numpyro_dais.annealed.selfcheck`)."""
        fitted = self._params_from(params)
        if check:
            check_q0_once(self, params)
        return sampling.in_z(fitted.affine, fitted.q0)

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

    def _summary_draws(self, params):
        """``(SUMMARY_DRAWS, D)`` draws by ``posterior_method`` on the set-up data (fixed
        seed): what ``median`` and ``quantiles`` summarise when it is not ``"q0"``."""
        args, kwargs = self._setup_args
        args, kwargs = self._data(args, kwargs, self.posterior_method)
        fitted = self._params_from(params)
        method, key = self.posterior_method, jax.random.key(0)
        if method == "importance" and chunked.applies(None, None, key, fitted, args, kwargs):
            return chunked.importance(self, key, fitted, params, args, kwargs, SUMMARY_DRAWS).z
        draw = self._compiled(self._draw)
        runs = self._annealing_runs(SUMMARY_DRAWS, method=method)
        return draw.run_for(runs, key, fitted, args, kwargs, method, SUMMARY_DRAWS)

    def _summary(self, params, reduce):
        """``reduce`` (over the leading axis) of the draws behind :meth:`_summary_draws`, site
        by site: of the flat draws, constrained after (each coordinate's map is monotone),
        or, when sites run non-centred (their values need the model), of the draws'
        values."""
        draws = self._summary_draws(params)
        if not self._view.noncentred:
            return self._transform(reduce(draws))
        if self.posterior_method == "q0":
            check_q0_once(self, params)
        values = self._constrain(draws, params)
        return {name: reduce(values[name]) for name in self._view.transforms}

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
        q = np.asarray(quantiles, dtype=float)
        if not np.all((q > 0) & (q < 1)):
            raise ValueError(
                f"`quantiles` must lie strictly inside (0, 1), got {quantiles!r}; q0 is a "
                "Gaussian, whose 0 and 1 quantiles are infinite."
            )
        self._check_set_up()
        if self.posterior_method != "q0" or self._view.noncentred:
            return self._summary(params, lambda x: jnp.nanquantile(x, jnp.asarray(q), axis=0))
        q0 = self._q0_of_z(params, check=True)
        normal_q = dist.Normal(0.0, 1.0).icdf(jnp.asarray(q))
        return self._transform(q0.loc + normal_q[..., None] * gaussian.marginal_std(q0))
