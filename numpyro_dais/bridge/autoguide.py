"""NumPyro plumbing shared by every guide of this package.

The guides flatten all latent sites into one unconstrained vector (like numpyro's
``AutoContinuous``) and add what numpyro's built-in DAIS guides get wrong:

* the log joint used by the dynamics is rebuilt from the arguments of the *current* call
  and the *current* values of the model's ``numpyro.param`` sites
  (:func:`numpyro_dais.bridge.modelview.log_joint`);
* the weight factor is a reparameterised site, so ``TraceGraph_ELBO`` keeps its gradient
  (:func:`numpyro_dais.bridge.numpyro_private.emit_log_weight`);
* unpacking and constraining draws is vectorised with ``vmap`` and an optional
  ``batch_size``;
* options are fixed at construction, and foreign or missing parameters are refused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions.transforms import biject_to
from numpyro.distributions.util import sum_rightmost
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import helpful_support_errors

from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.checks import (
    check_full_data,
)
from numpyro_dais.bridge.modelview import (
    ModelView,
    hidden_values,
    split,
    subsampled_plates,
    trace_without_sampling,
)
from numpyro_dais.bridge.options import declare
from numpyro_dais.bridge.template import GuideTemplate
from numpyro_dais.engine.annealing import weights
from numpyro_dais.runtime.vectorise import CompiledPrograms, map_batched


def _element_name(site: str, pos: tuple) -> str:
    """The label of element ``pos`` of ``site``'s value, e.g. ``"w[0,1]"`` (``site`` for a
    scalar)."""
    return site + ("[" + ",".join(map(str, pos)) + "]" if pos else "")


class ContinuousGuide(GuideTemplate, CompiledPrograms, numpyro_private.AutoContinuousBridge):
    """Base of the package's guides: a flat unconstrained latent ``z ∈ R^D``.

    Subclasses fill in the hooks of :class:`~numpyro_dais.bridge.template.GuideTemplate` (the
    training call and the skeleton of ``sample_posterior``); this class gives them a
    :class:`ModelView` of the model, its current parameters, vectorised constraining of draws
    and checks of ``params``. A subclass declares its options once, as ``defaults`` (option
    groups, :mod:`numpyro_dais.bridge.options`), and sets them before calling ``__init__``;
    afterwards they are read-only, because compiled samplers and parameter shapes depend on
    them.
    """

    #: whether the guide accepts models with a subsampled plate
    supports_subsampling = False
    #: the option groups of a guide, with its defaults (:mod:`numpyro_dais.bridge.options`)
    defaults = ()
    #: constructor options that are read-only after construction
    _options = ("prefix", "init_loc_fn")

    def __init_subclass__(cls, **kwargs):
        """A guide's options are read-only after construction, and its ``help()`` shows
        every option with the guide's default."""
        super().__init_subclass__(**kwargs)
        declare(cls)
        cls._options = tuple(dict.fromkeys(ContinuousGuide._options + cls._options))

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

    # -- set-up -------------------------------------------------------------------------

    def _after_setup(self, args, kwargs):
        """Once numpyro has traced the model: the :class:`ModelView`, the set-up data, the
        model's own parameters and its plates."""
        model = numpyro_private.unblocked(self.model)
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
            self._unpack,
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

    def _check_model(self, args, kwargs):
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

    def _fixed_posterior(self):
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

    def _check_params(self, params, make_params, optional=()):
        """Every parameter that ``make_params()`` creates, but those named in ``optional``,
        must be in ``params`` with its shape: a ``KeyError`` names the missing ones (as
        numpyro's guides raise), a ``ValueError`` the mis-shaped ones."""
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
        missing = sorted(k for k in expected if k not in params and k not in optional)
        if missing:
            raise KeyError(
                f"{type(self).__name__}: params lack {missing}. Pass the params this guide "
                "was trained with (svi_result.params), from a guide of the same class, "
                "prefix and options."
            )
        wrong = {
            k: (jnp.shape(params[k]), shape)
            for k, shape in expected.items()
            if k in params and jnp.shape(params[k]) != shape
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

    # -- a guide call's sites ----------------------------------------------------------------

    def _emit_sites(self, latent, args, kwargs):
        """One ``Delta`` site per latent site of the flat ``latent (D,)``, its value
        constrained and its ``log_density`` minus the log Jacobian (so that the ELBO's
        ``log p − log q`` is the flat space's), as numpyro's ``AutoContinuous`` does; the
        values of non-centred sites come from a run of the model."""
        values, log_dets, noise = split(self._view, latent)
        if noise:
            run = numpyro_private.NonCentre(noise=noise)
            model = handlers.seed(run(self._view.model), rng_seed=0)
            data = {**hidden_values(self._view), **values, **self._model_params()}
            with handlers.block():
                trace = handlers.trace(handlers.substitute(model, data=data)).get_trace(
                    *args, **kwargs
                )
            values.update({name: trace[name]["value"] for name in noise})
            log_dets.update(run.log_scale)
        result = {}
        for name in self._view.unpack(latent):
            value, log_det = values[name], log_dets[name]
            event_dim = self.prototype_trace[name]["fn"].event_dim
            log_density = 0.0
            if numpyro.get_mask() is not False:
                extra = jnp.ndim(log_det) - jnp.ndim(value) + event_dim
                log_density = -sum_rightmost(log_det, extra)
            delta = dist.Delta(value, log_density=log_density, event_dim=event_dim)
            result[name] = numpyro.sample(name, delta)
        return result

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
            values, _, noise = split(self._view, z)
            run = handlers.substitute(numpyro_private.NonCentre(model, noise), data=values)
            trace = handlers.trace(run).get_trace(*args, **kwargs)
            return {k: site["value"] for k, site in trace.items() if k in keep}

        return map_batched(one, latents, batch_size)

    def _transform(self, z):
        """Flat unconstrained ``z (..., D)`` to constrained latent values; needs no data (the
        guide runs no site non-centred: those need the model, :meth:`_constrain`)."""
        assert not self._view.noncentred
        return {name: self._view.transforms[name](u) for name, u in self._view.unpack(z).items()}

    def _coordinate_names(self):
        """Labels of the flat unconstrained coordinates, e.g. ``["b", "w[0]", "w[1]"]``."""
        index = self._view.unpack(jnp.arange(self.latent_dim))
        names = [""] * self.latent_dim
        for site, idx in index.items():
            idx = np.asarray(idx)
            site = f"{site}_decentered" if site in self._view.noncentred else site
            for pos in np.ndindex(idx.shape):
                names[int(idx[pos])] = _element_name(site, pos)
        return names

    def _value_sites(self):
        """``[(site, shape)]`` of the latent sample sites, in the prototype trace's order."""
        return [
            (name, tuple(jnp.shape(site["value"])))
            for name, site in self.prototype_trace.items()
            if site["type"] == "sample" and not site["is_observed"]
        ]

    def _value_coordinates(self):
        """The names of the flat constrained latent values (e.g. ``"w[0]"``) and the map of
        such a flat ``(M,)`` array to ``{site: array}``."""
        names, sizes = [], []
        for site, shape in self._value_sites():
            sizes.append((site, shape, int(np.prod(shape, dtype=np.int64))))
            for pos in np.ndindex(shape):
                names.append(_element_name(site, pos))

        def unpack(flat):
            flat, out, i = np.asarray(flat), {}, 0
            for site, shape, size in sizes:
                out[site] = np.reshape(flat[i : i + size], shape)
                i += size
            return out

        return names, unpack

    def _coordinate_site_sizes(self) -> np.ndarray:
        """``(D,)`` the number of unconstrained coordinates of each coordinate's site."""
        sizes = np.zeros(self.latent_dim, np.int64)
        for idx in self._view.unpack(jnp.arange(self.latent_dim)).values():
            sizes[np.asarray(idx).ravel()] = np.size(idx)
        return sizes

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
