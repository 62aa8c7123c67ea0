"""Training until the bound has stopped improving, instead of for a guessed number of steps.

:func:`run_until_converged` is ``svi.run`` without ``num_steps``: it trains in windows of ``window``
steps, each one compiled program (a ``lax.scan`` of ``svi.update``), and stops when the stopping
rule of :mod:`numpyro_dais.engine.diagnostics.stopping` says that the loss has gone ``patience``
windows without a significant improvement. The parameters it returns are the average of the iterates
of those stationary windows. For the annealed guides the self-check of ``q0`` (``transport_check``)
then judges the result, and warns with the fix where it fails.

On CPU the window program is compiled at XLA's cheaper level of
:mod:`numpyro_dais.runtime.compilation` (a training loop's work is mostly the model's gradients),
and compiled again, optimised, when the first window shows that the run is long next to that
compilation.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.annealed.guide import AnnealedGuide
from numpyro_dais.bridge.checks import check_positive_int
from numpyro_dais.engine.diagnostics import stopping
from numpyro_dais.results import ConvergedRun
from numpyro_dais.runtime import compilation
from numpyro_dais.runtime.reporting import on_main_process, warn
from numpyro_dais.runtime.vectorise import jit_by_leaves

#: Steps ahead that the first window's step time is projected over when deciding whether
#: to compile the window program again, optimised.
UPGRADE_STEPS = 1000
#: The optimised compilation is worth it when those steps would take longer than this
#: factor times the cheap compilation (an optimised compile takes a few times as long, and
#: saves a fraction of the run).
UPGRADE_FACTOR = 10.0


def _window_program(svi, length, stable_update, forward_mode_differentiation):
    """``(state, args, kwargs) -> (state, losses (length,), mean)``: ``length`` SVI steps,
    their losses and the mean of the optimiser's (unconstrained) parameters over them."""
    update = svi.stable_update if stable_update else svi.update

    def run(state, args, kwargs):
        start = svi.optim.get_params(state.optim_state)

        def body(carry, _):
            state, total = carry
            state, loss = update(
                state, *args, forward_mode_differentiation=forward_mode_differentiation, **kwargs
            )
            params = svi.optim.get_params(state.optim_state)
            # sums of the moves from the window's start: exact for parameters that stay put
            total = jax.tree.map(lambda t, p, s: t + (p - s), total, params, start)
            return (state, total), loss

        zeros = jax.tree.map(jnp.zeros_like, start)
        (state, total), losses = jax.lax.scan(body, (state, zeros), None, length=length)
        mean = jax.tree.map(lambda s, t: s + t / length, start, total)
        return state, losses, mean

    return jit_by_leaves(run)


class _Window:
    """The window program bound to this run's arguments, compiled for its run on CPU."""

    def __init__(self, program, state, args, kwargs, num_windows):
        self.program, self.args, self.kwargs = program, args, kwargs
        key, jitted, dynamic = program.bind(state, args, kwargs)
        self.jitted = jitted
        self.level = None
        self.compile_s = 0.0
        self.compiled = None
        if key is None or not compilation.on_cpu(jax.tree.leaves(dynamic)):
            return
        if not compilation.options_at(1):  # XLA_FLAGS chose the options
            return
        start = time.perf_counter()
        lowered = jitted.lower(dynamic)
        work = compilation.flops(lowered) * num_windows
        self.level = 1 if work <= compilation.WORK_BUDGETS[1] else None
        self.compiled = compilation.compile_at(lowered, self.level)
        self.compile_s = time.perf_counter() - start

    def __call__(self, state):
        if self.compiled is None:
            return self.program(state, self.args, self.kwargs)
        _, _, dynamic = self.program.bind(state, self.args, self.kwargs)
        return self.compiled(dynamic)

    def upgrade_if_worth_it(self, step_seconds):
        """Compile the program again, optimised, when ``UPGRADE_STEPS`` more steps at
        ``step_seconds`` each would outlast ``UPGRADE_FACTOR`` cheap compilations."""
        if self.level is None or self.compiled is None:
            return
        if step_seconds * UPGRADE_STEPS <= UPGRADE_FACTOR * self.compile_s:
            return
        self.compiled = None  # plain jax.jit: XLA's own optimisation
        self.level = None


def _check_options(max_steps, window, patience):
    max_steps = check_positive_int("max_steps", max_steps)
    window = check_positive_int("window", window, minimum=20)
    patience = check_positive_int("patience", patience)
    if max_steps < (patience + 1) * window:
        raise ValueError(
            f"`max_steps` ({max_steps}) leaves no room for the stopping rule: it needs at "
            f"least (patience + 1) * window = {(patience + 1) * window} steps to see "
            f"{patience} windows without an improvement after a first one. Raise "
            "`max_steps`, or lower `window` or `patience`."
        )
    return max_steps, window, patience


def _raise_if_not_finite(mean, done):
    """Stop with the fix when the window's iterates (host arrays) are not finite."""
    if all(np.all(np.isfinite(x)) for x in jax.tree.leaves(mean)):
        return
    raise FloatingPointError(
        f"run_until_converged: the parameters became non-finite within the last window "
        f"(steps {done - 1}…): the optimiser stepped into a region where the loss or its "
        "gradient overflows. Fix: lower the learning rate, pass `stable_update=True` (skips "
        "non-finite steps), or start nearer the posterior (`init_loc_fn=init_to_median`)."
    )


