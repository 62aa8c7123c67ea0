"""Every use of NumPyro's private API, in one place (tested with numpyro 0.22).

Each function says why it is needed and what breaks if NumPyro changes it; nothing else in
the package touches a private NumPyro name. ``AutoContinuous`` internals (``_init_latent``,
``_unpack_latent``) and its protected hooks are handed to ours by
:class:`AutoContinuousBridge`.
"""

import contextlib
import functools
import inspect

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.infer import util
from numpyro.infer.autoguide import AutoContinuous, AutoGuide
from numpyro.primitives import _PYRO_STACK, Messenger, _subsample_fn
from numpyro.util import is_prng_key

from numpyro_dais.bridge.checks import check_processes, despite_an_invalid_draw
from numpyro_dais.engine.annealing import minibatch
from numpyro_dais.runtime.vectorise import jit_by_leaves


class SetUpHooks:
    """numpyro's protected ``_setup_prototype`` (it traces the model and fixes the sites and
    the initial point) handed to hooks of ours: ``_check_model(args, kwargs)`` runs before
    it and ``_after_setup(args, kwargs)`` after; ``_set_up_once(args, kwargs)`` runs it on a
    guide's first call; ``init_locs`` is numpyro's ``_init_locs`` (each latent site's
    unconstrained initial value). Renamed upstream: the guides are no longer set up."""

    def _setup_prototype(self, *args, **kwargs):
        check_processes(type(self).__name__)
        self._check_model(args, kwargs)
        with compiled_initialization():
            despite_an_invalid_draw(functools.partial(super()._setup_prototype, *args, **kwargs))
        self._after_setup(args, kwargs)

    def _check_model(self, args, kwargs):
        pass

    def _after_setup(self, args, kwargs):
        pass

    def _set_up_once(self, args, kwargs):
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)

    @property
    def init_locs(self) -> dict:
        return self._init_locs


class AutoGuideBridge(SetUpHooks, AutoGuide):
    """numpyro's ``AutoGuide`` with the set-up hooks of :class:`SetUpHooks`."""


class AutoContinuousBridge(SetUpHooks, AutoContinuous):
    """numpyro's ``AutoContinuous``, its protected hooks handed to hooks of ours, so that no
    other module overrides a private NumPyro name:

    * the set-up, as in :class:`SetUpHooks`;
    * ``_sample_latent`` (the flat latent of a guide call) is ``_latent_sample``;
    * ``_get_posterior`` (the fixed posterior behind numpyro's ``get_posterior``) is
      ``_fixed_posterior``;
    * ``__call__`` emits the sites of the flat latent with ``_emit_sites(latent, args,
      kwargs)`` (numpyro's loop, which maps each site on its own, cannot run a site
      non-centred);
    * ``_init_latent`` and ``_unpack_latent`` are ``_init_point`` and ``_unpack``.

    Renamed upstream: the guides are no longer set up or trained, and every test fails."""

    @property
    def _init_point(self) -> jax.Array:
        """The flat unconstrained initial point ``(D,)`` that
        ``AutoContinuous._setup_prototype`` builds from ``init_loc_fn``."""
        return self._init_latent

    def _unpack(self, z: jax.Array) -> dict:
        """Flat unconstrained ``z (..., D)`` to ``{site: unconstrained value}`` with
        ``AutoContinuous._unpack_latent`` (batch dimensions allowed): the one map between the
        engine's vectors and the model's sites."""
        return self._unpack_latent(z)

    def _sample_latent(self, *args, **kwargs):
        return self._latent_sample(*args, **kwargs)

    def _get_posterior(self):
        return self._fixed_posterior()

    def __call__(self, *args, **kwargs):
        self._set_up_once(args, kwargs)
        latent = self._sample_latent(*args, **kwargs)
        return self._emit_sites(latent, args, kwargs)


