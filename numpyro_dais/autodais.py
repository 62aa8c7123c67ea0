"""``AutoDAIS``: differentiable annealed importance sampling with an N-particle bound.

References:
  Geffner & Domke (2021), "MCMC variational inference via uncorrected Hamiltonian annealing".
  Zhang et al. (2021), "Differentiable annealed importance sampling and the perils of
  gradient noise".
  Zenn & Bamler (2023), "Differentiable annealed importance sampling minimizes the
  symmetrized KL divergence between initial and target distribution" (DAIS₀).
"""

import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform, LowerCholeskyAffine
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais._autoguide import (
    ContinuousGuide,
    check_choice,
    check_positive_int,
    check_step_sizes,
    emit_log_weight,
    jit_by_leaves,
    map_batched,
    report_nonfinite,
)
from numpyro_dais.engine import curvature, dais, dais0, gaussian, weights
from numpyro_dais.engine.annealing import betas_from_increments
from numpyro_dais.engine.transitions import KERNELS, Potential

POSTERIOR_METHODS = ("q0", "dais", "importance")


class LogEvidence(NamedTuple):
    """Result of :meth:`AutoDAIS.log_evidence`: an AIS estimate of ``log Z`` and its ESS."""

    log_Z: jax.Array
    """``()`` AIS estimate of ``log Z = log p(x)`` (log-mean-exp of the weights)."""
    ess: jax.Array
    """``()`` effective sample size of those weights, in ``[1, num_particles]``."""


class TransportReport(NamedTuple):
    """Result of :meth:`AutoDAIS.transport_check`: ``q0`` against the annealed end points."""

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


def _zero(z):
    return jnp.zeros((), z.dtype)


