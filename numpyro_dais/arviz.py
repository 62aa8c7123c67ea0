"""Export a trained guide to ArviZ (``pip install numpyro-dais[arviz]``).

``az.from_numpyro`` converts MCMC runs only (arviz-devs/arviz#2453); :func:`to_inference_data`
does the same for the guides of this package (and any NumPyro autoguide with
``sample_posterior``), so that ``az.summary``, ``az.loo`` and ``az.compare`` work on them.
"""

import inspect
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from numpyro import handlers
from numpyro.infer import log_likelihood as numpyro_log_likelihood

from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.modelview import partial_plates, substituted_plates


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


def _stack(trees):
    """``{name: (C, S, ...)}`` from one ``{name: (S, ...)}`` per chain."""
    return {k: np.stack([np.asarray(t[k]) for t in trees]) for k in trees[0]}


def arviz_version() -> tuple[int, ...]:
    """The installed ArviZ's version as a tuple of ints, e.g. ``(0, 23, 4)`` or ``(1, 3, 0)``;
    ``ImportError`` (naming the extra) without ArviZ."""
    try:
        import arviz as az
    except ImportError as err:
        raise ImportError(
            "to_inference_data needs ArviZ: `pip install numpyro-dais[arviz]` (or `pip "
            "install arviz`)."
        ) from err
    return tuple(int(p) for p in az.__version__.split(".")[:3] if p.isdigit())


def _from_dict(groups, dims, attrs):
    """ArviZ's container of ``groups`` (each ``{name: array}``): ``InferenceData`` for ArviZ
    0.x, an xarray ``DataTree`` for 1.x. ``attrs`` go to the root and to the posterior."""
    import arviz as az

    if arviz_version() < (1,):
        data = az.from_dict(**groups, dims=dims, attrs=attrs)
        data.posterior.attrs.update(attrs)
        return data
    return az.from_dict(groups, dims=dims, attrs={"/": attrs, "posterior": attrs})


