"""``AutoDAIS``: differentiable annealed importance sampling with an N-particle bound.

References:
  Geffner & Domke (2021), "MCMC variational inference via uncorrected Hamiltonian annealing".
  Zhang et al. (2021), "Differentiable annealed importance sampling and the perils of
  gradient noise".
  Zenn & Bamler (2023), "Differentiable annealed importance sampling minimizes the
  symmetrized KL divergence between initial and target distribution" (DAIS₀).
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
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
    emit_log_weight,
    jit_by_leaves,
    map_batched,
    report_nonfinite,
)
from numpyro_dais.engine import dais, gaussian, weights
from numpyro_dais.engine.annealing import betas_from_increments
from numpyro_dais.engine.transitions import KERNELS, Potential

POSTERIOR_METHODS = ("q0", "dais", "importance")


class LogEvidence(NamedTuple):
    """Result of :meth:`AutoDAIS.log_evidence`: an AIS estimate of ``log Z`` and its ESS."""

    log_Z: jax.Array
    """``()`` AIS estimate of ``log Z = log p(x)`` (log-mean-exp of the weights)."""
    ess: jax.Array
    """``()`` effective sample size of those weights, in ``[1, num_particles]``."""


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
    :param float eta_init: initial step size, in ``(0, eta_max)``.
    :param float eta_max: upper bound of the learnable step sizes.
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
        eta_init=0.01,
        eta_max=0.1,
        gamma_init=0.9,
        prefix="auto",
        init_loc_fn=init_to_uniform,
        init_scale=0.1,
        posterior_method="q0",
        report_divergences=True,
        forward_mode_differentiation=False,
    ):
        check_positive_int("K", K)
        check_positive_int("num_particles", num_particles)
        check_choice("kernel", kernel, KERNELS)
        check_choice("base_dist", base_dist, ("diagonal", "cholesky"))
        check_choice("posterior_method", posterior_method, POSTERIOR_METHODS)
        if not eta_max > 0:
            raise ValueError(f"`eta_max` must be positive, got {eta_max!r}.")
        if not 0 < eta_init < eta_max:
            raise ValueError(
                f"`eta_init` must lie in (0, eta_max) = (0, {eta_max}), got {eta_init!r}; "
                "raise `eta_max` or lower `eta_init`."
            )
        if not 0 < gamma_init < 1:
            raise ValueError(f"`gamma_init` must lie in (0, 1), got {gamma_init!r}.")
        if not init_scale > 0:
            raise ValueError(f"`init_scale` must be positive, got {init_scale!r}.")
        self.K = K
        self.num_particles = num_particles
        self.kernel = kernel
        self.base_dist = base_dist
        self.eta_init = eta_init
        self.eta_max = eta_max
        self.gamma_init = gamma_init
        self.posterior_method = posterior_method
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
        step_sizes = numpyro.param(
            f"{p}_step_size",
            jnp.full(K, self.eta_init),
            constraint=constraints.interval(0.0, self.eta_max),
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

    def _guide_params_from(self, params):
        """The guide's parameters from an SVI ``params`` dict (NumPy arrays accepted)."""
        params = {k: jnp.asarray(v) for k, v in params.items()}
        return handlers.substitute(self._guide_params, data=params)()

    # -- the engine --------------------------------------------------------------------------

    def _potential(self, q0, args, kwargs, model_params) -> Potential:
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
        q0, anneal = self._guide_params()
        model_params = self._model_params()
        if numpyro.get_mask() is False:
            # Not inside a loss (e.g. ``Predictive``): draw as ``sample_posterior`` does.
            return self._draw(
                rng_key, q0, anneal, model_params, args, kwargs, self.posterior_method, 1
            )[0]
        q0, anneal, model_params = self._bound_safe((q0, anneal, model_params))
        key_run, key_pick = jax.random.split(rng_key)
        out = self._run_for_bound(key_run, q0, anneal, model_params, args, kwargs)
        if self.report_divergences:
            report_nonfinite(type(self).__name__, out.num_nonfinite, self.num_particles)
        bound = self._log_marginal(out)
        # Hand one particle to the model, picked by its weight (so the model's
        # deterministic sites see a posterior-like draw). The factor makes the ELBO equal
        # the bound exactly: ELBO = ℓ(z*) − (ℓ(z*) − bound).
        idx = jax.random.categorical(key_pick, jax.lax.stop_gradient(out.log_weights))
        emit_log_weight(f"{self.prefix}_log_weight", out.log_final_target[idx] - bound)
        return out.z[idx]

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
