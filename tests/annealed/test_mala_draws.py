"""``sample_posterior(method="mala")``: Metropolis-adjusted chains from ``q0`` draws correct a
``q0`` too narrow for the posterior, warn when they had not settled, and are refused where
the dynamics never see the full-data posterior."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_dais import AutoDAIS, AutoDSMCS, AutoSurrogateLikelihoodDAIS
from numpyro_dais.annealed.posterior import mala_draws
from numpyro_dais.engine.mcmc import mala
from tests.annealed.test_autosldais import init_params, logistic, logistic_data
from tests.models import linear_gaussian, linear_gaussian_data, linear_gaussian_posterior

Y = linear_gaussian_data()
MEAN, COV = linear_gaussian_posterior(Y)
SD = jnp.sqrt(jnp.diag(COV))


@pytest.fixture(scope="module")
def narrow():
    """A trained guide whose ``q0`` is then made three times too narrow (its diagonal
    scale in the whitened coordinates divided by 3), with the self-check off: what a
    ``q0`` fitted by a mode-seeking objective looks like, exaggerated."""
    guide = AutoDAIS(linear_gaussian, self_check=False)
    svi = SVI(linear_gaussian, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.key(0), 300, Y, progress_bar=False).params
    return guide, {**params, "auto_z_0_scale": params["auto_z_0_scale"] / 3.0}


def quiet_mala_draws(guide, params, key):
    """4000 ``mala`` draws of ``z``, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return guide.sample_posterior(key, params, Y, sample_shape=(4000,), method="mala")["z"]


def test_mala_draws_correct_a_q0_three_times_too_narrow(narrow):
    """4000 draws against the exact posterior: ``q0``'s sds are about a third of it, the
    chains' within 10% (Monte Carlo error of 4000 correlated draws, about 3%) and their
    means within 0.1 sd; nothing warns. Without the chains (``method="q0"``) the sds
    fail the same tolerance by far."""
    guide, params = narrow
    q0 = guide.sample_posterior(jax.random.key(1), params, sample_shape=(4000,))["z"]
    assert np.all(np.asarray(q0.std(0) / SD) < 0.5)
    z = quiet_mala_draws(guide, params, jax.random.key(1))
    np.testing.assert_allclose(z.std(0), SD, rtol=0.1)
    np.testing.assert_array_less(np.abs(np.asarray(z.mean(0) - MEAN) / SD), 0.1)


def test_autodsmcs_draws_with_mala_too():
    """AutoDSMCS runs on the full-data posterior as AutoDAIS does: 100 training steps, then
    2000 ``mala`` draws with the exact posterior's means (within 0.1 sd) and sds (10%)."""
    guide = AutoDSMCS(linear_gaussian)
    svi = SVI(linear_gaussian, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.key(0), 100, Y, progress_bar=False).params
    z = guide.sample_posterior(jax.random.key(1), params, Y, sample_shape=(2000,), method="mala")
    np.testing.assert_allclose(z["z"].std(0), SD, rtol=0.1)
    np.testing.assert_array_less(np.abs(np.asarray(z["z"].mean(0) - MEAN) / SD), 0.1)


def test_mala_draws_have_the_sample_shape_and_no_pareto_k(narrow):
    guide, params = narrow
    draws, k = guide.sample_posterior(
        jax.random.key(2), params, Y, sample_shape=(3, 5), method="mala", return_pareto_k=True
    )
    assert draws["z"].shape == (3, 5, 2) and k is None
    assert np.all(np.isfinite(np.asarray(draws["z"])))


def test_chains_that_had_not_settled_warn_with_the_fix(narrow, monkeypatch):
    """One round of ten warm-up steps (windows of one step) from a ``q0`` thirty times too
    narrow: half-way through, the chains were still spreading, and the warning names the
    draws, what moved and the fix."""
    guide, params = narrow
    params = {**params, "auto_z_0_scale": params["auto_z_0_scale"] / 10.0}
    monkeypatch.setattr(mala_draws, "NUM_WARMUP", 2)
    monkeypatch.setattr(mala_draws, "MAX_ROUNDS", 1)
    with pytest.warns(RuntimeWarning, match="'mala' draws may not be the posterior's") as w:
        guide.sample_posterior(jax.random.key(3), params, Y, sample_shape=(100,), method="mala")
    assert "spread" in str(w[0].message) and "train q0 further" in str(w[0].message)


