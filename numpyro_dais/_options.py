"""Options the annealed presets share: how a preset hands its keyword options on, and the
resampling options of the SMC presets (``AutoDSMCS``, ``AutoSurrogateLikelihoodDSMCS``)."""

from numpyro_dais.engine.resampling import RULES
from numpyro_dais.engine.smc import ResamplingConfig
from numpyro_dais.engine.validation import check_choice


def preset_options(local_vars):
    """A preset's ``locals()`` without ``self``, ``model`` and ``__class__``: the options it
    hands on to :class:`AnnealedGuide` unchanged."""
    return {k: v for k, v in local_vars.items() if k not in ("self", "model", "__class__")}


#: the options of a resampling configuration, as the guides name them
RESAMPLING_OPTIONS = (
    "resampling",
    "resample_when",
    "ess_threshold",
    "resampling_gradient",
    "gst_temperature",
    "gst_gap",
    "train_resample_when",
)


def resampling_configs(guide, options) -> tuple[ResamplingConfig, ResamplingConfig]:
    """``(config, train_config)`` from a preset's keyword options (popped from ``options``
    and set on ``guide``): ``config`` runs posterior draws, ``log_evidence`` and
    ``diagnostics``; ``train_config`` the SVI loss, the same but for its rule
    ``train_resample_when`` (``None``: ``resample_when``)."""
    for name in RESAMPLING_OPTIONS:
        setattr(guide, name, options.pop(name))
    config = ResamplingConfig(*(getattr(guide, name) for name in RESAMPLING_OPTIONS[:-1]))
    train = guide.train_resample_when
    if train is None:
        return config, config
    check_choice("train_resample_when", train, RULES)
    return config, config._replace(when=train)
