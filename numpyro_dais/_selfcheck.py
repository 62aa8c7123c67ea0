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

#: importance draws of the check: the end points' mean to ~1/16 of their sd, at a cost of a
#: few percent of a 5000-step fit
NUM_SAMPLES = 256


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
