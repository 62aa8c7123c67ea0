"""The check that q0 draws are trustworthy, run once for each set of trained parameters.

``q0`` (DAIS₀) is a faithful posterior only where the transitions refine it; where they
carry a misplaced ``q0`` to the posterior instead, its draws are off while the bound is
tight. The first time ``q0`` is used as the posterior for given ``params``
(``sample_posterior`` with ``method="q0"``, ``median``, ``quantiles``), the guide compares it
with its importance-resampled end points on the set-up data (a transport check of
:data:`NUM_SAMPLES` draws) and warns, with the fix, when they disagree.
"""

import hashlib
import warnings

import jax
import numpy as np

from numpyro_dais.results import TransportReport

#: importance draws of the check: the end points' mean to ~1/16 of their sd, at a cost of a
#: few percent of a 5000-step fit
NUM_SAMPLES = 256

#: the fraction of finite end points below which the check fails whatever their moments:
#: an end point is not finite when every particle of its annealing diverged from ``q0``
MIN_FINITE = 0.95


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


def check_q0_once(guide, params) -> None:
    """Run ``guide.transport_check`` on the set-up data the first time ``params`` are used
    for ``q0`` draws, if ``guide.self_check``; its warning carries the fix."""
    if not guide.self_check:
        return
    key = _fingerprint(params)
    checked = guide.__dict__.setdefault("_self_checked", set())
    if key is None or key in checked:
        return
    checked.add(key)
    args, kwargs = guide._setup_args
    try:
        report = guide.transport_check(
            jax.random.key(0), params, *args, num_samples=NUM_SAMPLES, warn=False, **kwargs
        )
    except ValueError:
        # the annealing cannot run here (e.g. a guide inside an AutoGuideList, whose model
        # hides sites that another guide draws): nothing to compare q0 with
        return
    if not report.ok:
        warnings.warn(
            f"{report.message} (Checked once for these params on the set-up data, before "
            "their first use as the posterior; `self_check=False` skips the check.)",
            UserWarning,
            stacklevel=4,
        )


def transport_verdict(guide, check, mean_tol, std_ratio_tol, warn) -> TransportReport:
    """The :class:`TransportReport` of a :func:`numpyro_dais.engine.dais0.transport_check`
    result ``check`` (q0 against the end points, per unconstrained coordinate), with the
    fix in its message; a ``UserWarning`` too when it fails and ``warn``."""
    shift, ratio = np.asarray(check.mean_shift), np.exp(np.asarray(check.log_std_ratio))
    finite = float(check.finite_fraction)
    names = guide._coordinate_names()
    # written so that NaN (no finite end point, or one that does not vary) fails
    bad_mean = ~(np.abs(shift) <= mean_tol)
    bad_std = ~((ratio <= std_ratio_tol) & (ratio >= 1.0 / std_ratio_tol))
    ok = not bool(np.any(bad_mean | bad_std)) and finite >= MIN_FINITE
    i = int(np.argmax(np.nan_to_num(np.abs(shift), nan=np.inf)))
    j = int(np.argmax(np.nan_to_num(np.abs(np.log(ratio)), nan=np.inf)))
    summary = (
        f"largest mean shift {shift[i]:+.2f} end-point sds at {names[i]}, "
        f"largest std ratio {ratio[j]:.2f} at {names[j]}"
    )
    if finite < 1.0:
        summary += f"; {1.0 - finite:.0%} of the end points diverged and are left out"
    name = type(guide).__name__
    if ok:
        message = f"{name}: q0 agrees with the annealed end points ({summary})."
    else:
        fix = (
            f"raise `sym_kl_weight` (now {guide.sym_kl_weight:g}) or train longer"
            if guide.sym_kl_weight
            else "train with `sym_kl_weight=1` (the default for posterior_method='q0')"
        )
        message = (
            f"{name}: q0 disagrees with the annealed end points ({summary}; tolerances "
            f"{mean_tol:g} sds and a ratio of {std_ratio_tol:g}). The transitions carry "
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
        elif np.any(bad_std) and not np.any(bad_mean) and guide.base_dist == "diagonal":
            message += (
                " Only the spread disagrees: for a strongly correlated posterior use "
                "base_dist='cholesky'."
            )
        if warn:
            warnings.warn(message, UserWarning, stacklevel=3)
    unpack = lambda x: {k: np.asarray(v) for k, v in guide._view.unpack(x).items()}
    return TransportReport(ok, unpack(shift), unpack(ratio), names[i], message)
