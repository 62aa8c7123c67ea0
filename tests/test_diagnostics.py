"""``numpyro_dais.diagnostics``: the learnt transition parameters and their plots."""

import jax
import numpy as np
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

import numpyro_dais
from numpyro_dais import (
    AutoDAIS,
    AutoDSMCS,
    AutoGPVI,
    plot_ess,
    plot_transitions,
    transition_params,
)
from numpyro_dais.engine.annealing.path import betas_from_increments
from tests import models


def _params(guide):
    """Parameters right after set-up (``svi.init``): no training is needed to read them."""
    y = models.linear_gaussian_data()
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.05), Trace_ELBO())
    return svi.get_params(svi.init(jax.random.key(0), y))


@pytest.fixture(scope="module")
def hmc():
    guide = AutoDAIS(models.linear_gaussian, K=3, num_particles=2)
    return guide, _params(guide)


def test_transition_params_of_hmc(hmc):
    guide, params = hmc
    tp = transition_params(guide, params)
    assert tp.betas.shape == (4,) and tp.step_sizes.shape == (3,) and tp.mass.shape == (2,)
    np.testing.assert_allclose(tp.betas, betas_from_increments(params["auto_beta_increments"]))
    assert tp.betas[0] == 0 and abs(tp.betas[-1] - 1) < 1e-6 and np.all(np.diff(tp.betas) > 0)
    assert np.all((tp.step_sizes > 0) & (tp.step_sizes <= tp.eta_max))
    # the mass matrix as the sampler uses it: normalised to geometric mean 1
    np.testing.assert_allclose(np.exp(np.mean(np.log(tp.mass))), 1.0, rtol=1e-5)
    np.testing.assert_allclose(tp.gamma, params["auto_gamma"], rtol=1e-6)
    assert tp.kernel == "hmc" and tp.coordinates == ["z[0]", "z[1]"]
    # the guide's method returns the same
    same = guide.transition_params(params)
    np.testing.assert_array_equal(same.step_sizes, tp.step_sizes)


def test_transition_params_of_langevin_smc():
    guide = AutoDSMCS(models.linear_gaussian, K=2, kernel="langevin")
    tp = transition_params(guide, _params(guide))
    assert tp.kernel == "langevin" and tp.gamma == 0.0
    np.testing.assert_array_equal(tp.mass, np.ones(2))


def test_errors_for_other_guides_and_before_set_up():
    with pytest.raises(RuntimeError, match="not set up"):
        transition_params(AutoDAIS(models.linear_gaussian), {})
    with pytest.raises(TypeError, match="no annealing transitions"):
        transition_params(AutoGPVI(models.linear_gaussian), {})


def test_plots_and_exports(hmc):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    guide, params = hmc
    axes = plot_transitions(guide.transition_params(params))
    assert len(axes) == 3 and all(len(ax.lines) >= 1 for ax in axes)
    assert len(axes[2].patches) == 2  # one bar per coordinate
    d = numpyro_dais.SMCDiagnostics(
        ess=np.array([[4.0, 3.0], [2.0, 4.0]]),
        resampled=np.array([[False, True], [False, False]]),
        log_Z=np.zeros(2),
        pareto_k=np.full((2, 2), np.inf),
    )
    ax = plot_ess(d, num_particles=4)
    assert len(ax.lines) == 3  # two systems and the line ESS = N
    plt.close("all")
    # plot_ess lives in diagnostics and is re-exported where it used to be
    from numpyro_dais import diagnostics
    from numpyro_dais.annealed import autodsmcs

    assert numpyro_dais.plot_ess is diagnostics.plot_ess is autodsmcs.plot_ess
