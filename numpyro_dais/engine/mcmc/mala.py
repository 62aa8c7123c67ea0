"""Metropolis-adjusted Langevin chains, one at a time or as an adapted ensemble.

The kernel (:func:`mala_step`) is exact: its Metropolis–Hastings correction leaves the
target invariant whatever the step size. :func:`sample` runs ``C`` chains at once from
draws of a trained ``q0``, in the coordinates where ``q0`` is ``N(0, I)`` (``q0`` is the
chains' preconditioner, as a learnt transport is in NeuTra HMC), and adapts them together
during warm-up: the per-coordinate scale from the spread across the chains, the step size
towards MALA's optimal acceptance. A ``q0`` narrower than the posterior, which the
ensemble's first windows widen, and one that is misplaced both give way within a few
hundred steps where ``q0`` is near the posterior's shape.

References: Roberts & Tweedie (1996), "Exponential convergence of Langevin distributions
and their discrete approximations"; Roberts & Rosenthal (1998), optimal acceptance 0.574
and step size ``∝ D^{-1/6}``; Hoffman et al. (2019), "NeuTra-lizing bad geometry in
Hamiltonian Monte Carlo using neural transport"; Hoffman & Sountsov (2022), adaptation
across many chains.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

#: the acceptance that maximises MALA's efficiency in high dimension (Roberts & Rosenthal)
TARGET_ACCEPTANCE = 0.574


class ChainState(NamedTuple):
    x: jax.Array  # (D,) position
    log_density: jax.Array  # () log target at x
    grad: jax.Array  # (D,) its gradient


class EnsembleInfo(NamedTuple):
    """What an ensemble run (:func:`sample`) did, and whether its draws had settled."""

    acceptance: jax.Array
    """``()`` the fraction of accepted proposals over the draws' steps."""
    step_size: jax.Array
    """``()`` the adapted step size (in the scaled coordinates ``x / scale``)."""
    scale: jax.Array
    """``(D,)`` the adapted per-coordinate scale: the ensemble's spread at the warm-up's end."""
    mean_shift: jax.Array
    """``(D,)`` the draws' median minus the ensemble's half-way through the warm-up, in the
    draws' robust sds (interquartile range / 1.349)."""
    log_std_ratio: jax.Array
    """``(D,)`` ``log`` of the draws' interquartile range over the ensemble's half-way
    through the warm-up: both near 0 (within the chains' Monte Carlo error) once the
    ensemble had settled on the target by then; a spread still growing or a centre still
    moving shows here."""
    finite_fraction: jax.Array
    """``()`` the fraction of chains whose log density is finite at the end."""
    nonfinite_proposals: jax.Array
    """``()`` the fraction of the draws' proposals where the density was not finite
    (rejected): where that region holds posterior mass (a float32 Cholesky failing at a
    long length scale), the chains sample the posterior without it."""


def default_step_size(dim: int) -> float:
    """``D^{-1/6}``: acceptance 0.8-0.9 on a target of unit scale, the start of adaptation."""
    return float(dim) ** (-1.0 / 6.0)


def mala_step(log_density: Callable, step_size, state: ChainState, rng_key):
    """One MALA transition ``x → y = x + ε²/2 ∇log p(x) + ε ξ``, accepted with the
    Metropolis–Hastings ratio (a non-finite ratio rejects). Returns ``(state, accepted,
    finite)``, ``finite`` whether the density at the proposal ``y`` was finite.

    One generator call draws ``ξ`` and the acceptance's uniform ``Φ(ξ_{D+1})`` (each
    generator call in a loop body adds a few hundred operations to the compiled program)."""
    x, lp, g = state
    eps = jax.random.normal(rng_key, (x.shape[-1] + 1,), x.dtype)
    half = 0.5 * step_size**2
    forward_mean = x + half * g
    y = forward_mean + step_size * eps[:-1]
    lp_y, g_y = jax.value_and_grad(log_density)(y)
    backward_mean = y + half * g_y
    log_ratio = (
        lp_y
        - lp
        + (jnp.sum((y - forward_mean) ** 2) - jnp.sum((x - backward_mean) ** 2))
        / (2.0 * step_size**2)
    )
    accept = jax.scipy.special.log_ndtr(eps[-1]) < log_ratio
    new = jax.tree.map(lambda a, b: jnp.where(accept, a, b), ChainState(y, lp_y, g_y), state)
    return new, accept, jnp.isfinite(lp_y)


def init(log_density: Callable, x) -> ChainState:
    """The chain state at ``x (D,)``."""
    lp, g = jax.value_and_grad(log_density)(x)
    return ChainState(x, lp, g)


def run_chain(log_density: Callable, step_size, x0, rng_key, num_steps):
    """A chain of ``num_steps`` MALA steps (:func:`mala_step`) from ``x0 (D,)``, the key of
    step ``i`` ``fold_in(rng_key, i)``: its last state, the fraction of moves accepted and
    the fraction of proposals where the density was not finite. ``num_steps`` may be traced
    (a trip count the program does not fix), so that chains of different lengths share one
    loop body."""

    def body(i, carry):
        state, accepted, nonfinite = carry
        state, a, finite = mala_step(log_density, step_size, state, jax.random.fold_in(rng_key, i))
        return state, accepted + a, nonfinite + 1.0 - finite

    zero = jnp.zeros((), x0.dtype)
    start = (init(log_density, x0), zero, zero)
    state, accepted, nonfinite = jax.lax.fori_loop(0, num_steps, body, start)
    return state, accepted / num_steps, nonfinite / num_steps


