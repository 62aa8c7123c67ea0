"""AutoDAIS under numpyro's SVI: the bound, freshness, posterior access, errors."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer import SVI, Predictive, Trace_ELBO, TraceGraph_ELBO
from numpyro.infer.autoguide import AutoGuideList, AutoNormal
from numpyro.infer.initialization import init_to_median, init_to_value

from numpyro_dais import AutoDAIS
from numpyro_dais.annealed.posterior.selfcheck import ChainsCheck, transport_verdict
from numpyro_dais.engine.annealing import dais0
from numpyro_dais.engine.mcmc import mala
from tests import models


def _fit(guide, model, *args, steps=1000, lr=0.01, seed=0):
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    return svi.run(jax.random.key(seed), steps, *args, progress_bar=False)


def _init_params(guide, model, *args):
    """The guide's parameters right after set-up (``svi.init``), for checks that hold at any
    parameters: one eager set-up, no compiled training."""
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    return svi.get_params(svi.init(jax.random.key(0), *args))


def _bounds(guide, params, model, *args, num=400, seed=0):
    """``num`` independent draws of the guide's bound ``log (1/N) Σ w_i`` at ``params``."""
    loss = Trace_ELBO()
    with handlers.seed(rng_seed=0):
        guide(*args)  # lazy set-up outside vmap
    keys = jax.random.split(jax.random.key(seed), num)
    return -jax.jit(jax.vmap(lambda k: loss.loss(k, params, model, guide, *args)))(keys)


@pytest.fixture(scope="module")
def conjugate():
    y = models.linear_gaussian_data()
    # q0 trained on the bound alone (a wider q0, a better AIS proposal): these tests are
    # about the bound and the evidence; the DAIS₀ term has its own tests below
    guide = AutoDAIS(models.linear_gaussian, K=8, num_particles=4, sym_kl_weight=0.0)
    result = _fit(guide, models.linear_gaussian, y, steps=1500)
    return y, guide, result.params, models.linear_gaussian_log_Z(y)


def test_bound_below_log_Z_and_log_evidence_converges(conjugate):
    y, guide, params, log_Z = conjugate
    b = _bounds(guide, params, models.linear_gaussian, y)
    se = jnp.std(b) / jnp.sqrt(b.size)
    # E[L_{N,K}] <= log Z; allow 4 standard errors of the Monte Carlo mean
    assert float(jnp.mean(b)) <= float(log_Z) + 4 * float(se)
    # training got close: the gap of a trained 4-particle, 8-step bound is small here
    assert float(log_Z - jnp.mean(b)) < 0.5
    est = guide.log_evidence(jax.random.key(1), params, y, num_particles=20000, batch_size=5000)
    # the AIS estimate is consistent; with ESS in the thousands its error is ~1e-2
    assert float(est.ess) > 1000
    np.testing.assert_allclose(est.log_Z, log_Z, atol=0.05)
    assert 0 < float(est.se) < 0.05 and abs(float(est.log_Z - log_Z)) < 4 * float(est.se) + 0.01


def test_log_evidence_se_matches_the_spread_of_independent_estimates(conjugate):
    """60 independent 64-particle estimates: the root-mean-square of their standard errors
    agrees with the standard deviation of their log_Z within 30%."""
    y, guide, params, _ = conjugate
    keys = [jax.random.key(100 + i) for i in range(60)]
    ests = [guide.log_evidence(k, params, y, num_particles=64) for k in keys]
    log_Z = np.array([float(e.log_Z) for e in ests])
    se = np.array([float(e.se) for e in ests])
    np.testing.assert_allclose(np.sqrt(np.mean(se**2)), log_Z.std(), rtol=0.3)


def test_bound_rises_with_num_particles(conjugate):
    y, _, params, _ = conjugate
    # q0 moved off the trained (here exact) fit, so that the weights vary
    params = {**params, "auto_z_0_loc": params["auto_z_0_loc"] + 1.0}
    means = []
    for N in (1, 16):
        guide = AutoDAIS(models.linear_gaussian, K=8, num_particles=N)
        b = _bounds(guide, params, models.linear_gaussian, y, seed=N)
        means.append((float(jnp.mean(b)), float(jnp.std(b) / jnp.sqrt(b.size))))
    (m1, s1), (m16, s16) = means
    # L_{16,K} >= L_{1,K} for the same q: difference beyond 3 combined standard errors
    assert m16 - m1 > 3 * np.hypot(s1, s16)


