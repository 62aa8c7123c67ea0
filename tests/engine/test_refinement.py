"""The Gaussian VI refinement of a Laplace start (numpyro_dais.engine.refinement)."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.engine import refinement

EPS = jnp.asarray(refinement.antithetic_draws(32, 3, np.float32))


def test_antithetic_draws_have_mean_exactly_zero():
    assert EPS.shape == (32, 3)
    np.testing.assert_array_equal(EPS[:16], -EPS[16:])
    np.testing.assert_allclose(jnp.sum(EPS, axis=0), 0.0, atol=1e-5)  # float32 summation


def test_residual_of_a_standard_normal_target_is_zero():
    # ∇ℓ(ε) = −ε exactly, whatever the draws: the set-up keeps such a Laplace start
    assert float(refinement.residual(lambda u: -0.5 * jnp.sum(u**2), EPS)) < 1e-6


def test_gaussian_target_reaches_the_sample_average_optimum():
    # for ℓ = N(m, diag s²) the sample-average ELBO's optimum is exact: μ = m (the draws'
    # mean is 0) and e^ρ = s / rms(ε); tol = 0.05 stops within ~0.05 s of it, so 0.1 s
    m, s = jnp.array([8.0, -3.0, 0.5]), jnp.array([0.3, 2.0, 1.0])

    def log_density(u):
        return -0.5 * jnp.sum(((u - m) / s) ** 2)

    r = refinement.refine(log_density, EPS)
    # N(0, 0.3² I) is 2.7 nats better than N(0, I) here, far less than the margin: the fit
    # starts from the Laplace Gaussian (the start changes where a multimodal fit ends)
    assert float(r.start_scale) == 1.0
    assert float(r.residual) > refinement.THRESHOLD
    np.testing.assert_allclose(r.residual, refinement.residual(log_density, EPS), rtol=1e-5)
    assert 0 < int(r.num_iters) < 1000
    rms = jnp.sqrt(jnp.mean(EPS**2, axis=0))
    np.testing.assert_allclose(r.loc, m, atol=0.1 * float(s.max()))
    np.testing.assert_allclose(jnp.exp(r.log_scale), s / rms, rtol=0.1)
    assert float(r.gain) > 0


def test_residual_of_a_shifted_gaussian_is_its_shift():
    # ∇ℓ(ε) + ε = m exactly for ℓ = N(m, I): a shift of 1 sd is under the threshold of 3
    r = refinement.residual(lambda u: -0.5 * jnp.sum((u - jnp.array([1.0, 0, 0])) ** 2), EPS)
    np.testing.assert_allclose(r, 1.0, atol=1e-5)
    assert r < refinement.THRESHOLD


def test_a_non_finite_start_is_kept():
    def log_density(u):
        return jnp.where(u[0] > 0, -jnp.inf, -jnp.sum(u**2))

    assert not np.isfinite(float(refinement.residual(log_density, EPS)))
    r = refinement.refine(log_density, EPS)
    assert not np.isfinite(float(r.residual))
    assert int(r.num_iters) == 0
    np.testing.assert_array_equal(r.loc, 0.0)


def test_a_step_into_non_finite_density_keeps_the_last_finite_point():
    # finite only for u₀ < 4: the optimum of the far Gaussian lies beyond, so the fit walks
    # until the density is non-finite at some draw and returns the last finite parameters
    def log_density(u):
        value = -0.5 * jnp.sum((u - 10.0) ** 2)
        return jnp.where(u[0] < 4.0, value, jnp.nan)

    r = refinement.refine(log_density, EPS)
    assert int(r.num_iters) > 0
    assert np.all(np.isfinite(r.loc)) and np.all(np.isfinite(r.log_scale))
    u = r.loc + jnp.exp(r.log_scale) * EPS
    assert np.all(np.isfinite(jax.vmap(log_density)(u)))


def test_a_start_whose_draws_overflow_is_shrunk_until_they_do_not():
    # a mode so sharp that the draws of N(0, I) reach u ≈ 2.5, where exp(40 u) overflows:
    # the ELBO there is -inf (the residual too), so Adam starts from a shrunken N(0, s² I)
    # of START_SCALES whose draws stay finite, and fits the narrow target
    def log_density(u):
        return -0.5 * jnp.sum((u / 0.05) ** 2) - jnp.sum(jnp.exp(40.0 * u))

    assert not np.isfinite(float(refinement.residual(log_density, EPS)))
    r = refinement.refine(log_density, EPS)
    assert not np.isfinite(float(r.residual))
    assert int(r.num_iters) > 0 and float(r.start_scale) < 1.0
    scale = np.exp(np.asarray(r.log_scale))
    assert np.all(scale < 0.05) and np.all(np.abs(r.loc) < 0.1)
    assert np.isfinite(float(refinement._elbo(log_density, EPS)((r.loc, r.log_scale))))
