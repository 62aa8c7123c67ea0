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
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.custom_batching import custom_vmap
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn, helpful_support_errors, log_density
from numpyro.primitives import _PYRO_STACK

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


def jit_by_leaves(fn):
    """``jax.jit`` for functions of arbitrary arguments: array leaves are traced, every other
    leaf (ints, strings, …) is static. Compilations are cached per static configuration, so
    repeated ``sample_posterior`` calls do not re-trace the sampler."""
    cache = {}

    def wrapped(*args, **kwargs):
        leaves, treedef = jax.tree.flatten((args, kwargs))
        is_array = tuple(isinstance(x, (jax.Array, np.ndarray)) for x in leaves)
        static = tuple(x for x, a in zip(leaves, is_array, strict=True) if not a)
        dynamic = [x for x, a in zip(leaves, is_array, strict=True) if a]
        try:
            key = (treedef, is_array, static)
            hash(key)
        except TypeError:  # unhashable static leaf: run without jit
            return fn(*args, **kwargs)
        if key not in cache:

            def call(dynamic):
                dyn, stat = iter(dynamic), iter(static)
                full = [next(dyn) if a else next(stat) for a in is_array]
                a, k = jax.tree.unflatten(treedef, full)
                return fn(*a, **k)

            cache[key] = jax.jit(call)
        return cache[key](dynamic)

    return wrapped


def _warn_nonfinite(guide_name, step_info, num_nonfinite, num_particles):
    n, total = int(num_nonfinite), int(num_particles)
    msg = (
        f"{guide_name}: {n} of {total} particle trajectories diverged (non-finite weight, or "
        "an energy error far beyond a stable integrator's) and were dropped from the bound; "
        "their gradients were zeroed."
    )
    if n >= total:
        msg += " All particles diverged: the loss is not finite. " + (step_info or "")
        msg += (
            " If training ran well before this, the learning rate may have thrown the "
            "parameters off: lower it, or run SVI with `stable_update=True`."
        )
    warnings.warn(msg, RuntimeWarning, stacklevel=2)


def warn_from_jit(warn_fn, counts, total, values=()):
    """Call the host function ``warn_fn(*counts, total, *values)`` from inside jitted code
    when any of the scalar ``counts`` (e.g. diverged particles, out of ``total``) is positive.

    Under ``vmap`` (e.g. ``Trace_ELBO(num_particles=B)``) the batch is reduced first, the
    counts and ``total`` by their sum and ``values`` by their max, so the host is called once
    per step, not once per element (a host callback costs ~0.1-1 ms on CPU even when it does
    not fire).
    """
    args = tuple(jnp.asarray(x) for x in (*counts, total, *values))
    num_summed = len(counts) + 1

    @custom_vmap
    def report(args):
        fire = functools.reduce(jnp.logical_or, [c > 0 for c in args[: num_summed - 1]])
        jax.lax.cond(fire, lambda a: jax.debug.callback(warn_fn, *a), lambda a: None, args)
        return args[0]

    @report.def_vmap
    def report_batched(axis_size, in_batched, args):
        reduced = []
        for i, (x, batched) in enumerate(zip(args, in_batched[0], strict=True)):
            if i < num_summed:
                reduced.append(jnp.sum(x, axis=0) if batched else x * axis_size)
            else:
                reduced.append(jnp.max(x, axis=0) if batched else x)
        report(tuple(reduced))
        return args[0], in_batched[0][0]

    report(args)


def report_nonfinite(guide_name, num_nonfinite, num_particles, step_info=""):
    """Warn from inside jitted code when trajectories diverged; ``step_info`` says what the
    step sizes are and how to fix them (the guide knows, the engine does not)."""
    warn_from_jit(
        functools.partial(_warn_nonfinite, guide_name, step_info), (num_nonfinite,), num_particles
    )


def check_positive_int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")