def test_bound_rises_with_K():
    y = models.linear_gaussian_data()
    log_Z = models.linear_gaussian_log_Z(y)
    gaps = {}
    for K in (1, 8):
        # in z (no whitening, where a diagonal q0 of u is already the exact posterior)
        guide = AutoDAIS(
            models.linear_gaussian, K=K, eta_init=0.05, eta_max=0.3, laplace_init=False
        )
        params = _fit(guide, models.linear_gaussian, y, steps=1500).params
        gaps[K] = float(log_Z - jnp.mean(_bounds(guide, params, models.linear_gaussian, y)))
    # diagonal q0 cannot fit the correlated posterior; 8 annealing steps close part of the gap
    assert gaps[8] < 0.8 * gaps[1], gaps


def test_loss_is_minus_the_bound_for_every_elbo():
    """Trace_ELBO and TraceGraph_ELBO give the same value and gradient (no silent drop)."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=3, num_particles=4)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), y))
    key = jax.random.key(3)
    values, grads = [], []
    for elbo in (Trace_ELBO(), TraceGraph_ELBO()):
        f = lambda p, elbo=elbo: elbo.loss(key, p, models.linear_gaussian, guide, y)
        value, grad = jax.jit(jax.value_and_grad(f))(params)
        values.append(value)
        grads.append(grad)
    np.testing.assert_allclose(values[0], values[1], rtol=1e-6)
    for name in grads[0]:
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6)
        # the whitening fixed at set-up is a constant: training never moves it
        assert jnp.any(grads[1][name] != 0) != ("preconditioner" in name), name


def test_loss_gradient_matches_finite_differences():
    """With ``sym_kl_weight=0`` the gradient SVI gets is the gradient of the bound (central
    differences, float32: step 1e-2, tolerance 5% relative, dominated by round-off)."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=3, num_particles=4, sym_kl_weight=0.0)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), y))
    key = jax.random.key(5)
    f = jax.jit(lambda p: Trace_ELBO().loss(key, p, models.linear_gaussian, guide, y))
    g = jax.jit(jax.grad(f))(params)["auto_z_0_loc"]
    eps = 1e-2
    for i in range(2):
        e = jnp.zeros(2).at[i].set(eps)
        up = {**params, "auto_z_0_loc": params["auto_z_0_loc"] + e}
        down = {**params, "auto_z_0_loc": params["auto_z_0_loc"] - e}
        fd = (f(up) - f(down)) / (2 * eps)
        np.testing.assert_allclose(g[i], fd, rtol=0.05, atol=1e-3)


def _loss_and_grads(sym_kl_weight, seed=5):
    key = jax.random.key(seed)
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=3, num_particles=4, sym_kl_weight=sym_kl_weight)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), y))
    f = lambda p: Trace_ELBO().loss(key, p, models.linear_gaussian, guide, y)
    return jax.jit(jax.value_and_grad(f))(params)


def test_sym_kl_term_moves_only_q0_location():
    """The DAIS₀ term leaves the loss (minus the bound) and the gradients of q0's scale and
    of the transition parameters exactly as they are; it adds ``−(w / K) ∇J`` to the
    gradient of q0's location, linear in w."""
    (v0, g0), (v1, g1), (v2, g2) = (_loss_and_grads(w) for w in (0.0, 1.0, 2.0))
    np.testing.assert_allclose(v0, v1, rtol=1e-6)
    np.testing.assert_allclose(v0, v2, rtol=1e-6)
    for name in g0:
        if name == "auto_z_0_loc":
            assert not np.allclose(g0[name], g1[name]), name
            np.testing.assert_allclose(g2[name] - g1[name], g1[name] - g0[name], atol=1e-4)
        else:
            np.testing.assert_allclose(g0[name], g1[name], rtol=1e-6, atol=1e-7)


