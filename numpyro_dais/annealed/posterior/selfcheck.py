"""The check that q0 draws are trustworthy, run once for each set of trained parameters.

``q0`` (DAIS₀) is a faithful posterior only where the transitions refine it; where they
carry a misplaced ``q0`` to the posterior instead, its draws are off while the bound is
tight, and where the posterior is not Gaussian (a hierarchy's scale, a heavy tail) a
Gaussian ``q0`` is too narrow. The first time ``q0`` is used as the posterior for given
``params`` (``sample_posterior`` with ``method="q0"``, ``median``, ``quantiles``), the guide
compares it with its importance-resampled end points on the set-up data (a transport check
of :data:`NUM_SAMPLES` draws) and warns, with the fix, when they disagree. For a guide whose
target is the full-data posterior it also compares ``q0`` with the draws of
Metropolis-adjusted Langevin chains started at its draws (the ensemble of
:mod:`~numpyro_dais.annealed.posterior.mala_draws`, up to :data:`MAX_CHECK_CHAINS` chains
within a budget of the model's flops), which do
not trust the learnt transitions and leave the posterior invariant, and warns when their
mean or spread leaves ``q0``'s.
"""

import hashlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.posterior import mala_draws
from numpyro_dais.annealed.sampling import Call
from numpyro_dais.engine.annealing import dais0, gaussian
from numpyro_dais.engine.mcmc.mala import EnsembleInfo
from numpyro_dais.results import TransportReport
from numpyro_dais.runtime import reporting
from numpyro_dais.runtime.vectorise import jit_short_run

#: importance draws of the check: the end points' mean to ~1/16 of their sd, at a cost of a
#: few percent of a 5000-step fit
NUM_SAMPLES = 256

#: the fraction of finite end points below which the check fails whatever their moments:
#: an end point is not finite when every particle of its annealing diverged from ``q0``
MIN_FINITE = 0.95

#: The self-check's chains (:mod:`~numpyro_dais.annealed.posterior.mala_draws`' ensemble,
#: with fewer chains: it judges q0, it does not replace it) and the draws of theirs it
#: compares q0 with (8 per chain): their mean to ~0.03 sds, their log sd to ~0.02
#: (fewer where the model is costly, :func:`num_check_chains`)
MAX_CHECK_CHAINS = 256
MIN_CHECK_CHAINS = 32
CHECK_DRAWS = 8 * MAX_CHECK_CHAINS
#: the flops a round of the chains may cost: where even :data:`MIN_CHECK_CHAINS` chains
#: would cost more (a regression over tens of thousands of rows), they do not run
CHECK_BUDGET = 5e9


def num_check_chains(gradient_flops: float) -> int | None:
    """The self-check's chains for a model whose log density and gradient cost
    ``gradient_flops``: the largest power of two in ``[MIN_CHECK_CHAINS,
    MAX_CHECK_CHAINS]`` whose round (:data:`CHECK_DRAWS` draws across the chains) stays
    within :data:`CHECK_BUDGET`; ``None`` where even the fewest do not."""
    num_chains = MAX_CHECK_CHAINS
    while num_chains >= MIN_CHECK_CHAINS:
        steps = mala_draws.steps(CHECK_DRAWS, num_chains)
        if num_chains * steps * gradient_flops <= CHECK_BUDGET:
            return num_chains
        num_chains //= 2
    return None


def gradient(call: Call, rng_key):
    """The call's log density and its gradient at ``q0``'s mean: the program whose flops
    (:func:`numpyro_dais.runtime.compilation.flops`) size the chains."""
    q0 = sampling.in_z(call.fitted.affine, call.fitted.q0)
    return jax.value_and_grad(call.target.dynamics(rng_key))(q0.loc)


#: The check's tolerances: q0's mean shift from the chains' draws (in their sds) and the
#: ratio of their std to q0's (either way); the end points' mean shift (in their sds) and
#: their std ratio to q0's. Beyond any of them q0 fails. Set from the labelled fits of
#: ``benchmarks/self_check.py`` (models × seeds × settings against NUTS; its results score
#: each choice by its misses and false alarms): the fewest misses with false alarms at
#: most a few percent, checked on a hold-out set of new seeds.
CHAIN_MEAN_TOL = 0.2
CHAIN_STD_RATIO_TOL = 1.28
MEAN_SHIFT_TOL = 0.3
STD_RATIO_TOL = 1.5
#: below this acceptance the chains hardly moved: the check says nothing
CHAINS_MIN_ACCEPTANCE = 0.2
#: standard errors of the log std ratio (from both draw sets' kurtoses,
#: :func:`~numpyro_dais.engine.annealing.dais0.draws_check`) a coordinate's ratio must also
#: pass to fail ``q0``: past the ratio tolerance only where its tails are so heavy that the
#: sample stds are noisy (Neal's funnel's ``x``: ``benchmarks/funnel_metric``); for light
#: tails 3 standard errors are far below the tolerance
CHAIN_STD_NOISE_Z = 3.0


