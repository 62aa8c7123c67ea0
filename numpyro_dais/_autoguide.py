"""NumPyro plumbing shared by every guide of this package.

The guides flatten all latent sites into one unconstrained vector (like numpyro's
``AutoContinuous``) and add what numpyro's built-in DAIS guides get wrong:

* the log joint used by the dynamics is rebuilt from the arguments of the *current* call
  and the *current* values of the model's ``numpyro.param`` sites (:func:`log_joint`);
* the weight factor is a reparameterised site, so ``TraceGraph_ELBO`` keeps its gradient
  (:func:`numpyro_dais._numpyro.emit_log_weight`);
* unpacking and constraining draws is vectorised with ``vmap`` and an optional
  ``batch_size``;
* options are fixed at construction, and foreign or missing parameters are refused.
"""

import contextlib
import functools
import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.custom_batching import custom_vmap
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.infer.autoguide import AutoContinuous
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import constrain_fn, helpful_support_errors, log_density

from numpyro_dais import _numpyro
from numpyro_dais._hostcall import host_call
from numpyro_dais.engine import weights
from numpyro_dais.engine.validation import SubsamplingNotSupportedError, check_choice

__all__ = ["check_choice"]  # re-exported for the guides

# -- argument checks ----------------------------------------------------------------------


def check_positive_int(name, value, minimum=1) -> int:
    """``value`` as an ``int >= minimum`` (Python or NumPy integer), else a ``TypeError``
    or ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"`{name}` must be an integer >= {minimum}, got {type(value).__name__} {value!r}."
        )
    if value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def check_positive_float(name, value) -> float:
    """``value`` as a finite ``float > 0``, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__}.")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be a finite positive number, got {value!r}.")
    return float(value)


def check_step_sizes(eta_init, eta_max):
    """``eta_init`` and ``eta_max``: each ``None`` (set from the curvature) or a finite
    positive number, with ``eta_init < eta_max`` when both are given."""
    for name, value in (("eta_init", eta_init), ("eta_max", eta_max)):
        if value is not None:
            try:
                check_positive_float(name, value)
            except ValueError as err:
                raise ValueError(
                    f"{err} Leave it None to set it from the posterior's curvature."
                ) from None
    if eta_init is not None and eta_max is not None and not eta_init < eta_max:
        raise ValueError(
            f"`eta_init` must lie in (0, eta_max) = (0, {eta_max}), got {eta_init!r}; "
            "raise `eta_max` or lower `eta_init`."
        )


def check_sample_shape(sample_shape) -> tuple:
    """``sample_shape`` as a tuple of non-negative ints, else a ``TypeError``/``ValueError``."""
    if isinstance(sample_shape, (int, np.integer)) and not isinstance(sample_shape, bool):
        sample_shape = (sample_shape,)
    try:
        shape = tuple(sample_shape)
    except TypeError:
        raise TypeError(
            f"`sample_shape` must be a tuple of ints, e.g. (1000,), got {sample_shape!r}."
        ) from None
    for n in shape:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(
                f"`sample_shape` must be a tuple of non-negative ints, got {sample_shape!r}."
            )
    return tuple(int(n) for n in shape)


def check_batch_size(batch_size):
    """``None`` or a positive int."""
    return None if batch_size is None else check_positive_int("batch_size", batch_size)


def check_mesh(owner, mesh, total, batch_size, what="num_particles"):
    """``None``, or a :class:`jax.sharding.Mesh` whose size divides both ``total`` items
    along the particle axis and the items computed at once (``batch_size``)."""
    if mesh is None:
        return None
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"{owner}: `mesh` must be None or a jax.sharding.Mesh, got {type(mesh).__name__}."
        )
    m = mesh.size
    size = total if batch_size is None else min(batch_size, total)
    if total % m or size % m:
        fix = f"{what}={math.ceil(total / m) * m}"
        if batch_size is not None:
            fix += f", batch_size={math.ceil(size / m) * m}"
        raise ValueError(
            f"{owner}: a mesh of {m} devices does not divide {what}={total} "
            f"(batch_size={batch_size}): the particle axis is split evenly over the mesh, so "
            f"both must be multiples of {m}, e.g. {fix}; or use a mesh whose size divides them."
        )
    return mesh