def test_dais0_default_gets_the_exact_mean_and_covariance():
    """Default settings (q0 is the posterior, so ``sym_kl_weight=1``) on a correlated
    Gaussian posterior (ρ = −0.91): the diagonal q0 of the whitened coordinates is a
    full-rank Gaussian of z, and it ends at the exact mean, marginal stds (0.68, 0.64) and
    correlation. (Without the whitening the best a diagonal q0 could do is the marginal stds
    with no correlation; a symmetrised-KL fit of its scale would sit at 0.63× of them.)"""
    y = models.linear_gaussian_data()
    mean, cov = models.linear_gaussian_posterior(y)
    guide = AutoDAIS(models.linear_gaussian, K=4, num_particles=8)
    lr = optax.cosine_decay_schedule(0.02, 2000, 0.05)
    params = _fit(guide, models.linear_gaussian, y, steps=2000, lr=lr).params
    q0 = guide.get_posterior(params)
    sd = jnp.sqrt(jnp.diag(cov))
    np.testing.assert_array_less(jnp.abs(q0.mean - mean), 0.15 * sd)
    q0_sd = jnp.sqrt(jnp.diag(q0.covariance_matrix))
    np.testing.assert_array_less(0.8, q0_sd / sd)
    np.testing.assert_array_less(q0_sd / sd, 1.25)
    rho = q0.covariance_matrix[0, 1] / (q0_sd[0] * q0_sd[1])
    np.testing.assert_allclose(rho, cov[0, 1] / (sd[0] * sd[1]), atol=0.05)


def test_transport_check_fires_on_a_transported_q0_only():
    """A q0 placed 3 sds off, with transitions that reach the posterior anyway (K = 32 linear
    steps), is flagged with the fix; the same transitions from the right q0 pass."""
    y = models.linear_gaussian_data()
    mean, cov = models.linear_gaussian_posterior(y)
    sd = jnp.sqrt(jnp.diag(cov))
    guide = AutoDAIS(
        models.linear_gaussian,
        K=32,
        num_particles=16,
        eta_init=0.2,
        eta_max=0.5,
        laplace_init=False,  # params in z
    )
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), y))
    good = {**params, "auto_z_0_loc": mean, "auto_z_0_scale": 0.8 * sd}
    report = guide.transport_check(jax.random.key(1), good, y)
    assert report.ok, report.message
    moved = {**good, "auto_z_0_loc": mean + 3 * sd}
    with pytest.warns(UserWarning, match="sym_kl_weight.*method='importance'"):
        report = guide.transport_check(jax.random.key(1), moved, y)
    assert not report.ok
    assert report.worst in ("z[0]", "z[1]")
    # 2000 importance draws: the end points' mean is within ~0.1 sd of the posterior's
    np.testing.assert_allclose(report.mean_shift["z"], 3.0, atol=0.5)


def test_transport_verdict_fails_on_non_finite_or_diverged_end_points():
    # NaN compares False with every tolerance: a NaN moment (no finite end point) or too
    # few finite end points must fail the check, not pass it silently
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=2)
    _init_params(guide, models.linear_gaussian, y)
    dim = 2
    good = dais0.TransportCheck(jnp.zeros(dim), jnp.zeros(dim), jnp.asarray(1.0))
    assert transport_verdict(guide._subject(), good, 0.5, 2.0, warn=False).ok
    nan = good._replace(mean_shift=jnp.array([0.0, jnp.nan]))
    assert not transport_verdict(guide._subject(), nan, 0.5, 2.0, warn=False).ok
    diverged = good._replace(finite_fraction=jnp.asarray(0.8))
    report = transport_verdict(guide._subject(), diverged, 0.5, 2.0, warn=False)
    assert not report.ok
    assert "diverged from q0 for 20%" in report.message


