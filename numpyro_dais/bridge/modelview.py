"""The model, seen from a guide: its log joint in the flat unconstrained space, and its plates.

The log joint used by the dynamics is rebuilt from the arguments of the *current* call and
the *current* values of the model's ``numpyro.param`` sites (:func:`log_joint`).
"""

import contextlib
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import log_density

from numpyro_dais.bridge import numpyro_private


class ModelView(NamedTuple):
    """What evaluating the model's log joint needs, without the guide object."""

    guide_name: str
    model: Callable  # the model behind any handlers.block wrappers
    unpack: Callable  # flat unconstrained z (..., D) -> {site: unconstrained value}
    transforms: dict  # {site: bijection from unconstrained to the site's support}
    hidden_sites: tuple  # latent sites the guide's model hides (drawn by earlier guides)
    #: Normal sites whose flat coordinates hold the non-centred noise ``u`` (the site's value
    #: is ``loc + scale · u``, :class:`~numpyro_dais.bridge.numpyro_private.NonCentre`)
    noncentred: tuple = ()


def split(view: ModelView, z):
    """Flat unconstrained ``z (D,)`` to ``(values, log_dets, noise)``: the constrained values
    of the sites mapped on their own (``{site: value}``), ``log |∂value/∂z|`` per element of
    each, and the noise ``{site: u}`` of the non-centred sites, whose values the model's run
    gives (:class:`~numpyro_dais.bridge.numpyro_private.NonCentre`)."""
    values, log_dets, noise = {}, {}, {}
    for name, u in view.unpack(z).items():
        if name in view.noncentred:
            noise[name] = u
            continue
        transform = view.transforms[name]
        values[name] = transform(u)
        log_dets[name] = transform.log_abs_det_jacobian(u, values[name])
    return values, log_dets, noise


def log_joint(view: ModelView, args, kwargs, model_params, handler=None) -> Callable:
    """``z (D,) -> ℓ(z) = log p(x, z)`` in the unconstrained space (Jacobians included),
    built from *this* call's data and the *current* model parameters.

    Inside an ``AutoGuideList`` the guide's model hides the sites of the other parts; the
    log joint then conditions on their values drawn earlier in the same guide run.
    ``handler``: an optional numpyro messenger applied to the model's run (inside the
    ``block``), e.g. to reweight likelihood sites for a surrogate log likelihood.
    """
    fixed = hidden_values(view)
    inner = handler if handler is not None else contextlib.nullcontext()

    def ell(z):
        values, log_dets, noise = split(view, z)
        noncentre = numpyro_private.NonCentre(noise=noise)
        with handlers.block(), handlers.substitute(data=model_params), inner, noncentre:
            log_p, _ = log_density(view.model, args, kwargs, {**fixed, **values})
        log_dets = list(log_dets.values()) + list(noncentre.log_scale.values())
        return log_p + sum(jnp.sum(d) for d in log_dets)

    return ell


def hidden_values(view: ModelView) -> dict:
    if not view.hidden_sites:
        return {}
    found = numpyro_private.enclosing_trace_values(view.hidden_sites)
    missing = [k for k in view.hidden_sites if k not in found]
    if missing:
        raise ValueError(
            f"{view.guide_name} runs its dynamics on the full model, but sites {missing} are "
            "hidden from it (handlers.block) and were not drawn earlier in this guide run. "
            "Use it inside an AutoGuideList after the guide for those sites, or use "
            "method='q0', which needs no dynamics."
        )
    return found


def data_plates(trace) -> dict:
    """Plates of ``trace`` declared with a ``subsample_size`` (``B = Nd`` included):
    ``{name: (Nd, B)}``."""
    return {
        name: tuple(site["args"][:2])
        for name, site in trace.items()
        if site["type"] == "plate" and site["args"][1] is not None
    }


def subsampled_plates(trace) -> dict:
    """The plates of :func:`data_plates` that subsample (``B < Nd``)."""
    return {
        name: (size, b)
        for name, (size, b) in data_plates(trace).items()
        if isinstance(b, int) and b < size
    }


@contextlib.contextmanager
def substituted_plates():
    """Silence numpyro's warning for a plate whose indices are substituted with a set of
    another size than its ``subsample_size`` (a given set of members, or all of them)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "subsample_size does not match", UserWarning)
        yield


def partial_plates(trace) -> dict:
    """Plates whose run covers fewer than all their members (the indices drawn, or
    substituted, e.g. ``handlers.substitute(data={name: jnp.arange(Nd)})`` covers all):
    ``{name: (Nd, len(indices))}``."""
    return {
        name: (site["args"][0], len(site["value"]))
        for name, site in trace.items()
        if site["type"] == "plate" and len(site["value"]) < site["args"][0]
    }


def trace_without_sampling(model, args, kwargs, rng_seed=0, init_fn=init_to_uniform):
    """A trace of ``model`` whose latent sites take values from ``init_fn`` (numpyro's
    ``init_to_uniform`` by default, or e.g. ``init_to_median``) instead of being sampled, so
    improper priors (``dist.ImproperUniform``) need no sampler. The distributions' arguments
    are not validated: the trace is for the model's structure, and an initial value where
    they are invalid (a kernel matrix float32 cannot factorise) is no error of the model."""
    # seed inside substitute: the seed handler must give each site its key first
    seeded = handlers.substitute(handlers.seed(model, rng_seed=rng_seed), substitute_fn=init_fn)
    with handlers.block(), numpyro.validation_enabled(False):
        return handlers.trace(seeded).get_trace(*args, **kwargs)


def hierarchical_normal_sites(model, args, kwargs) -> tuple:
    """Latent ``Normal`` sites whose ``scale`` depends on other latent sites (the members of
    a hierarchy, whose joint density has a funnel when written centred), in model order:
    their scale differs between two traces at different initial points."""
    first, second = (trace_without_sampling(model, args, kwargs, seed) for seed in (0, 1))
    found = []
    for name, site in first.items():
        if site["type"] != "sample" or site["is_observed"] or name not in second:
            continue
        base, other = (numpyro_private.loc_scale_base(t[name]["fn"]) for t in (first, second))
        if base is None or other is None:
            continue
        if not np.array_equal(np.asarray(base.scale), np.asarray(other.scale)):
            found.append(name)
    return tuple(found)
