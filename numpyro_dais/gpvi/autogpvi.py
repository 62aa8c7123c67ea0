"""``AutoGPVI``: generative particle VI as a NumPyro guide.

A generator network ``z = f_θ(ε) = g_θ(ε_{1:k}) + λ ε``, ``ε ~ N(0, I_D)``, is trained
with amortized SVGD (the default) or with the GPVI functional gradient (kernel on noise
space, inverse-transpose Jacobian on the repulsive term). There is no density and no ELBO:
under ``SVI`` the guide emits a surrogate whose gradient is that direction.

References:
  Ratzlaff, Bai, Fuxin & Xu (ICML 2021), "Generative particle variational inference via
  estimation of functional gradients".
  Wang & Liu (2016), "Learning to draw samples: with application to amortized MLE for
  generative adversarial learning" (amortized SVGD).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import optax
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.autoguide import ContinuousGuide
from numpyro_dais.bridge.checks import (
    check_choice,
    check_gpvi_objective,
    check_mesh,
    check_positive_float,
    check_positive_int,
)
from numpyro_dais.bridge.modelview import log_joint
from numpyro_dais.bridge.options import parse
from numpyro_dais.engine.vi import gpvi, networks
from numpyro_dais.runtime.reporting import report_gpvi, warn
from numpyro_dais.runtime.vectorise import map_batched, shard_particles

#: ``"auto"``: the exact solve up to :data:`EXACT_MAX_DIM` latent dimensions, else the helper
JACOBIANS = ("auto", *gpvi.JACOBIANS)
#: ``jacobian="auto"`` solves exactly up to this latent dimension
EXACT_MAX_DIM = 100


class GPVIOptions(NamedTuple):
    """AutoGPVI's options and their defaults, documented on :class:`AutoGPVI`."""

    num_particles: int = 64
    noise_dim: int | None = None
    hidden_dims: tuple = (64,)
    jacobian: str = "auto"
    algorithm: str | None = None
    lambda_init: float = 1.0
    learn_lambda: bool = False
    prefix: str = "auto"
    init_loc_fn: Callable = init_to_uniform
    init_scale: float = 0.1
    helper_hidden: int = 100
    helper_layers: int = 2
    max_helper_rel_loss: float = 100.0
    monitor: str = "ksd"
    num_summary_draws: int = 10_000
    report_divergences: bool = True
    mesh: Any = None