def _chains(shift, ratio, acceptance=0.8, se=(0.02, 0.02)):
    """A :class:`ChainsCheck` of the two coordinates ``z[0]``, ``z[1]``: q0's mean
    ``shift`` in the chains' sds, the chains' std ``ratio`` to q0's and the standard error
    ``se`` of its log."""
    comparison = dais0.TransportCheck(
        jnp.asarray(shift), -jnp.log(jnp.asarray(ratio)), jnp.asarray(1.0), jnp.asarray(se)
    )
    zeros = jnp.zeros(2)
    info = mala.EnsembleInfo(
        jnp.asarray(acceptance), jnp.asarray(0.5), zeros + 1, zeros, zeros, jnp.asarray(1.0),
        jnp.asarray(0.0),
    )  # fmt: skip
    return ChainsCheck(comparison, ["z[0]", "z[1]"], lambda x: {"z": np.asarray(x)}, info, 1)


def test_transport_verdict_of_the_chains():
    """The verdict on the self-check's chains: a spread 3 times q0's fails with the
    coordinate and the fix, as does a q0 mean 0.9 of their sds off or a spread a third of
    q0's; within the tolerances, or from chains that hardly moved (acceptance 5%), it
    passes, and the message says which."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=2)
    _init_params(guide, models.linear_gaussian, y)
    good = dais0.TransportCheck(jnp.zeros(2), jnp.zeros(2), jnp.asarray(1.0))
    chains = _chains([0.0, 0.1], [1.1, 3.0])
    report = transport_verdict(guide._subject(), good, 0.5, 2.0, False, chains)
    assert not report.ok and "q0 is narrower than the posterior at z[1]" in report.message
    assert "method='mala'" in report.message and "method='psis'" in report.message
    np.testing.assert_allclose(report.chain_std_ratio["z"], [1.1, 3.0], rtol=1e-6)
    np.testing.assert_allclose(report.chain_mean_shift["z"], [0.0, 0.1])
    subject = guide._subject()
    report = transport_verdict(subject, good, 0.5, 2.0, False, chains, chain_std_ratio_tol=4.0)
    assert report.ok and "agree (q0's mean is +0.10" in report.message
    off = transport_verdict(subject, good, 0.5, 2.0, False, _chains([0.9, 0.0], [1.0, 1.0]))
    assert not off.ok and "q0 is off-centre at z[0]" in off.message
    wide = transport_verdict(subject, good, 0.5, 2.0, False, _chains([0.0, 0.0], [1.0, 0.33]))
    assert not wide.ok and "q0 is wider than the posterior at z[1]" in wide.message
    # a ratio past the tolerance but within 3 standard errors (heavy tails) passes
    noisy = _chains([0.0, 0.1], [1.1, 1.6], se=(0.02, 0.2))
    assert transport_verdict(subject, good, 0.5, 2.0, False, noisy).ok
    sure = _chains([0.0, 0.1], [1.1, 1.6], se=(0.02, 0.1))
    report = transport_verdict(subject, good, 0.5, 2.0, False, sure)
    assert not report.ok and "3 standard errors of the ratio" in report.message
    stuck = _chains([0.0, 0.1], [1.1, 3.0], acceptance=0.05)
    report = transport_verdict(guide._subject(), good, 0.5, 2.0, False, stuck)
    assert report.ok and "cannot judge it" in report.message
    # both checks fail: the chains' verdict and its fix lead, the importance draws (which
    # share q0's spread) are not offered; the end points' disagreement follows
    shifted = good._replace(mean_shift=jnp.array([0.0, 0.9]))
    report = transport_verdict(guide._subject(), shifted, 0.5, 2.0, False, chains)
    assert not report.ok and report.message.startswith("AutoDAIS: q0 is narrower")
    assert "Also, q0 disagrees with the annealed end points" in report.message
    assert "method='importance'" not in report.message


def _end_points(guide, params, *args, **kwargs):
    return guide.sample_posterior(
        jax.random.key(7), params, *args, sample_shape=(200,), method="dais", **kwargs
    )


def test_dynamics_use_the_data_of_the_current_call():
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=8, eta_init=0.09)
    params = _init_params(guide, models.linear_gaussian, y)
    a = _end_points(guide, params, y)["z"]
    b = _end_points(guide, params, y + 5.0)["z"]
    # same q0 draws and noise; only the data differ, and the particles follow them (by 2.0
    # here; by 0 if the dynamics kept the data of set-up)
    assert float(jnp.mean(b - a)) > 0.05


def test_dynamics_use_the_current_model_parameters():
    def model(y):
        shift = numpyro.param("shift", 0.0)
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(z + shift, 0.3), obs=y)

    guide = AutoDAIS(model, K=8, eta_init=0.09)
    params = _init_params(guide, model, 1.0)
    a = _end_points(guide, params, 1.0)["z"]
    b = _end_points(guide, {**params, "shift": jnp.array(3.0)}, 1.0)["z"]
    assert float(jnp.mean(a - b)) > 0.05  # 1.2 here


def test_model_parameter_learned_jointly():
    def model(y):
        loc = numpyro.param("loc", 0.0)
        z = numpyro.sample("z", dist.Normal(loc, 1.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(z, 1.0), obs=y)

    y = 2.0 + jax.random.normal(jax.random.key(0), (50,))
    params = _fit(AutoDAIS(model, K=4, num_particles=4), model, y, steps=1500, lr=0.02).params
    # empirical Bayes: the evidence is maximised at loc = mean(y); SGD noise ~0.1
    np.testing.assert_allclose(params["loc"], jnp.mean(y), atol=0.2)


def test_beta_bernoulli():
    data = jnp.array([[1.0] * 8 + [0.0] * 2, [1.0] * 4 + [0.0] * 6]).T

    def model(data):
        f = numpyro.sample("beta", dist.Beta(jnp.ones(2), jnp.ones(2)).to_event())
        with numpyro.plate("N", len(data)):
            numpyro.sample("obs", dist.Bernoulli(f).to_event(1), obs=data)

    guide = AutoDAIS(model, init_loc_fn=init_to_median, base_dist="cholesky")
    params = _fit(guide, model, data, steps=3000).params
    true = (jnp.sum(data, axis=0) + 1) / (len(data) + 2)
    samples = guide.sample_posterior(jax.random.key(1), params, sample_shape=(1000,))
    np.testing.assert_allclose(samples["beta"].mean(0), true, atol=0.05)
    assert guide.median(params)["beta"].shape == (2,)
    assert guide.quantiles(params, [0.2, 0.5, 0.8])["beta"].shape == (3, 2)
    pred = Predictive(model, guide=guide, params=params, num_samples=1000)(jax.random.key(1), data)
    assert pred["obs"].shape == (1000, len(data), 2)


@pytest.mark.parametrize("kernel", ["hmc", "langevin"])
def test_logistic_regression(kernel):
    N, dim = 3000, 3
    data = jax.random.normal(jax.random.key(0), (N, dim))
    true_coefs = jnp.arange(1.0, dim + 1.0)
    labels = dist.Bernoulli(logits=data @ true_coefs).sample(jax.random.key(1))

    def model(data, labels=None):
        coefs = numpyro.sample("coefs", dist.Normal(0, 1).expand([dim]).to_event())
        logits = numpyro.deterministic("logits", data @ coefs)
        with numpyro.plate("N", len(data)):
            numpyro.sample("obs", dist.Bernoulli(logits=logits), obs=labels)

    guide = AutoDAIS(model, init_loc_fn=init_to_median, kernel=kernel)
    params = _fit(guide, model, data, labels, steps=1500).params
    assert guide.median(params)["coefs"].shape == (dim,)
    assert guide.quantiles(params, [0.2, 0.5])["coefs"].shape == (2, dim)
    samples = guide.sample_posterior(
        jax.random.key(1), params, data, labels, sample_shape=(1000,), method="dais"
    )
    # posterior means of this data set (NUTS, 2000 draws: [0.98, 1.88, 2.92]); the
    # posterior std is 0.07-0.11, so 5% relative covers Monte Carlo and optimisation error
    np.testing.assert_allclose(samples["coefs"].mean(0), [0.98, 1.88, 2.92], rtol=0.05)
    assert samples["logits"].shape == (1000, N)


def test_deterministic_and_constrained_sites():
    def model(y=None):
        n = y.size if y is not None else 1
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        sigma = numpyro.param("sigma", 1.0, constraint=constraints.positive)
        scale = numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
        with numpyro.plate("N", n):
            y = numpyro.sample("y", dist.Normal(mu, sigma * scale), obs=y)
        numpyro.deterministic("z", (y - mu) / sigma)

    y = 2 + 3 * jax.random.normal(jax.random.key(0), (300,))
    guide = AutoDAIS(model)
    params = _fit(guide, model, y[:200], steps=500).params
    post = guide.sample_posterior(jax.random.key(0), params, sample_shape=(1000,))
    assert post["z"].shape == (1000, 200)
    assert bool((post["scale"] > 0).all())
    post.pop("z")
    pred = Predictive(model, post, params=params)(jax.random.key(0), y[200:])
    assert pred["y"].shape == (1000, 100)
    np.testing.assert_allclose(
        (pred["y"] - post["mu"][:, None]) / params["sigma"], pred["z"], atol=0.05
    )


@pytest.fixture(scope="module")
def k4n4():
    """A K = 4, N = 4 guide trained for 500 steps, for the tests of posterior access (one
    training, not one per test: the draws depend on the parameters, not on how they were
    trained)."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=4, num_particles=4)
    return y, _fit(guide, models.linear_gaussian, y, steps=500).params