@contextlib.contextmanager
def compiled_initialization():
    """numpyro's set-up with its initial point found by one program, not ~150 eager ones
    (most of a new process's ``svi.init`` before): ``find_valid_initial_params`` under
    ``jit`` from the same key (the same point), compiled for one run (``compilation.run_for``,
    its cheap level). If ``initialize_model`` stops
    calling the function of its module, the set-up is only slower."""
    original = util.find_valid_initial_params

    @jit_by_leaves
    def search(rng_key, args, kwargs, items):  # items: the sites in the model's order
        return original(rng_key, *args, prototype_params=dict(items), **kwargs)

    def find_valid_initial_params(rng_key, *args, prototype_params=None, **kwargs):
        if not is_prng_key(rng_key) or not prototype_params:
            return original(rng_key, *args, prototype_params=prototype_params, **kwargs)
        items = list(prototype_params.items())  # a dict's leaves would come back sorted
        (z, energy, grad), is_valid = search.run_for(1, rng_key, args, kwargs, items)
        order = lambda d: d and {k: d[k] for k in prototype_params if k in d}
        return (order(z), energy, order(grad)), is_valid

    util.find_valid_initial_params = find_valid_initial_params
    try:
        yield
    finally:
        util.find_valid_initial_params = original


def unblocked(model):
    """``model`` without the ``handlers.block`` wrappers around it (their ``fn``): the model
    whose sites an ``AutoGuideList`` part hides from the guide."""
    while isinstance(model, handlers.block):
        model = model.fn
    return model


def in_loss() -> bool:
    """Whether the guide runs inside an ELBO (``True``) or under ``Predictive`` (``False``).

    ``Predictive`` runs the guide under ``handlers.mask(mask=False)``, so ``get_mask()`` is
    exactly ``False`` there and ``None``/an array inside a loss. If ``Predictive`` stops
    masking, ``Predictive(model, guide=g)`` would run the sampler's training path: it still
    returns a posterior draw (a weighted end point), not the guide's ``posterior_method``.
    """
    return numpyro.get_mask() is not False


def enclosing_elbo():
    """The numpyro ``ELBO`` object whose loss is calling the guide, or ``None``.

    NumPyro passes the guide neither the objective nor a marker of it, so this walks the
    Python call stack (at trace time only: under ``jit`` the walk happens once per
    compilation) for a frame whose ``self`` is an ``ELBO``. If ``ELBO.loss`` stops being on
    the stack (e.g. the loss moves into a free function), this returns ``None`` and the
    guides that check their objective accept any, as before the check existed.
    """
    return next((local["self"] for local in _elbo_frames()), None)


def enclosing_loss_model():
    """The model that the enclosing ELBO's loss runs (its ``model`` argument), or ``None``.

    It can differ from the model a guide was set up with: e.g. a guide trained on a
    subsampled model, scored by the ELBO of the full-data model. Walks the call stack as
    :func:`enclosing_elbo` does (at trace time only); ``None`` if no ELBO frame with a
    ``model`` is found.
    """
    return next((local["model"] for local in _elbo_frames() if "model" in local), None)


def _elbo_frames():
    """The local variables of the frames on the call stack whose ``self`` is a numpyro
    ``ELBO``, innermost first."""
    from numpyro.infer.elbo import ELBO

    frame = inspect.currentframe()
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), ELBO):
            yield frame.f_locals
        frame = frame.f_back


def in_svi_init() -> bool:
    """Whether the guide runs inside ``SVI.init``, which keeps only the guide's parameter
    sites and the values of its sample sites (to replay the model), never the loss.

    Walks the Python call stack for ``SVI.init``'s frame (eagerly, once per ``SVI.init``).
    If ``SVI.init`` is renamed or stops calling the guide itself, this returns ``False`` and
    the guide runs its bound there as everywhere else: slower set-up, same result.
    """
    from numpyro.infer.svi import SVI

    code = SVI.init.__code__
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def enclosing_trace_values(names) -> dict:
    """Values of the sites ``names`` recorded by the ``handlers.trace`` frames that enclose
    this call (innermost first), read from ``_PYRO_STACK``.

    Inside an ``AutoGuideList`` the sites that a part's model hides (``handlers.block``) are
    drawn earlier by other parts; the dynamics condition on them. If ``_PYRO_STACK`` or
    ``trace.trace`` change, such compositions fail with a clear "hidden sites" error.
    """
    found = {}
    for frame in reversed(_PYRO_STACK):
        if isinstance(frame, handlers.trace):
            found.update(
                {k: frame.trace[k]["value"] for k in names if k in frame.trace and k not in found}
            )
    return found


