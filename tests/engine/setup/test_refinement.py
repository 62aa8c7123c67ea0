"""The Gaussian VI refinement of a Laplace start (numpyro_dais.engine.setup.refinement)."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.engine.setup import refinement

EPS = jnp.asarray(refinement.antithetic_draws(32, 3, np.float32))
#: one program per log density: the budget and the tolerance are traced, so the tests of one
#: target share it where they pass both
refine = jax.jit(refinement.refine, static_argnums=0)
BUDGET = inspect.signature(refinement.refine).parameters["max_evals"].default
TOL = inspect.signature(refinement.refine).parameters["tol"].default


def test_antithetic_draws_have_mean_exactly_zero():
    assert EPS.shape == (32, 3)
    np.testing.assert_array_equal(EPS[:16], -EPS[16:])
    np.testing.assert_allclose(jnp.sum(EPS, axis=0), 0.0, atol=1e-5)  # float32 summation


def test_residual_of_a_standard_normal_target_is_zero():
    # ∇ℓ(ε) = −ε exactly, whatever the draws: the set-up keeps such a Laplace start
    assert float(refinement.residual(lambda u: -0.5 * jnp.sum(u**2), EPS)) < 1e-6


M, S = jnp.array([8.0, -3.0, 0.5]), jnp.array([0.3, 2.0, 1.0])
RMS = jnp.sqrt(jnp.mean(EPS**2, axis=0))


def gaussian(u):
    return -0.5 * jnp.sum(((u - M) / S) ** 2)


def test_gaussian_target_reaches_the_sample_average_optimum_exactly():
    # for ℓ = N(m, diag s²) the sample-average ELBO's optimum over the fixed draws is exact:
    # μ = m (the draws' mean is 0) and e^ρ = s / rms(ε); a quasi-Newton fit to a tight
    # tolerance reaches it to float32 round-off
    r = refine(gaussian, EPS, BUDGET, 1e-4)
    assert bool(r.converged)
    # N(0, 0.3² I) is 2.7 nats better than N(0, I) here, far less than the margin: the fit
    # starts from the Laplace Gaussian (the start changes where a multimodal fit ends)
    assert float(r.start_scale) == 1.0
    np.testing.assert_allclose(r.loc, M, atol=1e-4)
    np.testing.assert_allclose(jnp.exp(r.log_scale), S / RMS, rtol=1e-4)
    # the gain is the ELBO at the optimum less the ELBO at N(0, I), both in closed form
    elbo = refinement._elbo(gaussian, EPS)
    optimum = jnp.concatenate([M, jnp.log(S / RMS)])
    expected = elbo(optimum) - elbo(jnp.zeros(6))
    np.testing.assert_allclose(r.gain, expected, rtol=1e-5)


def test_float64_draws_fit_in_float64():
    # the set-up refines in the model's precision: with x64 on, float64 throughout
    with jax.enable_x64(True):
        eps = jnp.asarray(refinement.antithetic_draws(32, 3, np.float64))
        r = jax.jit(refinement.refine, static_argnums=0)(gaussian, eps, tol=1e-6)
        assert r.loc.dtype == r.log_scale.dtype == r.gain.dtype == jnp.float64
        rms = jnp.sqrt(jnp.mean(eps**2, axis=0))
        np.testing.assert_allclose(r.loc, M, atol=1e-6)
        np.testing.assert_allclose(jnp.exp(r.log_scale), S / rms, rtol=1e-6)


def test_default_tolerance_bounds_the_distance_to_the_optimum():
    # stopped where every |∂f/∂μ_i| e^{ρ_i} and |∂f/∂ρ_i| is below tol (f = −ELBO): for the
    # Gaussian target, with the draws' mean 0, that is |μ − m| < tol s² / e^ρ in μ (tol target
    # sds) and |e^{2ρ} rms² / s² − 1| < tol in ρ, whatever the scale s
    tol = TOL
    r = refine(gaussian, EPS, BUDGET, tol)
    assert bool(r.converged) and 0 < int(r.num_iters) < 100
    assert int(r.num_iters) <= int(r.num_evals) - len(refinement.START_SCALES)
    assert float(r.residual) > refinement.THRESHOLD
    np.testing.assert_allclose(r.residual, refinement.residual(gaussian, EPS), rtol=1e-5)
    scale = np.exp(np.asarray(r.log_scale))
    assert np.all(np.abs(r.loc - M) < 1.01 * tol * S**2 / scale)
    assert np.all(np.abs(scale**2 * RMS**2 / S**2 - 1) < 1.01 * tol)
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
    r = refine(log_density, EPS)
    assert not np.isfinite(float(r.residual))
    assert int(r.num_iters) == 0 and not bool(r.converged)
    assert int(r.num_evals) == len(refinement.START_SCALES)  # the starts' evaluations only
    np.testing.assert_array_equal(r.loc, 0.0)
    np.testing.assert_array_equal(r.gain, 0.0)


@pytest.mark.parametrize("outside", [jnp.nan, -jnp.inf])
def test_trial_steps_into_non_finite_density_do_not_poison_the_fit(outside):
    # finite only for u₀ < 4.5, with the optimum inside (its draws reach u₀ ≈ 4.3): the
    # line search's long trial steps land outside, and the fit still ends at the exact
    # sample-average optimum
    m, s = jnp.array([3.0, 3.0, -3.0]), jnp.array([0.5, 1.0, 1.0])
    assert float(jnp.max(m[0] + s[0] / RMS[0] * EPS[:, 0])) < 4.5

    def log_density(u):
        return jnp.where(u[0] < 4.5, -0.5 * jnp.sum(((u - m) / s) ** 2), outside)

    r = refine(log_density, EPS, tol=1e-4)
    assert bool(r.converged)
    np.testing.assert_allclose(r.loc, m, atol=1e-4)
    np.testing.assert_allclose(jnp.exp(r.log_scale), s / RMS, rtol=1e-4)


def test_an_optimum_beyond_non_finite_density_keeps_the_last_finite_point():
    # finite only for u₀ < 4: the optimum of the far Gaussian lies beyond, so the fit walks
    # up to where the density is non-finite at some draw, with ever shorter steps, stops
    # (long before its budget) and returns the last finite parameters
    def log_density(u):
        value = -0.5 * jnp.sum((u - 10.0) ** 2)
        return jnp.where(u[0] < 4.0, value, jnp.nan)

    r = refine(log_density, EPS)
    assert int(r.num_iters) > 0 and not bool(r.converged)
    assert int(r.num_evals) < 300
    assert np.all(np.isfinite(r.loc)) and np.all(np.isfinite(r.log_scale))
    u = r.loc + jnp.exp(r.log_scale) * EPS
    assert np.all(np.isfinite(jax.vmap(log_density)(u)))
    assert float(r.gain) > 0


def test_the_budget_bounds_the_evaluations():
    # out of evaluations before the tolerance: the point reached so far, not converged; a
    # line search started within the budget may finish past it
    r = refine(gaussian, EPS, 8, 1e-4)
    assert not bool(r.converged) and int(r.num_iters) > 0
    assert 8 <= int(r.num_evals) < 8 + refinement.MAX_LINESEARCH_STEPS
    assert 0 < float(r.gain) < float(refine(gaussian, EPS, BUDGET, 1e-4).gain)


def test_a_start_whose_draws_overflow_is_shrunk_until_they_do_not():
    # a mode so sharp that the draws of N(0, I) reach u ≈ 2.5, where exp(40 u) overflows:
    # the ELBO there is -inf (the residual too), so the fit starts from a shrunken N(0, s² I)
    # of START_SCALES whose draws stay finite, and fits the narrow target
    def log_density(u):
        return -0.5 * jnp.sum((u / 0.05) ** 2) - jnp.sum(jnp.exp(40.0 * u))

    assert not np.isfinite(float(refinement.residual(log_density, EPS)))
    r = refine(log_density, EPS)
    assert not np.isfinite(float(r.residual))
    assert int(r.num_iters) > 0 and float(r.start_scale) < 1.0
    scale = np.exp(np.asarray(r.log_scale))
    assert np.all(scale < 0.05) and np.all(np.abs(r.loc) < 0.1)
    assert bool(r.converged)
    assert np.isfinite(
        float(refinement._elbo(log_density, EPS)(jnp.concatenate([r.loc, r.log_scale])))
    )