@pytest.mark.parametrize("method", ["q0", "dais", "importance"])
def test_predictive_agrees_with_sample_posterior(k4n4, method):
    y, params = k4n4
    guide = AutoDAIS(models.linear_gaussian, K=4, num_particles=4, posterior_method=method)
    with handlers.seed(rng_seed=0):
        guide(y)  # set-up only: the draws below use the trained `params`
    a = guide.sample_posterior(jax.random.key(0), params, y, sample_shape=(2000,))["z"]
    b = Predictive(
        models.linear_gaussian, guide=guide, params=params, num_samples=2000, return_sites=["z"]
    )(jax.random.key(1), y)["z"]
    assert a.shape == b.shape == (2000, 2)
    # same distribution: means agree within 5 standard errors of a 2000-draw mean
    se = jnp.std(a, 0) / jnp.sqrt(2000.0)
    assert bool((jnp.abs(a.mean(0) - b.mean(0)) < 5 * jnp.sqrt(2.0) * se).all())


def test_sample_posterior_batch_size_and_methods(k4n4):
    y, params = k4n4
    guide = AutoDAIS(models.linear_gaussian, K=4, num_particles=4)
    with handlers.seed(rng_seed=0):
        guide(y)  # set-up only
    for method in ("q0", "importance"):
        a = guide.sample_posterior(jax.random.key(0), params, y, sample_shape=(6, 5), method=method)
        b = guide.sample_posterior(
            jax.random.key(0), params, y, sample_shape=(6, 5), method=method, batch_size=7
        )
        assert a["z"].shape == (6, 5, 2)
        np.testing.assert_allclose(a["z"], b["z"], rtol=1e-5)
    c = guide.sample_posterior(
        jax.random.key(0), params, y, sample_shape=(10,), method="dais", batch_size=3
    )
    assert c["z"].shape == (10, 2)
    with pytest.raises(ValueError, match="method"):
        guide.sample_posterior(jax.random.key(0), params, y, method="nuts")