def masked_std(x, finite):
    """``(std (D,), count)``: the std across the rows of ``x (C, D)`` where ``finite``
    ``(C,)`` holds, and how many those are (NaN where fewer than two)."""
    count = jnp.sum(finite)
    mean = jnp.sum(jnp.where(finite[:, None], x, 0.0), axis=0) / count
    var = jnp.sum(jnp.where(finite[:, None], (x - mean) ** 2, 0.0), axis=0) / (count - 1)
    return jnp.sqrt(var), count


def _spread(x, finite, fallback):
    """:func:`masked_std` of the chains' positions ``x (C, D)``, ``fallback (D,)`` where
    fewer than two are finite, floored at a thousandth of ``fallback``."""
    std, count = masked_std(x, finite)
    std = jnp.where(count > 1, std, fallback)
    return jnp.maximum(jnp.nan_to_num(std, nan=0.0), 1e-3 * fallback)


def _compare(before, after):
    """``(shift (D,), log_spread_ratio (D,))`` of the draws ``after (S, D)`` against the
    ensemble ``before (C, D)`` half-way through the warm-up: the medians' difference in
    ``after``'s robust sd (interquartile range / 1.349) and the log ratio of the
    interquartile ranges, which a heavy tail does not make noisy as it does a mean and a
    std."""
    q = jnp.array([0.25, 0.5, 0.75])
    b, a = jnp.quantile(before, q, axis=0), jnp.quantile(after, q, axis=0)
    iqr_before, iqr = b[2] - b[0], a[2] - a[0]
    return (a[1] - b[1]) / (iqr / 1.349), jnp.log(iqr / iqr_before)


def sample(
    rng_key,
    log_density: Callable,
    x0,
    num_warmup: int,
    num_draws: int,
    thin: int = 1,
    num_windows: int = 10,
    scale=None,
    step_size=None,
):
    """An ensemble of MALA chains on ``log_density`` (``x (D,) -> ℓ``) from ``x0 (C, D)``,
    with the per-coordinate ``scale (D,)`` (default ones) and ``step_size`` (default
    :func:`default_step_size`) to start the adaptation from: a run continues another from
    its last draws, ``info.scale`` and ``info.step_size``.

    Warm-up: ``num_windows`` windows of ``num_warmup // num_windows`` steps; after each, the
    per-coordinate scale becomes the chains' spread and the step size moves towards
    :data:`TARGET_ACCEPTANCE` (times ``exp(2 (a − 0.574))`` for the window's acceptance
    ``a``), and a chain whose density is not finite restarts at another chain's position.
    Then ``num_draws`` draws per chain, each ``thin`` steps apart, with both fixed,
    so that every chain is a Markov chain with the target as its invariant law.

    Returns ``(draws (C, num_draws, D), EnsembleInfo)``.
    """
    C, D = x0.shape
    length = max(num_warmup // num_windows, 1)

    def scaled(scale):
        return lambda y: log_density(scale * y)

    def window(carry, inputs):
        """A warm-up window (``adapt``: then adapted) or the steps to the next draw."""
        x, step_size, scale = carry
        key, steps, adapt = inputs
        key_run, key_restart = jax.random.split(key)
        run = lambda y, k: run_chain(scaled(scale), step_size, y, k, steps)
        state, accepted, nonfinite = jax.vmap(run)(x / scale, jax.random.split(key_run, C))
        x, finite = state.x * scale, jnp.isfinite(state.log_density)
        acceptance = jnp.sum(jnp.where(finite, accepted, 0.0)) / jnp.sum(finite)
        adapted_step = step_size * jnp.exp(2.0 * (acceptance - TARGET_ACCEPTANCE))
        adapted_scale = _spread(x, finite, scale)
        # a chain stuck where the density is not finite (it never moves: every ratio from
        # there is NaN) restarts at a finite chain's position: warm-up only
        donor = jax.random.choice(key_restart, C, (C,), p=finite / jnp.sum(finite))
        restarted = jnp.where(finite[:, None], x, x[donor])
        carry = (
            jnp.where(adapt, restarted, x),
            jnp.where(adapt, adapted_step, step_size),
            jnp.where(adapt, adapted_scale, scale),
        )
        return carry, (x, acceptance, jnp.mean(nonfinite), jnp.mean(finite))

    scale = jnp.ones(D, x0.dtype) if scale is None else scale
    step_size = default_step_size(D) if step_size is None else step_size
    start = (x0, jnp.asarray(step_size, x0.dtype), scale)
    adapt = jnp.arange(num_windows + num_draws) < num_windows
    steps = jnp.where(adapt, length, thin)
    keys = jax.random.split(rng_key, num_windows + num_draws)
    (_, step_size, scale), out = jax.lax.scan(window, start, (keys, steps, adapt))
    xs, acceptance, nonfinite, finite = out
    draws = jnp.swapaxes(xs[num_windows:], 0, 1)  # (C, num_draws, D)
    pooled = draws.reshape(-1, D)
    mean_shift, log_std_ratio = _compare(xs[(num_windows - 1) // 2], pooled)
    info = EnsembleInfo(
        acceptance=jnp.mean(acceptance[num_windows:]),
        step_size=step_size,
        scale=scale,
        mean_shift=mean_shift,
        log_std_ratio=log_std_ratio,
        finite_fraction=finite[-1],
        nonfinite_proposals=jnp.mean(nonfinite[num_windows:]),
    )
    return draws, info