class ChainsCheck(NamedTuple):
    """``q0`` against the self-check's chains, in the constrained space of the latent
    sites: ``comparison`` (:func:`~numpyro_dais.engine.annealing.dais0.draws_check` of
    ``q0``'s draws against theirs, per coordinate ``(M,)``), the coordinates' ``names``,
    ``unpack`` (``(M,)`` to ``{site: array}``), the ensemble's ``info`` and the ``rounds`` it
    ran; or, where they did not run, ``skipped``: why."""

    comparison: dais0.TransportCheck | None
    names: list
    unpack: object
    info: EnsembleInfo | None
    rounds: int
    skipped: str | None = None


def skipped(gradient_flops: float) -> ChainsCheck:
    """The :class:`ChainsCheck` of chains too costly to run for the check."""
    why = (
        f" Metropolis-adjusted chains from its draws did not run: a gradient of the model "
        f"costs {gradient_flops:.1e} flops, and {MIN_CHECK_CHAINS} chains would exceed the "
        f"check's budget of {CHECK_BUDGET:.0e}; where the posterior may not be Gaussian, "
        "compare with sample_posterior(..., method='mala') draws."
    )
    return ChainsCheck(None, [], None, None, 0, why)


def chains_round(call: Call, rng_key, start: mala_draws.Start, round_index, values):
    """Round ``round_index`` of the chains of ``start`` on the call's dynamics (the
    full-data posterior; :func:`~numpyro_dais.annealed.posterior.mala_draws.draw`):
    ``(comparison, info, next start)``, ``comparison`` the
    :func:`~numpyro_dais.engine.annealing.dais0.draws_check` of :data:`CHECK_DRAWS` ``q0``
    draws against as many of the chains', both mapped by ``values`` (``z (S, D)`` to the
    flat constrained latent values ``(S, M)``: what a user reads). Meaningful where the
    dynamics run on the full-data posterior (not a surrogate, not a mini-batch)."""
    key_q0, key_chains = jax.random.split(rng_key)
    z, info, following = mala_draws.draw(call, key_chains, CHECK_DRAWS, start, round_index)
    q0 = sampling.in_z(call.fitted.affine, call.fitted.q0)
    z_q0 = gaussian.sample(key_q0, q0, (CHECK_DRAWS,))
    # one map of both sets: the model traced once in the program
    both = values(jnp.concatenate([z_q0, z]))
    return dais0.draws_check(both[:CHECK_DRAWS], both[CHECK_DRAWS:]), info, following


def fingerprint(params) -> str | None:
    """A digest of ``params``' values, the key of their self-check; ``None`` under ``jit``
    (nothing to check there)."""
    digest = hashlib.sha1()
    for name in sorted(params):
        value = params[name]
        if isinstance(value, jax.core.Tracer):
            return None
        digest.update(name.encode())
        digest.update(np.asarray(value).tobytes())
    return digest.hexdigest()


def first_use(checked: set, params) -> bool:
    """Whether ``params`` are used for ``q0`` draws for the first time (their fingerprint not
    in ``checked``, which then holds it); ``False`` under ``jit`` (nothing to check there)."""
    key = fingerprint(params)
    if key is None or key in checked:
        return False
    checked.add(key)
    return True


def warn_if_failed(report: TransportReport, use="q0") -> TransportReport:
    """Warn, with the fix, when the self-check's ``report`` fails for ``use``: ``"q0"``
    (``report.ok``) or ``"importance"`` (the end points, ``report.importance_ok``); returns
    it."""
    failed = not report.ok if use == "q0" else report.importance_ok is False
    if failed:
        reporting.warn(
            f"{report.message} (Checked once for these params on the set-up data, before "
            f"their first use for {use!r} draws; `self_check=False` skips the check.)",
            UserWarning,
        )
    return report


class Subject(NamedTuple):
    """What a verdict says of the guide it judges: its class ``name``, the ``names`` of the
    flat coordinates, ``unpack`` (flat ``(D,)`` to a dict by site) and the options its fix
    names (``sym_kl_weight``, ``base_dist``)."""

    name: str
    names: list
    unpack: object
    sym_kl_weight: float
    base_dist: str


