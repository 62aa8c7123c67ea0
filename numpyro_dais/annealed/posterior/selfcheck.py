"""The check that q0 draws are trustworthy, run once for each set of trained parameters.

``q0`` (DAIS₀) is a faithful posterior only where the transitions refine it; where they
carry a misplaced ``q0`` to the posterior instead, its draws are off while the bound is
tight. The first time ``q0`` is used as the posterior for given ``params``
(``sample_posterior`` with ``method="q0"``, ``median``, ``quantiles``), the guide compares it
with its importance-resampled end points on the set-up data (a transport check of
:data:`NUM_SAMPLES` draws) and warns, with the fix, when they disagree. For a guide whose
target is the full-data posterior it also runs Metropolis-adjusted Langevin chains from
``q0`` draws (:func:`numpyro_dais.engine.diagnostics.mala.relaxation_check`), which do not trust the
learnt transitions, and warns when their spread leaves ``q0``'s.
"""

import hashlib
from typing import NamedTuple

import jax
import numpy as np

from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.sampling import Call
from numpyro_dais.engine.annealing import dais0
from numpyro_dais.engine.diagnostics import mala
from numpyro_dais.results import TransportReport
from numpyro_dais.runtime import compilation, reporting
from numpyro_dais.runtime.vectorise import jit_short_run

#: importance draws of the check: the end points' mean to ~1/16 of their sd, at a cost of a
#: few percent of a 5000-step fit
NUM_SAMPLES = 256

#: the fraction of finite end points below which the check fails whatever their moments:
#: an end point is not finite when every particle of its annealing diverged from ``q0``
MIN_FINITE = 0.95

#: MALA chains of the relaxation check and their length
RELAX_CHAINS = 64
RELAX_STEPS = 100
#: The check's tolerances: the ratio of the chains' std to q0's (either way), the end
#: points' mean shift (in their sds) and their std ratio to q0's, beyond which q0 fails.
#: Set from the labelled fits of ``benchmarks/self_check.py`` (models × seeds × settings
#: against NUTS; its results score each choice by its misses and false alarms): the grid's
#: fewest misses with no false alarm, but the end points' std ratio at the next grid step
#: up, where the lowest one passed a right fit by a hair.
CHAIN_STD_RATIO_TOL = 1.6
MEAN_SHIFT_TOL = 0.3
STD_RATIO_TOL = 1.5
#: below this acceptance the chains hardly moved: the check says nothing
RELAX_MIN_ACCEPTANCE = 0.2
#: The runs the chains' program is compiled for (:func:`numpyro_dais.runtime.compilation.run_for`):
#: its steps, the model's gradients, counted at
#: 1 / :data:`~numpyro_dais.runtime.compilation.GRADIENT_WORK_DISCOUNT`.
RELAX_RUNS = RELAX_STEPS / compilation.GRADIENT_WORK_DISCOUNT


def _fingerprint(params) -> str | None:
    """A digest of ``params``' values; ``None`` under ``jit`` (nothing to check there)."""
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
    key = _fingerprint(params)
    if key is None or key in checked:
        return False
    checked.add(key)
    return True


def warn_if_failed(report: TransportReport) -> TransportReport:
    """Warn, with the fix, when the self-check's ``report`` fails; returns it."""
    if not report.ok:
        reporting.warn(
            f"{report.message} (Checked once for these params on the set-up data, before "
            "their first use as the posterior; `self_check=False` skips the check.)",
            UserWarning,
        )
    return report


def relaxation(call: Call, rng_key) -> mala.RelaxationCheck:
    """:func:`numpyro_dais.engine.diagnostics.mala.relaxation_check` of the call's ``q0`` on its
    dynamics (:data:`RELAX_CHAINS` chains of :data:`RELAX_STEPS`, from ``rng_key`` folded with
    1: the end points it is compared with use ``rng_key`` itself). Meaningful where the
    dynamics run on the full-data posterior (not a surrogate, not a mini-batch)."""
    key_target, key_run = jax.random.split(jax.random.fold_in(rng_key, 1))
    log_target = call.target.dynamics(key_target)
    q0 = sampling.in_z(call.fitted.affine, call.fitted.q0)
    return mala.relaxation_check(key_run, q0, log_target, RELAX_CHAINS, RELAX_STEPS)


class Subject(NamedTuple):
    """What a verdict says of the guide it judges: its class ``name``, the ``names`` of the
    flat coordinates, ``unpack`` (flat ``(D,)`` to a dict by site) and the options its fix
    names (``sym_kl_weight``, ``base_dist``)."""

    name: str
    names: list
    unpack: object
    sym_kl_weight: float
    base_dist: str