def _as_list(value, name):
    if isinstance(value, Mapping):
        return [value]
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0:
        return list(value)
    raise TypeError(f"`{name}` must be a dict of parameters or a non-empty list of them.")


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
    """ArviZ's data of one or several trained guides: an ``arviz.InferenceData`` with ArviZ
    0.x, an xarray ``DataTree`` with ArviZ 1.x (same groups, dims and attributes).

    Groups: ``posterior`` (``num_samples`` draws of ``guide.sample_posterior`` per chain,
    deterministic sites included), ``log_likelihood`` (pointwise, per observed site: what
    ``az.loo`` and ``az.compare`` need), ``observed_data`` and, if asked for,
    ``posterior_predictive``. Deterministic sites are recomputed by ``model`` from the
    latent draws. Dimensions are named after the model's plates.

    **Chains.** ``params`` is one fit's parameters (one chain) or a list of independent
    fits' parameters, one chain each: e.g. ``svi.run`` with ``C`` different keys, or
    :func:`~numpyro_dais.run_chains`. Then ``az.summary`` reports ``r_hat`` and the bulk/tail
    ESS over the fits, as for MCMC chains: ``r_hat`` well above 1.01 says the fits disagree
    (one did not converge, or they found different modes), which one fit's draws cannot
    show. Several draw sets of one fit would always agree, and are not offered. ``guide`` is
    the guide they were trained with, or a list of guides, one per entry of ``params``
    (guides set up separately).

    **Attributes** (of the data and of its posterior): ``inference_library``, ``guide``,
    ``posterior_method``, ``num_chains``; for guides with ``log_evidence``, ``log_Z``, its
    standard error ``log_Z_se``, the ``log_Z_ess`` of ``evidence_particles`` weighted
    particles and ``log_Z_particles``, plus ``log_Z_pareto_k``, the Pareto ``k̂`` of those
    weights, where ``log_evidence`` returns one (``pareto_k``). With one chain they are
    numbers; with several, lists with one entry per chain (each fit has its own evidence
    estimate: compare them, or pool them yourself).

    :param guide: a trained guide (``AutoDAIS``, ``AutoSurrogateLikelihoodDAIS``,
        ``AutoDSMCS``, ``AutoGPVI``, or a NumPyro autoguide), or a list of them, one per
        chain.
    :param params: trained parameters (``svi_result.params``), or a list of them, one per
        chain.
    :param args: the model's arguments, data included (as for ``log_evidence``).
    :param int num_samples: posterior draws ``S`` per chain; every group has shape
        ``(C, S, ...)``.
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
    arviz_version()  # ImportError naming the extra, before any work
    params = [dict(p) for p in _as_list(params, "params")]
    guides = [guide] * len(params) if not isinstance(guide, Sequence) else list(guide)
    if len(guides) != len(params):
        raise ValueError(f"{len(guides)} guides for {len(params)} sets of parameters.")
    num_chains = len(params)
    rng_key = jax.random.key(0) if rng_key is None else rng_key
    chain_keys = [rng_key] if num_chains == 1 else list(jax.random.split(rng_key, num_chains))

    options = dict(
        num_samples=num_samples,
        method=method,
        log_likelihood=log_likelihood,
        posterior_predictive=posterior_predictive,
        evidence_particles=evidence_particles,
        model=model,
        batch_size=batch_size,
    )
    with substituted_plates():  # a plate's indices may be fixed to all its members
        chains = [
            _one_chain(g, p, k, args, kwargs, **options)
            for g, p, k in zip(guides, params, chain_keys, strict=True)
        ]
    first = chains[0]
    groups = {
        "posterior": _stack([c["posterior"] for c in chains]),
        "observed_data": {k: np.asarray(v) for k, v in first["observed"].items()},
    }
    for group in ("log_likelihood", "posterior_predictive"):
        if group in first:
            groups[group] = _stack([c[group] for c in chains])

    names = {type(g).__name__ for g in guides}
    attrs = {
        "inference_library": "numpyro",
        "guide": names.pop() if len(names) == 1 else [type(g).__name__ for g in guides],
        "num_chains": num_chains,
    }
    if "posterior_method" in first:
        attrs["posterior_method"] = first["posterior_method"]
    for name in first.get("evidence", {}):
        values = [c["evidence"][name] for c in chains]
        attrs[name] = values[0] if num_chains == 1 else values
    return _from_dict(groups, first["dims"], attrs)


def _one_chain(
    guide,
    params,
    rng_key,
    args,
    kwargs,
    *,
    num_samples,
    method,
    log_likelihood,
    posterior_predictive,
    evidence_particles,
    model,
    batch_size,
):
    """One fit's groups (``(S, ...)`` arrays), dims and evidence attributes."""
    model = guide.model if model is None else model
    key_post, key_pred, key_ev = jax.random.split(rng_key, 3)

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
    subsampled = list(partial_plates(trace))
    if subsampled and (log_likelihood or posterior_predictive):
        raise ValueError(
            f"The model subsamples plate(s) {subsampled}: the log likelihood and observed data "
            "would cover one mini-batch. Pass the full-data model, e.g. "
            "`to_inference_data(guide, params, X, y, model=full_model)`, or fix the plate's "
            "indices to all members: `with handlers.substitute(data={plate: jnp.arange(N)}):`."
        )
    observed = {n: s["value"] for n, s in trace.items() if _is_sample(s) and s["is_observed"]}
    latents = {n: v for n, v in draws.items() if n in trace and _is_sample(trace[n])}

    def replay(key, latent):
        """Deterministic sites (and new observations) of one draw, with this model."""
        run = _with_latents(model, latent)
        if posterior_predictive:
            run = numpyro_private.Unobserve(run, observed)
        tr = handlers.trace(handlers.seed(run, key)).get_trace(*args, **kwargs)
        keep = lambda n, s: s["type"] == "deterministic" or (posterior_predictive and n in observed)
        return {n: s["value"] for n, s in tr.items() if keep(n, s)}

    replayed = jax.vmap(replay)(jax.random.split(key_pred, num_samples), latents)
    posterior = {**latents, **{n: v for n, v in replayed.items() if n not in observed}}
    dims = {n: _dims(trace, n, np.shape(v)[1:]) for n, v in posterior.items()}
    dims.update({n: _dims(trace, n, np.shape(v)) for n, v in observed.items()})

    out = {"posterior": posterior, "observed": observed, "dims": dims}
    if log_likelihood:
        out["log_likelihood"] = numpyro_log_likelihood(
            model, latents, *args, batch_ndims=1, **kwargs
        )
    if posterior_predictive:
        out["posterior_predictive"] = {n: replayed[n] for n in observed}
    if method is not None or hasattr(guide, "posterior_method"):
        out["posterior_method"] = method or guide.posterior_method
    if evidence_particles and hasattr(guide, "log_evidence"):
        ev = guide.log_evidence(
            key_ev, params, *args, num_particles=evidence_particles, batch_size=batch_size, **kwargs
        )
        out["evidence"] = {
            "log_Z": float(ev.log_Z),
            "log_Z_se": float(ev.se),
            "log_Z_ess": float(ev.ess),
            "log_Z_particles": int(evidence_particles),
        }
        k = getattr(ev, "pareto_k", None)
        if k is not None:
            out["evidence"]["log_Z_pareto_k"] = float(getattr(k, "k", k))
    return out
