"""The MALA ensemble (:func:`numpyro_dais.engine.mcmc.mala.sample`) on exact Gaussian targets:
it corrects a start far too narrow, restarts chains stuck where the density is not finite,
and its drift statistics tell a settled ensemble from one still moving."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import multivariate_normal

from numpyro_dais.engine.mcmc import mala

# a correlated 3-D Gaussian target: sds 1, 3 and 0.5, correlation 0.7 between the first two
M = jnp.array([1.0, -2.0, 0.5])
SD = jnp.array([1.0, 3.0, 0.5])
CORR = jnp.array([[1.0, 0.7, 0.0], [0.7, 1.0, 0.0], [0.0, 0.0, 1.0]])
COV = CORR * SD[:, None] * SD[None, :]


def log_p(x):
    return multivariate_normal.logpdf(x, M, COV)


def test_the_ensemble_corrects_a_start_ten_times_too_narrow():
    """1024 chains from N(M, (SD/10)²) (a q0 ten times too narrow, at the right mean), 500
    warm-up steps, 4 draws each 2 steps apart: the pooled draws' means within 0.1 sd and
    sds within 10% of the target's (Monte Carlo error of about 4,000 correlated draws:
    about 0.03 sd; the tolerance leaves room for the chains' correlation), the drift
    statistics within the guide's tolerances, and acceptance near 0.574."""
    key_start, key_run = jax.random.split(jax.random.key(0))
    x0 = M + SD / 10 * jax.random.normal(key_start, (1024, 3))
    draws, info = jax.jit(lambda k: mala.sample(k, log_p, x0, 500, 4, 2))(key_run)
    assert draws.shape == (1024, 4, 3)
    pooled = np.asarray(draws).reshape(-1, 3)
    np.testing.assert_array_less(np.abs(pooled.mean(0) - M) / SD, 0.1)
    np.testing.assert_allclose(pooled.std(0), SD, rtol=0.1)
    assert np.all(np.abs(np.asarray(info.mean_shift)) < 0.2)
    assert np.all(np.abs(np.asarray(info.log_std_ratio)) < 0.25)
    assert 0.4 < float(info.acceptance) < 0.75
    assert float(info.finite_fraction) == 1.0
    assert float(info.nonfinite_proposals) == 0.0


def test_the_drift_statistics_see_an_ensemble_still_spreading():
    """Ten warm-up steps (windows of one step) from the same narrow start: half-way through
    the warm-up the ensemble is still spreading (the adapted scale widens it each window;
    measured 0.6 of the widest sd there), so the draws' spread is far from the warm-up's
    middle: a log std ratio above the guide's tolerance of 0.25 (measured 0.5; with 20
    steps the ensemble has settled, 0.07)."""
    key_start, key_run = jax.random.split(jax.random.key(1))
    x0 = M + SD / 10 * jax.random.normal(key_start, (1024, 3))
    _, info = mala.sample(key_run, log_p, x0, 10, 4, 2)
    assert float(np.max(np.abs(np.asarray(info.log_std_ratio)))) > 0.25


def test_chains_stuck_where_the_density_is_nan_restart_during_warm_up():
    """Half the chains start where the density is NaN (``x[2] < 0``, a hard wall the target
    below has no mass behind): MALA never moves them (every ratio from there is NaN), so
    without restarts half the draws would be their starting points. With restarts every
    chain ends finite and the draws are the truncated target's (``x[2] > 0``). The wall
    sits 1 sd from the mode, so proposals land behind it often: ``nonfinite_proposals``
    says so (above the guide's 1%), where an uncut target gives 0 (first test)."""
    wall = lambda x: jnp.where(x[2] > 0, log_p(x), jnp.nan)
    key_start, key_run = jax.random.split(jax.random.key(2))
    x0 = M + SD * jax.random.normal(key_start, (512, 3))
    x0 = x0.at[:, 2].set(jnp.where(jnp.arange(512) % 2 == 0, -1.0, jnp.abs(x0[:, 2])))
    draws, info = mala.sample(key_run, wall, x0, 300, 4, 2)
    assert float(info.finite_fraction) == 1.0
    assert np.all(np.asarray(draws)[..., 2] > 0)
    assert float(info.nonfinite_proposals) > 0.01


def test_mala_step_keeps_the_target_invariant():
    """Exact draws of the target stay draws of it after 20 MH-corrected steps: means and
    sds within 5 Monte Carlo standard errors of 4000 chains (0.08 sd), for a proposal far
    from the target's shape (identity covariance, step 1)."""
    key_start, key_run = jax.random.split(jax.random.key(0))
    x = jax.random.multivariate_normal(key_start, M, COV, (4000,))

    keys = jax.random.split(key_run, 4000)
    state, acceptance, _ = jax.vmap(lambda *a: mala.run_chain(log_p, 1.0, *a, 20))(x, keys)
    z = state.x
    assert 0.2 < float(acceptance.mean()) < 0.95
    assert np.all(np.abs(np.asarray(z.mean(0) - M)) < 0.08 * np.asarray(SD))
    np.testing.assert_allclose(z.std(0), SD, rtol=0.08)


def test_a_chain_never_enters_where_the_density_is_not_finite():
    """A target that is -inf for x[0] < 0: a chain never accepts a move there (the ratio is
    -inf, and a NaN ratio rejects), so every chain that starts inside stays finite."""
    log_half = lambda x: jnp.where(x[0] > 0, log_p(x), -jnp.inf)
    x0 = jnp.tile(jnp.array([3.0, -2.0, 0.5]), (64, 1))
    keys = jax.random.split(jax.random.key(2), 64)
    state, _, _ = jax.vmap(lambda *a: mala.run_chain(log_half, 0.3, *a, 50))(x0, keys)
    assert np.all(np.asarray(state.x[:, 0]) > 0)
    assert np.all(np.isfinite(np.asarray(state.log_density)))