def test_q0_is_the_posterior_object():
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, base_dist="cholesky")
    params = _init_params(guide, models.linear_gaussian, y)
    # a scale with an off-diagonal entry, so that a transposed factor would show
    params["auto_z_0_scale_tril"] = jnp.array([[0.5, 0.0], [0.3, 0.2]])
    params["auto_z_0_loc"] = jnp.array([0.3, -0.2])
    post = guide.get_posterior(params)
    assert isinstance(post, dist.MultivariateNormal)
    # params hold q0 of the whitened u; z = m + L u with the whitening fixed at set-up
    m, L = params["auto_preconditioner_loc"], params["auto_preconditioner_scale"]
    np.testing.assert_allclose(
        guide.median(params)["z"], m + L @ params["auto_z_0_loc"], rtol=1e-5, atol=1e-6
    )
    # get_transform: N(0, I) to q0 of z, N(m + L loc, L S Sᵀ Lᵀ), by a triangular factor
    # (numpyro's LowerCholeskyAffine): at 0 the mean, its Jacobian a root of the covariance
    transform = guide.get_transform(params)
    np.testing.assert_allclose(
        transform(jnp.zeros(2)), m + L @ params["auto_z_0_loc"], rtol=1e-5, atol=1e-6
    )
    J = jax.jacobian(transform)(jnp.zeros(2))
    F = L @ params["auto_z_0_scale_tril"]
    np.testing.assert_allclose(J @ J.T, F @ F.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(post.covariance_matrix, F @ F.T, rtol=1e-5, atol=1e-6)


def test_autoguidelist_composition():
    def model(x, y=None):
        a = numpyro.sample("a", dist.Normal(0, 1))
        b = numpyro.sample("b", dist.Normal(jnp.ones((2, 1)), 1))
        with numpyro.plate("N", len(x), dim=-2):
            numpyro.sample("y", dist.Normal(a + x @ b, 0.05), obs=y)

    x = jax.random.normal(jax.random.key(0), (500, 2))
    b_true = jnp.array([[-0.5], [-1.0]])
    y = 1 + x @ b_true + 0.05 * jax.random.normal(jax.random.key(1), (500, 1))
    guide = AutoGuideList(model)
    guide.append(AutoNormal(handlers.block(model, expose=["a"])))
    # σ = 0.05 and 500 rows give curvature ~2e5: leapfrog needs η·sqrt(H) < 2, so η ≤ 2e-3
    guide.append(
        AutoDAIS(handlers.block(model, hide=["a"]), num_particles=4, eta_init=1e-3, eta_max=2e-3)
    )
    params = _fit(guide, model, x, y, steps=500, lr=0.1).params
    post = guide.sample_posterior(jax.random.key(0), params, x, sample_shape=(1000,))
    assert post["a"].shape == (1000,) and post["b"].shape == (1000, 2, 1)
    np.testing.assert_allclose(post["a"].mean(0), 1.0, atol=0.05)
    np.testing.assert_allclose(post["b"].mean(0), b_true, atol=0.05)
    pred = Predictive(model, guide=guide, params=params, num_samples=100)(jax.random.key(1), x)
    assert pred["y"].shape == (100, 500, 1)
    assert guide.quantiles(params, [0.2, 0.5, 0.8])["b"].shape == (3, 2, 1)
    with pytest.raises(ValueError, match="hidden"):
        guide[1].sample_posterior(jax.random.key(0), params, x, y, method="dais")


@pytest.mark.parametrize("report, elbo_particles", [(True, 1), (False, 1), (True, 3)])
def test_divergent_particles_are_dropped_and_reported(report, elbo_particles):
    def model():
        numpyro.sample("z", dist.Normal(0.0, 1.0))
        # the log density is NaN for w > 1: some particles leave the domain
        w = numpyro.sample("w", dist.Normal(0.0, 1.0))
        numpyro.factor("wall", jnp.where(w > 1.0, jnp.nan, 0.0))

    # q0 centred on the wall: each particle starts in the NaN region with probability 1/2
    # (no Laplace start, which would move q0 off the wall: then no particle may cross it)
    init = init_to_value(values={"z": 0.0, "w": 1.0})
    guide = AutoDAIS(
        model,
        K=2,
        num_particles=16,
        init_scale=1.0,
        init_loc_fn=init,
        laplace_init=False,
        report_divergences=report,
    )
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO(num_particles=elbo_particles))
    state = svi.init(jax.random.key(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state, loss = jax.jit(svi.update)(state)
        jax.block_until_ready(loss)  # the warning comes when the step runs
    reported = [str(w.message) for w in caught if "diverged" in str(w.message)]
    if report:
        # one warning per step, counting the particles of every vmapped ELBO draw
        assert len(reported) == 1
        assert f"of {16 * elbo_particles} particle trajectories" in reported[0]
    else:
        assert not reported
    # dropped from the bound and from the gradient either way
    assert bool(jnp.isfinite(loss))
    for value in svi.get_params(state).values():
        assert bool(jnp.isfinite(value).all())


@pytest.mark.parametrize("elbo_particles", [1, 2])
def test_divergence_check_changes_nothing_on_a_healthy_run(elbo_particles):
    """The check is a host call taken only when something diverged: no effect in the
    compiled step and, on CPU, no JAX host callback (either would slow every call: no C++
    dispatch fast path), no warning, the same training."""
    y = models.linear_gaussian_data()
    runs = {}
    for report in (True, False):
        guide = AutoDAIS(models.linear_gaussian, K=2, num_particles=4, report_divergences=report)
        svi = SVI(models.linear_gaussian, guide, optax.adam(0.05), Trace_ELBO(elbo_particles))
        state = svi.init(jax.random.key(0), y)
        assert not jax.make_jaxpr(svi.update)(state, y).effects
        update = jax.jit(svi.update)
        hlo = update.lower(state, y).compile().as_text()
        assert "python_cpu_callback" not in hlo
        assert ("numpyro_dais_host_call" in hlo) == report
        losses = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails the test
            for _ in range(20):
                state, loss = update(state, y)
                losses.append(loss)
            jax.block_until_ready(losses)
        runs[report] = (np.asarray(losses), svi.get_params(state))
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-6)
    for name, value in runs[True][1].items():
        np.testing.assert_allclose(value, runs[False][1][name], rtol=1e-6, err_msg=name)


def test_discrete_site_helpful_error():
    def model():
        p = numpyro.sample("p", dist.Beta(2.0, 2.0))
        x = numpyro.sample("x", dist.Bernoulli(p))
        with numpyro.plate("N", 2):
            numpyro.sample(
                "obs", dist.Bernoulli(p * x + (1 - p) * (1 - x)), obs=jnp.array([1.0, 0.0])
            )

    with pytest.raises(ValueError, match="handle discrete latent site 'x'"):
        handlers.seed(AutoDAIS(model), 0)()


def test_subsample_plate_points_to_sldais():
    def model(x):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("n", 100, subsample_size=10):
            numpyro.sample("x", dist.Normal(mu, 1), obs=numpyro.subsample(x, event_dim=0))

    with pytest.raises(ValueError, match="AutoSurrogateLikelihoodDAIS"):
        handlers.seed(AutoDAIS(model), 0)(jnp.zeros(100))


def test_local_latents_error():
    def model():
        with numpyro.plate("n", 10, subsample_size=3):
            numpyro.sample("x", dist.Normal(0, 1))

    with pytest.raises(ValueError, match="local latent"):
        handlers.seed(AutoDAIS(model), 0)()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"K": 0}, "`K`"),
        ({"K": 2.5}, "`K`"),
        ({"num_particles": 0}, "`num_particles`"),
        ({"eta_init": 0.2, "eta_max": 0.1}, "`eta_init`"),
        ({"eta_init": 0.0}, "`eta_init`"),
        ({"eta_max": -1.0}, "`eta_max`"),
        ({"gamma_init": 1.0}, "`gamma_init`"),
        ({"kernel": "nuts"}, "`kernel`"),
        ({"base_dist": "full"}, "`base_dist`"),
        ({"init_scale": 0.0}, "`init_scale`"),
        ({"posterior_method": "mean"}, "`posterior_method`"),
        ({"sym_kl_weight": -1.0}, "`sym_kl_weight`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        AutoDAIS(models.linear_gaussian, **kwargs)


def test_numpy_params_accepted():
    """``jax.device_get`` params (NumPy arrays) work for every posterior method."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=2, num_particles=2)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = jax.device_get(svi.get_params(svi.init(jax.random.key(0), y)))
    for method in ("q0", "dais", "importance"):
        out = guide.sample_posterior(jax.random.key(0), params, y, sample_shape=(3,), method=method)
        assert out["z"].shape == (3, 2)
    assert bool(
        jnp.isfinite(guide.log_evidence(jax.random.key(0), params, y, num_particles=10).log_Z)
    )