def _tail_average(svi, means):
    """The constrained parameters at the average of the windows' mean iterates ``means``
    (host arrays, unconstrained): one small program, not one per operation."""

    def average(last, means):
        moved = jax.tree.map(lambda x, *ms: x + sum(m - x for m in ms) / len(ms), last, *means)
        return svi.constrain_fn(moved)

    return jax.jit(average)(means[-1], means)


def run_until_converged(
    svi,
    rng_key,
    *args,
    max_steps=10_000,
    window=250,
    patience=3,
    progress_bar=True,
    stable_update=False,
    forward_mode_differentiation=False,
    init_state=None,
    init_params=None,
    **kwargs,
) -> ConvergedRun:
    """``svi.run`` until the loss has stopped improving, at most ``max_steps`` steps.

    Trains in windows of ``window`` steps and stops after ``patience`` windows in a row whose
    mean loss does not beat the best window's by more than twice the standard error of the
    difference (:mod:`numpyro_dais.engine.diagnostics.stopping`). The returned ``params`` are the
    average, in the optimiser's unconstrained space, of the iterates of those last
    ``patience`` windows (the last iterate's where the fit did not converge: it was still
    improving, and warns). For an annealed guide whose posterior is ``q0``
    (``AutoDAIS``'s default), the ``q0`` self-check then runs on them: its
    :class:`~numpyro_dais.TransportReport` is ``check``, and it warns with the fix where it
    fails (the later ``q0`` draws do not run it again).

    :param svi: a ``numpyro.infer.SVI`` with any guide.
    :param rng_key: a JAX key, as ``svi.run``'s.
    :param args: the model's arguments.
    :param int max_steps: the most steps to take; rounded up to whole windows.
    :param int window: steps per window (``>= 20``): one compiled program, the unit of the
        rule's comparison, and of the progress bar.
    :param int patience: windows without a significant improvement before stopping.
    :param bool progress_bar: show the steps taken and each window's mean loss (in process
        0 only, where several processes run the same script).
    :param bool stable_update: use ``svi.stable_update`` (skip non-finite steps).
    :param bool forward_mode_differentiation: as ``svi.run``'s.
    :param init_state: an ``SVIState`` to continue from (e.g. a previous result's ``state``).
    :param dict init_params: initial parameter values, as ``svi.run``'s.
    :param kwargs: the model's keyword arguments.
    :return: :class:`~numpyro_dais.ConvergedRun` ``(params, state, losses, num_steps,
        converged, check)``; its first three fields are those of ``svi.run``'s result.
    """
    max_steps, window, patience = _check_options(max_steps, window, patience)
    rule = stopping.Rule(patience=patience)
    if init_state is None:
        state = svi.init(rng_key, *args, init_params=init_params, **kwargs)
    else:
        state = init_state
    # the self-check of an annealed guide's q0, run at the end: its programs compile during
    # the training
    annealed = isinstance(svi.guide, AnnealedGuide) and svi.guide.posterior_method == "q0"
    if annealed:
        svi.guide._prepare_self_check(svi.get_params(state))
    num_windows = -(-max_steps // window)
    program = _window_program(svi, window, stable_update, forward_mode_differentiation)
    run = _Window(program, state, args, kwargs, num_windows)
    bar = _progress(progress_bar, num_windows * window)
    rule_state, losses, means = stopping.RuleState(), [], []
    done = 0
    try:
        for w in range(num_windows):
            start = time.perf_counter()
            state, window_losses, mean = run(state)
            window_losses, mean = jax.device_get((window_losses, mean))  # waits for it
            if w == 0:
                run.upgrade_if_worth_it((time.perf_counter() - start) / window)
            done += window
            _raise_if_not_finite(mean, done)
            losses.append(window_losses)
            means = (means + [mean])[-patience:]
            stats = stopping.window_stats(window_losses, rule.num_batches)
            rule_state = stopping.update(rule, rule_state, stats)
            if bar is not None:
                bar.update(window)
                bar.set_postfix_str(f"loss {stats.mean:.4g} ± {stats.se:.2g}")
            if stopping.converged(rule, rule_state):
                break
    finally:
        if bar is not None:
            bar.close()
    converged = stopping.converged(rule, rule_state)
    if converged:
        params = _tail_average(svi, means)
    else:
        params = svi.get_params(state)
        warn(
            f"run_until_converged: the loss was still improving after max_steps = {done} "
            f"steps (last window's mean {stats.mean:.6g} ± {stats.se:.2g}); the returned "
            "params are the last iterate's. Fix: raise `max_steps`, or continue with "
            "`init_state=result.state`.",
            RuntimeWarning,
        )
    # the self-check on params (once; warns with the fix where it fails), None for other
    # guides or where it is off
    check = svi.guide._check_q0_once(params) if annealed else None
    return ConvergedRun(params, state, jnp.asarray(np.concatenate(losses)), done, converged, check)


def _progress(enabled, total):
    """The progress bar, in process 0 only
    (:func:`~numpyro_dais.runtime.reporting.on_main_process`)."""
    if not enabled or not on_main_process():
        return None
    import tqdm

    return tqdm.tqdm(total=total, desc="run_until_converged", unit="step")