@contextlib.contextmanager
def isolated():
    """The block with no numpyro handler outside it (``_PYRO_STACK`` emptied, then
    restored): a program compiled inside cannot bake in an outer handler's value (a plate's
    substituted indices) and reuse it on a later call. If ``_PYRO_STACK`` changes
    upstream, compiled ``AutoSemiDAIS`` draws could reuse stale indices."""
    outer = list(_PYRO_STACK)
    _PYRO_STACK.clear()
    try:
        yield
    finally:
        _PYRO_STACK[:] = outer


def subsample_indices(size: int, subsample_size: int, rng_key=None) -> jax.Array:
    """A uniform mini-batch of ``subsample_size`` of ``size`` indices
    (:func:`~numpyro_dais.engine.annealing.minibatch.without_replacement`), with the signature of
    ``numpyro.primitives._subsample_fn``, which draws a subsample plate's indices. The
    guides' plates (:func:`guide_plate_indices`), which the ELBO replays into the model, and
    NS-DAIS's dynamics draw with it."""
    if rng_key is None:
        raise ValueError("Missing random key to generate subsample indices.")
    return minibatch.without_replacement(rng_key, size, subsample_size)


class _FastPlateIndices(Messenger):
    """Draws the indices of a subsample plate opened inside it with :func:`subsample_indices`
    instead of numpyro's ``_subsample_fn`` (a loop of ``B`` sequential steps on CPU, a
    permutation of all ``Nd`` indices elsewhere). Relies on a plate message's ``fn`` being
    called as ``fn(size, subsample_size, rng_key=key)`` when its value is ``None``; if that
    changes, the SL guides' plates fail at their first step."""

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["value"] is None and msg["fn"] is _subsample_fn:
            msg["fn"] = subsample_indices


def guide_plate_indices(name: str, size: int, subsample_size: int) -> jax.Array:
    """Open the plate ``name`` in the guide and return its mini-batch indices (the plate's
    ``_indices``, drawn by :func:`subsample_indices`). ``SVI`` replays a guide plate's
    indices into the model, so the guide's multi-particle bound and the model's own term use
    the same rows. If ``_indices`` is renamed, ``num_particles > 1`` with a subsampled plate
    fails with an ``AttributeError``."""
    with _FastPlateIndices():
        return numpyro.plate(name, size, subsample_size=subsample_size)._indices


class LogWeight(dist.Unit):
    """A ``numpyro.factor`` distribution with a reparameterised ``log_factor``.

    ``dist.Unit`` reports ``has_rsample = False``, so ``TraceGraph_ELBO`` stops the gradient
    of an ordinary guide factor and would silently train on a zero gradient. Declaring
    ``log_factor`` reparameterised keeps it under every numpyro ELBO. If NumPyro's ELBOs
    stop reading ``reparametrized_params``, the test suite's check of the same gradient under
    ``Trace_ELBO`` and ``TraceGraph_ELBO`` fails.
    """

    reparametrized_params = ["log_factor"]


def emit_log_weight(name, log_factor):
    """Guide-side factor (observed auxiliary site): ``Trace_ELBO`` subtracts it, so the ELBO
    changes by ``-log_factor``."""
    unit = LogWeight(log_factor)
    numpyro.sample(name, unit, obs=unit.sample(None), infer={"is_auxiliary": True})


class FixPlates(Messenger):
    """Sets the indices of subsample plates, ``{name: (n,) indices}``; a plate of size ``Nd``
    then scales its sites by ``Nd / n`` (by 1 when ``n = Nd``).

    Relies on the layout of plate messages (``msg["args"] = (size, subsample_size, dim)``,
    ``msg["value"]`` the indices): if it changes, SL-DAIS's final term and NS-DAIS's
    dynamics read the wrong rows, which the test suite's reduction tests of SL-DAIS catch.
    """

    def __init__(self, indices):
        self.indices = indices
        super().__init__()

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.indices:
            msg["value"] = self.indices[msg["name"]]
            msg["args"] = (msg["args"][0], msg["value"].shape[0])


