"""NumPyro plumbing shared by every guide of this package.

The guides flatten all latent sites into one unconstrained vector (like numpyro's
``AutoContinuous``) and add what numpyro's built-in DAIS guides get wrong
(``../shared/specs/numpyro-contract.md``):

* the log joint used by the dynamics is rebuilt from the arguments of the *current* call
  and the *current* values of the model's ``numpyro.param`` sites (traps 1 and 2);
* the weight factor is a reparameterised site, so ``TraceGraph_ELBO`` keeps its gradient
  (trap 3);
* unpacking and constraining draws is vectorised with ``vmap`` and an optional
  ``batch_size`` (trap 5).
"""

import contextlib
import math
import warnings
from functools import partial

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform
from numpyro.distributions.transforms import biject_to
from numpyro.infer.util import constrain_fn, helpful_support_errors

from numpyro_dais.engine import weights


class LogWeight(dist.Unit):
    """A ``numpyro.factor`` distribution with a reparameterised ``log_factor``.

    ``dist.Unit`` reports ``has_rsample = False``, so ``TraceGraph_ELBO`` stops the gradient
    of an ordinary guide factor and would silently train on a zero gradient. This subclass
    declares ``log_factor`` reparameterised, so every numpyro ELBO keeps its gradient.
    """

    reparametrized_params = ["log_factor"]


def emit_log_weight(name, log_factor):
    """Guide-side factor: ``Trace_ELBO`` subtracts it, so the ELBO changes by ``-log_factor``."""
    unit = LogWeight(log_factor)
    numpyro.sample(name, unit, obs=unit.sample(None), infer={"is_auxiliary": True})


def map_batched(fn, xs, batch_size=None):
    """``vmap(fn)(xs)``, or ``lax.map`` over chunks of ``batch_size`` to bound memory."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if batch_size is None or batch_size >= n:
        return jax.vmap(fn)(xs)
    return jax.lax.map(fn, xs, batch_size=int(batch_size))


def _warn_nonfinite(guide_name, num_nonfinite, num_particles):
    n, total = int(num_nonfinite), int(num_particles)
    msg = (
        f"{guide_name}: {n} of {total} particle trajectories diverged (non-finite weight) "
        "and were dropped from the bound; their gradients were zeroed."
    )
    if n >= total:
        msg += (
            " All particles diverged: the loss is not finite. Lower `eta_max` / `eta_init` "
            "or `init_scale`, or run SVI with `stable_update=True`."
        )
    warnings.warn(msg, RuntimeWarning, stacklevel=2)


def report_nonfinite(guide_name, num_nonfinite, num_particles):
    """Warn from inside jitted code when trajectories diverged; free when none did."""
    jax.lax.cond(
        num_nonfinite > 0,
        lambda n: jax.debug.callback(partial(_warn_nonfinite, guide_name), n, num_particles),
        lambda n: None,
        num_nonfinite,
    )


def check_positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)}, got {value!r}.")


class ContinuousGuide(AutoContinuous):
    """Base of the package's guides: a flat unconstrained latent ``z ∈ R^D``.

    Subclasses implement ``_sample_latent`` (what a training call returns) and the
    posterior methods; this class gives them the current log joint ``ℓ(z)``,
    the model's current parameters, and vectorised constraining of draws.
    """

    #: whether the guide accepts models with a subsampled plate
    supports_subsampling = False

    def __init__(self, model, *, prefix="auto", init_loc_fn=init_to_uniform,
                 forward_mode_differentiation=False):
        super().__init__(model, prefix=prefix, init_loc_fn=init_loc_fn,
                         forward_mode_differentiation=forward_mode_differentiation)

    # -- set-up -------------------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        # used to compute deterministic sites when sample_posterior is given no data
        self._setup_args = (args, kwargs)
        self._model_param_sites = {
            name: (site["value"], dict(site["kwargs"]))
            for name, site in self.prototype_trace.items()
            if site["type"] == "param"
        }
        self._subsample_plates = {
            name: (site["args"][0], site["args"][1])
            for name, site in self.prototype_trace.items()
            if site["type"] == "plate"
            and isinstance(site["args"][1], int)
            and site["args"][0] > site["args"][1]
        }
        if self._subsample_plates and not self.supports_subsampling:
            name = next(iter(self._subsample_plates))
            raise ValueError(
                f"{type(self).__name__} needs the full data set in every step, but plate "
                f"{name!r} subsamples {self._subsample_plates[name][1]} of "
                f"{self._subsample_plates[name][0]} points. Use "
                "numpyro_dais.AutoSurrogateLikelihoodDAIS for mini-batch training, or "
                "remove `subsample_size`."
            )

    def _get_posterior(self):
        raise NotImplementedError(
            f"{type(self).__name__} is not a fixed distribution; use get_posterior(params)."
        )

    # -- the model's current state --------------------------------------------------------

    def _model_params(self):
        """Current values of the model's ``numpyro.param`` sites.

        Registered in the guide under their own names and constraints, so that SVI's
        ``substitute`` hands the guide the same values it hands the model.
        """
        return {
            name: numpyro.param(name, value, **kw)
            for name, (value, kw) in self._model_param_sites.items()
        }

    def _model_params_from(self, params):
        return {k: params[k] for k in self._model_param_sites if k in params}

    def _log_joint(self, args, kwargs, model_params, handler=None):
        """``ℓ(z) = log p(x, z)`` for flat unconstrained ``z (D,)``, Jacobians included,
        built from *this* call's data and the *current* model parameters.

        ``handler``: an optional numpyro messenger applied to the model's run (inside the
        ``block``), e.g. to reweight likelihood sites for a surrogate log likelihood.
        """
        potential_fn = self._potential_fn_gen(*args, **kwargs)

        def log_joint(z):
            with (
                handlers.block(),
                handlers.substitute(data=model_params),
                handler if handler is not None else contextlib.nullcontext(),
            ):
                return -potential_fn(self._unpack_latent(z))

        return log_joint

    # -- draws in the model's space -----------------------------------------------------------

    def _constrain(self, latents, params, args=(), kwargs=None, batch_size=None):
        """Flat unconstrained draws ``(S, D)`` to a dict of constrained values ``(S, ...)``,
        deterministic sites included (computed from this call's data)."""
        if not args and not kwargs:
            args, kwargs = self._setup_args
        model_params = self._model_params_from(params)
        model = handlers.seed(handlers.substitute(self.model, data=model_params), rng_seed=0)
        keep = {
            name
            for name, site in self.prototype_trace.items()
            if (site["type"] == "sample" and not site["is_observed"])
            or site["type"] == "deterministic"
        }

        def one(z):
            values = constrain_fn(model, args, kwargs, self._unpack_latent(z),
                                  return_deterministic=True)
            return {k: v for k, v in values.items() if k in keep}

        return map_batched(one, latents, batch_size)

    def _reshape_draws(self, draws, sample_shape):
        return jax.tree.map(lambda x: jnp.reshape(x, tuple(sample_shape) + x.shape[1:]), draws)

    @staticmethod
    def _num_draws(sample_shape):
        return int(math.prod(sample_shape)) if sample_shape else 1

    def _transform(self, z):
        """Flat unconstrained ``z (..., D)`` to constrained latent values; needs no data."""
        out = {}
        for name, value in self._unpack_latent(z).items():
            site = self.prototype_trace[name]
            with helpful_support_errors(site):
                out[name] = biject_to(site["fn"].support)(value)
        return out

    def _bound_safe(self, tree):
        """Differentiable inputs of a bound, with non-finite gradient entries zeroed."""
        return weights.zero_nonfinite_grads(tree)