class _ChainsVerdict(NamedTuple):
    ok: bool
    mean_shift: np.ndarray | None
    std_ratio: np.ndarray | None
    message: str
    spread_ok: bool = True
    judged: bool = False  # the chains ran, moved and kept finite


def _chains_verdict(name, chains, mean_tol, std_ratio_tol, end_points_ok):
    """Whether ``q0``'s mean stays within ``mean_tol`` of the chains' draws' sds and the
    chains' std within ``[1 / std_ratio_tol, std_ratio_tol]`` times ``q0``'s in every
    constrained coordinate (or the chains cannot say: they hardly moved, or diverged), and
    what to add to the verdict (with the fix when not ok; ``""`` when not run). ``name``:
    the guide's class name."""
    if chains is None:
        return _ChainsVerdict(True, None, None, "")
    if chains.skipped is not None:
        return _ChainsVerdict(True, None, None, chains.skipped)
    comparison, info, names = chains.comparison, chains.info, chains.names
    shift = np.asarray(comparison.mean_shift)
    ratio = np.exp(-np.asarray(comparison.log_std_ratio))  # the chains' std over q0's
    acceptance = float(info.acceptance)
    if acceptance < CHAINS_MIN_ACCEPTANCE or float(info.finite_fraction) < MIN_FINITE:
        return _ChainsVerdict(
            True,
            shift,
            ratio,
            (
                f" MALA chains from its draws accepted {acceptance:.0%} of their moves (or "
                "diverged) and cannot judge it."
            ),
        )
    # the spread fails past the tolerance and past its noise (heavy tails)
    limit = np.maximum(np.log(std_ratio_tol), CHAIN_STD_NOISE_Z * np.asarray(comparison.log_std_se))
    excess = np.nan_to_num(np.abs(np.log(ratio)) - limit, nan=np.inf)
    i, j = int(np.argmax(np.nan_to_num(np.abs(shift), nan=np.inf))), int(np.argmax(excess))
    mean_ok = bool(np.abs(shift[i]) <= mean_tol)
    spread_ok = bool(excess[j] <= 0.0)
    found = (
        f"q0's mean is {shift[i]:+.2f} of their sds from theirs at {names[i]}, their std "
        f"{ratio[j]:.2f} times q0's at {names[j]}"
    )
    if mean_ok and spread_ok:
        return _ChainsVerdict(
            True,
            shift,
            ratio,
            f" Metropolis-adjusted chains from its draws agree ({found}).",
            judged=True,
        )
    wider = ratio[j] > 1.0
    what = (
        f"q0 is {'narrower' if wider else 'wider'} than the posterior at {names[j]}"
        if not spread_ok
        else f"q0 is off-centre at {names[i]}"
    )
    end_points = (
        ", while the annealed end points, a few uncorrected steps from q0, stay near it"
        if end_points_ok
        else ""
    )
    shared = _shared(end_points_ok, spread_ok)
    importance = ", and the 'importance' draws with them," if shared else ""
    steps = chains.rounds * mala_draws.NUM_WARMUP
    return _ChainsVerdict(
        False,
        shift,
        ratio,
        (
            f"{name}: {what}: Metropolis-adjusted Langevin chains started at q0 draws, which "
            f"leave the posterior invariant, moved away from it in {steps} steps ({found}; "
            f"tolerances {mean_tol:g} sds and a ratio of {std_ratio_tol:g}, or "
            f"{CHAIN_STD_NOISE_Z:g} standard errors of the ratio where the tails are heavy)"
            f"{end_points}. q0 "
            f"draws (DAIS₀, median, quantiles){importance} are off there. Fix: draw with "
            "sample_posterior(..., method='mala'), Metropolis-adjusted chains from q0 draws "
            "that correct it (they warn if they had not settled); or method='psis', which "
            "reweights the end points of many particle systems and reports its Pareto k̂."
        ),
        spread_ok,
        judged=True,
    )


def _shared(end_points_ok, spread_ok) -> bool:
    """Whether the end points (the ``'importance'`` draws of one particle) share a failed
    ``q0``'s error: they stay near it, or its spread is off (a few uncorrected steps do not
    widen it). Otherwise ``q0`` is off-centre and the end points moved away from it: the
    transitions transported them, and they may be right."""
    return end_points_ok or not spread_ok


@jit_short_run
def end_point_check(affine, q0, z_end):
    """:func:`numpyro_dais.engine.annealing.dais0.transport_check` of ``q0`` (in the sampler's
    coordinates, ``affine`` its whitening) against the end points ``z_end (S, D)``: one
    small program."""
    return dais0.transport_check(sampling.in_z(affine, q0), z_end)


