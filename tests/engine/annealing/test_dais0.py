"""The DAIS₀ objective of q0 (symmetrised KL) and the transport check, on exact Gaussians."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import multivariate_normal

from numpyro_dais.engine.annealing import dais0, gaussian

# A correlated 2-D Gaussian target p = N(m, Σ), normalised (log Z = 0).
M = jnp.array([1.0, -0.5])
COV = jnp.array([[1.0, 0.8], [0.8, 1.0]]) * 0.5
PREC = jnp.linalg.inv(COV)


def log_p(z):
    return multivariate_normal.logpdf(z, M, COV)


def kl_gauss(m0, S0, m1, S1):
    """KL(N(m0, S0) ‖ N(m1, S1)), closed form."""
    S1_inv = jnp.linalg.inv(S1)
    d = m1 - m0
    return 0.5 * (
        jnp.trace(S1_inv @ S0)
        + d @ S1_inv @ d
        - m0.shape[0]
        + jnp.linalg.slogdet(S1)[1]
        - jnp.linalg.slogdet(S0)[1]
    )


def _estimate(loc, scale, key, n=200_000):
    """J estimate with z0 ~ q0 (reparameterised) and exact posterior draws as end points."""
    q0 = gaussian.Gaussian(loc, scale)
    k0, k1 = jax.random.split(key)
    z0 = gaussian.sample(k0, q0, (n,))
    z = jax.random.multivariate_normal(k1, M, COV, (n,))
    return dais0.symmetrized_kl(lambda x: gaussian.log_prob(q0, x), log_p, z0, z, jnp.zeros(n))


def test_symmetrized_kl_matches_closed_form():
    loc, scale = jnp.array([0.7, -0.2]), jnp.array([0.6, 0.9])
    S0 = jnp.diag(scale**2)
    # value = KL(q0‖p) + KL(p‖q0) − log Z + H(p), with log Z = 0 for a normalised p
    entropy = 0.5 * jnp.linalg.slogdet(2 * jnp.pi * jnp.e * COV)[1]
    expected = kl_gauss(loc, S0, M, COV) + kl_gauss(M, COV, loc, S0) + entropy
    value = _estimate(loc, scale, jax.random.key(0))
    # Monte Carlo mean of 2·10⁵ draws of two O(1)-variance terms: standard error ≈ 5e-3
    np.testing.assert_allclose(value, expected, atol=0.03)


def test_symmetrized_kl_gradient_matches_finite_differences():
    """With the random numbers fixed, the estimate is a smooth function of q0's parameters."""
    key = jax.random.key(1)

    def f(theta):
        return _estimate(theta[:2], jnp.exp(theta[2:]), key, n=512)

    theta = jnp.array([0.3, 0.1, -0.4, 0.2])
    grad = jax.grad(f)(theta)
    eps = 1e-2
    fd = jnp.array([(f(theta + eps * e) - f(theta - eps * e)) / (2 * eps) for e in jnp.eye(4)])
    # central differences in float32 with step 1e-2: O(eps²) truncation and ~1e-4 rounding
    np.testing.assert_allclose(grad, fd, rtol=2e-2, atol=2e-3)


def test_minimiser_is_the_geometric_mean_of_reverse_and_forward_kl_stds():
    """For a Gaussian p and a diagonal q0, J is minimised at the exact mean and the std
    ``(Σ_ii / Λ_ii)^{1/4}`` (the geometric mean of the reverse-KL std ``Λ_ii^{-1/2}`` and
    the marginal std ``Σ_ii^{1/2}``): the expected gradient vanishes there."""
    std = (jnp.diag(COV) / jnp.diag(PREC)) ** 0.25
    assert jnp.all(1 / jnp.sqrt(jnp.diag(PREC)) < std) and jnp.all(std < jnp.sqrt(jnp.diag(COV)))
    g = jax.grad(lambda t: _estimate(t[:2], jnp.exp(t[2:]), jax.random.key(2)))(
        jnp.concatenate([M, jnp.log(std)])
    )
    # 2·10⁵ draws: gradient noise ~1e-2 (an O(1) variance per term); a 10 % error in the
    # std would give a log-std gradient of ~0.4
    np.testing.assert_allclose(g, 0.0, atol=0.05)


def test_symmetrized_kl_ignores_diverged_particles():
    q0 = gaussian.Gaussian(jnp.zeros(2), jnp.ones(2))
    z0 = jnp.ones((3, 2))
    z = jnp.array([[0.0, 0.0], [jnp.nan, jnp.nan], [1.0, 1.0]])
    log_w = jnp.array([0.0, jnp.nan, -jnp.inf])
    log_q0 = lambda x: gaussian.log_prob(q0, x)
    value, grad = jax.value_and_grad(
        lambda loc: dais0.symmetrized_kl(
            lambda x: gaussian.log_prob(gaussian.Gaussian(loc, q0.scale), x), log_p, z0, z, log_w
        )
    )(q0.loc)
    # only the first end point counts in the forward term
    expected = jnp.mean(jax.vmap(log_q0)(z0) - jax.vmap(log_p)(z0)) - log_q0(z[0])
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    assert jnp.all(jnp.isfinite(grad))