def shard_particles(tree, mesh):
    """Place the leading (particle) axis of every array in ``tree`` on all axes of ``mesh``
    (:func:`jax.lax.with_sharding_constraint`); XLA partitions the computation that produces
    them. ``mesh=None``: unchanged."""
    if mesh is None:
        return tree
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


# -- vectorisation and compiled entry points ------------------------------------------------


def map_batched(fn, xs, batch_size=None, mesh=None):
    """``vmap(fn)(xs)``, or ``lax.map`` over chunks of ``batch_size`` to bound memory.
    With a ``mesh``, each chunk's leading axis is split over it (:func:`shard_particles`)."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if batch_size is None or batch_size >= n:
        return shard_particles(jax.vmap(fn)(xs), mesh)
    if mesh is None:
        return jax.lax.map(fn, xs, batch_size=int(batch_size))
    # lax.map(batch_size=b) spelt out, so that each vmapped chunk can be constrained
    b = int(batch_size)
    full = n // b * b
    head = jax.tree.map(lambda x: x[:full].reshape((n // b, b) + x.shape[1:]), xs)
    out = jax.lax.map(lambda x: shard_particles(jax.vmap(fn)(x), mesh), head)
    out = jax.tree.map(lambda x: x.reshape((full,) + x.shape[2:]), out)
    if full == n:
        return out
    tail = shard_particles(jax.vmap(fn)(jax.tree.map(lambda x: x[full:], xs)), mesh)
    return jax.tree.map(lambda a, c: jnp.concatenate([a, c]), out, tail)


def map_chunks(fn, rng_key, total: int, batch_size=None, mesh=None):
    """``fn(key, n)`` returns ``n`` items (leading axis); call it on chunks of at most
    ``batch_size`` with independent keys and concatenate the first ``total`` items. With a
    ``mesh``, each chunk's items are split over it (:func:`shard_particles`)."""
    size = total if batch_size is None else min(int(batch_size), total)
    keys = jax.random.split(rng_key, math.ceil(total / size))
    chunks = jax.lax.map(lambda k: shard_particles(fn(k, size), mesh), keys)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:total], chunks)


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


# -- warnings from inside jitted code ---------------------------------------------------------


def warn_from_jit(warn_fn, counts, total, values=()) -> jax.Array:
    """Call the host function ``warn_fn(*counts, total, *values)`` from inside jitted code
    when any of the scalar ``counts`` (e.g. diverged particles, out of ``total``) is positive.

    Returns a float32 ``0.0`` that the caller **must add to a value the compiled program
    returns** (the loss): the call (:func:`numpyro_dais._hostcall.host_call`) sits inside a
    ``lax.cond``, and XLA keeps it only while its result is used. On CPU the call is an XLA
    FFI custom call, not a JAX host callback, so a step where nothing diverged costs what
    the same step without the check costs (``benchmarks/autodais_vs_numpyro.py``); other
    platforms use ``jax.pure_callback``. Under ``jax.grad`` alone (no value) the check is
    dropped with the value.

    Under ``vmap`` (e.g. ``Trace_ELBO(num_particles=B)``) the batch is reduced first, the
    counts and ``total`` by their sum and ``values`` by their max, so the host is called once
    per step, not once per element (a ``cond`` under ``vmap`` would become a ``select`` and
    call the host on every step).
    """
    args = tuple(jax.lax.stop_gradient(jnp.asarray(x)) for x in (*counts, total, *values))
    num_summed = len(counts) + 1

    @custom_vmap
    def report(args):
        fire = functools.reduce(jnp.logical_or, [c > 0 for c in args[: num_summed - 1]])
        return jax.lax.cond(
            fire,
            lambda a: host_call(warn_fn, a),
            lambda a: jnp.zeros((), jnp.float32),
            args,
        )

    @report.def_vmap
    def report_batched(axis_size, in_batched, args):
        reduced = []
        for i, (x, batched) in enumerate(zip(args, in_batched[0], strict=True)):
            if i < num_summed:
                reduced.append(jnp.sum(x, axis=0) if batched else x * axis_size)
            else:
                reduced.append(jnp.max(x, axis=0) if batched else x)
        return report(tuple(reduced)), False

    return report(args)


