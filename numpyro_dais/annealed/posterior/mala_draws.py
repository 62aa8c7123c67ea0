"""``sample_posterior(method="mala")``: draws of the posterior itself, by Metropolis-adjusted
Langevin chains that start at ``q0`` draws and run in ``q0``'s standard coordinates.

``q0`` (DAIS₀) is a Gaussian: where the posterior is not (a hierarchy's group scale, a
heavy tail), it is narrower than the posterior, and the self-check says so. The chains
correct it: :data:`NUM_CHAINS` short chains adapted as an ensemble
(:func:`numpyro_dais.engine.mcmc.mala.sample`), :data:`NUM_WARMUP` steps of warm-up, then
draws :data:`THIN` steps apart, the first ``S`` taken across the chains. Their law is the
posterior's in the limit; a trained ``q0`` as start and preconditioner makes the limit
near. An ensemble still moving at the end of its warm-up (its centre or spread changed
over the warm-up's second half) runs another round from where it is, up to
:data:`MAX_ROUNDS`, and then gets a warning with the fix, as do draws whose proposals often
met a non-finite density (a region of the posterior the chains cannot enter).

Reference: Hoffman et al. (2019), "NeuTra-lizing bad geometry in Hamiltonian Monte Carlo
using neural transport"; Roberts & Rosenthal (1998).
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.sampling import Call
from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.engine.mcmc import mala
from numpyro_dais.runtime import compilation, reporting

#: chains run at once: their spread adapts the scale, and the drift check's Monte Carlo
#: error is about ``1/sqrt(NUM_CHAINS)`` sds
NUM_CHAINS = 1024
#: warm-up steps (in 10 adaptation windows) and steps between two draws of a chain
NUM_WARMUP = 500
THIN = 2
#: rounds of warm-up at most: a round whose chains had not settled is followed by another
#: from where they are, adaptation included
MAX_ROUNDS = 4
#: the drift between the warm-up's middle and the draws beyond which the chains had not
#: settled: the median (in the draws' robust sds) and the log of the spread's ratio, set
#: so that no right draw set of ``benchmarks/mala_draws`` went past them
MEAN_SHIFT_TOL = 0.2
LOG_STD_TOL = 0.25
#: the ensemble size up to which those tolerances hold; a smaller one (the self-check's on
#: a costly model) widens them by ``sqrt(SETTLE_CHAINS / C)``, as the Monte Carlo error of
#: its median grows (``1.25 / sqrt(C)`` sds: 0.22 for 32 chains, which would otherwise
#: never pass)
SETTLE_CHAINS = 256
#: the fraction of chains at a finite density below which the draws are not trusted (a
#: chain stuck where the density is not finite keeps its position)
MIN_FINITE = 0.95
#: the fraction of proposals at a non-finite density above which the draws may miss the
#: posterior's mass there
MAX_NONFINITE = 0.01


class Start(NamedTuple):
    """Where a round of the chains starts, in ``q0``'s standard coordinates: the chains'
    positions ``x (C, D)`` (ignored in the first round: ``q0`` draws), the scale ``(D,)``
    and the step size ``()`` their adaptation starts from."""

    x: np.ndarray
    scale: np.ndarray
    step_size: np.ndarray


def first_start(dim: int, dtype, num_chains: int = NUM_CHAINS) -> Start:
    """The first round's :class:`Start` of ``num_chains`` chains, made on the host (no
    program to compile) and put on the device, as the rounds after it return theirs: the
    same input types, so that every round runs the one compiled program."""
    step = np.asarray(mala.default_step_size(dim), dtype)
    return jax.device_put(Start(np.zeros((num_chains, dim), dtype), np.ones(dim, dtype), step))


def draws_per_chain(num_draws: int, num_chains: int = NUM_CHAINS) -> int:
    """Draws kept from each chain: at least 2, enough for ``num_draws`` across them."""
    return max(2, math.ceil(num_draws / num_chains))


def steps(num_draws: int, num_chains: int = NUM_CHAINS) -> int:
    """The steps of each chain in a round: warm-up, then :data:`THIN` per draw kept."""
    return NUM_WARMUP + THIN * draws_per_chain(num_draws, num_chains)


def runs(num_draws: int, num_chains: int = NUM_CHAINS) -> float:
    """The runs a round's program is compiled for
    (:func:`numpyro_dais.runtime.compilation.run_for`): its :func:`steps`, the model's
    gradients, counted at 1 / :data:`~numpyro_dais.runtime.compilation.GRADIENT_WORK_DISCOUNT`."""
    return steps(num_draws, num_chains) / compilation.GRADIENT_WORK_DISCOUNT


def run_rounds(run_round, start: Start, names):
    """Rounds of the chains until they settle (:func:`unsettled`), at most
    :data:`MAX_ROUNDS`: ``run_round(start, round_index)`` runs one and returns ``(result,
    info, next start)``. Returns the last round's ``(result, info)`` and the rounds run."""
    num_chains = start.x.shape[0]
    for rounds in range(1, MAX_ROUNDS + 1):
        result, info, start = run_round(start, np.asarray(rounds - 1, np.int32))
        if unsettled(info, names, num_chains) is None:
            break
    return result, info, rounds


