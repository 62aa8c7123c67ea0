"""Curvature estimates behind the default step sizes: exact values on Gaussians and mixtures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.engine import curvature


def _power(log_density, z, num_iters=20):
    return curvature.max_eigenvalue(jax.random.key(1), log_density, z, num_iters)


def _dense(log_density, z, num_iters=None):
    return curvature.max_eigenvalue_dense(curvature.neg_hessian(log_density, z))


#: both ways to λ_max: power iteration (no Hessian formed) and the formed Hessian's
ESTIMATES = pytest.mark.parametrize("max_eigenvalue", [_power, _dense], ids=["power", "dense"])


def test_hvp_matches_the_hessian():
    A = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    log_density = lambda z: -0.5 * z @ A @ z + jnp.sin(z[0])
    z, v = jnp.array([0.3, -0.2]), jnp.array([1.0, 2.0])
    np.testing.assert_allclose(
        curvature.hvp(log_density, z, v), jax.hessian(log_density)(z) @ v, rtol=1e-6
    )


@ESTIMATES
def test_gaussian_precision_eigenvalue(max_eigenvalue):
    # ℓ = −½ zᵀ P z: the potential's Hessian is P, its largest eigenvalue 1e4 (a stiff case)
    P = jnp.diag(jnp.array([1e4, 3.0, 1.0]))
    lam = max_eigenvalue(lambda z: -0.5 * z @ P @ z, jnp.ones(3))
    np.testing.assert_allclose(lam, 1e4, rtol=1e-4)


@ESTIMATES
def test_negative_curvature_does_not_limit_the_step(max_eigenvalue):
    # Midway between the modes of ½N(0, σ²I) + ½N(1, σ²I) in d = 7, −∇²ℓ has the eigenvalue
    # 1/σ² − d/(4σ⁴) = −432 along the diagonal (it pushes particles apart, no stability limit)
    # and 1/σ² = 16 across it: the step size is set by 16, not by |−432|.
    d, sigma = 7, 0.25

    def log_density(z):
        comps = jnp.stack([-0.5 * jnp.sum((z - m) ** 2) / sigma**2 for m in (0.0, 1.0)])
        return jax.scipy.special.logsumexp(comps)

    lam = max_eigenvalue(log_density, jnp.full(d, 0.5), 50)
    np.testing.assert_allclose(lam, 1 / sigma**2, rtol=1e-3)


@ESTIMATES
def test_non_finite_curvature_is_inf(max_eigenvalue):
    lam = max_eigenvalue(lambda z: jnp.sum(jnp.sqrt(z)), -jnp.ones(2))
    assert lam == jnp.inf


def test_newton_mode_lands_on_a_stiff_gaussian_mode():
    """ℓ = −½(z − m)ᵀP(z − m) with a stiff, correlated P: the first regularised Newton step
    from far away lands at ``z + (P + 100 I)⁻¹P(m − z)`` (``max_iters=1``), on the mode up
    to the regularisation I/scale² = 100 (P's eigenvalues are 1e5 and 1.9e6); iterated, it
    reaches the mode, and returns the Hessian there."""
    P = jnp.array([[1e6, 9e5], [9e5, 1e6]])
    m = jnp.array([0.975, -0.3])
    log_density = lambda z: -0.5 * (z - m) @ P @ (z - m)
    h = curvature.neg_hessian(log_density, jnp.zeros(2))
    np.testing.assert_allclose(h, P, rtol=1e-6)
    cov = curvature.regularised_covariance(h, 0.1)
    np.testing.assert_allclose(cov, np.linalg.inv(np.asarray(P, np.float64) + 100 * np.eye(2)))
    z = jnp.array([-2.0, 1.5])
    one, _ = curvature.newton_mode(log_density, z, 0.1, max_iters=1)
    np.testing.assert_allclose(one, z + cov @ np.asarray(P) @ (m - z), rtol=1e-4)
    mode, hessian = curvature.newton_mode(log_density, z, 0.1)
    np.testing.assert_allclose(mode, m, atol=1e-4)
    np.testing.assert_allclose(hessian, P, rtol=1e-6)
    # negative curvature (between modes) is dropped, not inverted: the prior's scale is left
    cov = curvature.regularised_covariance(-np.eye(2), 0.1)
    np.testing.assert_allclose(cov, 0.01 * np.eye(2))


def test_newton_mode_reaches_a_logistic_mode_from_a_saturated_start():
    """A logistic regression started where its likelihood saturates (logits of ±20): the
    Hessian there is far smaller than at the mode, so one Newton step lands far from it
    (the reason ``newton_mode`` iterates); iterated, it ends within its tolerance of the
    maximum."""
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(2000, 3)), jnp.float32)
    y = jnp.asarray(rng.uniform(size=2000) < 1 / (1 + np.exp(-np.asarray(X) @ [1.0, -0.5, 0.3])))
    log_density = lambda z: (
        jnp.sum(jnp.where(y, jax.nn.log_sigmoid(X @ z), jax.nn.log_sigmoid(-X @ z))) - 0.5 * z @ z
    )
    z = jnp.array([10.0, 10.0, -10.0])
    one, _ = curvature.newton_mode(log_density, z, 0.1, max_iters=1)
    mode, _ = curvature.newton_mode(log_density, z, 0.1)
    # the rise left to the maximum of the local quadratic model, gᵀH⁻¹g / 2 (nats)
    gap = lambda z: (
        0.5
        * jax.grad(log_density)(z)
        @ jnp.linalg.solve(curvature.neg_hessian(log_density, z), jax.grad(log_density)(z))
    )
    assert gap(one) > 100.0
    # stops once the damped decrement is below tol = 0.01 nats; the undamped gap is larger
    # by at most (λ_min + 100) / λ_min = 1.25 (λ_min ≈ 400: 2,000 rows of unit features)
    assert gap(mode) < 0.0125


def test_newton_mode_never_lowers_the_density():
    # each step is halved until ℓ rises; where none does, z is kept
    log_density = lambda z: -jnp.sum(z**4)
    z = jnp.array([1.0, -1.0])
    mode, _ = curvature.newton_mode(log_density, z, 10.0, max_iters=1)
    assert log_density(mode) > log_density(z)
    np.testing.assert_array_equal(
        curvature.newton_mode(log_density, jnp.zeros(2), 1.0)[0], jnp.zeros(2)
    )