class AutoDAIS(ContinuousGuide):
    """Differentiable AIS guide over all latent sites (uncorrected Hamiltonian annealing).

    Each call draws ``N = num_particles`` particles ``z_0 ~ q0``, moves them through ``K``
    annealed transitions towards the posterior, and, under ``SVI(..., Trace_ELBO())``,
    makes the reported loss equal to minus the importance-weighted bound
    ``L_{N,K} = log (1/N) Σ_i w_i`` (value and gradient). Learnable: ``q0`` (loc and
    diagonal scale or Cholesky factor), the β schedule, ``K`` step sizes, the diagonal mass
    matrix and the damping ``γ`` of the partial momentum refresh.

    After training, ``q0`` itself is the recommended posterior (**DAIS₀**): it fits a
    symmetrised KL, so it covers the posterior better than ordinary VI, and it has a
    density, mean, median and quantiles. ``sample_posterior`` and ``Predictive`` both
    return ``q0`` draws unless ``posterior_method`` says otherwise.

    :param model: a NumPyro model with continuous global latent sites.
    :param int K: number of annealing transitions, ``K >= 1``.
    :param int num_particles: particles ``N >= 1`` inside the bound (``N = 1``: the
        DAIS ELBO, as numpyro's ``AutoDAIS``).
    :param str kernel: ``"hmc"`` (leapfrog + partial momentum refresh) or ``"langevin"``
        (overdamped, unadjusted).
    :param str base_dist: ``"diagonal"`` or ``"cholesky"`` covariance of ``q0``.
    :param float eta_init: initial step size, in ``(0, eta_max)``; default ``eta_max / 10``.
    :param float eta_max: upper bound of the learnable step sizes. Default: set from the
        curvature at the initial point, ``1 / sqrt(λ)`` for HMC and ``1 / λ`` for Langevin
        (half the stability limit of the integrator), with ``λ`` the larger of ``|λ|_max``
        of ``∇²ℓ`` (power iteration at set-up) and ``1 / init_scale²`` (the curvature of
        ``q0``); :attr:`curvature` holds ``λ``.
    :param float gamma_init: initial damping of the momentum refresh, in ``(0, 1)``.
    :param float init_scale: initial standard deviation of ``q0``.
    :param str posterior_method: what ``sample_posterior`` and ``Predictive`` return by
        default: ``"q0"`` (DAIS₀), ``"dais"`` (end points ``z_K``) or ``"importance"``
        (end points resampled by weight within N-particle sets).
    :param bool report_divergences: warn (``RuntimeWarning``) from inside the jitted step
        when trajectories diverge. Diverged particles are always dropped from the bound and
        their non-finite gradients zeroed. The warning is one host callback per step (also
        under ``Trace_ELBO(num_particles=B)``, whose draws are summed into one warning); on
        CPU it costs about 1 ms per step, so switch it off for tiny models once training is
        known to be stable.
    """

    def __init__(
        self,
        model,
        *,
        K=4,
        num_particles=1,
        kernel="hmc",
        base_dist="diagonal",
        eta_init=None,
        eta_max=None,
        gamma_init=0.9,
        prefix="auto",
        init_loc_fn=init_to_uniform,
        init_scale=0.1,
        posterior_method="q0",
        sym_kl_weight=None,
        report_divergences=True,
        forward_mode_differentiation=False,
    ):
        check_positive_int("K", K)
        check_positive_int("num_particles", num_particles)
        check_choice("kernel", kernel, KERNELS)
        check_choice("base_dist", base_dist, ("diagonal", "cholesky"))
        check_choice("posterior_method", posterior_method, POSTERIOR_METHODS)
        check_step_sizes(eta_init, eta_max)
        if not 0 < gamma_init < 1:
            raise ValueError(f"`gamma_init` must lie in (0, 1), got {gamma_init!r}.")
        if not init_scale > 0:
            raise ValueError(f"`init_scale` must be positive, got {init_scale!r}.")
        if sym_kl_weight is None:
            sym_kl_weight = 1.0 if posterior_method == "q0" else 0.0
        if not sym_kl_weight >= 0:
            raise ValueError(
                f"`sym_kl_weight` must be >= 0 (0: q0 trained on the bound alone), "
                f"got {sym_kl_weight!r}."
            )
        self.K = K
        self.num_particles = num_particles
        self.kernel = kernel
        self.base_dist = base_dist
        self.eta_init = eta_init
        self.eta_max = eta_max
        self.curvature = None  # λ of the step-size default, measured at set-up
        self._step_bounds = None  # (eta_init, eta_max) in use, resolved at set-up
        self.gamma_init = gamma_init
        self.posterior_method = posterior_method
        self.sym_kl_weight = float(sym_kl_weight)
        self.report_divergences = report_divergences
        self._init_scale = init_scale
        super().__init__(
            model,
            prefix=prefix,
            init_loc_fn=init_loc_fn,
            forward_mode_differentiation=forward_mode_differentiation,
        )

    # -- parameters -------------------------------------------------------------------------

    def _q0(self) -> gaussian.Gaussian:
        p, D = self.prefix, self.latent_dim
        loc = numpyro.param(f"{p}_z_0_loc", self._init_latent)
        if self.base_dist == "diagonal":
            scale = numpyro.param(
                f"{p}_z_0_scale", jnp.full(D, self._init_scale), constraint=constraints.positive
            )
        else:
            scale = numpyro.param(
                f"{p}_z_0_scale_tril",
                jnp.eye(D) * self._init_scale,
                constraint=constraints.scaled_unit_lower_cholesky,
            )
        return gaussian.Gaussian(loc, scale)

    def _anneal_params(self) -> dais.AnnealParams:
        p, D, K = self.prefix, self.latent_dim, self.K
        increments = numpyro.param(
            f"{p}_beta_increments", jnp.ones(K), constraint=constraints.positive
        )
        # before set-up (params given from outside) the bounds do not matter: substituted
        eta_init, eta_max = self._step_bounds or (0.01, 0.1)
        step_sizes = numpyro.param(
            f"{p}_step_size",
            jnp.full(K, eta_init),
            constraint=constraints.interval(0.0, eta_max),
        )
        if self.kernel == "hmc":
            mass = numpyro.param(f"{p}_mass_matrix", jnp.ones(D), constraint=constraints.positive)
            # Only η/√m enters the position update, so an unnormalised mass matrix would let
            # training undo the `eta_max` cap: keep its geometric mean at 1.
            mass = mass / jnp.exp(jnp.mean(jnp.log(mass)))
            damping = numpyro.param(
                f"{p}_gamma", self.gamma_init, constraint=constraints.interval(0.0, 1.0)
            )
        else:  # the Langevin kernel has no momentum
            mass, damping = jnp.ones(D), jnp.zeros(())
        return dais.AnnealParams(betas_from_increments(increments), step_sizes, mass, damping)

    def _guide_params(self):
        return self._q0(), self._anneal_params()

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

    def _resolve_step_sizes(self, args, kwargs, model_params):
        """Fix ``(eta_init, eta_max)`` at set-up, from the curvature where not given."""
        if self._step_bounds is not None:
            return
        eta_init, eta_max = self.eta_init, self.eta_max
        if eta_max is None:
            q0 = gaussian.Gaussian(self._init_latent, jnp.full(self.latent_dim, self._init_scale))
            key = jax.random.key(0)  # a fixed start: the set-up is deterministic
            potential = self._potential(q0, args, kwargs, model_params, key)
            lam = curvature.max_eigenvalue(key, potential.log_target, self._init_latent)
            try:
                lam = float(lam)
            except jax.errors.ConcretizationTypeError:
                lam = float("nan")  # set up under jit: fall back to the q0 curvature
            if not np.isfinite(lam):
                lam = 0.0
            self.curvature = max(lam, 1.0 / self._init_scale**2)
            eta_max = (
                1.0 / math.sqrt(self.curvature) if self.kernel == "hmc" else 1.0 / self.curvature
            )
            if eta_init is not None and eta_init >= eta_max:
                eta_max = 10.0 * eta_init
        if eta_init is None:
            eta_init = eta_max / 10.0
        self._step_bounds = (float(eta_init), float(eta_max))

    def _guide_params_from(self, params):
        """The guide's parameters from an SVI ``params`` dict (NumPy arrays accepted)."""
        params = {k: jnp.asarray(v) for k, v in params.items()}
        return handlers.substitute(self._guide_params, data=params)()

    # -- the engine --------------------------------------------------------------------------

    def _potential(self, q0, args, kwargs, model_params, rng_key=None) -> Potential:
        """The dynamics' path ends: ``q0`` and the current log joint."""
        return Potential(partial_log_prob(q0), self._log_joint(args, kwargs, model_params))

    def _run(
        self,
        rng_key,
        q0,
        anneal,
        model_params,
        args,
        kwargs,
        num_particles,
        model_supplies_final=False,
    ):
        """Run the sampler. With ``model_supplies_final`` the final term ``ℓ(z_K)`` is left
        out of the weights (the model's own term adds it, saving one evaluation)."""
        potential = self._potential(q0, args, kwargs, model_params)
        return dais.run(
            rng_key,
            q0,
            potential,
            anneal,
            num_particles,
            kernel=self.kernel,
            log_final_target=_zero if model_supplies_final else None,
        )

    def _log_marginal(self, out):
        """The bound's value for one run of :meth:`_run`: ``log (1/N) Σ_i w_i``."""
        return weights.log_mean_exp(out.log_weights)

    # -- training call ----------------------------------------------------------------------------

    def _run_for_bound(self, rng_key, q0, anneal, model_params, args, kwargs):
        """The run inside the loss: ``num_particles`` particles; for ``N = 1`` the model's
        own term of the ELBO supplies the final term of the weight."""
        N = self.num_particles
        return self._run(
            rng_key, q0, anneal, model_params, args, kwargs, N, model_supplies_final=N == 1
        )

    def _sample_latent(self, *args, **kwargs):
        kwargs.pop("sample_shape", None)
        rng_key = numpyro.prng_key()
        model_params = self._model_params()
        self._resolve_step_sizes(args, kwargs, model_params)
        q0, anneal = self._guide_params()
        if numpyro.get_mask() is False:
            # Not inside a loss (e.g. ``Predictive``): draw as ``sample_posterior`` does.
            return self._draw(
                rng_key, q0, anneal, model_params, args, kwargs, self.posterior_method, 1
            )[0]
        q0, anneal, model_params = self._bound_safe((q0, anneal, model_params))
        key_run, key_pick = jax.random.split(rng_key)
        out = self._run_for_bound(key_run, q0, anneal, model_params, args, kwargs)
        if self.report_divergences:
            report_nonfinite(
                type(self).__name__, out.num_nonfinite, self.num_particles, self._step_info()
            )
        bound = self._log_marginal(out)
        objective = bound + self._sym_kl_term(q0, model_params, args, kwargs, out, key_pick)
        # Hand one particle to the model, picked by its weight (so the model's
        # deterministic sites see a posterior-like draw). The factor makes the ELBO equal
        # the bound exactly: ELBO = ℓ(z*) − (ℓ(z*) − bound).
        idx = jax.random.categorical(key_pick, jax.lax.stop_gradient(out.log_weights))
        emit_log_weight(f"{self.prefix}_log_weight", out.log_final_target[idx] - objective)
        return out.z[idx]

    def _sym_kl_term(self, q0, model_params, args, kwargs, out, rng_key):
        """``−(w / K) · J`` with value 0: only its gradient, in ``q0``'s parameters, counts.

        ``J`` estimates ``KL(q0 ‖ p) + KL(p ‖ q0)`` (:func:`engine.dais0.symmetrized_kl`);
        the model's parameters are held fixed in it, and the particles and weights are
        stopped, so the transitions and the model see only the bound.
        """
        if not self.sym_kl_weight:
            return 0.0
        fixed = jax.lax.stop_gradient(model_params)
        potential = self._potential(q0, args, kwargs, fixed, rng_key)
        J = dais0.symmetrized_kl(
            potential.log_q0, potential.log_target, out.z0, out.z, out.log_weights
        )
        return -(self.sym_kl_weight / self.K) * (J - jax.lax.stop_gradient(J))

    # -- posterior access ---------------------------------------------------------------------

    def _draw(
        self, rng_key, q0, anneal, model_params, args, kwargs, method, num_draws, batch_size=None
    ):
        """``num_draws`` flat unconstrained draws ``(S, D)`` by ``method``."""
        if method == "q0":
            return gaussian.sample(rng_key, q0, (num_draws,))
        if method == "dais":
            size = num_draws if batch_size is None else min(int(batch_size), num_draws)
            keys = jax.random.split(rng_key, math.ceil(num_draws / size))
            chunks = jax.lax.map(
                lambda k: (
                    self._run(
                        k, q0, anneal, model_params, args, kwargs, size, model_supplies_final=True
                    ).z
                ),
                keys,
            )
            return chunks.reshape(-1, chunks.shape[-1])[:num_draws]

        def importance(key):
            key_run, key_pick = jax.random.split(key)
            out = self._run(key_run, q0, anneal, model_params, args, kwargs, self.num_particles)
            return out.z[jax.random.categorical(key_pick, out.log_weights)]

        return map_batched(importance, jax.random.split(rng_key, num_draws), batch_size)

    def sample_posterior(
        self, rng_key, params, *args, sample_shape=(), method=None, batch_size=None, **kwargs
    ):
        """Posterior draws, vectorised.

        :param method: ``"q0"`` (DAIS₀: draws of the trained ``q0``; needs no data),
            ``"dais"`` (end points ``z_K`` of the annealing) or ``"importance"`` (an end point
            resampled by weight from each set of ``num_particles``). Defaults to the guide's
            ``posterior_method``.
        :param batch_size: draws computed at once (bounds memory); ``None``: all at once.
        :return: dict of site values with leading shape ``sample_shape``.
        """
        method = self.posterior_method if method is None else method
        check_choice("method", method, POSTERIOR_METHODS)
        if not hasattr(self, "_jit_sample_posterior"):
            self._jit_sample_posterior = jit_by_leaves(self._sample_posterior)
        return self._jit_sample_posterior(
            rng_key, params, args, kwargs, tuple(sample_shape), method, batch_size
        )

    def _sample_posterior(self, rng_key, params, args, kwargs, sample_shape, method, batch_size):
        q0, anneal = self._guide_params_from(params)
        n = self._num_draws(sample_shape)
        latents = self._draw(
            rng_key,
            q0,
            anneal,
            self._model_params_from(params),
            args,
            kwargs,
            method,
            n,
            batch_size,
        )
        return self._reshape_draws(
            self._constrain(latents, params, args, kwargs, batch_size), sample_shape
        )

    def log_evidence(
        self, rng_key, params, *args, num_particles=1000, batch_size=None, **kwargs
    ) -> LogEvidence:
        """AIS estimate of ``log Z = log p(x)`` from ``num_particles`` weighted particles.

        The estimate is biased low by ``O(1/ess)``; the ESS says how far to trust it.
        """
        check_positive_int("num_particles", num_particles)
        if not hasattr(self, "_jit_log_evidence"):
            self._jit_log_evidence = jit_by_leaves(self._log_evidence)
        return self._jit_log_evidence(rng_key, params, args, kwargs, num_particles, batch_size)

    def _log_evidence(self, rng_key, params, args, kwargs, num_particles, batch_size):
        q0, anneal = self._guide_params_from(params)
        model_params = self._model_params_from(params)
        size = num_particles if batch_size is None else min(int(batch_size), num_particles)
        keys = jax.random.split(rng_key, math.ceil(num_particles / size))
        log_w = jax.lax.map(
            lambda k: self._run(k, q0, anneal, model_params, args, kwargs, size).log_weights,
            keys,
        ).reshape(-1)[:num_particles]
        return LogEvidence(weights.log_mean_exp(log_w), weights.ess(log_w))

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

        Learned transitions can *transport* a misplaced ``q0`` to the posterior: the bound
        is then tight and the end points right, but ``q0`` draws are not. This draws
        ``num_samples`` end points (``method="importance"``, so it needs the data) and
        compares each unconstrained coordinate: the mean shift in end-point standard
        deviations must stay below ``mean_tol`` and the std ratio within
        ``[1 / std_ratio_tol, std_ratio_tol]`` (a diagonal ``q0`` fitted by the
        symmetrised KL is narrower than the marginals of a correlated posterior: ratio
        ``(1 − ρ²)^{1/4}`` for correlation ``ρ``). With ``warn=True`` a failed check also
        raises a ``UserWarning`` carrying the fix.
        """
        check_positive_int("num_samples", num_samples, minimum=2)
        q0, anneal = self._guide_params_from(params)
        end = self._draw(
            rng_key,
            q0,
            anneal,
            self._model_params_from(params),
            args,
            kwargs,
            "importance",
            num_samples,
            batch_size,
        )
        check = dais0.transport_check(q0, end)
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
        unpack = lambda x: {k: np.asarray(v) for k, v in self._unpack_latent(x).items()}
        return TransportReport(ok, unpack(shift), unpack(ratio), names[i], message)

    def _coordinate_names(self):
        """Labels of the flat unconstrained coordinates, e.g. ``["b", "w[0]", "w[1]"]``."""
        index = self._unpack_latent(jnp.arange(self.latent_dim))
        names = [""] * self.latent_dim
        for site, idx in index.items():
            idx = np.asarray(idx)
            for pos in np.ndindex(idx.shape):
                label = site + ("[" + ",".join(map(str, pos)) + "]" if pos else "")
                names[int(idx[pos])] = label
        return names

    # -- q0 as an explicit posterior (DAIS₀) ---------------------------------------------------

    def get_base_dist(self):
        """The standard normal ``N(0, I_D)`` that :meth:`get_transform` maps to ``q0``."""
        return dist.Normal(jnp.zeros(self.latent_dim), 1.0).to_event(1)

    def get_transform(self, params):
        """The affine map from :meth:`get_base_dist` to ``q0`` (unconstrained space)."""
        q0, _ = self._guide_params_from(params)
        if gaussian.is_diagonal(q0):
            return AffineTransform(q0.loc, q0.scale, domain=constraints.real_vector)
        return LowerCholeskyAffine(q0.loc, q0.scale)

    def get_posterior(self, params):
        """``q0`` in the unconstrained space, as a NumPyro distribution."""
        q0, _ = self._guide_params_from(params)
        if gaussian.is_diagonal(q0):
            return dist.Normal(q0.loc, q0.scale).to_event(1)
        return dist.MultivariateNormal(q0.loc, scale_tril=q0.scale)

    def median(self, params):
        """Posterior median from ``q0`` (its mean, constrained), as a dict of site values."""
        q0, _ = self._guide_params_from(params)
        return self._transform(q0.loc)

    def quantiles(self, params, quantiles):
        """Posterior quantiles from ``q0`` (marginal normal quantiles, constrained).

        :param quantiles: array of quantiles in ``(0, 1)``, e.g. ``[0.05, 0.5, 0.95]``.
        :return: dict of site values with a leading axis over ``quantiles``.
        """
        q0, _ = self._guide_params_from(params)
        normal_q = dist.Normal(0.0, 1.0).icdf(jnp.asarray(quantiles))
        return self._transform(q0.loc + normal_q[..., None] * gaussian.marginal_std(q0))


def partial_log_prob(q0):
    return lambda z: gaussian.log_prob(q0, z)