def transport_verdict(
    subject: Subject,
    check,
    mean_tol,
    std_ratio_tol,
    warn,
    chains: ChainsCheck | None = None,
    chain_mean_tol=CHAIN_MEAN_TOL,
    chain_std_ratio_tol=CHAIN_STD_RATIO_TOL,
) -> TransportReport:
    """The :class:`TransportReport` of a :func:`numpyro_dais.engine.annealing.dais0.transport_check`
    result ``check`` (q0 against the end points, per unconstrained coordinate) and of
    ``chains`` (:func:`chains_round`'s last round, ``None``: not run), with the fix in its
    message; a ``UserWarning`` too when it fails and ``warn``."""
    shift, ratio = np.asarray(check.mean_shift), np.exp(np.asarray(check.log_std_ratio))
    finite = float(check.finite_fraction)
    names = subject.names
    # written so that NaN (no finite end point, or one that does not vary) fails
    bad_mean = ~(np.abs(shift) <= mean_tol)
    bad_std = ~((ratio <= std_ratio_tol) & (ratio >= 1.0 / std_ratio_tol))
    end_points_ok = not bool(np.any(bad_mean | bad_std)) and finite >= MIN_FINITE
    i = int(np.argmax(np.nan_to_num(np.abs(shift), nan=np.inf)))
    j = int(np.argmax(np.nan_to_num(np.abs(np.log(ratio)), nan=np.inf)))
    summary = (
        f"largest mean shift {shift[i]:+.2f} end-point sds at {names[i]}, "
        f"largest std ratio {ratio[j]:.2f} at {names[j]}"
    )
    if finite < 1.0:
        summary += f"; {1.0 - finite:.0%} of the end points diverged and are left out"
    name = subject.name
    chains_ok, chain_shift, chain_ratio, chains_message, spread_ok, judged = _chains_verdict(
        name, chains, chain_mean_tol, chain_std_ratio_tol, end_points_ok
    )
    ok = end_points_ok and chains_ok
    importance_ok = (chains_ok or not _shared(end_points_ok, spread_ok)) if judged else None
    if end_points_ok:
        message = f"{name}: q0 agrees with the annealed end points ({summary})."
        if chains_ok:
            message += chains_message
    else:
        fix = (
            f"raise `sym_kl_weight` (now {subject.sym_kl_weight:g}) or train longer"
            if subject.sym_kl_weight
            else "train with `sym_kl_weight=1` (the default for posterior_method='q0')"
        )
        disagrees = (
            f"q0 disagrees with the annealed end points ({summary}; tolerances "
            f"{mean_tol:g} sds and a ratio of {std_ratio_tol:g})"
        )
        message = (
            f"{name}: {disagrees}. The transitions carry "
            "particles to the posterior instead of refining q0, so q0 draws (DAIS₀, median, "
            f"quantiles) are not a faithful posterior. Fix: {fix}; or use "
            "sample_posterior(..., method='importance'), whose draws are the end points "
            "checked here."
        )
        if finite < MIN_FINITE:
            message += (
                f" The annealing diverged from q0 for {1.0 - finite:.0%} of the draws, so "
                "neither q0 nor the end points are trustworthy: heed the training's "
                "divergence reports, train longer at a lower learning rate, and compare "
                "with NUTS."
            )
        elif np.any(bad_std) and not np.any(bad_mean) and subject.base_dist == "diagonal":
            message += (
                " Only the spread disagrees: for a strongly correlated posterior use "
                "base_dist='cholesky'."
            )
    if not chains_ok and end_points_ok:
        message = chains_message
    elif not chains_ok and (finite < MIN_FINITE or spread_ok):
        # the divergences first; or a transported q0, whose end points are the fix
        message = f"{message} Also: {chains_message}"
    elif not chains_ok:
        # lead with the spread, whose fix (psis) serves both checks: the importance draws,
        # the end points' own fix, share q0's spread there
        message = f"{chains_message} Also, {disagrees}."
    if warn and not ok:
        reporting.warn(message, UserWarning)
    unpack = lambda x: {k: np.asarray(v) for k, v in subject.unpack(x).items()}
    if chain_shift is not None:
        chain_shift, chain_ratio = chains.unpack(chain_shift), chains.unpack(chain_ratio)
    return TransportReport(
        ok, unpack(shift), unpack(ratio), names[i], message, chain_ratio, chain_shift, importance_ok
    )