def test_transport_check():
    z = jax.random.multivariate_normal(jax.random.key(3), M, COV, (4000,))
    sd = jnp.sqrt(jnp.diag(COV))
    good = dais0.transport_check(gaussian.Gaussian(M, sd), z)
    # 4000 draws: the sample mean is within 4/√4000 ≈ 0.06 sd, the sample std within ~5 %
    np.testing.assert_allclose(good.mean_shift, 0.0, atol=0.06)
    np.testing.assert_allclose(good.log_std_ratio, 0.0, atol=0.05)
    shifted = dais0.transport_check(gaussian.Gaussian(M + 3 * sd, 0.5 * sd), z)
    # the shift is divided by the sample std (±5 % at 4 standard errors) and offset by the
    # sample mean (±0.06)
    np.testing.assert_allclose(shifted.mean_shift, 3.0, atol=0.25)
    np.testing.assert_allclose(shifted.log_std_ratio, jnp.log(0.5), atol=0.05)


def test_transport_check_leaves_out_end_points_that_diverged():
    # the moments are those of the finite rows exactly; the fraction says how many there were
    z = jax.random.multivariate_normal(jax.random.key(3), M, COV, (400,))
    q0 = gaussian.Gaussian(M, jnp.sqrt(jnp.diag(COV)))
    diverged = z.at[::4].set(jnp.nan).at[1, 0].set(jnp.inf)
    check = dais0.transport_check(q0, diverged)
    finite = jnp.all(jnp.isfinite(diverged), axis=1)
    expected = dais0.transport_check(q0, diverged[finite])
    np.testing.assert_allclose(check.mean_shift, expected.mean_shift, rtol=1e-5)
    np.testing.assert_allclose(check.log_std_ratio, expected.log_std_ratio, rtol=1e-5)
    np.testing.assert_allclose(check.finite_fraction, 299 / 400)
    assert float(dais0.transport_check(q0, z).finite_fraction) == 1.0


def test_draws_check_is_the_transport_check_of_the_draws_moments():
    """``draws_check(draws, reference)`` is ``transport_check`` of a Gaussian with the
    draws' finite moments (exactly, up to float32 rounding), and takes the finite fraction
    of the reference."""
    z = jax.random.multivariate_normal(jax.random.key(3), M, COV, (400,))
    x = jax.random.multivariate_normal(jax.random.key(4), M + 1.0, 2.0 * COV, (300,))
    reference = z.at[::4].set(jnp.nan)
    check = dais0.draws_check(x.at[0, 1].set(jnp.inf), reference)
    finite = x[1:]
    moments = gaussian.Gaussian(finite.mean(0), finite.std(0))
    expected = dais0.transport_check(moments, reference)
    np.testing.assert_allclose(check.mean_shift, expected.mean_shift, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(check.log_std_ratio, expected.log_std_ratio, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(check.finite_fraction, 300 / 400)


def test_draws_check_gives_the_standard_error_of_the_log_std_ratio():
    """``log_std_se`` is the delta method's ``sqrt(Σ (κ − 1) / 4n)`` of the two sets: for
    Gaussian draws ``sqrt(2 / 4n)`` each (within 10%: the sample kurtosis of 8,000 draws);
    where the tails are heavy (a Student-t of 5 degrees of freedom, κ = 9) it is larger, and
    it matches the spread of the log ratio over repeated draws (within 25%: 200 repeats)."""
    n = 8000
    z = jax.random.normal(jax.random.key(3), (n, 2))
    x = jax.random.normal(jax.random.key(4), (n, 2))
    se = np.asarray(dais0.draws_check(x, z).log_std_se)
    np.testing.assert_allclose(se, np.sqrt(2 * 2 / (4 * n)), rtol=0.1)
    t = lambda key, m: jax.random.t(key, 5.0, (m, 1))
    heavy = float(dais0.draws_check(t(jax.random.key(5), n), t(jax.random.key(6), n)).log_std_se[0])
    assert heavy > 1.5 * se[0]
    keys = jax.random.split(jax.random.key(7), 200)
    checks = jax.vmap(lambda k: dais0.draws_check(t(k, 2000), t(jax.random.fold_in(k, 1), 2000)))(
        keys
    )
    spread = float(np.std(np.asarray(checks.log_std_ratio)))
    np.testing.assert_allclose(np.median(np.asarray(checks.log_std_se)), spread, rtol=0.25)


def test_draws_check_of_a_constant_coordinate_is_zero_not_nan():
    """A coordinate constant in both sets of draws (``L[0, 0] = 1`` of a correlation
    matrix's Cholesky factor, up to float32 rounding) neither shifts nor spreads: 0, 0."""
    z = jax.random.normal(jax.random.key(3), (400, 2))
    x = jax.random.normal(jax.random.key(4), (300, 2))
    one = lambda a: a.at[:, 0].set(1.0 + 1e-7 * jnp.sign(a[:, 0]))
    check = dais0.draws_check(one(x), one(z))
    assert np.all(np.isfinite(np.asarray(check.mean_shift)))
    assert abs(float(check.mean_shift[0])) < 0.05 and abs(float(check.log_std_ratio[0])) < 0.05
