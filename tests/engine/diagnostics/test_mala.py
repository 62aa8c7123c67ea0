"""MALA chains from q0 draws (the relaxation check), on exact Gaussian targets."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import multivariate_normal

from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.engine.diagnostics import mala
from numpyro_dais.engine.mcmc import mala as kernel

# a correlated 2-D Gaussian target N(m, Σ): marginal sds 1 and 2, correlation 0.8
M = jnp.array([1.0, -0.5])
COV = jnp.array([[1.0, 1.6], [1.6, 4.0]])
SD = jnp.sqrt(jnp.diag(COV))


def log_p(z):
    return multivariate_normal.logpdf(z, M, COV)


def test_mala_step_keeps_the_target_invariant():
    """Exact draws of the target stay draws of it after 20 MH-corrected steps: means and
    sds within 5 Monte Carlo standard errors of 4000 chains (0.08 sd), for a proposal far
    from the target's shape (identity covariance, step 1)."""
    key_start, key_run = jax.random.split(jax.random.key(0))
    target = gaussian.Gaussian(M, jnp.linalg.cholesky(COV))
    x = gaussian.sample(key_start, target, (4000,))

    keys = jax.random.split(key_run, 4000)
    state, acceptance, _ = jax.vmap(lambda *a: kernel.run_chain(log_p, 1.0, *a, 20))(x, keys)
    z = state.x
    assert 0.2 < float(acceptance.mean()) < 0.95
    assert np.all(np.abs(np.asarray(z.mean(0) - M)) < 0.08 * np.asarray(SD))
    np.testing.assert_allclose(z.std(0), SD, rtol=0.08)


def test_relaxation_check_keeps_a_right_q0_and_widens_a_narrow_one():
    """q0 with the target's marginals: the chains' std stays at q0's (ratio 1 ± 0.2, 256
    chains: ±4.5% standard error, and the diagonal q0 misses the correlation). q0 four times
    too narrow: the chains spread to the target's (ratio near 4, at least 3 after 100
    steps of a random walk of about 1 q0 sd per step). q0 four times too wide: the steps,
    sized for q0, are too long for the target and nearly all rejected, which the
    acceptance says (the check cannot see a q0 that is too wide)."""
    right = gaussian.Gaussian(M, SD)
    check = mala.relaxation_check(jax.random.key(1), right, log_p, 256, 100)
    np.testing.assert_allclose(check.std_ratio, 1.0, atol=0.2)
    assert float(check.finite_fraction) == 1.0
    assert float(check.acceptance) > 0.5
    narrow = gaussian.Gaussian(M, SD / 4)
    ratio = mala.relaxation_check(jax.random.key(1), narrow, log_p, 256, 100).std_ratio
    assert np.all(np.asarray(ratio) > 3.0), ratio
    wide = gaussian.Gaussian(M, SD * 4)
    check = mala.relaxation_check(jax.random.key(1), wide, log_p, 256, 100)
    assert float(check.acceptance) < 0.2


def test_a_chain_that_leaves_the_support_is_left_out():
    """A target that is -inf for z[0] < 0: chains never accept a move there (the ratio is
    -inf, and a NaN ratio rejects), so every chain that starts inside stays finite."""
    log_half = lambda z: jnp.where(z[0] > 0, log_p(z), -jnp.inf)
    q0 = gaussian.Gaussian(jnp.array([3.0, -0.5]), SD / 4)
    check = mala.relaxation_check(jax.random.key(2), q0, log_half, 64, 50)
    assert float(check.finite_fraction) == 1.0
    assert np.all(np.isfinite(np.asarray(check.std_ratio)))