def test_further_rounds_of_warm_up_recover_unsettled_chains(narrow, monkeypatch):
    """The same start with up to four rounds, each continuing from the last: the chains
    settle (the ensemble's adapted scale spreads them within two rounds here), nothing
    warns, and the draws are the posterior's (sds within 10%, as above)."""
    guide, params = narrow
    params = {**params, "auto_z_0_scale": params["auto_z_0_scale"] / 10.0}
    monkeypatch.setattr(mala_draws, "NUM_WARMUP", 2)
    z = quiet_mala_draws(guide, params, jax.random.key(3))
    np.testing.assert_allclose(z.std(0), SD, rtol=0.1)


def test_every_round_runs_the_one_compiled_program():
    """The first round's start has the input types (shapes, dtypes, placement) of the
    start a round's program returns for the next, which key the compiled programs
    (``runtime.compilation.run_for``): a start left on the host compiled the program again
    for the second round."""
    from numpyro_dais.runtime.compilation import input_types

    first = mala_draws.first_start(3, np.dtype("float32"))
    following = jax.jit(lambda s: jax.tree.map(lambda x: x + 0, s))(first)
    assert input_types(jax.tree.leaves(first)) == input_types(jax.tree.leaves(following))


def test_a_density_not_finite_where_the_posterior_has_mass_warns():
    """Chains that proposed a non-finite density a fifth of the time (the engine's
    ``nonfinite_proposals``, tested on a cut target in tests/engine/mcmc): the warning says
    the draws miss that region and how to fix it; at 0 nothing warns."""
    from numpyro_dais.engine.mcmc.mala import EnsembleInfo

    info = EnsembleInfo(
        *(jnp.asarray(x) for x in (0.55, 1.0, jnp.ones(2), jnp.zeros(2), jnp.zeros(2), 1.0)),
        nonfinite_proposals=jnp.asarray(0.2),
    )
    with pytest.warns(RuntimeWarning, match="not finite at 20.0% of the chains' proposals"):
        assert mala_draws.warn_if_doubtful("AutoDAIS", info, ["z[0]", "z[1]"], 1)
    quiet = info._replace(nonfinite_proposals=jnp.asarray(0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not mala_draws.warn_if_doubtful("AutoDAIS", quiet, ["z[0]", "z[1]"], 1)


def test_mala_refuses_batch_size_and_mesh(narrow):
    guide, params = narrow
    with pytest.raises(ValueError, match="`batch_size` and `mesh` do not apply"):
        guide.sample_posterior(
            jax.random.key(0), params, Y, sample_shape=(8,), method="mala", batch_size=4
        )


def test_mala_needs_the_data(narrow):
    """The chains run on the posterior of the data passed, as the annealed methods do."""
    guide, params = narrow
    with pytest.raises(ValueError, match="method='mala'.*pass the model's arguments"):
        guide.sample_posterior(jax.random.key(0), params, method="mala")


def test_a_mini_batch_guide_refuses_mala_with_the_alternatives():
    X, Yl = logistic_data(200)
    guide = AutoSurrogateLikelihoodDAIS(logistic, K=2, num_surrogate=8)
    params = init_params(guide, logistic, X, Yl, subsample_size=50)
    with pytest.raises(ValueError, match="method='mala'.*'importance' or 'psis'"):
        guide.sample_posterior(jax.random.key(0), params, X, Yl, method="mala")


def test_fewer_chains_widen_the_settling_tolerances():
    """The drift of an ensemble's median is judged against its Monte Carlo error, about
    ``1.25 / sqrt(C)`` sds: a drift of 0.3 sds says 256 chains had not settled, but is
    noise for 32 (tolerance 0.2 × sqrt(256 / 32) = 0.57), which would otherwise run every
    round there is."""
    zeros = jnp.zeros(2)
    info = mala.EnsembleInfo(
        jnp.asarray(0.6), jnp.asarray(0.5), zeros + 1, jnp.array([0.3, 0.0]), zeros,
        jnp.asarray(1.0), jnp.asarray(0.0),
    )  # fmt: skip
    names = ["z[0]", "z[1]"]
    assert "moved +0.30 sds at z[0]" in mala_draws.unsettled(info, names, 256)
    assert "moved +0.30 sds at z[0]" in mala_draws.unsettled(info, names)  # 1,024
    assert mala_draws.unsettled(info, names, 32) is None
