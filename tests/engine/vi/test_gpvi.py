"""Pure-JAX GPVI engine: kernels, networks, exact and helper ``J^{-T} v``, directions."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from numpyro_dais.engine.vi import gpvi, networks
from numpyro_dais.engine.vi.kernels import RBF, ksd_u_statistic, median_bandwidth

D, N = 3, 16


def test_median_bandwidth_and_kernel_gradient():
    x_prime = jax.random.normal(jax.random.PRNGKey(0), (5, D))
    x = jax.random.normal(jax.random.PRNGKey(1), (4, D))
    sq = np.sum((np.asarray(x_prime)[:, None] - np.asarray(x)[None]) ** 2, -1)
    np.testing.assert_allclose(median_bandwidth(x_prime, x), np.median(sq) / np.log(20), 1e-5)
    kern = RBF(x_prime, x)
    k = lambda a, b: jnp.exp(-jnp.sum((a - b) ** 2) / kern.h)
    expect = jax.vmap(lambda a: jax.vmap(lambda b: jax.grad(k)(a, b))(x))(x_prime)
    np.testing.assert_allclose(kern.grad_first, expect, rtol=1e-5, atol=1e-7)


def test_ksd_separates_target_from_a_wrong_fit():
    # p = N(0, I_2). On 400 exact draws KSD² is O(1/n) (≈ −0.003 over seeds 0–2); a cloud
    # shifted by 1 or twice as wide gives ≈ 0.1 (0.099–0.126), so 0.02 / 0.05 separate them.
    x = jax.random.normal(jax.random.PRNGKey(0), (400, 2))
    good = ksd_u_statistic(x, -x)
    shifted = ksd_u_statistic(x + 1.0, -(x + 1.0))
    wide = ksd_u_statistic(2.0 * x, -2.0 * x)
    assert abs(good) < 0.02
    assert shifted > 0.05 and wide > 0.05


def test_exact_inverse_transpose_on_a_linear_generator():
    A = jnp.array([[1.0, 0.5, 0.0], [0.2, 2.0, 0.1], [0.0, -0.3, 0.7]])
    layers = [(A.T, jnp.zeros(D))]
    f = lambda e: networks.generator_apply(layers, 0.5, e)  # J = A + 0.5 I
    eps_prime = jax.random.normal(jax.random.PRNGKey(0), (4, D))
    V = jax.random.normal(jax.random.PRNGKey(1), (4, 5, D))
    expect = V @ jnp.linalg.inv(A + 0.5 * jnp.eye(D))  # rows vᵀ J^{-1} = (J^{-T} v)ᵀ
    np.testing.assert_allclose(
        gpvi.inverse_transpose_exact(f, eps_prime, V), expect, rtol=1e-4, atol=1e-5
    )
    W = gpvi.inverse_transpose_exact(f, eps_prime, V)
    assert gpvi.helper_loss(f, eps_prime, V, W) < 1e-8


def _fixed_generator():
    # A nonlinear generator whose Jacobians are well conditioned (σ_min > 0.3) at the test
    # noise, so that J^{-T} v differs from v / λ by about 50%.
    key = jax.random.split(jax.random.PRNGKey(0))[0]
    layers = networks.generator_init(key, D, D, (8,), out_scale=0.3)
    return lambda e: networks.generator_apply(layers, 1.0, e)


def _pairs(key):
    k1, k2 = jax.random.split(key)
    eps, eps_prime = jax.random.normal(k1, (N, D)), jax.random.normal(k2, (N, D))
    return eps_prime, RBF(eps_prime, eps).grad_first


def test_helper_converges_to_the_exact_solve():
    f = _fixed_generator()
    helper = networks.helper_init(jax.random.PRNGKey(2), D, D, hidden=64, num_layers=2)
    opt = optax.adam(optax.cosine_decay_schedule(3e-3, 1000, 0.03))
    state = opt.init(helper)

    def loss(h, key):
        eps_prime, V = _pairs(key)
        return gpvi.helper_loss(f, eps_prime, V, gpvi.helper_predict(h, eps_prime, V, 1.0))

    @jax.jit
    def step(carry, key):
        h, s = carry
        value, grad = jax.value_and_grad(loss)(h, key)
        updates, s = opt.update(grad, s, h)
        return (optax.apply_updates(h, updates), s), value

    keys = jax.random.split(jax.random.PRNGKey(3), 1000)
    (helper, _), losses = jax.lax.scan(step, (helper, state), keys)

    eps_prime, V = _pairs(jax.random.PRNGKey(99))
    exact = gpvi.inverse_transpose_exact(f, eps_prime, V)
    sv = jax.vmap(lambda e: jnp.linalg.svd(jax.jacfwd(f)(e), compute_uv=False))(eps_prime)
    assert sv.min() > 0.3  # precondition: a well-posed solve
    rel = lambda W: float(jnp.linalg.norm(W - exact) / jnp.linalg.norm(exact))
    baseline = rel(V)  # J ≈ I: what amortized SVGD implicitly assumes
    learned = rel(gpvi.helper_predict(helper, eps_prime, V, 1.0))
    # Held-out pairs. 1000 Adam steps of a 2-layer ReLU helper reach ≈ 0.1 relative error
    # (its piecewise-linear fit of a map linear in v); 0.2 leaves room for seeds/platforms.
    assert baseline > 0.4
    assert learned < 0.2
    assert float(losses[-100:].mean()) < 0.1 * float(losses[:10].mean())


def test_helper_prediction_is_homogeneous_and_starts_at_v_over_lambda():
    # J^{-T} v is linear in v: the estimate scales with v exactly (up to float32 rounding),
    # however small v is, and with a zero output layer it is the flat-generator answer v / λ.
    helper = networks.helper_init(jax.random.PRNGKey(2), D, D, hidden=16, num_layers=2)
    eps_prime, V = _pairs(jax.random.PRNGKey(5))
    W = gpvi.helper_predict(helper, eps_prime, V, 2.0)
    for c in (1e-6, 3.0):
        np.testing.assert_allclose(
            gpvi.helper_predict(helper, eps_prime, c * V, 2.0), c * W, rtol=1e-4, atol=1e-6 * c
        )
    zero_out = helper[:-1] + [jax.tree.map(jnp.zeros_like, helper[-1])]
    np.testing.assert_allclose(gpvi.helper_predict(zero_out, eps_prime, V, 2.0), V / 2.0)


def test_amortized_svgd_equals_gpvi_for_a_translation_generator():
    # f(ε) = ε + b: kernel on outputs = kernel on noise, J = I, so both directions agree.
    b = jnp.array([0.3, -1.0, 2.0])
    layers = [(jnp.zeros((D, D)), b)]
    f = lambda e: networks.generator_apply(layers, 1.0, e)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    eps, eps_prime = jax.random.normal(k1, (N, D)), jax.random.normal(k2, (N, D))
    score = -(eps_prime + b)  # ∇ log N(0, I) at x′
    g_gpvi = gpvi.gpvi_direction(f, eps, eps_prime, score, lam=1.0, jacobian="exact").g
    g_svgd = gpvi.amortized_svgd_direction(eps + b, eps_prime + b, score).g
    np.testing.assert_allclose(g_gpvi, g_svgd, rtol=1e-4, atol=1e-5)


def test_pullback_vanishes_at_the_target_generator():
    # Target N(0, Σ) with Σ = A Aᵀ; at f(ε) = A ε the pulled-back gradient of
    # ⟨g, f_θ(ε)⟩ w.r.t. A is pure Monte Carlo noise; at 2A it is systematic.
    A = jnp.array([[1.0, 0.0], [0.8, 0.6]])
    prec = jnp.linalg.inv(A @ A.T)

    def grad_A(M, key):
        k1, k2 = jax.random.split(key)
        eps, eps_prime = jax.random.normal(k1, (256, 2)), jax.random.normal(k2, (256, 2))
        f = lambda e, M=M: e @ M.T
        score = -f(eps_prime) @ prec
        out = gpvi.gpvi_direction(f, eps, eps_prime, score, lam=1.0, jacobian="exact")
        return jax.grad(lambda M: jnp.mean(jnp.sum(out.g * (eps @ M.T), -1)))(M)

    keys = jax.random.split(jax.random.PRNGKey(0), 8)
    at_target = jnp.mean(jax.vmap(lambda k: grad_A(A, k))(keys), 0)
    too_wide = jnp.mean(jax.vmap(lambda k: grad_A(2 * A, k))(keys), 0)
    assert jnp.linalg.norm(at_target) < 0.25 * jnp.linalg.norm(too_wide)


def test_helper_divergence_falls_back():
    f = _fixed_generator()
    helper = networks.helper_init(jax.random.PRNGKey(2), D, D, hidden=8, num_layers=1)
    helper = jax.tree.map(lambda w: w * jnp.nan, helper)
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    eps, eps_prime = jax.random.normal(k1, (N, D)), jax.random.normal(k2, (N, D))
    out = gpvi.gpvi_direction(
        f, eps, eps_prime, -eps_prime, lam=1.0, jacobian="helper", helper_layers=helper
    )
    assert int(out.num_fallback) == N
    assert bool(jnp.all(jnp.isfinite(out.g)))


def test_unknown_jacobian():
    with pytest.raises(ValueError, match="`jacobian`"):
        gpvi.gpvi_direction(
            lambda e: e,
            jnp.zeros((2, 1)),
            jnp.ones((2, 1)),
            jnp.zeros((2, 1)),
            lam=1.0,
            jacobian="cg",
        )


def test_jacobian_work_is_ordered_after_the_scores():
    """``_after(x, y)`` returns ``y`` unchanged, through a real data dependency on ``x`` that
    the compiled program keeps (a non-finite ``x`` reaches the output; XLA drops an
    ``optimization_barrier`` instead), so that the Jacobian solves do not run beside the
    likelihood's gradients."""
    y = (jnp.arange(6.0).reshape(2, 3), -jnp.ones(4))
    after = jax.jit(gpvi._after)
    out = after(jnp.ones((2, 3)), y)
    for a, b in zip(out, y, strict=True):
        np.testing.assert_array_equal(a, b)
    poisoned = after(jnp.array([1.0, jnp.nan]), y)
    assert all(bool(jnp.all(jnp.isnan(a))) for a in poisoned)