def _farthest_from_one(ratio) -> int:
    """The index of the finite ratio farthest from 1 (in log)."""
    return int(np.argmax(np.abs(np.log(np.where(np.isfinite(ratio), ratio, 1.0)))))


def _chains_verdict(name, names, chains, std_ratio_tol, end_points_ok):
    """``(ok, std ratio (D,) or None, message)``: whether the chains' std stays within
    ``[1 / std_ratio_tol, std_ratio_tol]`` times ``q0``'s in every coordinate of ``z`` (or
    the chains cannot say: they hardly moved, or diverged), and what to add to the verdict
    (with the fix when not ok; ``""`` when not run). ``name``: the guide's class name;
    ``names``: the coordinates of ``z``."""
    if chains is None:
        return True, None, ""
    ratio = np.asarray(chains.std_ratio)
    acceptance = float(chains.acceptance)
    if acceptance < RELAX_MIN_ACCEPTANCE or float(chains.finite_fraction) < MIN_FINITE:
        return (
            True,
            ratio,
            (
                f" MALA chains from its draws accepted {acceptance:.0%} of their moves (or "
                "diverged) and cannot judge its spread."
            ),
        )
    j = _farthest_from_one(ratio)
    coordinate = names[j]
    if 1.0 / std_ratio_tol <= ratio[j] <= std_ratio_tol:
        return (
            True,
            ratio,
            (
                f" MALA chains from its draws keep its spread (largest std ratio {ratio[j]:.2f} "
                f"at {coordinate})."
            ),
        )
    wider = ratio[j] > 1.0
    end_points = (
        ", while the annealed end points, a few uncorrected steps from q0, stay near it"
        if end_points_ok
        else ""
    )
    return (
        False,
        ratio,
        (
            f"{name}: q0 is {'narrower' if wider else 'wider'} than the "
            f"posterior at {coordinate}: Metropolis-adjusted Langevin chains started at q0 draws "
            f"spread to {ratio[j]:.2f} times q0's std there within {RELAX_STEPS} steps "
            f"(tolerance a ratio of {std_ratio_tol:g}){end_points}. q0 draws (DAIS₀, median, "
            f"quantiles), and the 'importance' draws with them, "
            f"{'understate' if wider else 'overstate'} the uncertainty there. Fix: draw with "
            "sample_posterior(..., method='mala'), Metropolis-adjusted chains from q0 draws "
            "that correct its spread (they warn if they had not settled); or "
            "method='psis', which reweights the end points of many particle systems and "
            "reports its Pareto k̂."
        ),
    )


@jit_short_run
def end_point_check(affine, q0, z_end):
    """:func:`numpyro_dais.engine.annealing.dais0.transport_check` of ``q0`` (in the sampler's
    coordinates, ``affine`` its whitening) against the end points ``z_end (S, D)``: one
    small program."""
    return dais0.transport_check(sampling.in_z(affine, q0), z_end)


def transport_verdict(
    subject: Subject, check, mean_tol, std_ratio_tol, warn, chains=None, chain_std_ratio_tol=None
) -> TransportReport:
    """The :class:`TransportReport` of a :func:`numpyro_dais.engine.annealing.dais0.transport_check`
    result ``check`` (q0 against the end points, per unconstrained coordinate) and of
    ``chains`` (:func:`relaxation`, ``None``: not run), with the fix in its message; a
    ``UserWarning`` too when it fails and ``warn``."""
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
    chain_tol = CHAIN_STD_RATIO_TOL if chain_std_ratio_tol is None else chain_std_ratio_tol
    chains_ok, chain_ratio, chains_message = _chains_verdict(
        name, names, chains, chain_tol, end_points_ok
    )
    ok = end_points_ok and chains_ok
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
    elif not chains_ok and finite < MIN_FINITE:  # the divergences first
        message = f"{message} Also: {chains_message}"
    elif not chains_ok:
        # lead with the spread, whose fix (psis) serves both checks: the importance draws,
        # the end points' own fix, share q0's spread there
        message = f"{chains_message} Also, {disagrees}."
    if warn and not ok:
        reporting.warn(message, UserWarning)
    unpack = lambda x: {k: np.asarray(v) for k, v in subject.unpack(x).items()}
    chain_ratio = None if chain_ratio is None else unpack(chain_ratio)
    return TransportReport(ok, unpack(shift), unpack(ratio), names[i], message, chain_ratio)
