"""AutoGPVI under numpyro's SVI: fits with known answers, the surrogate's gradients, errors,
and posterior access. Errors are relative Frobenius norms ``‖Ĉ − C‖ / ‖C‖``."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.infer import SVI, Predictive, Trace_ELBO, init_to_median, init_to_value

import numpyro_dais
from numpyro_dais import AutoGPVI

COV_2D = jnp.array([[1.0, 0.8], [0.8, 1.5]])


def gaussian_2d():
    numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(2), COV_2D))


def _blr_data(n=10, D=3, tau=10.0):
    kx, kb, kn = jax.random.split(jax.random.PRNGKey(0), 3)
    X = jax.random.normal(kx, (n, D))
    y = X @ jax.random.uniform(kb, (D,), minval=-5, maxval=5) + jax.random.normal(kn, (n,))
    cov = jnp.linalg.inv(X.T @ X + jnp.eye(D) / tau**2)
    return X, y, cov @ X.T @ y, cov


def blr(X, y=None, tau=10.0):
    b = numpyro.sample("beta", dist.Normal(0, tau).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Normal(X @ b, 1.0), obs=y)


def _fit(model, guide, steps, *args, lr=5e-2, helper_lr=3e-3):
    opt = AutoGPVI.split_optimizer(
        optax.adam(optax.cosine_decay_schedule(lr, steps, 0.02)), optax.adam(helper_lr)
    )
    svi = SVI(model, guide, opt, Trace_ELBO())
    return svi.run(jax.random.PRNGKey(0), steps, *args, progress_bar=False)


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.slow
@pytest.mark.parametrize("jacobian", ["exact", "helper"])
def test_gaussian_2d_covariance(jacobian):
    guide = AutoGPVI(
        gaussian_2d,
        num_particles=32,
        hidden_dims=(8,),
        helper_hidden=32,
        jacobian=jacobian,
        init_loc_fn=init_to_median,
    )
    res = _fit(gaussian_2d, guide, 400)
    x = guide.sample_posterior(jax.random.PRNGKey(1), res.params, sample_shape=(20_000,))["x"]
    # 20k draws give ≈ 0.01 Monte Carlo error; 400 steps reach ≈ 0.03–0.06 here. 0.14 is
    # the paper's GPVI density-estimation figure, our target.
    assert _rel(jnp.cov(x.T), COV_2D) < 0.14
    # The mean wanders by ≈ 0.1–0.15 (32 particles per step, lr decayed to 1e-3) against
    # marginal stds of 1 and 1.2.
    assert float(jnp.linalg.norm(x.mean(0))) < 0.25


@pytest.mark.slow
@pytest.mark.parametrize("jacobian", ["exact", "helper"])
def test_linear_regression_posterior(jacobian):
    X, y, mean, cov = _blr_data()
    guide = AutoGPVI(
        blr,
        num_particles=32,
        hidden_dims=(),
        helper_hidden=32,
        jacobian=jacobian,
        init_loc_fn=init_to_median,
    )
    res = _fit(blr, guide, 500, X, y)
    b = guide.sample_posterior(jax.random.PRNGKey(1), res.params, sample_shape=(20_000,))
    b = b["beta"]
    # Paper (GPVI): 0.002 / 0.128. 500 steps reach ≈ 0.002 / 0.04–0.06 on this seed; the
    # bounds leave a factor ≈ 2 for platform noise.
    assert _rel(b.mean(0), mean) < 0.01
    assert _rel(jnp.cov(b.T), cov) < 0.128


def test_amortized_svgd_runs_and_reports_a_finite_monitor():
    guide = AutoGPVI(
        gaussian_2d,
        num_particles=16,
        hidden_dims=(4,),
        algorithm="amortized_svgd",
        monitor="energy",
    )
    res = _fit(gaussian_2d, guide, 20)
    assert np.all(np.isfinite(res.losses))


def _shift_model(y=1.5):
    mu = numpyro.param("mu", 0.3)
    x = numpyro.sample("x", dist.Normal(mu, 1.0))
    numpyro.sample("y", dist.Normal(x, 1.0), obs=y)


def test_surrogate_value_and_model_parameter_gradient():
    # A collapsed generator (g ≡ b, λ tiny) puts every particle at b, so the loss must be
    # the monitor −ℓ(b) and d loss / d mu = −∂_mu ℓ(b) = −(b − mu): the model's own ℓ(z*)
    # term is cancelled (without the cancellation the gradient would be doubled).
    guide = AutoGPVI(
        _shift_model,
        num_particles=8,
        hidden_dims=(),
        jacobian="exact",
        lambda_init=1e-6,
        monitor="energy",
        init_loc_fn=init_to_value(values={"x": 0.9}),
    )
    with handlers.seed(rng_seed=0):
        guide()
    params = {
        "mu": jnp.asarray(0.3),
        "auto_generator_0_w": jnp.zeros((1, 1)),
        "auto_generator_0_b": jnp.array([0.9]),
    }
    loss_fn = lambda p: Trace_ELBO().loss(jax.random.PRNGKey(0), p, _shift_model, guide)
    loss, grad = jax.jit(jax.value_and_grad(loss_fn))(params)
    b, mu = 0.9, 0.3
    minus_ell = -(dist.Normal(mu, 1.0).log_prob(b) + dist.Normal(b, 1.0).log_prob(1.5))
    np.testing.assert_allclose(loss, minus_ell, rtol=1e-4)
    np.testing.assert_allclose(grad["mu"], -(b - mu), rtol=1e-4)


def test_generator_gradient_is_the_pulled_back_direction():
    # With the translation generator f(ε) = ε + b, d loss / d b = (1/N) Σ_i g_i, and the
    # score term dominates far from the target: the update moves b towards the mode.
    guide = AutoGPVI(
        gaussian_2d,
        num_particles=16,
        hidden_dims=(),
        jacobian="exact",
        init_loc_fn=init_to_value(values={"x": jnp.array([4.0, -4.0])}),
    )
    svi = SVI(gaussian_2d, guide, optax.adam(1e-3), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.PRNGKey(0)))  # set-up: b = (4, -4)
    loss = lambda p: Trace_ELBO().loss(jax.random.PRNGKey(3), p, gaussian_2d, guide)
    grad = jax.jit(jax.grad(loss))(params)["auto_generator_0_b"]
    b = params["auto_generator_0_b"]
    assert float(grad @ b) > 0  # descent moves b towards 0


def test_argument_errors():
    with pytest.raises(ValueError, match="`jacobian`"):
        AutoGPVI(gaussian_2d, jacobian="cg")
    with pytest.raises(ValueError, match="`algorithm`"):
        AutoGPVI(gaussian_2d, algorithm="svgd")
    with pytest.warns(FutureWarning, match="`algorithm`"):
        assert AutoGPVI(gaussian_2d, method="amortized_svgd").algorithm == "amortized_svgd"
    with pytest.raises(ValueError, match="`jacobian`"):
        AutoGPVI(gaussian_2d, algorithm="amortized_svgd", jacobian="helper")
    with pytest.raises(ValueError, match="`num_particles`"):
        AutoGPVI(gaussian_2d, num_particles=1)
    with pytest.raises(ValueError, match="`noise_dim`"):
        AutoGPVI(gaussian_2d, noise_dim=0)
    guide = AutoGPVI(gaussian_2d, noise_dim=3)  # D = 2 is only known at set-up
    with pytest.raises(ValueError, match=r"`noise_dim` must lie in \[1, D\] = \[1, 2\]"):
        with handlers.seed(rng_seed=0):
            guide()


@pytest.mark.parametrize("report", [True, False])
def test_diverged_helper_warns_and_falls_back(report):
    guide = AutoGPVI(
        gaussian_2d,
        num_particles=8,
        hidden_dims=(4,),
        helper_hidden=8,
        jacobian="helper",
        report_divergences=report,
    )
    svi = SVI(gaussian_2d, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0))
    params = svi.get_params(state)
    params = {k: v * jnp.nan if "_helper_" in k else v for k, v in params.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss, grads = jax.jit(
            jax.value_and_grad(
                lambda p: Trace_ELBO().loss(jax.random.PRNGKey(1), p, gaussian_2d, guide)
            )
        )(params)
        jax.block_until_ready(loss)  # the warning comes when the step runs
    reported = [str(w.message) for w in caught if "helper network diverged" in str(w.message)]
    assert len(reported) == int(report)
    if report:
        assert "(loss nan" in reported[0]
    # the fallback J^-T v ≈ v / λ applies either way
    assert np.isfinite(loss)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def _constrained_model(X, y=None):
    scale = numpyro.sample("scale", dist.HalfNormal(1.0))
    w = numpyro.sample("w", dist.Normal(0, 1).expand([2]).to_event(1))
    numpyro.deterministic("w_norm", jnp.linalg.norm(w))
    numpyro.sample("y", dist.Normal(X @ w, scale), obs=y)


def test_sample_posterior_predictive_median_quantiles():
    X = jax.random.normal(jax.random.PRNGKey(0), (20, 2))
    y = X @ jnp.array([1.0, -1.0]) + 0.3 * jax.random.normal(jax.random.PRNGKey(1), (20,))
    guide = AutoGPVI(_constrained_model, num_particles=8, hidden_dims=(4,))
    res = _fit(_constrained_model, guide, 30, X, y)
    params = res.params

    draws = guide.sample_posterior(jax.random.PRNGKey(2), params, X, sample_shape=(7, 3))
    assert draws["scale"].shape == (7, 3) and draws["w"].shape == (7, 3, 2)
    assert draws["w_norm"].shape == (7, 3)
    assert bool(jnp.all(draws["scale"] > 0))
    chunked = guide.sample_posterior(
        jax.random.PRNGKey(2), params, X, sample_shape=(21,), batch_size=4
    )
    np.testing.assert_allclose(chunked["w"], draws["w"].reshape(21, 2), rtol=1e-5)

    pred = Predictive(
        _constrained_model, guide=guide, params=params, num_samples=2000, return_sites=["w", "y"]
    )(jax.random.PRNGKey(3), X)
    assert pred["w"].shape == (2000, 2) and pred["y"].shape == (2000, 20)
    many = guide.sample_posterior(jax.random.PRNGKey(4), params, X, sample_shape=(2000,))
    # Same generator, independent draws: means agree to a few Monte Carlo standard errors.
    se = jnp.std(many["w"], 0) / jnp.sqrt(2000.0)
    assert bool(jnp.all(jnp.abs(pred["w"].mean(0) - many["w"].mean(0)) < 5 * jnp.sqrt(2) * se))

    med = guide.median(params)
    assert med["w"].shape == (2,) and med["scale"].shape == ()
    q = guide.quantiles(params, [0.1, 0.5, 0.9])
    assert q["w"].shape == (3, 2) and bool(jnp.all(q["scale"][0] <= q["scale"][2]))
    with pytest.raises(NotImplementedError, match="sample_posterior"):
        guide.get_posterior(params)


def flat_regression(X, y=None):
    w = numpyro.sample("w", dist.ImproperUniform(dist.constraints.real, (), (3,)))
    s = numpyro.sample("s", dist.ImproperUniform(dist.constraints.positive, (), ()))
    numpyro.sample("y", dist.Normal(X @ w, s), obs=y)


@pytest.mark.slow
def test_the_default_is_right_on_a_flat_prior_regression():
    """Defaults trained until converged: the coefficients' means within 0.3 posterior sds of
    the exact (Student-t) posterior's, their sds within [0.6, 1.4] of its (amortized SVGD
    spreads a little too little: 0.68-1.05 over two seeds). The GPVI update, the former
    default, put them 1-6 sds off with sds 3-8 times too wide, and further with more steps."""
    rng = np.random.default_rng(0)
    X = np.stack([np.ones(50), rng.normal(size=50), rng.normal(size=50)], 1)
    y = X @ np.array([1.0, 2.0, -0.5]) + rng.normal(0, 0.5, 50)
    beta, rss = np.linalg.lstsq(X, y, rcond=None)[:2]
    nu = 50 - 3 - 1  # flat priors on w and s: w's marginal is Student-t with n - p - 1 dof
    sd = np.sqrt(np.diag(rss[0] / nu * np.linalg.inv(X.T @ X) * nu / (nu - 2)))
    guide = AutoGPVI(flat_regression)
    svi = SVI(flat_regression, guide, optax.adam(1e-2), Trace_ELBO())
    args = (jnp.asarray(X), jnp.asarray(y))
    run = numpyro_dais.run_until_converged(svi, jax.random.key(0), *args, progress_bar=False)
    w = np.asarray(
        guide.sample_posterior(jax.random.key(1), run.params, args[0], sample_shape=(4000,))["w"]
    )
    assert np.all(np.abs(w.mean(0) - beta) / sd < 0.3), (w.mean(0) - beta) / sd
    assert np.all((0.6 < w.std(0) / sd) & (w.std(0) / sd < 1.4)), w.std(0) / sd
