"""The annealed guides' options, declared once.

Each group of options is a frozen ``NamedTuple`` whose field defaults are the one table of
defaults (AutoDAIS's): :class:`Annealing` (every annealed guide), :class:`Resampling` (the SMC
presets) and :class:`SurrogateLikelihood` (the mini-batch presets). A preset declares its
``defaults`` as instances of the groups it takes, restating only the values it changes, and
:func:`~numpyro_dais.bridge.options.parse` turns a user's keyword arguments into those
groups.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais.bridge.checks import (
    check_bool,
    check_mesh,
    check_positive_float,
    check_positive_int,
    check_step_sizes,
)
from numpyro_dais.engine import ResamplingConfig
from numpyro_dais.engine.annealing import transitions
from numpyro_dais.engine.smc.resampling import RULES
from numpyro_dais.engine.validation import check_choice


class Annealing(NamedTuple):
    """Options of every annealed guide, documented on :class:`~numpyro_dais.AutoDAIS`."""

    K: int = 4
    num_particles: int = 1
    kernel: str = "hmc"
    base_dist: str = "diagonal"
    eta_init: float | None = None
    eta_max: float | None = None
    gamma_init: float = 0.9
    prefix: str = "auto"
    init_loc_fn: Callable = init_to_uniform
    init_scale: float = 0.1
    laplace_init: bool = True
    noncentre: str | bool = "auto"
    posterior_method: str = "q0"
    sym_kl_weight: float | None = None
    report_divergences: bool = True
    self_check: bool = True
    mesh: Any = None
    forward_mode_differentiation: bool = False


BASE_DISTS = ("diagonal", "cholesky")
POSTERIOR_METHODS = ("q0", "dais", "importance", "psis")
#: ``sample_posterior``'s methods: the posterior methods and ``"mala"``, chains whose many
#: steps per call would be run again for each draw of ``Predictive`` (not a posterior method)
SAMPLE_METHODS = (*POSTERIOR_METHODS, "mala")


def checked(a: Annealing, name: str, subsamples: bool) -> Annealing:
    """The :class:`Annealing` options of guide ``name`` checked (each error names the option
    and the fix), with ``sym_kl_weight`` resolved to a float and the counts to ints;
    ``subsamples``: the guide's target takes mini-batches (``noncentre=False`` only)."""
    K = check_positive_int("K", a.K)
    num_particles = check_positive_int("num_particles", a.num_particles)
    mesh = check_mesh(name, a.mesh, num_particles, None)
    check_choice("kernel", a.kernel, transitions.KERNELS)
    check_choice("base_dist", a.base_dist, BASE_DISTS)
    check_choice("posterior_method", a.posterior_method, POSTERIOR_METHODS)
    check_step_sizes(a.eta_init, a.eta_max)
    if not 0 < a.gamma_init < 1:
        raise ValueError(f"`gamma_init` must lie in (0, 1), got {a.gamma_init!r}.")
    init_scale = check_positive_float("init_scale", a.init_scale)
    laplace_init = check_bool("laplace_init", a.laplace_init)
    self_check = check_bool("self_check", a.self_check)
    valid = a.noncentre == "auto" or isinstance(a.noncentre, bool | np.bool_)
    if not valid or (a.noncentre and subsamples):
        raise ValueError(
            "`noncentre` must be 'auto' (non-centre a hierarchy whose centred posterior "
            "has no mode), True (always) or False (never), got "
            f"{a.noncentre!r}; the mini-batch guides take False only."
        )
    sym_kl_weight = a.sym_kl_weight
    if sym_kl_weight is None:
        sym_kl_weight = 1.0 if a.posterior_method == "q0" else 0.0
    if isinstance(sym_kl_weight, bool) or not (np.isfinite(sym_kl_weight) and sym_kl_weight >= 0):
        raise ValueError(
            "`sym_kl_weight` must be a finite number >= 0 (0: q0 trained on the bound "
            f"alone), got {sym_kl_weight!r}."
        )
    return a._replace(
        K=K,
        num_particles=num_particles,
        mesh=mesh,
        init_scale=init_scale,
        laplace_init=laplace_init,
        self_check=self_check,
        sym_kl_weight=float(sym_kl_weight),
    )


class Resampling(NamedTuple):
    """Options of the SMC presets, documented on :class:`~numpyro_dais.AutoDSMCS`."""

    resampling: str = "multinomial"
    resample_when: str = "bernoulli"
    ess_threshold: float = 0.5
    resampling_gradient: str = "stop"
    gst_temperature: float = 0.1
    gst_gap: float = 1.0
    train_resample_when: str | None = "never"

    def configs(self) -> tuple[ResamplingConfig, ResamplingConfig]:
        """``(config, train_config)``: ``config`` runs posterior draws, ``log_evidence`` and
        ``diagnostics``; ``train_config`` the SVI loss, the same but for its rule
        ``train_resample_when`` (``None``: ``resample_when``)."""
        config = ResamplingConfig(*self[:-1])
        if self.train_resample_when is None:
            return config, config
        if not callable(self.train_resample_when):
            check_choice("train_resample_when", self.train_resample_when, RULES)
        return config, config._replace(when=self.train_resample_when)


class SurrogateLikelihood(NamedTuple):
    """Options of the mini-batch presets, documented on
    :class:`~numpyro_dais.AutoSurrogateLikelihoodDAIS`."""

    surrogate_model: Callable | None = None
    num_surrogate: int | None = None
    dynamics: str = "surrogate"


def step_bounds(eta_init, eta_max, lam, floor, momentum):
    """``((eta_init, eta_max), λ)``: unless given, ``eta_max`` is half the integrator's
    stability limit for the curvature ``max(λ, floor)`` (``1 / sqrt(λ)`` with momentum,
    ``1 / λ`` for Langevin; ``floor``: ``q0``'s own) and ``eta_init = eta_max / 10``. ``λ``
    returned is the curvature used (``None`` when ``eta_max`` was given)."""
    used = None
    if eta_max is None:
        lam = float(lam) if lam is not None and np.isfinite(lam) else 0.0
        used = max(lam, floor)
        eta_max = 1.0 / math.sqrt(used) if momentum else 1.0 / used
        if eta_init is not None and eta_init >= eta_max:
            eta_max = 10.0 * eta_init
    if eta_init is None:
        eta_init = eta_max / 10.0
    return (float(eta_init), float(eta_max)), used