def draw(call: Call, rng_key, num_draws: int, start: Start, round_index):
    """Round ``round_index`` (``0``: from ``q0`` draws, else from ``start``) of the chains on
    the call's dynamics (the full-data posterior): ``num_draws`` flat unconstrained draws
    ``(S, D)``, the ensemble's :class:`~numpyro_dais.engine.mcmc.mala.EnsembleInfo` and the
    next round's :class:`Start`."""
    key_target, key_start, key_run = jax.random.split(jax.random.fold_in(rng_key, round_index), 3)
    log_target = call.target.dynamics(key_target)
    q0 = sampling.in_z(call.fitted.affine, call.fitted.q0)
    x0 = jax.random.normal(key_start, start.x.shape, start.x.dtype)
    x0 = jnp.where(round_index == 0, x0, start.x)
    log_density = lambda x: log_target(gaussian.reparameterize(q0, x))
    n = draws_per_chain(num_draws, start.x.shape[0])
    x, info = mala.sample(
        key_run, log_density, x0, NUM_WARMUP, n, THIN, scale=start.scale,
        step_size=start.step_size,
    )  # fmt: skip
    following = Start(x[:, -1], info.scale, info.step_size)
    x = jnp.reshape(jnp.swapaxes(x, 0, 1), (-1, x.shape[-1]))[:num_draws]  # across chains
    return gaussian.reparameterize(q0, x), info, following


def _largest(values):
    """The index of the largest ``|value|`` (NaN counts as largest)."""
    return int(np.argmax(np.nan_to_num(np.abs(values), nan=np.inf)))


def unsettled(info: mala.EnsembleInfo, names, num_chains: int = NUM_CHAINS) -> str | None:
    """What says the chains had not settled, ``None`` where nothing does (or under ``jit``):
    a drift over the warm-up's second half beyond :data:`MEAN_SHIFT_TOL` in a median or
    :data:`LOG_STD_TOL` in a log spread ratio at a coordinate of ``names`` (both widened
    for fewer than :data:`SETTLE_CHAINS` chains);
    more than ``1 − MIN_FINITE`` of them at a non-finite density; or hardly a move
    accepted."""
    if isinstance(info.acceptance, jax.core.Tracer):
        return None
    finite, acceptance = float(info.finite_fraction), float(info.acceptance)
    if finite < MIN_FINITE or acceptance < 0.2:
        return (
            f"{1 - finite:.0%} of the chains ended at a non-finite density and they accepted "
            f"{acceptance:.0%} of their moves after warm-up"
        )
    shift, log_ratio = np.asarray(info.mean_shift), np.asarray(info.log_std_ratio)
    i, j = _largest(shift), _largest(log_ratio)
    widen = math.sqrt(max(1.0, SETTLE_CHAINS / num_chains))
    mean_tol, log_std_tol = MEAN_SHIFT_TOL * widen, LOG_STD_TOL * widen
    if not (abs(shift[i]) <= mean_tol and abs(log_ratio[j]) <= log_std_tol):
        return (
            f"the chains' median moved {shift[i]:+.2f} sds at {names[i]} and their spread "
            f"(interquartile range) by a factor {np.exp(log_ratio[j]):.2f} at {names[j]} over "
            f"the second half of the last warm-up (tolerances {mean_tol:.2g} and a factor "
            f"{np.exp(log_std_tol):.2f})"
        )
    return None


def truncated(info: mala.EnsembleInfo) -> str | None:
    """What says the chains sampled the posterior only where the model's density is finite:
    more than :data:`MAX_NONFINITE` of their proposals were at a non-finite density; ``None``
    where not (or under ``jit``). More warm-up does not help there."""
    if isinstance(info.nonfinite_proposals, jax.core.Tracer):
        return None
    rate = float(info.nonfinite_proposals)
    if rate <= MAX_NONFINITE:
        return None
    return (
        f"the model's log density was not finite at {rate:.1%} of the chains' proposals, "
        "which were rejected: where the posterior has mass there the draws miss it (a float32 "
        "Cholesky of a kernel matrix failing at long length scales, an overflow). Fix: run in "
        "float64 (jax.config.update('jax_enable_x64', True)) or make the model's density "
        "finite there (a larger jitter)"
    )


def warn_if_doubtful(name, info: mala.EnsembleInfo, names, rounds: int) -> bool:
    """Warn, with the fix, when the chains had not settled after ``rounds`` rounds
    (:func:`unsettled`) or were :func:`truncated`; returns whether it warned."""
    messages = []
    what = unsettled(info, names)
    if what is not None:
        messages.append(
            f"{what}, so {rounds * NUM_WARMUP} warm-up steps from q0 did not reach the "
            "posterior. Fix: train q0 further (it is the chains' start and preconditioner), "
            "or run NUTS, started at q0's draws"
        )
    what = truncated(info)
    if what is not None:
        messages.append(what)
    if not messages:
        return False
    reporting.warn(
        f"{name}: the 'mala' draws may not be the posterior's: {'. Also, '.join(messages)}.",
        RuntimeWarning,
    )
    return True
