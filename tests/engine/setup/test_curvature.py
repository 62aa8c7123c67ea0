"""Curvature estimates behind the default step sizes: exact values on Gaussians and mixtures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.engine.setup import curvature


def _power(log_density, z, num_iters=20):
    return curvature.max_eigenvalue(jax.random.key(1), log_density, z, num_iters)


def _dense(log_density, z, num_iters=None):
    return curvature.find_mode(log_density, z, max_iters=1).start_curvature


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


def test_find_mode_lands_on_a_stiff_correlated_gaussian_mode_in_one_step():
    """ℓ = −½(z − m)ᵀP(z − m) with a stiff, correlated P (eigenvalues 1e5 and 1.9e6): the
    least damped step is Newton's, exact on a quadratic, so one step reaches the mode;
    the Hessian returned is P and the decrement 0."""
    P = jnp.array([[1e6, 9e5], [9e5, 1e6]])
    m = jnp.array([0.975, -0.3])
    log_density = lambda z: -0.5 * (z - m) @ P @ (z - m)
    np.testing.assert_allclose(curvature.neg_hessian(log_density, jnp.zeros(2)), P, rtol=1e-6)
    mode = curvature.find_mode(log_density, jnp.array([-2.0, 1.5]))
    assert int(mode.num_iters) == 2 and bool(mode.converged)  # one step, then the check
    np.testing.assert_allclose(mode.z, m, atol=1e-4)
    np.testing.assert_allclose(mode.neg_hessian, P, rtol=1e-6)


def test_find_mode_reaches_an_uncentred_regression_mode():
    """A linear regression on one covariate near 4000 (intercept and slope correlated at
    −0.9999, curvatures 10 orders of magnitude apart) with an unknown log σ: from a start
    thousands of residual sds off, the damped Newton ascent reaches the least-squares fit
    (float64, as the problem's conditioning needs)."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(3952, 4013, 62))
    y = 1990 + 0.5 * (x - 3980) + rng.normal(0, 3.0, 62)
    with jax.enable_x64(True):
        X = jnp.stack([jnp.ones(62), jnp.asarray(x)], axis=1)

        def log_density(z):  # flat priors on (a, b, log σ), Jacobian of σ included
            r = jnp.asarray(y) - X @ z[:2]
            return -62 * z[2] - 0.5 * jnp.sum(r**2) * jnp.exp(-2 * z[2]) + z[2]

        mode = curvature.find_mode(log_density, jnp.array([1.0, -1.5, 0.5]))
        coef = np.linalg.lstsq(np.asarray(X), y, rcond=None)[0]
        sigma2 = np.sum((y - np.asarray(X) @ coef) ** 2) / 61  # the mode of σ given the fit
        assert bool(mode.converged), mode
        # within 0.02 Laplace sds (a decrement of 1e-4 nats is ~0.014 sd); the intercept's
        # sd is ~86, the slope's ~0.02
        sd = np.sqrt(np.diag(np.linalg.inv(np.asarray(mode.neg_hessian))))
        exact = np.array([*coef, 0.5 * np.log(sigma2)])
        np.testing.assert_array_less(np.abs(np.asarray(mode.z) - exact), 0.02 * sd)


def test_find_mode_reaches_a_logistic_mode_from_a_saturated_start():
    """A logistic regression started where its likelihood saturates (logits of ±20): the
    Hessian there is far smaller than at the mode, so one Newton step lands far from it;
    iterated, it ends within its tolerance (a decrement of 1e-4 nats) of the maximum."""
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.normal(size=(2000, 3)), jnp.float32)
    y = jnp.asarray(rng.uniform(size=2000) < 1 / (1 + np.exp(-np.asarray(X) @ [1.0, -0.5, 0.3])))
    log_density = lambda z: (
        jnp.sum(jnp.where(y, jax.nn.log_sigmoid(X @ z), jax.nn.log_sigmoid(-X @ z))) - 0.5 * z @ z
    )
    z = jnp.array([10.0, 10.0, -10.0])
    one = curvature.find_mode(log_density, z, max_iters=1)
    mode = curvature.find_mode(log_density, z)
    assert float(one.decrement) > 1.0
    assert bool(mode.converged) and float(mode.decrement) <= 1e-4
    gap = lambda z: (  # the rise left to the maximum of the local quadratic model (nats)
        0.5
        * jax.grad(log_density)(z)
        @ jnp.linalg.solve(curvature.neg_hessian(log_density, z), jax.grad(log_density)(z))
    )
    assert gap(mode.z) < 1e-3


def test_find_mode_never_lowers_the_density_and_leaves_minima():
    """Every step rises (ℓ = −Σz⁴ from (1, −1)); a start between two modes, where the
    curvature is negative, is left towards one (|H| turns the negative curvature into
    ascent), and is not reported as converged while it is a minimum."""
    log_density = lambda z: -jnp.sum(z**4)
    z = jnp.array([1.0, -1.0])
    one = curvature.find_mode(log_density, z, max_iters=1)
    assert log_density(one.z) > log_density(z)
    double_well = lambda z: -jnp.sum((z**2 - 1.0) ** 2)
    mode = curvature.find_mode(double_well, jnp.array([0.1, -0.05]))
    np.testing.assert_allclose(jnp.abs(mode.z), 1.0, atol=1e-2)  # sd 0.35
    assert bool(mode.converged)
    stuck = curvature.find_mode(double_well, jnp.zeros(2))  # no gradient to follow
    assert not bool(stuck.converged)


