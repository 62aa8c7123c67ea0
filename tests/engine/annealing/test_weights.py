"""Standard error of the log-mean-exp estimate (engine/annealing/weights.py)."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.engine.annealing import weights


def test_se_is_the_ess_formula_and_zero_for_equal_weights():
    log_w = jax.random.normal(jax.random.key(0), (50,))
    N, ess = 50, weights.ess(log_w)
    np.testing.assert_allclose(
        weights.log_mean_exp_se(log_w) ** 2, (N / ess - 1) / (N - 1), rtol=1e-5
    )
    assert float(weights.log_mean_exp_se(jnp.zeros(10))) < 1e-3
    # founders = identity is the i.i.d. case
    np.testing.assert_allclose(
        weights.log_mean_exp_se(log_w, jnp.arange(N)), weights.log_mean_exp_se(log_w), rtol=1e-6
    )


def test_se_matches_the_lognormal_closed_form():
    """log w ~ N(0, σ²): Var(w) / E[w]² = exp(σ²) − 1, so se = sqrt((exp(σ²) − 1) / N)."""
    sigma, N = 0.8, 200_000
    log_w = sigma * jax.random.normal(jax.random.key(1), (N,))
    exact = np.sqrt(np.expm1(sigma**2) / N)
    np.testing.assert_allclose(weights.log_mean_exp_se(log_w), exact, rtol=0.03)


def test_se_matches_the_spread_of_independent_batches():
    """2000 batches of N = 100 log-normal weights (σ = 0.5): the delta-method se of one batch
    agrees with the standard deviation of log Ẑ across batches within 10%."""
    log_w = 0.5 * jax.random.normal(jax.random.key(2), (2000, 100))
    log_Z = jax.vmap(weights.log_mean_exp)(log_w)
    se = jax.vmap(weights.log_mean_exp_se)(log_w)
    np.testing.assert_allclose(float(jnp.mean(se)), float(jnp.std(log_Z)), rtol=0.1)


def test_se_with_one_surviving_founder_is_large():
    """All particles descending from one initial particle after a resampling: the estimate
    has no independent replicate left, and the relative variance is ~1."""
    log_w = jnp.zeros(8)
    se = weights.log_mean_exp_se(log_w, jnp.zeros(8, jnp.int32), num_resampled=1)
    assert float(se) > 0.9


def test_combine_se_of_independent_estimates():
    # B equal estimates with equal se: the mean's se shrinks by sqrt(B)
    se = weights.combine_se(jnp.zeros(4), jnp.full(4, 0.2))
    np.testing.assert_allclose(se, 0.1, rtol=1e-6)
    # one estimate dominating: its own se
    se = weights.combine_se(jnp.array([0.0, -50.0]), jnp.array([0.3, 5.0]))
    np.testing.assert_allclose(se, 0.3, rtol=1e-5)