def _warn_diverged(guide_name, step_info, num_diverged, num_particles):
    n, total = int(num_diverged), int(num_particles)
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


def report_diverged(guide_name, num_diverged, num_particles, step_info="") -> jax.Array:
    """Warn from inside jitted code when trajectories diverged; ``step_info`` says what the
    step sizes are and how to fix them (the guide knows, the engine does not). Returns the
    ``0.0`` of :func:`warn_from_jit`, to be added to the loss."""
    return warn_from_jit(
        functools.partial(_warn_diverged, guide_name, step_info), (num_diverged,), num_particles
    )


# -- the model, seen from a guide ---------------------------------------------------------------


class ModelView(NamedTuple):
    """What evaluating the model's log joint needs, without the guide object."""

    guide_name: str
    model: Callable  # the model behind any handlers.block wrappers
    unpack: Callable  # flat unconstrained z (..., D) -> {site: unconstrained value}
    transforms: dict  # {site: bijection from unconstrained to the site's support}
    hidden_sites: tuple  # latent sites the guide's model hides (drawn by earlier guides)


def log_joint(view: ModelView, args, kwargs, model_params, handler=None) -> Callable:
    """``z (D,) -> ℓ(z) = log p(x, z)`` in the unconstrained space (Jacobians included),
    built from *this* call's data and the *current* model parameters.

    Inside an ``AutoGuideList`` the guide's model hides the sites of the other parts; the
    log joint then conditions on their values drawn earlier in the same guide run.
    ``handler``: an optional numpyro messenger applied to the model's run (inside the
    ``block``), e.g. to reweight likelihood sites for a surrogate log likelihood.
    """
    fixed = _hidden_values(view)
    inner = handler if handler is not None else contextlib.nullcontext()

    def ell(z):
        values, log_det = {}, 0.0
        for name, u in view.unpack(z).items():
            transform = view.transforms[name]
            values[name] = transform(u)
            log_det = log_det + jnp.sum(transform.log_abs_det_jacobian(u, values[name]))
        with handlers.block(), handlers.substitute(data=model_params), inner:
            log_p, _ = log_density(view.model, args, kwargs, {**fixed, **values})
        return log_p + log_det

    return ell


def _hidden_values(view: ModelView) -> dict:
    if not view.hidden_sites:
        return {}
    found = _numpyro.enclosing_trace_values(view.hidden_sites)
    missing = [k for k in view.hidden_sites if k not in found]
    if missing:
        raise ValueError(
            f"{view.guide_name} runs its dynamics on the full model, but sites {missing} are "
            "hidden from it (handlers.block) and were not drawn earlier in this guide run. "
            "Use it inside an AutoGuideList after the guide for those sites, or use "
            "method='q0', which needs no dynamics."
        )
    return found


def subsampled_plates(trace) -> dict:
    """Plates of ``trace`` that subsample: ``{name: (size, subsample_size)}``."""
    return {
        name: (site["args"][0], site["args"][1])
        for name, site in trace.items()
        if site["type"] == "plate"
        and isinstance(site["args"][1], int)
        and site["args"][0] > site["args"][1]
    }


def check_full_data(guide_name, plates):
    """A guide whose dynamics need all the data refuses subsampled ``plates``."""
    if plates:
        name = next(iter(plates))
        raise SubsamplingNotSupportedError(
            f"{guide_name} does not support data subsampling: it needs the full data set in "
            f"every step, but plate {name!r} "
            f"subsamples {plates[name][1]} of {plates[name][0]} points in this call. Use "
            "numpyro_dais.AutoSurrogateLikelihoodDAIS for mini-batch training, or pass "
            "all the data (no `subsample_size`, or one equal to the plate's size)."
        )


def trace_without_sampling(model, args, kwargs):
    """A trace of ``model`` whose latent sites take values from ``init_to_uniform`` instead of
    being sampled, so improper priors (``dist.ImproperUniform``) need no sampler."""
    # seed inside substitute: the seed handler must give each site its key first
    seeded = handlers.substitute(handlers.seed(model, rng_seed=0), substitute_fn=init_to_uniform)
    with handlers.block():
        return handlers.trace(seeded).get_trace(*args, **kwargs)


