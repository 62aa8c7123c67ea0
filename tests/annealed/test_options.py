"""The annealed presets' options: one table of defaults, parsed keyword arguments."""

import pytest

from numpyro_dais import (
    AutoDAIS,
    AutoDSMCS,
    AutoSurrogateLikelihoodDAIS,
    AutoSurrogateLikelihoodDSMCS,
)
from numpyro_dais.annealed.options import Annealing, Resampling, SurrogateLikelihood
from numpyro_dais.engine.smc import resampling

PRESETS = [AutoDAIS, AutoDSMCS, AutoSurrogateLikelihoodDAIS, AutoSurrogateLikelihoodDSMCS]


def model():
    pass


@pytest.mark.parametrize("cls", PRESETS)
def test_a_preset_is_built_with_its_defaults(cls):
    guide = cls(model)
    for group in cls.defaults:
        for name, default in group._asdict().items():
            if name in ("sym_kl_weight", "forward_mode_differentiation"):
                continue  # None resolves from posterior_method; numpyro's base holds the other
            assert getattr(guide, name) == default, (cls.__name__, name)


def test_presets_restate_only_what_they_change():
    assert AutoDAIS.defaults == (Annealing(),)
    assert AutoDSMCS.defaults[0]._replace(K=4, num_particles=1, posterior_method="q0") == (
        Annealing()
    )
    assert AutoDSMCS.defaults[1] == Resampling()
    assert AutoSurrogateLikelihoodDAIS.defaults[1] == SurrogateLikelihood()


def test_options_given_by_keyword_reach_the_guide():
    guide = AutoDSMCS(model, K=3, resample_when="ess", ess_threshold=0.25)
    assert (guide.K, guide.num_particles) == (3, 16)
    assert guide._sampler.resampling.when is resampling.ess_below  # resolved once
    assert guide._sampler.resampling.ess_threshold == 0.25
    assert guide._train_sampler.resampling.when is resampling.never
    guide = AutoSurrogateLikelihoodDAIS(model, None, num_surrogate=7, dynamics="surrogate")
    assert guide.num_surrogate == 7


@pytest.mark.parametrize("cls", PRESETS)
def test_an_unknown_option_is_refused_with_the_closest_name(cls):
    with pytest.raises(TypeError, match=r"unexpected keyword argument `num_particle`.*`num_par"):
        cls(model, num_particle=4)


def test_options_are_read_only_after_construction():
    guide = AutoDSMCS(model)
    for name in ("K", "resample_when", "prefix"):
        with pytest.raises(AttributeError, match="fixed at construction"):
            setattr(guide, name, None)
