"""Every guide's options, declared once (``defaults``): ``help()`` shows each with its
default, a misspelt name is an error naming the closest, and AutoSemiDAIS keeps numpyro's
positional arguments."""

import inspect

import pytest

from numpyro_dais import (
    AutoDAIS,
    AutoDSMCS,
    AutoGPVI,
    AutoSemiDAIS,
    AutoSurrogateLikelihoodDAIS,
    AutoSurrogateLikelihoodDSMCS,
)

GUIDES = [
    AutoDAIS,
    AutoDSMCS,
    AutoSurrogateLikelihoodDAIS,
    AutoSurrogateLikelihoodDSMCS,
    AutoGPVI,
    AutoSemiDAIS,
]


def model():
    pass


@pytest.mark.parametrize("cls", GUIDES)
def test_every_guide_declares_its_options_once_and_help_shows_them(cls):
    params = inspect.signature(cls).parameters
    for group in cls.defaults:
        for name, default in group._asdict().items():
            assert params[name].default is default, (cls.__name__, name)
            assert name in cls._options, (cls.__name__, name)
    assert "Build the guide" in cls.__init__.__doc__


@pytest.mark.parametrize("cls", GUIDES)
def test_a_misspelt_option_names_the_closest(cls):
    with pytest.raises(TypeError, match="Did you mean `num_particles`"):
        cls(model, num_particle=2)


def test_semidais_takes_numpyros_positional_options():
    guide = AutoSemiDAIS(model, None, None, None, 5, 0.01, 0.1, 0.8)
    assert (guide.K, guide.eta_init, guide.eta_max, guide.gamma_init) == (5, 0.01, 0.1, 0.8)
    params = list(inspect.signature(AutoSemiDAIS).parameters)
    assert params[:6] == ["model", "local_model", "global_guide", "local_guide", "K", "eta_init"]
    with pytest.raises(TypeError, match="multiple values for `K`"):
        AutoSemiDAIS(model, None, None, None, 5, K=3)
    with pytest.raises(TypeError, match="at most 7 options by position"):
        AutoSemiDAIS(model, None, None, None, *range(1, 9))
