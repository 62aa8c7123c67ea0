"""Export a trained guide to ArviZ (``pip install numpyro-dais[arviz]``).

``az.from_numpyro`` converts MCMC runs only (arviz-devs/arviz#2453); :func:`to_inference_data`
does the same for the guides of this package (and any NumPyro autoguide with
``sample_posterior``), so that ``az.summary``, ``az.loo`` and ``az.compare`` work on them.
"""

import inspect

import jax
import numpy as np
from numpyro import handlers
from numpyro.infer import log_likelihood as numpyro_log_likelihood
from numpyro.primitives import Messenger


class _Unobserve(Messenger):
    """Sample the named observed sites from their distributions instead of observing them."""

    def __init__(self, fn, names):
        self.names = set(names)
        super().__init__(fn)

    def process_message(self, msg):
        if msg["type"] == "sample" and msg["name"] in self.names and msg["is_observed"]:
            msg["value"], msg["is_observed"] = None, False


def _with_params(model, params):
    """``model`` with its ``numpyro.param`` sites fixed to their values in ``params``."""
    return handlers.substitute(
        model, substitute_fn=lambda msg: params.get(msg["name"]) if msg["type"] == "param" else None
    )


def _with_latents(model, values):
    """``model`` with its latent sample sites fixed to ``values`` (deterministic sites are
    recomputed, observed sites stay observed)."""

    def fn(msg):
        if _is_sample(msg) and not msg["is_observed"]:
            return values.get(msg["name"])
        return None

    return handlers.substitute(model, substitute_fn=fn)


def _is_sample(site):
    return site["type"] == "sample"


def _dims(trace, name, shape):
    """ArviZ dims of a site value of ``shape`` (no draw axis): plate names where the model's
    plates give them, ``<name>_dim_<i>`` elsewhere."""
    site = trace[name]
    dims = [f"{name}_dim_{i}" for i in range(len(shape))]
    event_dim = site["fn"].event_dim if site["type"] == "sample" else 0
    num_batch = len(shape) - event_dim
    for frame in site.get("cond_indep_stack", []):
        i = num_batch + frame.dim
        if 0 <= i < num_batch and shape[i] == frame.size:
            dims[i] = frame.name
    return dims


def _arrays(tree, chain=True):
    return {k: np.asarray(v)[None] if chain else np.asarray(v) for k, v in tree.items()}