@jax.custom_jvp
def _unit_slope(x):
    """1, whose derivative is infinite beyond 5: ``ℓ(h(x))`` with ``h' = _unit_slope`` keeps
    ``ℓ``'s value and gradient everywhere but has an infinite Hessian there."""
    return jnp.ones_like(x)


@_unit_slope.defjvp
def _unit_slope_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _unit_slope(x), jnp.where(x > 5.0, jnp.inf, 0.0) * t


@jax.custom_jvp
def _identity(x):
    return x


@_identity.defjvp
def _identity_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return x, _unit_slope(x) * t


def test_find_mode_backs_off_a_step_into_overflowing_derivatives():
    # Newton's step from 0 lands on the mode 8, where the value and gradient are finite but
    # the Hessian is not (as an exp-link likelihood's far out): the search goes back and
    # takes shorter steps, so it returns a point whose Hessian it could form, above the start
    def log_density(z):
        return -0.5 * jnp.sum((_identity(z) - 8.0) ** 2)

    mode = curvature.find_mode(log_density, jnp.zeros(1), max_iters=30)
    assert np.all(np.isfinite(mode.neg_hessian))
    np.testing.assert_allclose(mode.neg_hessian, [[1.0]], rtol=1e-5)
    assert 0.0 < float(mode.z[0]) <= 5.0
    np.testing.assert_allclose(mode.rise, log_density(mode.z) - log_density(jnp.zeros(1)))
    assert float(mode.rise) > 0 and not bool(mode.converged)


def test_hessian_vector_products_through_a_custom_vjp():
    """``jax.custom_vjp`` functions (ODE solvers such as ``odeint``) have no forward-mode
    rule (JAX refuses, sometimes only when a loop around the product is lowered):
    reverse-over-reverse gives the product."""

    @jax.custom_vjp
    def cube(x):
        return x**3

    cube.defvjp(lambda x: (x**3, x), lambda x, g: (3 * x**2 * g,))
    log_density = lambda z: -jnp.sum(cube(z) ** 2)
    z, v = jnp.array([0.5, -1.0]), jnp.array([1.0, 2.0])
    expected = jax.hessian(lambda z: -jnp.sum(z**6))(z) @ v
    product = curvature.hvp(log_density, z, v, forward=False)
    np.testing.assert_allclose(product, expected, rtol=1e-5)


def test_find_mode_leaves_a_fully_saturated_logistic_start():
    """scikit-learn's breast cancer set on 5 raw (unstandardised) features, values up to
    ~2500: from a start in (−2, 2) every logit is in the hundreds or thousands, where the
    likelihood's curvature is exactly 0 in float32 and its gradient enormous, so steps damped
    relative to the curvature alone all overshoot (the search stalled at its first
    iteration); damped relative to the gradient's norm too, it reaches the mode."""
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_breast_cancer()
    X = jnp.asarray(np.c_[np.ones(569), data.data[:, :5]], jnp.float32)
    y = jnp.asarray(data.target, bool)
    log_density = lambda z: (
        jnp.sum(jnp.where(y, jax.nn.log_sigmoid(X @ z), jax.nn.log_sigmoid(-X @ z)))
        - 0.5 * z @ z / 100
    )
    mode = curvature.find_mode(log_density, jnp.array([1.5, -1.0, 0.5, 1.2, -0.7, 1.9]))
    assert int(mode.num_iters) > 1 and bool(mode.converged), mode


def test_blocks_give_each_block_its_own_largest_eigenvalue():
    # ℓ a sum over rows (a block-diagonal Hessian): row 0 a Gaussian of precisions (9, 1),
    # row 1 (4, 100), row 2 the two-mode midpoint of the test above (d = 2, σ = 0.25:
    # eigenvalues −16 and 16), row 3 sqrt outside its domain; one power iteration on all
    # blocks finds 9, 100, 16 (not |−16|) and inf, each to the iteration's accuracy
    P = jnp.array([[9.0, 1.0], [4.0, 100.0]])
    sigma = 0.25

    def log_density(Z):
        gauss = -0.5 * jnp.sum(P * Z[:2] ** 2)
        comps = jnp.stack([-0.5 * jnp.sum((Z[2] - m) ** 2) / sigma**2 for m in (0.0, 1.0)])
        return gauss + jax.scipy.special.logsumexp(comps) + jnp.sum(jnp.sqrt(Z[3]))

    Z = jnp.array([[1.0, 1.0], [1.0, 1.0], [0.5, 0.5], [-1.0, -1.0]])
    lam = curvature.max_eigenvalue(jax.random.key(1), log_density, Z, 50, blocks=True)
    assert lam.shape == (4,) and lam[3] == jnp.inf
    np.testing.assert_allclose(lam[:3], [9.0, 100.0, 1 / sigma**2], rtol=1e-3)


@pytest.mark.parametrize("max_iters", [0, 1, 3, 500])
def test_mode_rise_is_the_density_gained_from_the_start(max_iters):
    """``Mode.rise`` is carried through the loop (ℓ is evaluated only in its body): it equals
    ``ℓ(z_end) − ℓ(z_start)`` evaluated afresh, after any number of iterations (float32
    rounding of a density of size ~10: 1e-4 relative)."""
    log_density = lambda z: -jnp.sum(z**4) - jnp.sum((z - 0.5) ** 2)
    z = jnp.array([1.5, -2.0, 0.3])
    mode = curvature.find_mode(log_density, z, max_iters=max_iters)
    expected = log_density(mode.z) - log_density(z)
    np.testing.assert_allclose(float(mode.rise), float(expected), rtol=1e-4, atol=1e-5)
    assert (float(mode.rise) > 0) == (max_iters > 0)