class SurrogateData(FixPlates):
    """Runs a model on the surrogate points of its subsample plate ``name`` (RAND ansatz of
    Jankowiak & Phan 2022).

    Fixes the plate's indices to ``indices (N_s,)``, replaces the outputs of
    ``numpyro.subsample`` by the stored ``rows`` (in call order, so the data set itself is
    never read), and weights every sample site inside the plate by ``weights (N_s,)``
    instead of the plate's ``Nd / N_s``: the log likelihood becomes
    ``ψ̂(z) = Σ_m ω_m log p(ỹ_m | z)``; sites outside the plate (the prior) are untouched.
    With ``rows=None`` it fixes the indices only and records the subsampled rows
    (:attr:`recorded`), which is how the rows are stored at set-up.

    Relies on ``"subsample"`` messages (value, ``kwargs["event_dim"]``), on
    ``msg["cond_indep_stack"]`` frames (``name``, ``dim``) and on ``msg["scale"]``.
    """

    def __init__(self, name, size, indices, rows=None, weights=None):
        self.name, self.size = name, size
        self.rows, self.weights = rows, weights
        self._subsampled = []
        super().__init__({name: indices})

    def __enter__(self):
        self._subsampled = []
        return super().__enter__()

    @property
    def recorded(self):
        # the messages are final once the model has run (plates subsample on postprocess)
        return [msg["value"] for msg in self._subsampled]

    def process_message(self, msg):
        super().process_message(msg)
        if msg["type"] == "subsample":
            if self.rows is not None:
                msg["value"] = self.rows[len(self._subsampled)]
                # already subsampled: with no event_dim every plate leaves the value alone
                msg["kwargs"] = {**msg["kwargs"], "event_dim": None}
            self._subsampled.append(msg)
        elif msg["type"] == "sample" and self.weights is not None:
            frame = next((f for f in msg["cond_indep_stack"] if f.name == self.name), None)
            if frame is not None:
                num = self.weights.shape[0]
                plate_scale = self.size / num if num < self.size else 1.0
                scale = 1.0 if msg["scale"] is None else msg["scale"]
                weights = jnp.reshape(self.weights, (num,) + (1,) * (-frame.dim - 1))
                msg["scale"] = weights * (scale / plate_scale)


def loc_scale_base(fn):
    """The ``dist.Normal`` behind ``fn``'s ``expand``/``to_event`` wrappers, or ``None``."""
    while isinstance(fn, dist.ExpandedDistribution | dist.Independent):
        fn = fn.base_dist
    return fn if type(fn) is dist.Normal else None


class NonCentre(Messenger):
    """Runs the latent sites named in ``noise`` (``{name: u}``, Normal sites) non-centred:
    the site takes the value ``loc + scale · u`` from the ``loc`` and ``scale`` of its
    distribution in this run (``LocScaleReparam(0)`` of Gorinova et al. 2020, without
    renaming the site), and :attr:`log_scale` records ``log scale`` broadcast to the site's
    shape, ``log |∂value/∂u|`` per element.

    Sets a sample message's ``value`` before the sample primitive runs, and reads the
    distribution's ``loc`` and ``scale`` behind ``ExpandedDistribution``/``Independent``: if
    these change, the guides' non-centred set-up gives another log joint than numpyro's own
    ``LocScaleReparam``, which the test suite compares.
    """

    def __init__(self, fn=None, noise=None):
        self.noise = dict(noise or {})
        self.log_scale = {}
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] != "sample" or msg["name"] not in self.noise or msg["is_observed"]:
            return
        base = loc_scale_base(msg["fn"])
        u = self.noise[msg["name"]]
        msg["value"] = base.loc + base.scale * u
        self.log_scale[msg["name"]] = jnp.broadcast_to(jnp.log(base.scale), jnp.shape(u))


class Unobserve(Messenger):
    """Sample the named observed sites from their distributions instead of observing them
    (the posterior predictive of ``to_inference_data``). Rewrites a sample message's
    ``value`` and ``is_observed`` fields before the sample primitive runs: if their meaning
    changes, the export's ``posterior_predictive`` group holds the observations instead of
    draws, which its test catches."""

    def __init__(self, fn, names):
        self.names = set(names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.names and msg["is_observed"]:
            msg["value"], msg["is_observed"] = None, False
