"""Argument checks shared by the guides: each error names the argument and the fix."""

import math
import os
import sys

import jax
import numpy as np
import numpyro

from numpyro_dais.engine.validation import SubsamplingNotSupportedError, check_choice

__all__ = ["check_choice"]  # re-exported for the guides


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


def check_bool(name, value) -> bool:
    """``value`` as a ``bool`` (Python or NumPy), else a ``TypeError`` naming ``name``."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


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


def check_processes(owner):
    """Several processes joined by ``jax.distributed`` must compile the same programs, since
    the collectives of each program pair up across them; refuse a run whose processes hash
    strings each their own way (``PYTHONHASHSEED`` unset), under which they do not."""
    seed = os.environ.get("PYTHONHASHSEED", "")
    if jax.process_count() == 1 or not sys.flags.hash_randomization or seed.isdigit():
        return
    raise RuntimeError(
        f"{owner}: this run spans {jax.process_count()} processes (jax.distributed), which "
        "must compile the same programs for their collectives to pair up, but Python hashes "
        "strings differently in each (PYTHONHASHSEED is not set), and numpyro's ELBOs sum "
        "the sites' terms in the order of a set of their names: the processes would compile "
        "different programs and compute wrong losses, parameters and draws, with no error. "
        "Fix: start every process with the same PYTHONHASHSEED, e.g. "
        "`PYTHONHASHSEED=0 python train.py` (or in the job's environment)."
    )


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


def check_gpvi_objective(guide_name, elbo):
    """AutoGPVI's loss is a surrogate whose *gradient* is the functional gradient; only
    objectives that average per-draw losses (Trace_ELBO, TraceMeanField_ELBO) keep it so."""
    from numpyro.infer import Trace_ELBO, TraceMeanField_ELBO

    if elbo is None or isinstance(elbo, Trace_ELBO | TraceMeanField_ELBO):
        return
    raise ValueError(
        f"{guide_name} trains under Trace_ELBO (or TraceMeanField_ELBO) only, got "
        f"{type(elbo).__name__}: its loss is a surrogate whose gradient is the RKHS "
        "functional gradient, and an objective that reweights or re-combines draws (e.g. "
        "RenyiELBO) would silently turn it into a different, meaningless update. Use "
        f"SVI(model, guide, optim, Trace_ELBO()); more particles: {guide_name}(..., "
        "num_particles=N)."
    )


def despite_an_invalid_draw(setup):
    """``setup()``, numpyro's set-up of a guide, run once more without validation where
    validation stopped it. numpyro traces the model at an initial or prior draw with its
    distributions' arguments validated: one invalid draw (a kernel matrix that float32
    cannot factorise at an extreme length scale) is no reason to stop, since the initial
    point is searched for afterwards. Where the second run fails too (no valid point), the
    validation's own error stands."""
    try:
        return setup()
    except ValueError as invalid:
        if "distribution got invalid" not in str(invalid):
            raise
        try:
            with numpyro.validation_enabled(False):
                return setup()
        except Exception:
            raise invalid from None