def to_inference_data(
    guide,
    params,
    *args,
    num_samples=1000,
    method=None,
    rng_key=None,
    log_likelihood=True,
    posterior_predictive=False,
    evidence_particles=1000,
    model=None,
    batch_size=None,
    **kwargs,
):
    """An ``arviz.InferenceData`` of a trained guide.

    Groups: ``posterior`` (``num_samples`` draws of ``guide.sample_posterior``, one chain,
    deterministic sites included), ``log_likelihood`` (pointwise, per observed site: what
    ``az.loo`` and ``az.compare`` need), ``observed_data`` and, if asked for,
    ``posterior_predictive``. Deterministic sites are recomputed by ``model`` from the
    latent draws. Dimensions are named after the model's plates. For guides with
    ``log_evidence`` the attributes (of the ``InferenceData`` and of its posterior) hold
    ``log_Z``, its standard error ``log_Z_se`` and the ``log_Z_ess`` of
    ``evidence_particles`` weighted particles.

    :param guide: a trained guide (``AutoDAIS``, ``AutoSurrogateLikelihoodDAIS``,
        ``AutoDSMCS``, ``AutoGPVI``, or a NumPyro autoguide).
    :param dict params: trained parameters (``svi_result.params``).
    :param args: the model's arguments, data included (as for ``log_evidence``).
    :param int num_samples: posterior draws ``S``; every group has shape ``(1, S, ...)``.
    :param str method: ``sample_posterior``'s ``method`` (``"q0"``, ``"dais"``,
        ``"importance"``); ``None``: the guide's default.
    :param rng_key: a JAX key; ``None``: ``jax.random.key(0)``.
    :param bool log_likelihood: compute the ``log_likelihood`` group.
    :param bool posterior_predictive: draw the observed sites anew for each posterior draw.
    :param int evidence_particles: particles of ``log_evidence`` (``0``: leave it out).
    :param model: the model to evaluate the likelihood with; default ``guide.model``. A
        guide trained on mini-batches (a subsampled plate) needs the full-data model here.
    :param int batch_size: draws (and particles) computed at once; ``None``: all at once.
    :param kwargs: the model's keyword arguments.
    """
    try:
        import arviz as az
    except ImportError as err:
        raise ImportError(
            "to_inference_data needs ArviZ: `pip install numpyro-dais[arviz]` (or `pip "
            "install arviz`)."
        ) from err
    model = guide.model if model is None else model
    rng_key = jax.random.key(0) if rng_key is None else rng_key
    key_post, key_pred, key_ev = jax.random.split(rng_key, 3)
    params = dict(params)

    accepts = inspect.signature(guide.sample_posterior).parameters
    options = {"sample_shape": (num_samples,)}
    if "batch_size" in accepts:
        options["batch_size"] = batch_size
    if method is not None:
        if "method" not in accepts:
            raise TypeError(f"{type(guide).__name__}.sample_posterior has no `method`.")
        options["method"] = method
    draws = guide.sample_posterior(key_post, params, *args, **options, **kwargs)

    model = _with_params(model, params)
    first = {k: v[0] for k, v in draws.items()}
    trace = handlers.trace(handlers.seed(_with_latents(model, first), 0)).get_trace(*args, **kwargs)
    subsampled = [
        n
        for n, s in trace.items()
        if s["type"] == "plate" and s["args"][1] not in (None, s["args"][0])
    ]
    if subsampled and (log_likelihood or posterior_predictive):
        raise ValueError(
            f"The model subsamples plate(s) {subsampled}: the log likelihood and observed data "
            "would cover one mini-batch. Pass the full-data model, e.g. "
            "`to_inference_data(guide, params, X, y, model=full_model)`."
        )
    observed = {n: s["value"] for n, s in trace.items() if _is_sample(s) and s["is_observed"]}
    latents = {n: v for n, v in draws.items() if n in trace and _is_sample(trace[n])}

    def replay(key, latent):
        """Deterministic sites (and new observations) of one draw, with this model."""
        run = _with_latents(model, latent)
        if posterior_predictive:
            run = _Unobserve(run, observed)
        tr = handlers.trace(handlers.seed(run, key)).get_trace(*args, **kwargs)
        keep = lambda n, s: s["type"] == "deterministic" or (posterior_predictive and n in observed)
        return {n: s["value"] for n, s in tr.items() if keep(n, s)}

    replayed = jax.vmap(replay)(jax.random.split(key_pred, num_samples), latents)
    posterior = {**latents, **{n: v for n, v in replayed.items() if n not in observed}}
    dims = {n: _dims(trace, n, np.shape(v)[1:]) for n, v in posterior.items()}
    dims.update({n: _dims(trace, n, np.shape(v)) for n, v in observed.items()})

    groups = {"posterior": _arrays(posterior), "observed_data": _arrays(observed, chain=False)}
    if log_likelihood:
        ll = numpyro_log_likelihood(model, latents, *args, batch_ndims=1, **kwargs)
        groups["log_likelihood"] = _arrays(ll)
    if posterior_predictive:
        groups["posterior_predictive"] = _arrays({n: replayed[n] for n in observed})

    attrs = {"inference_library": "numpyro", "guide": type(guide).__name__}
    if method is not None or hasattr(guide, "posterior_method"):
        attrs["posterior_method"] = method or guide.posterior_method
    if evidence_particles and hasattr(guide, "log_evidence"):
        ev = guide.log_evidence(
            key_ev, params, *args, num_particles=evidence_particles, batch_size=batch_size, **kwargs
        )
        attrs.update(
            log_Z=float(ev.log_Z),
            log_Z_se=float(ev.se),
            log_Z_ess=float(ev.ess),
            log_Z_particles=int(evidence_particles),
        )
    idata = az.from_dict(**groups, dims=dims, attrs=attrs)
    idata.posterior.attrs.update(attrs)
    return idata