# -- the base class ----------------------------------------------------------------------------


class ContinuousGuide(AutoContinuous):
    """Base of the package's guides: a flat unconstrained latent ``z ∈ R^D``.

    Subclasses implement ``_sample_latent`` (what a training call returns) and the
    posterior methods; this class gives them a :class:`ModelView` of the model, its current
    parameters, vectorised constraining of draws and checks of ``params``. Subclasses set
    their options (named in ``_options``) before calling ``__init__``; afterwards they are
    read-only, because compiled samplers and parameter shapes depend on them.
    """

    #: whether the guide accepts models with a subsampled plate
    supports_subsampling = False
    #: constructor options that are read-only after construction
    _options = ("prefix", "init_loc_fn")

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
        self._frozen = True

    def __setattr__(self, name, value):
        if name in self._options and self.__dict__.get("_frozen", False):
            raise AttributeError(
                f"`{name}` of {type(self).__name__} is fixed at construction (its compiled "
                "sampler and its parameters depend on it); build a new guide with "
                f"{type(self).__name__}(model, {name}=...)."
            )
        super().__setattr__(name, value)

    def __getstate__(self):
        state = super().__getstate__()
        return {k: v for k, v in state.items() if not k.startswith("_jit_")}

    # -- set-up -------------------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        self._check_continuous(*args, **kwargs)
        super()._setup_prototype(*args, **kwargs)
        model = self.model
        while isinstance(model, handlers.block):
            model = model.fn
        transforms = {}
        for name, site in self.prototype_trace.items():
            if site["type"] == "sample" and not site["is_observed"]:
                with helpful_support_errors(site):
                    transforms[name] = biject_to(site["fn"].support)
        hidden = ()
        if model is not self.model:
            full = trace_without_sampling(model, args, kwargs)
            hidden = tuple(
                name
                for name, site in full.items()
                if site["type"] == "sample"
                and not site["is_observed"]
                and name not in self.prototype_trace
            )
        self._view = ModelView(
            type(self).__name__,
            model,
            functools.partial(_numpyro.unpack_latent, self),
            transforms,
            hidden,
        )
        # used to compute deterministic sites when sample_posterior is given no data
        self._setup_args = (args, kwargs)
        self._observed_sites = tuple(
            name
            for name, site in self.prototype_trace.items()
            if site["type"] == "sample" and site["is_observed"]
        )
        self._model_param_sites = {
            name: (site["value"], dict(site["kwargs"]))
            for name, site in self.prototype_trace.items()
            if site["type"] == "param"
        }
        self._subsample_plates = subsampled_plates(self.prototype_trace)
        if not self.supports_subsampling:
            check_full_data(type(self).__name__, self._subsample_plates)

    def _check_continuous(self, *args, **kwargs):
        """Refuse discrete latent sites before numpyro tries to enumerate them."""
        for name, site in trace_without_sampling(self.model, args, kwargs).items():
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

    def _get_posterior(self):
        raise NotImplementedError(
            f"{type(self).__name__} is not a fixed distribution; use get_posterior(params)."
        )

    def _check_set_up(self):
        """Posterior methods need the shapes that the first call fixes."""
        if self.prototype_trace is None:
            raise RuntimeError(
                f"{type(self).__name__} is not set up yet: it learns the model's latent "
                "sites on its first call. Run svi.init(rng_key, *data) (or svi.run) first; "
                "to use saved params in a new process, build the guide and call svi.init "
                "with the same data, then pass the saved params."
            )

    def _check_params(self, params, make_params):
        """Every parameter that ``make_params()`` creates must be in ``params`` with its
        shape: a ``KeyError`` names the missing ones (as numpyro's guides raise), a
        ``ValueError`` the mis-shaped ones."""
        self._check_set_up()

        def initial_values():
            with handlers.block(), handlers.trace() as tr, handlers.seed(rng_seed=0):
                make_params()
            return {k: s["value"] for k, s in tr.items() if s["type"] == "param"}

        # traced once per guide and caller, not run: the shapes are fixed at set-up
        attr = f"_param_shapes_{make_params.__qualname__}"
        if attr not in self.__dict__:
            shapes = jax.eval_shape(initial_values)
            self.__dict__[attr] = {k: v.shape for k, v in shapes.items()}
        expected = self.__dict__[attr]
        missing = sorted(k for k in expected if k not in params)
        if missing:
            raise KeyError(
                f"{type(self).__name__}: params lack {missing}. Pass the params this guide "
                "was trained with (svi_result.params), from a guide of the same class, "
                "prefix and options."
            )
        wrong = {
            k: (jnp.shape(params[k]), shape)
            for k, shape in expected.items()
            if jnp.shape(params[k]) != shape
        }
        if wrong:
            raise ValueError(
                f"{type(self).__name__}: params have the wrong shapes {wrong} (got, expected): "
                "they come from a guide with other options (K, base_dist, num_surrogate, ...) "
                "or another model."
            )

    def _substituted(self, make_params, params):
        """``make_params()`` with its ``numpyro.param`` sites set from ``params`` (check them
        first with :meth:`_check_params`)."""
        params = {k: jnp.asarray(v) for k, v in params.items()}
        return handlers.substitute(make_params, data=params)()

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

    def _check_has_observations(self, args, kwargs, method):
        """``method`` anneals to the posterior of the data the guide was trained on: refuse a
        call whose arguments leave an observed site of set-up unobserved (e.g.
        ``Predictive(...)(key, X_new)`` with ``y=None``)."""
        if not self._observed_sites:
            return
        with numpyro.validation_enabled(False):  # only which sites are observed matters
            trace = trace_without_sampling(self._view.model, args, kwargs)
        lost = [k for k in self._observed_sites if k in trace and not trace[k].get("is_observed")]
        if lost:
            raise ValueError(
                f"{type(self).__name__}: method={method!r} anneals to the posterior given the "
                f"observations, but this call leaves {lost} unobserved (new inputs without "
                "outputs, as in Predictive(model, guide=...)(key, X_new)). Use "
                "posterior_method='q0' (needs no data), or draw posterior samples with "
                "sample_posterior(key, params, *training_data, method=...) and pass them to "
                "Predictive(model, posterior_samples=...) for new inputs."
            )

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
                model, args, kwargs, self._view.unpack(z), return_deterministic=True
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
        return {name: self._view.transforms[name](u) for name, u in self._view.unpack(z).items()}

    def _coordinate_names(self):
        """Labels of the flat unconstrained coordinates, e.g. ``["b", "w[0]", "w[1]"]``."""
        index = self._view.unpack(jnp.arange(self.latent_dim))
        names = [""] * self.latent_dim
        for site, idx in index.items():
            idx = np.asarray(idx)
            for pos in np.ndindex(idx.shape):
                names[int(idx[pos])] = site + ("[" + ",".join(map(str, pos)) + "]" if pos else "")
        return names

    def _compiled(self, fn, name=None):
        """``jit_by_leaves(fn)``, built once per guide (under ``name``, default
        ``fn.__name__``) so that repeated calls reuse its compilations."""
        attr = f"_jit_{name or fn.__name__}"  # dropped when pickled (``__getstate__``)
        if attr not in self.__dict__:
            self.__dict__[attr] = jit_by_leaves(fn)
        return self.__dict__[attr]

    def _one_program_when_eager(self, fn, rng_key):
        """``fn(rng_key, *args)`` compiled as one program when the guide runs eagerly (a loss
        evaluated outside ``jit`` would otherwise run op by op, each operation compiled on its
        own: seconds for a bound), else ``fn`` itself. Inside, keys the model's plates ask
        numpyro for come from ``rng_key``, not from the seed handler outside (a key drawn in
        a compiled program cannot leave it)."""
        if isinstance(rng_key, jax.core.Tracer):
            return fn

        def seeded(rng_key, *args):
            return handlers.seed(fn, jax.random.fold_in(rng_key, 1))(rng_key, *args)

        return self._compiled(seeded, f"eager{fn.__name__}")

    @staticmethod
    def _bound_safe(tree):
        """Differentiable inputs of a bound, with non-finite gradient entries zeroed."""
        return weights.zero_nonfinite_grads(tree)