def check_step_sizes(eta_init, eta_max):
    """``eta_init`` and ``eta_max``: each ``None`` (set from the curvature) or a finite
    positive number, with ``eta_init < eta_max`` when both are given."""
    for name, value in (("eta_init", eta_init), ("eta_max", eta_max)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise TypeError(f"`{name}` must be a number or None, got {type(value).__name__}.")
        if not (np.isfinite(value) and value > 0):
            raise ValueError(
                f"`{name}` must be a finite positive number, got {value!r}; leave it None to "
                "set it from the posterior's curvature."
            )
    if eta_init is not None and eta_max is not None and not eta_init < eta_max:
        raise ValueError(
            f"`eta_init` must lie in (0, eta_max) = (0, {eta_max}), got {eta_init!r}; "
            "raise `eta_max` or lower `eta_init`."
        )


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

    def __init__(
        self,
        model,
        *,
        prefix="auto",
        init_loc_fn=init_to_uniform,
        forward_mode_differentiation=False,
    ):
        super().__init__(
            model,
            prefix=prefix,
            init_loc_fn=init_loc_fn,
            forward_mode_differentiation=forward_mode_differentiation,
        )

    def __getstate__(self):
        state = super().__getstate__()
        return {k: v for k, v in state.items() if not k.startswith("_jit_")}

    # -- set-up -------------------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        self._check_continuous(*args, **kwargs)
        super()._setup_prototype(*args, **kwargs)
        self._setup_joint_model(*args, **kwargs)
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
        return {k: jnp.asarray(params[k]) for k in self._model_param_sites if k in params}

    def _log_joint(self, args, kwargs, model_params, handler=None):
        """``ℓ(z) = log p(x, z)`` for flat unconstrained ``z (D,)``, Jacobians included,
        built from *this* call's data and the *current* model parameters.

        Inside an ``AutoGuideList`` the guide's model hides the sites of the other parts;
        the log joint then conditions on their values drawn earlier in the same guide run.
        ``handler``: an optional numpyro messenger applied to the model's run (inside the
        ``block``), e.g. to reweight likelihood sites for a surrogate log likelihood.
        """
        fixed = self._hidden_site_values()
        inner = handler if handler is not None else contextlib.nullcontext()

        def log_joint(z):
            values, log_det = {}, 0.0
            for name, u in self._unpack_latent(z).items():
                transform = self._transforms[name]
                values[name] = transform(u)
                log_det = log_det + jnp.sum(transform.log_abs_det_jacobian(u, values[name]))
            with handlers.block(), handlers.substitute(data=model_params), inner:
                log_p, _ = log_density(self._joint_model, args, kwargs, {**fixed, **values})
            return log_p + log_det

        return log_joint

    def _check_continuous(self, *args, **kwargs):
        """Refuse discrete latent sites before numpyro tries to enumerate them."""
        with handlers.block():
            trace = handlers.trace(handlers.seed(self.model, rng_seed=0)).get_trace(*args, **kwargs)
        for name, site in trace.items():
            if (
                site["type"] == "sample"
                and not site["is_observed"]
                and getattr(site["fn"].support, "is_discrete", False)
            ):
                raise ValueError(
                    f"{type(self).__name__} cannot handle discrete latent site {name!r} "
                    f"({type(site['fn']).__name__}): its dynamics need gradients. Marginalise "
                    "the site out of the model, or give it its own guide and hide it from "
                    "this one with handlers.block inside an AutoGuideList."
                )

    def _setup_joint_model(self, *args, **kwargs):
        """Find the model behind ``handlers.block`` wrappers and the latent sites it hides."""
        model = self.model
        while isinstance(model, handlers.block):
            model = model.fn
        self._joint_model = model
        self._transforms = {}
        for name, site in self.prototype_trace.items():
            if site["type"] == "sample" and not site["is_observed"]:
                with helpful_support_errors(site):
                    self._transforms[name] = biject_to(site["fn"].support)
        self._hidden_sites = []
        if model is not self.model:
            with handlers.block():
                full = handlers.trace(handlers.seed(model, rng_seed=0)).get_trace(*args, **kwargs)
            self._hidden_sites = [
                name
                for name, site in full.items()
                if site["type"] == "sample"
                and not site["is_observed"]
                and name not in self.prototype_trace
            ]

    def _hidden_site_values(self):
        """Values of hidden sites, read from the trace of the current guide run."""
        if not self._hidden_sites:
            return {}
        found = {}
        for frame in reversed(_PYRO_STACK):
            if isinstance(frame, handlers.trace):
                found.update(
                    {
                        k: frame.trace[k]["value"]
                        for k in self._hidden_sites
                        if k in frame.trace and k not in found
                    }
                )
        missing = [k for k in self._hidden_sites if k not in found]
        if missing:
            raise ValueError(
                f"{type(self).__name__} runs its dynamics on the full model, but sites "
                f"{missing} are hidden from it (handlers.block) and were not drawn earlier in "
                "this guide run. Use it inside an AutoGuideList after the guide for those "
                "sites, or use method='q0', which needs no dynamics."
            )
        return found

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
            values = constrain_fn(
                model, args, kwargs, self._unpack_latent(z), return_deterministic=True
            )
            return {k: v for k, v in values.items() if k in keep}

        return map_batched(one, latents, batch_size)

    def _reshape_draws(self, draws, sample_shape):
        return jax.tree.map(lambda x: jnp.reshape(x, tuple(sample_shape) + x.shape[1:]), draws)

    @staticmethod
    def _num_draws(sample_shape):
        return int(math.prod(sample_shape)) if sample_shape else 1

    def _transform(self, z):
        """Flat unconstrained ``z (..., D)`` to constrained latent values; needs no data."""
        return {name: self._transforms[name](u) for name, u in self._unpack_latent(z).items()}

    def _bound_safe(self, tree):
        """Differentiable inputs of a bound, with non-finite gradient entries zeroed."""
        return weights.zero_nonfinite_grads(tree)
