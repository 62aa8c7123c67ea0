"""Warnings from inside jitted code (a host call behind a ``lax.cond``, once per step), and
the rule that progress and warnings come from process 0 only (:func:`on_main_process`)."""

import functools
import math
import os
import sys
import warnings

import jax
import jax.numpy as jnp
import numpyro
import optax
from jax.custom_batching import custom_vmap

from numpyro_dais.runtime.hostcall import host_call


def on_main_process() -> bool:
    """Whether this process prints: process 0 of a multi-process JAX run
    (``jax.distributed.initialize``), or the only process. Every process runs the same
    script, so without this rule a run of ``n`` processes would show each progress bar and
    warning ``n`` times."""
    return jax.process_index() == 0


#: the packages whose frames a warning passes over to reach the line that called them (this
#: library's top-level package, whichever of its folders a warning comes from)
_LIBRARIES = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (sys.modules[__name__.partition(".")[0]], numpyro, jax, optax)
)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warn`'s ``warnings.warn`` that names the first frame
    outside this library, numpyro, JAX and optax: the user's line (a call of
    ``sample_posterior``, ``svi.run``), wherever in the library the warning comes from."""
    frame, level = sys._getframe(2), 2  # the caller of warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARIES):
        frame, level = frame.f_back, level + 1
    return level


def warn(message, category=UserWarning):
    """``warnings.warn(message, category)`` attributed to the user's line
    (:func:`_user_stacklevel`), in process 0 only (:func:`on_main_process`)."""
    if on_main_process():
        warnings.warn(message, category, stacklevel=_user_stacklevel())


def warn_from_jit(warn_fn, counts, total, values=()) -> jax.Array:
    """Call the host function ``warn_fn(*counts, total, *values)`` from inside jitted code
    when any of the scalar ``counts`` (e.g. diverged particles, out of ``total``) is positive.

    Returns a float32 ``0.0`` that the caller **must add to a value the compiled program
    returns** (the loss): the call (:func:`numpyro_dais.runtime.hostcall.host_call`) sits inside a
    ``lax.cond``, and XLA keeps it only while its result is used. On CPU the call is an XLA
    FFI custom call, not a JAX host callback, so a step where nothing diverged costs what
    the same step without the check costs; other
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


#: what "diverged" means, in every divergence warning
DIVERGED = "non-finite weight, or an energy error far beyond a stable integrator's"


def _warn_diverged(guide_name, step_info, fell_back, num_diverged, total):
    n, total = int(num_diverged), int(total)
    if fell_back:
        msg = (
            f"{guide_name}: {n} of {total} chains diverged ({DIVERGED}); each fell back to "
            "its start z_0 for this step (its term is the K = 0 bound) and its step sizes "
            f"were pushed down. {step_info}"
        )
    else:
        msg = (
            f"{guide_name}: {n} of {total} particle trajectories diverged ({DIVERGED}) and "
            "were dropped from the bound; their gradients were zeroed."
        )
        if n >= total:
            msg += " All particles diverged: the loss is not finite. " + (step_info or "")
            msg += (
                " If training ran well before this, the learning rate may have thrown the "
                "parameters off: lower it, or run SVI with `stable_update=True`."
            )
    warn(msg, RuntimeWarning)


def report_diverged(guide_name, num_diverged, total, step_info="", fell_back=False):
    """Warn from inside jitted code when trajectories diverged; ``step_info`` says what the
    step sizes are and how to fix them (the guide knows, the engine does not).
    ``fell_back``: one-particle chains that restart from ``z_0`` when they diverge
    (``AutoSemiDAIS``), not particles dropped from the bound. Returns the ``0.0`` of
    :func:`warn_from_jit`, to be added to the loss."""
    warn = functools.partial(_warn_diverged, guide_name, step_info, fell_back)
    return warn_from_jit(warn, (num_diverged,), total)


def _warn_gpvi(
    guide_name,
    is_helper,
    nonfinite_steps,
    num_nonfinite,
    num_fallback,
    total,
    helper_rel_loss,
    helper_loss,
):
    """``nonfinite_steps``: the guide's one-element count of steps with non-finite particles."""
    n_bad, n_fb, total = int(num_nonfinite), int(num_fallback), int(total)
    if n_bad:
        nonfinite_steps[0] += 1
    occurrence = nonfinite_steps[0]
    if n_bad and math.log10(occurrence).is_integer():  # steps 1, 10, 100, ...: not a flood
        warn(
            f"{guide_name}: {n_bad} of {total} particles had a non-finite log joint or "
            "gradient (the model's density is undefined there); they were left out of the "
            "model-parameter gradient and steered back towards the finite particles. "
            f"Step {occurrence} with such particles (reported at 1, 10, 100, ... steps). If "
            "this persists, give the latent site a support that excludes the region (a "
            "constrained distribution) so that the guide cannot reach it.",
            RuntimeWarning,
        )
    if n_fb and is_helper:
        warn(
            f"{guide_name}: the helper network diverged (loss {float(helper_loss):.4g}, "
            f"{float(helper_rel_loss):.4g}× the loss of predicting 0). This step used "
            "J^-T v ≈ v / λ instead of its prediction. Lower the helper's learning rate "
            "(AutoGPVI.split_optimizer) or use jacobian='exact'.",
            RuntimeWarning,
        )
    elif n_fb:
        warn(
            f"{guide_name}: the generator Jacobian was singular at {n_fb} of {total} "
            "particles; this step used J^-T v ≈ v / λ there.",
            RuntimeWarning,
        )


def report_gpvi(guide_name, is_helper, nonfinite_steps, num_nonfinite, out, total):
    """AutoGPVI's step report: warn from inside jitted code (one host call, made only when
    something went wrong); returns the ``0.0`` to add to the loss (:func:`warn_from_jit`)."""
    return warn_from_jit(
        functools.partial(_warn_gpvi, guide_name, is_helper, nonfinite_steps),
        (num_nonfinite, out.num_fallback),
        total,
        (out.helper_rel_loss, jax.lax.stop_gradient(out.helper_loss)),
    )
