"""The annealed guides' options, declared once.

Each group of options is a frozen ``NamedTuple`` whose field defaults are the one table of
defaults (AutoDAIS's): :class:`Annealing` (every annealed guide), :class:`Resampling` (the SMC
presets) and :class:`SurrogateLikelihood` (the mini-batch presets). A preset declares its
``defaults`` as instances of the groups it takes, restating only the values it changes, and
:func:`~numpyro_dais.bridge.options.parse` turns a user's keyword arguments into those
groups.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from numpyro.infer.initialization import init_to_uniform

from numpyro_dais.engine import ResamplingConfig
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