class AutoGPVI(ContinuousGuide):
    """Generative particle VI over all latent sites (a neural sampler, no density).

    Each training call draws ``N = num_particles`` update noises ``ε_i`` and ``N′ = N``
    fresh noises ``ε′_j``, evaluates ``∇ℓ`` at ``z′_j = f_θ(ε′_j)`` and computes the
    direction ``g_i`` of ``algorithm`` (amortized SVGD's by default, or GPVI's:
    :func:`numpyro_dais.engine.vi.gpvi.gpvi_direction`). Under
    ``SVI(model, guide, optax_optimiser, Trace_ELBO())`` one step then applies

    * to θ (generator, and λ when learnable): ``∇_θ (1/N) Σ_i ⟨stop_gradient(g_i), f_θ(ε_i)⟩``;
    * to η (helper): ``∇_η`` of the helper loss ``mean ‖J_f(ε′_j)ᵀ h_η − v_ji‖²`` at the
      current η, with θ fixed;
    * to the model's own ``numpyro.param`` sites: ``−∇ (1/N′) Σ_j ℓ(stop_gradient(z′_j))``.

    *Helper "first".* The paper updates η, then uses the new prediction in ``g_i``. One
    SVI step yields one gradient for all parameters, so here the direction uses the
    prediction of the current η while the same step's gradient updates η: the helper lags
    one step behind (as it does relative to θ in the paper). If the helper's loss is not
    finite or exceeds ``max_helper_rel_loss × mean ‖v‖²`` (``mean ‖v‖²`` is the loss of
    predicting 0), a warning is raised with the loss, that step uses ``J^{-T} v ≈ v / λ``
    instead, and non-finite gradients of η are zeroed.

    *Reported loss.* The value ``SVI`` reports is a convergence monitor, not an ELBO
    (gradients are the GPVI ones via ``x − stop_gradient(x)``): with ``monitor="ksd"`` the
    squared kernel Stein discrepancy (U-statistic, RBF kernel on ``z`` with the median
    bandwidth) of the ``N′`` fresh particles to the posterior — it tends to 0 (noisily,
    it may dip below 0) as the generator converges and is scale-dependent; with
    ``monitor="energy"`` the mean ``−ℓ(z′_j)``, which plateaus at convergence. The model's
    own ``ℓ(z*)`` term in ``Trace_ELBO`` (``z*`` = the first fresh particle, without
    gradient to θ) is cancelled by the guide's factor.

    *Posterior.* ``sample_posterior`` and ``Predictive`` both draw ``f_θ(ε)`` with fresh
    ``ε``. ``median`` and ``quantiles`` are Monte Carlo estimates from
    ``num_summary_draws`` generator draws with a fixed seed (coordinate-wise in the
    unconstrained space, then constrained, like numpyro's ``AutoContinuous``).
    ``get_posterior``/``get_transform`` raise: the generator has no density.

    :param int num_particles: ``N = N′ >= 2`` particles per step.
    :param int noise_dim: ``k`` in ``[1, D]``, the input width of ``g_θ``; default ``D``.
        With ``k < D`` each output past ``k`` keeps the skip term's variance ``λ²``, which
        ``g_θ`` cannot cancel: pair it with ``learn_lambda=True`` for narrow posteriors.
    :param tuple hidden_dims: hidden widths of ``g_θ`` (ReLU); ``()`` is a linear ``g_θ``.
    :param str jacobian: ``"exact"`` (solve with ``jax.jacfwd``, cost ``O(N D³)``),
        ``"helper"`` (helper network) or ``"auto"`` (exact for ``D <= 100``).
    :param str algorithm: ``"gpvi"`` or ``"amortized_svgd"`` (kernel on outputs, ``J ≡ I``).
        Default: ``"amortized_svgd"``, or ``"gpvi"`` when a ``jacobian`` is given (it means
        nothing else). On linear regressions with the default network the GPVI update let
        the particles spread far past the posterior, and further with more steps, where
        amortized SVGD's stayed on it (``method``, its former name, still works with a
        ``FutureWarning``.)
    :param float lambda_init: λ of the skip term ``λ ε`` (paper: 1).
    :param bool learn_lambda: learn λ (positive) as ``{prefix}_lambda``.
    :param float init_scale: scale of the initial output weights of ``g_θ``; the initial
        particles spread about ``init_loc`` by roughly ``λ`` plus this.
    :param int helper_hidden: ``H`` of the helper (reference: 100).
    :param int helper_layers: number of ``Linear(2H→2H)+ReLU`` layers, 1 to 3.
    :param float max_helper_rel_loss: divergence threshold of the helper (see above).
    :param str monitor: the value ``SVI`` reports, ``"ksd"`` or ``"energy"`` (see above).
    :param int num_summary_draws: draws behind ``median`` and ``quantiles``.
    :param bool report_divergences: warn (``RuntimeWarning``) from inside the jitted step
        when particles are non-finite, the helper diverged or a Jacobian was singular. The
        fallbacks apply either way; the host is called only on a step where something went
        wrong; a healthy step pays only tens of µs on CPU for the check.
    :param jax.sharding.Mesh mesh: split both particle sets of a training step (``N``
        update and ``N′ = N`` fresh particles) evenly over the mesh's devices (its size must
        divide ``num_particles``); XLA partitions the step, gathering across devices where
        the kernel couples every pair of particles. Loss and gradients equal the one-device
        run's for the same key. ``sample_posterior`` takes its own ``mesh``. Default
        ``None``: one device.

    Parameters: ``{prefix}_generator_{l}_w/_b``, ``{prefix}_helper_{l}_w/_b`` (``"helper"``
    only) and ``{prefix}_lambda`` (if learnt). The helper usually wants its own learning
    rate: :meth:`split_optimizer`.
    """

    defaults = (GPVIOptions(),)

    def __init__(self, model, *, method=None, **options):
        """Build the guide: the options are AutoGPVI's (``method``: the former name of
        ``algorithm``)."""
        (o,) = parse(type(self), options)
        algorithm = o.algorithm
        if method is not None:
            warn(
                "AutoGPVI's `method` is now `algorithm` (sample_posterior's `method` means "
                "something else); pass algorithm=... instead.",
                FutureWarning,
            )
            algorithm = method
        jacobian, noise_dim, helper_layers = o.jacobian, o.noise_dim, o.helper_layers
        if algorithm is None:
            algorithm = "amortized_svgd" if jacobian == "auto" else "gpvi"
        self.num_particles = check_positive_int("num_particles", o.num_particles, minimum=2)
        self.mesh = check_mesh(type(self).__name__, o.mesh, self.num_particles, None)
        if noise_dim is not None:
            noise_dim = check_positive_int("noise_dim", noise_dim)
        check_choice("jacobian", jacobian, JACOBIANS)
        check_choice("algorithm", algorithm, gpvi.ALGORITHMS)
        check_choice("monitor", o.monitor, gpvi.MONITORS)
        if algorithm == "amortized_svgd" and jacobian != "auto":
            raise ValueError(
                f"`jacobian={jacobian!r}` has no meaning for algorithm='amortized_svgd' "
                "(it takes J ≡ I); leave `jacobian` at 'auto'."
            )
        hidden_dims = tuple(check_positive_int("hidden_dims", h) for h in o.hidden_dims)
        if helper_layers not in (1, 2, 3):
            raise ValueError(f"`helper_layers` must be 1, 2 or 3, got {helper_layers!r}.")
        self.noise_dim = noise_dim
        self.hidden_dims = hidden_dims
        self.jacobian = jacobian
        self.algorithm = algorithm
        self.lambda_init = check_positive_float("lambda_init", o.lambda_init)
        self.learn_lambda = o.learn_lambda
        self.init_scale = check_positive_float("init_scale", o.init_scale)
        self.helper_hidden = check_positive_int("helper_hidden", o.helper_hidden)
        self.helper_layers = helper_layers
        self.max_helper_rel_loss = check_positive_float(
            "max_helper_rel_loss", o.max_helper_rel_loss
        )
        self.monitor = o.monitor
        self.num_summary_draws = check_positive_int("num_summary_draws", o.num_summary_draws)
        self.report_divergences = o.report_divergences
        self._nonfinite_steps = [0]  # steps with non-finite particles, for the warnings
        super().__init__(model, prefix=o.prefix, init_loc_fn=o.init_loc_fn)

    @staticmethod
    def split_optimizer(optimizer, helper_optimizer):
        """``optax.multi_transform``: ``helper_optimizer`` for the helper's parameters
        (names containing ``"_helper_"``), ``optimizer`` for all others. The helper chases
        a moving target and usually needs a smaller, constant learning rate."""
        labels = lambda params: {
            name: "helper" if "_helper_" in name else "rest" for name in params
        }
        return optax.multi_transform({"helper": helper_optimizer, "rest": optimizer}, labels)

    # -- set-up -------------------------------------------------------------------------------

    def _after_setup(self, args, kwargs):
        super()._after_setup(args, kwargs)
        D = self.latent_dim
        k = D if self.noise_dim is None else self.noise_dim
        if not 1 <= k <= D:
            raise ValueError(
                f"`noise_dim` must lie in [1, D] = [1, {D}] for this model (D is the number "
                f"of unconstrained latent dimensions), got {self.noise_dim!r}."
            )
        self._k = k
        if self.algorithm == "amortized_svgd":
            self._jac = None
        elif self.jacobian == "auto":
            self._jac = "exact" if D <= EXACT_MAX_DIM else "helper"
        else:
            self._jac = self.jacobian
        key = numpyro.prng_key()
        key = jax.random.PRNGKey(0) if key is None else key
        key_gen, key_help = jax.random.split(key)
        self._init_generator = networks.generator_init(
            key_gen, k, D, self.hidden_dims, self._init_point, self.init_scale
        )
        self._init_helper = (
            networks.helper_init(key_help, k, D, self.helper_hidden, self.helper_layers)
            if self._jac == "helper"
            else None
        )

    # -- parameters -------------------------------------------------------------------------

    def _layers(self, name, init):
        p = self.prefix
        return [
            (numpyro.param(f"{p}_{name}_{i}_w", w), numpyro.param(f"{p}_{name}_{i}_b", b))
            for i, (w, b) in enumerate(init)
        ]

    def _generator_params(self):
        layers = self._layers("generator", self._init_generator)
        if self.learn_lambda:
            lam = numpyro.param(
                f"{self.prefix}_lambda",
                jnp.asarray(self.lambda_init),
                constraint=constraints.positive,
            )
        else:
            lam = jnp.asarray(self.lambda_init)
        return layers, lam

    def _generator_params_from(self, params):
        self._check_params(params, self._generator_params)
        return self._substituted(self._generator_params, params)

    def _generator(self, layers, lam):
        return lambda eps: networks.generator_apply(layers, lam, eps)

    # -- training call ----------------------------------------------------------------------

    # -- training call (the hooks of ContinuousGuide._latent_sample) ----------------------------

    _weight_site = "gpvi_surrogate"

    def _read_params(self, args, kwargs):
        layers, lam = self._generator_params()
        helper = self._layers("helper", self._init_helper) if self._jac == "helper" else None
        # a diverged helper must not turn the whole update into NaN
        helper = self._bound_safe(helper) if helper is not None else None
        return layers, lam, helper, self._model_params()

    def _posterior_draw(self, rng_key, call, args, kwargs):
        layers, lam = call[:2]  # one fresh draw, as sample_posterior
        return self._generator(layers, lam)(jax.random.normal(rng_key, (self.latent_dim,)))

    def _in_loss(self, call, args, kwargs):
        check_gpvi_objective(type(self).__name__, numpyro_private.enclosing_elbo())
        return call

    def _loss_term(self, rng_key, call, args, kwargs):
        objective = self._one_program_when_eager(self._objective, rng_key)
        return objective(rng_key, *call, args, kwargs)

    def _objective(self, rng_key, layers, lam, helper, model_params, args, kwargs):
        """One particle ``z*`` for the model and the log weight that makes the loss's value
        the monitor and its gradient the surrogate's."""
        N, D = self.num_particles, self.latent_dim
        # both sets of base draws from one call (one generator in the program, not two)
        eps, eps_prime = jax.random.normal(rng_key, (2, N, D))
        out = gpvi.objective(
            self._generator(layers, lam),
            self._generator(*jax.lax.stop_gradient((layers, lam))),
            log_joint(self._view, args, kwargs, model_params),
            shard_particles(eps, self.mesh),
            shard_particles(eps_prime, self.mesh),
            lam=lam,
            algorithm=self.algorithm,
            jacobian=self._jac or "exact",
            helper_layers=helper,
            max_helper_rel_loss=self.max_helper_rel_loss,
            monitor=self.monitor,
        )
        # Trace_ELBO's loss is −ℓ(z*) + factor, with z* = z′_0 handed to the model: the factor
        # cancels ℓ(z*) (value and model-parameter gradient) and leaves value = monitor,
        # gradient = ∇ surrogate. (S − sg(S)) is formed first: added to ℓ(z*) before the
        # subtraction, a large S would swallow the monitor's digits.
        # z* is a particle with a finite ℓ where there is one, so the loss stays finite.
        zero_with_grad = out.surrogate - jax.lax.stop_gradient(out.surrogate)
        star = jnp.argmax(jnp.isfinite(out.log_joint))
        factor = (out.log_joint[star] + out.monitor) + zero_with_grad
        if self.report_divergences:  # adds 0.0: the loss keeps the check in the program
            factor += report_gpvi(
                type(self).__name__,
                self._jac == "helper",
                self._nonfinite_steps,
                out.num_nonfinite,
                out.direction,
                N,
            )
        return out.z_prime[star], factor

    # -- posterior access -------------------------------------------------------------------

    def _draw(self, rng_key, params, num_draws, batch_size=None, mesh=None):
        """``num_draws`` flat unconstrained draws ``f_θ(ε)``: ``(S, D)``."""
        f = self._generator(*self._generator_params_from(params))
        eps = jax.random.normal(rng_key, (num_draws, self.latent_dim))
        return map_batched(f, eps, batch_size, mesh)

    def sample_posterior(
        self, rng_key, params, *args, sample_shape=(), batch_size=None, mesh=None, **kwargs
    ):
        """Fresh generator draws, constrained to the supports (deterministic sites included).

        :param batch_size: draws computed at once (bounds memory); ``None``: all at once.
        :param mesh: a :class:`jax.sharding.Mesh`: the draws (each chunk of ``batch_size``)
            are split evenly over its devices; its size must divide their number.
        :return: dict of site values with leading shape ``sample_shape``.
        """
        plan = self._draw_plan(sample_shape, batch_size, mesh)
        latents = self._draw(rng_key, params, plan.num_draws, plan.batch_size, plan.mesh)
        return self._finish_draws(latents, params, args, kwargs, plan)

    def _summary_draws(self, params):
        return self._draw(jax.random.PRNGKey(0), params, self.num_summary_draws)

    def median(self, params):
        """Coordinate-wise median of ``num_summary_draws`` draws (fixed seed), constrained."""
        return self._transform(jnp.median(self._summary_draws(params), axis=0))

    def quantiles(self, params, quantiles):
        """Coordinate-wise quantiles of ``num_summary_draws`` draws (fixed seed), constrained.

        :return: dict of site values with leading shape ``jnp.shape(quantiles)``.
        """
        q = jnp.quantile(self._summary_draws(params), jnp.asarray(quantiles), axis=0)
        return self._transform(q)

    def get_transform(self, params):
        """Not available: the generator is not a bijection. Raises ``NotImplementedError``."""
        raise NotImplementedError(
            "AutoGPVI's generator is a neural network without a density or bijective "
            "transform; use sample_posterior(rng_key, params) to draw from it."
        )

    def get_posterior(self, params):
        """Not available: the generator has no density. Raises ``NotImplementedError``."""
        raise NotImplementedError(
            "AutoGPVI has no explicit posterior distribution (an implicit generator); use "
            "sample_posterior(rng_key, params) to draw from it."
        )

    def _fixed_posterior(self):
        self.get_posterior(None)
