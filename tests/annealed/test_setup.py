"""The set-up of the annealed guides (``numpyro_dais.annealed.setup``) and the q0 self-check
(``numpyro_dais.annealed.posterior.selfcheck``): a mode, its Laplace whitening, loud
failures, and the check that q0 draws agree with the annealed end points."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax.experimental.ode import odeint
from numpyro.distributions import constraints
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO

from numpyro_dais import AutoDAIS, run_until_converged
from numpyro_dais.annealed.objective import divergence_brake
from numpyro_dais.annealed.posterior import mala_draws, selfcheck
from numpyro_dais.engine.diagnostics import psis
from numpyro_dais.engine.setup import refinement
from tests import models


def _svi(model, guide, lr=1e-2):
    return SVI(model, guide, optax.adam(lr), Trace_ELBO())


# -- an uncentred regression: the case that used to fall back silently ---------------------


def uncentred_data():
    """n = 62 rows of one covariate in [3952, 4013]: intercept and slope correlated at
    −0.9999, posterior sds ~90 and ~0.02."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(3952, 4013, 62)).astype(np.float32)
    y = (1990 + 0.5 * (x - 3980) + rng.normal(0, 3.0, 62)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


def uncentred(x, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 1000.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1000.0))
    sigma = numpyro.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
    numpyro.sample("y", dist.Normal(a + b * x, sigma), obs=y)


def test_uncentred_regression_gets_the_posterior_with_default_settings():
    """Default AutoDAIS, Adam 1e-2, float32: q0's mean of (a, b) is the least-squares fit (the
    posterior mean under these nearly flat priors) within 0.3 posterior sds, and its sds
    within 25% of the exact marginal t sds; no warning (before the whitening: 90 sds off,
    silently). Tolerances: q0's location is an Adam iterate (jitter ~0.1-0.2 sd at 1e-2)."""
    x, y = uncentred_data()
    guide = AutoDAIS(uncentred)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        params = _svi(uncentred, guide).run(jax.random.key(0), 1000, x, y, progress_bar=False)
        draws = guide.sample_posterior(jax.random.key(1), params.params, sample_shape=(4000,))
    assert guide.refinement.num_iters == 0  # Gaussian: the Laplace start is kept
    X = np.stack([np.ones(62), np.asarray(x, np.float64)], axis=1)
    coef, rss = np.linalg.lstsq(X, np.asarray(y, np.float64), rcond=None)[:2]
    nu = 62 - 3  # flat prior on σ: (a, b) is a t with n − 3 degrees of freedom
    cov = rss[0] / nu * np.linalg.inv(X.T @ X) * nu / (nu - 2)
    sd = np.sqrt(np.diag(cov))
    for i, name in enumerate("ab"):
        assert abs(float(jnp.mean(draws[name])) - coef[i]) < 0.3 * sd[i], name
        assert 0.75 < float(jnp.std(draws[name])) / sd[i] < 1.25, name
    # a diagonal q0 in the whitened coordinates is a full-rank q0 in (a, b): the draws carry
    # the posterior's correlation (exact -0.99999, measured -0.99999 from 4000 draws; a
    # diagonal q0 in (a, b) gives 0)
    exact = cov[0, 1] / (sd[0] * sd[1])
    corr = np.corrcoef(np.asarray(draws["a"], np.float64), np.asarray(draws["b"], np.float64))
    assert abs(corr[0, 1] - exact) < 1e-4, (corr[0, 1], exact)


def test_a_hessian_that_is_not_finite_is_loud():
    """A log density whose Hessian is NaN at every point: the Laplace start is skipped with
    a warning that says so and gives the fix (before: silently, and no stiffness warning
    either, as λ = 0 was passed on)."""

    @jax.custom_jvp
    def square(z):
        return z**2

    @square.defjvp
    def _(primals, tangents):  # a finite gradient 2z whose own derivative is NaN
        (z,), (t,) = primals, tangents
        nan_slope = jnp.sqrt(jnp.abs(z) - jnp.abs(z))  # 0, with an infinite derivative
        return z**2, 2 * z * (1 + 0 * nan_slope) * t

    def model():
        z = numpyro.sample("z", dist.Normal(0.0, 1.0))
        numpyro.factor("nan_curvature", -square(z))

    guide = AutoDAIS(model)
    with pytest.warns(UserWarning, match="Laplace start was skipped.*init_to_median") as got:
        _svi(model, guide).init(jax.random.key(0))
    # named at the user's call of svi.init, through numpyro's frames and the library's
    assert {w.filename for w in got if "Laplace" in str(w.message)} == {__file__}


# -- hierarchies --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eight_schools():
    y, sigma = models.SCHOOLS_Y, models.SCHOOLS_SIGMA

    def non_centred(y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", 8):
            theta_raw = numpyro.sample("theta_raw", dist.Normal(0.0, 1.0))
            numpyro.sample("obs", dist.Normal(mu + tau * theta_raw, sigma), obs=y)

    mcmc = MCMC(NUTS(non_centred), num_warmup=1000, num_samples=4000, progress_bar=False)
    mcmc.run(jax.random.key(0), y, sigma)
    return non_centred, (y, sigma), mcmc.get_samples()


def test_eight_schools_non_centred(eight_schools):
    """The classic funnel, non-centred, default AutoDAIS: the whitening comes from the joint
    mode, refined by Gaussian VI; importance draws within 0.3 NUTS sds of NUTS's means of μ
    and τ (the library's bar for a right answer; τ's was 0.26 after 2,000 steps); q0's
    within 1.5 of μ and log τ, and within 0.5 unless the q0 self-check warned (the bound
    barely fixes where q0 sits along log τ: q0's τ wanders 0.4–1.1 NUTS sds of log τ low
    between 2,000 and 20,000 steps, from the refined start and the mode's alike);
    divergences on under 5% of the steps, and a finite loss at the end (before: q0's τ
    0.57 ± 3.8 against 3.54 ± 3.1, and divergences on 325 of 5000 steps)."""
    model, data, ref = eight_schools
    guide = AutoDAIS(model, K=8, num_particles=8)
    with jax.enable_x64(True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = tuple(jnp.asarray(x, jnp.float64) for x in data)
        result = _svi(model, guide).run(jax.random.key(0), 2000, *data, progress_bar=False)
        jax.block_until_ready(result.params)
        key = jax.random.key(1)
        q0 = guide.sample_posterior(key, result.params, *data, sample_shape=(4000,))
        end = guide.sample_posterior(
            key, result.params, *data, sample_shape=(4000,), method="importance"
        )
    diverged = [w for w in caught if "diverged" in str(w.message)]
    assert len(diverged) < 100, len(diverged)
    assert np.all(np.isfinite(result.losses[-100:]))
    for name in ("mu", "tau"):
        sd = float(jnp.std(ref[name]))
        assert abs(float(jnp.mean(end[name]) - jnp.mean(ref[name]))) < 0.3 * sd, name
    disagrees = any("q0 disagrees" in str(w.message) for w in caught)
    for name, f in (("mu", jnp.asarray), ("tau", jnp.log)):  # q0: in its own coordinates
        x, r = f(q0[name]), f(ref[name])
        off = abs(float(jnp.mean(x) - jnp.mean(r))) / float(jnp.std(r))
        assert off < 1.5, name
        assert off < 0.5 or disagrees, (name, off)  # off by more: the self-check says so


def test_a_hierarchy_starts_at_its_bulk_not_its_mode(eight_schools):
    """Eight schools' joint mode overfits the schools (τ there is ~15 NUTS sds above the
    posterior's bulk in τ, 2.2 in log τ): its residual is far above the threshold, so the
    set-up refines the Laplace start by Gaussian VI. q0 at the start (before any training
    step) is then within 0.5 NUTS sds of log τ's mean (Laplace: 2.17; refined: 0.22) and of
    μ's (0.94; 0.01); 0.5 leaves room for the refinement's 32 fixed draws."""
    model, data, ref = eight_schools
    guide = AutoDAIS(model)
    svi = _svi(model, guide)
    params = svi.get_params(svi.init(jax.random.key(0), *data))
    assert guide.refinement.residual > refinement.THRESHOLD
    assert guide.refinement.num_iters > 0
    q0 = guide.sample_posterior(jax.random.key(1), params, *data, sample_shape=(4000,))
    for name, f in (("mu", jnp.asarray), ("tau", jnp.log)):
        x, r = f(q0[name]), f(ref[name])
        assert abs(float(jnp.mean(x) - jnp.mean(r))) < 0.5 * float(jnp.std(r)), name


def test_divergence_brake_shortens_the_steps_and_leaves_the_loss():
    """The brake is 0 in value; in gradient it pushes each step size down by f / η_k, f the
    fraction of particles that diverged, and is absent on a healthy step."""
    step_sizes = jnp.array([0.1, 0.4])
    value, grad = jax.value_and_grad(divergence_brake)(step_sizes, 0.25)
    assert float(value) == 0.0
    np.testing.assert_allclose(grad, -0.25 / step_sizes, rtol=1e-6)
    np.testing.assert_array_equal(jax.grad(divergence_brake)(step_sizes, 0.0), 0.0)


def test_a_centred_funnel_without_a_mode_is_loud(eight_schools):
    """Centred eight schools has no mode (its density grows without bound as τ → 0 with
    every θ_j = μ): the mode search runs into the neck, and, with ``noncentre=False``, the
    set-up says so and names the fix instead of whitening by a curvature of ~1e17 (the
    default non-centres instead: ``tests/test_noncentre.py``)."""
    _, data, _ = eight_schools

    def centred(y, sigma):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", 8):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    guide = AutoDAIS(centred, noncentre=False)
    svi = _svi(centred, guide)
    with pytest.warns(UserWarning, match="no mode.*noncentre='auto'.*LocScaleReparam"):
        params = svi.get_params(svi.init(jax.random.key(0), *data))
    assert "auto_preconditioner_loc" not in params
    assert guide.curvature < 1e3  # measured at the initial point, not in the neck


# -- an ODE model (odeint: a custom_vjp without a forward-mode rule) ---------------------------


def pk_model(t, conc=None, use_ode=True):
    """One-compartment elimination, C(t) = C0 exp(−k t): by odeint or in closed form."""
    k = numpyro.sample("k", dist.LogNormal(-1.0, 0.5))
    c0 = numpyro.sample("c0", dist.LogNormal(2.0, 0.5))
    if use_ode:
        mean = odeint(lambda c, _, k: -k * c, c0, jnp.concatenate([jnp.zeros(1), t]), k)[1:]
    else:
        mean = c0 * jnp.exp(-k * t)
    numpyro.sample("conc", dist.LogNormal(jnp.log(mean), 0.1), obs=conc)


def test_ode_model_sets_up_and_fits():
    """The set-up's Hessian-vector products fall back to reverse-over-reverse through
    ``odeint`` (before: a TypeError at set-up); the whitening's mode matches the closed-form
    model's and a short fit keeps a finite loss."""
    t = jnp.array([0.5, 1.0, 2.0, 4.0, 6.0])
    conc = 8.0 * jnp.exp(-0.35 * t) * jnp.exp(0.1 * jax.random.normal(jax.random.key(0), (5,)))
    modes = []
    for use_ode in (True, False):
        model = lambda t, conc, use_ode=use_ode: pk_model(t, conc, use_ode)
        guide = AutoDAIS(model, K=1)
        svi = _svi(model, guide)
        state = svi.init(jax.random.key(0), t, conc)
        modes.append(np.asarray(svi.get_params(state)["auto_preconditioner_loc"]))
        if use_ode:
            losses = svi.run(jax.random.key(1), 5, t, conc, progress_bar=False).losses
            assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(modes[0], modes[1], rtol=1e-3, atol=1e-3)


# -- the whitened parameterisation -------------------------------------------------------


def test_training_resumes_exactly_from_a_saved_state():
    """The whitening lives in ``params`` (its gradient is zero), so 20 + 20 steps continued
    from the saved state give the parameters of 40 steps, bit for bit."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, num_particles=2)
    svi = _svi(models.linear_gaussian, guide)
    whole = svi.run(jax.random.key(0), 40, y, progress_bar=False)
    half = svi.run(jax.random.key(0), 20, y, progress_bar=False)
    rest = svi.run(jax.random.key(0), 20, y, progress_bar=False, init_state=half.state)
    for name, value in whole.params.items():
        np.testing.assert_array_equal(value, rest.params[name], err_msg=name)
    m0 = svi.get_params(svi.init(jax.random.key(0), y))["auto_preconditioner_loc"]
    np.testing.assert_array_equal(whole.params["auto_preconditioner_loc"], m0)


# -- the self-check ---------------------------------------------------------------------------


def test_q0_used_as_the_posterior_is_checked_once():
    """A q0 placed 3 sds off while the transitions reach the posterior anyway: the first use
    of these params as the posterior (median, quantiles, q0 draws) warns with the fix, once;
    importance draws are not checked; ``self_check=False`` skips it."""
    y = models.linear_gaussian_data()
    mean, cov = models.linear_gaussian_posterior(y)
    sd = jnp.sqrt(jnp.diag(cov))
    options = dict(K=32, num_particles=16, eta_init=0.2, eta_max=0.5, laplace_init=False)
    guide = AutoDAIS(models.linear_gaussian, **options)
    svi = _svi(models.linear_gaussian, guide)
    params = svi.get_params(svi.init(jax.random.key(0), y))
    moved = {**params, "auto_z_0_loc": mean + 3 * sd, "auto_z_0_scale": 0.8 * sd}
    with pytest.warns(UserWarning, match="q0 disagrees.*Checked once.*self_check=False") as got:
        guide.median(moved)
    assert {w.filename for w in got if "q0 disagrees" in str(w.message)} == {__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guide.quantiles(moved, [0.5])
        guide.sample_posterior(jax.random.key(0), moved, sample_shape=(10,))
    quiet = AutoDAIS(models.linear_gaussian, self_check=False, **options)
    _svi(models.linear_gaussian, quiet).init(jax.random.key(0), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet.median(moved)
    with pytest.raises(TypeError, match="self_check"):
        AutoDAIS(models.linear_gaussian, self_check="yes")


@pytest.fixture(scope="module")
def narrow_q0():
    """An AutoDAIS of the linear Gaussian with short steps (K = 4, η = 0.05) and two sets of
    params: ``q0`` at the exact posterior mean with a quarter of its sds (``narrow``), and
    with its sds (``right``)."""
    y = models.linear_gaussian_data()
    mean, cov = models.linear_gaussian_posterior(y)
    sd = jnp.sqrt(jnp.diag(cov))
    guide = AutoDAIS(models.linear_gaussian, K=4, eta_init=0.05, eta_max=0.1, laplace_init=False)
    svi = _svi(models.linear_gaussian, guide)
    params = svi.get_params(svi.init(jax.random.key(0), y))
    narrow = {**params, "auto_z_0_loc": mean, "auto_z_0_scale": sd / 4}
    right = {**params, "auto_z_0_loc": mean, "auto_z_0_scale": sd}
    return guide, narrow, right, y


def test_a_q0_narrower_than_the_posterior_is_loud_though_the_end_points_agree(narrow_q0):
    """The narrow q0's end points stay near it: the MALA chains of the transport check
    spread to about 4 times q0's std (above 2.5: 2,048 draws of 256 adapted chains,
    ±3% standard error), the check fails, and the self-check before the first q0 draws
    warns, naming the coordinate and the fix. At the exact marginal sds: no warning."""
    guide, narrow, right, y = narrow_q0
    report = guide.transport_check(jax.random.key(0), narrow, y, warn=False)
    ratio = np.exp(np.abs(np.log(report.std_ratio["z"])))
    assert np.all(ratio < 1.5)  # the end points agree with q0
    assert not report.ok and np.all(report.chain_std_ratio["z"] > 2.5), report.chain_std_ratio
    assert "while the annealed end points, a few uncorrected steps from q0" in report.message
    with pytest.warns(UserWarning, match=r"q0 is narrower than the posterior at z\[.\].*Fix:"):
        guide.sample_posterior(jax.random.key(0), narrow, sample_shape=(10,))
    assert report.importance_ok is False  # the end points share q0's spread
    assert guide.transport_check(jax.random.key(0), right, y, warn=False).ok
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guide.median(right)


def test_the_self_check_judges_the_importance_draws_of_one_particle(narrow_q0, monkeypatch):
    """With ``num_particles=1`` the importance draws are the end points, and the self-check's
    chains judge them rather than the ``k̂`` of weights none of them was resampled by: the
    narrow q0's end points warn, once, naming them and the fix, with no ``k̂`` warning though
    every ``k̂`` is made to look heavy; the right q0's are silent; where no check ran
    (``self_check=False``, under ``jit``) ``k̂`` judges them again."""
    guide, narrow, right, y = narrow_q0
    monkeypatch.setattr(psis, "unreliable", lambda k, S: True)
    draw = lambda params: guide.sample_posterior(
        jax.random.key(1), params, y, sample_shape=(100,), method="importance"
    )
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        draw(narrow)
    messages = [str(w.message) for w in got]
    assert len(messages) == 1, messages
    assert "'importance' draws with them, are off" in messages[0]
    assert "first use for 'importance' draws" in messages[0] and "method='mala'" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw(narrow)  # once for these params
        draw(right)
    monkeypatch.setattr(AutoDAIS, "_self_check_report", lambda self, params: None)  # no check
    with pytest.warns(RuntimeWarning, match="Pareto"):
        draw(right)


def test_the_self_checks_chains_fit_a_budget_of_the_models_flops(monkeypatch):
    """The chains are as many as the budget of flops affords (a power of two from 32 to
    256), none where even 32 would exceed it: the report then says that they did not run,
    and why, and judges q0 by its end points alone."""

    def cost(num_chains, flops):
        draws = selfcheck.CHECK_DRAWS // num_chains
        return num_chains * (mala_draws.NUM_WARMUP + mala_draws.THIN * draws) * flops

    budget = selfcheck.CHECK_BUDGET
    assert selfcheck.num_check_chains(1e2) == selfcheck.MAX_CHECK_CHAINS
    for flops in np.geomspace(1e2, 1e8, 25):
        chains = selfcheck.num_check_chains(flops)
        if chains is None:
            assert cost(selfcheck.MIN_CHECK_CHAINS, flops) > budget
        else:
            assert cost(chains, flops) <= budget and chains & (chains - 1) == 0
            assert chains == selfcheck.MAX_CHECK_CHAINS or cost(2 * chains, flops) > budget
    assert selfcheck.num_check_chains(float("inf")) is None  # no cost analysis: not run
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=4)
    svi = _svi(models.linear_gaussian, guide)
    params = svi.get_params(svi.init(jax.random.key(0), y))
    monkeypatch.setattr(selfcheck, "CHECK_BUDGET", 1.0)
    report = guide.transport_check(jax.random.key(0), params, y, warn=False)
    assert report.chain_std_ratio is None and report.chain_mean_shift is None
    assert "Metropolis-adjusted chains from its draws did not run" in report.message
    assert "method='mala'" in report.message


@pytest.mark.filterwarnings("ignore:.*could not be fitted")  # the weights' k̂: all diverged
def test_annealed_draws_that_are_not_finite_are_loud():
    """Steps far beyond the integrator's stability limit: every particle diverges, and the
    importance draws, which have nothing to pick from, are reported, not returned silently."""
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=8, num_particles=4, eta_init=50.0, eta_max=100.0)
    svi = _svi(models.linear_gaussian, guide)
    params = svi.get_params(svi.init(jax.random.key(0), y))
    with pytest.warns(RuntimeWarning, match="of the 20 'importance' draws are not finite"):
        guide.sample_posterior(
            jax.random.key(1), params, y, sample_shape=(20,), method="importance"
        )


def _two_modes():
    """A mixture of two unit Gaussians at ±(2, 2), equal weights: mean 0, sds √5."""
    mix = dist.MixtureSameFamily(
        dist.Categorical(jnp.array([0.5, 0.5])),
        dist.MultivariateNormal(jnp.array([[2.0, 2.0], [-2.0, -2.0]]), jnp.eye(2)),
    )
    numpyro.sample("z", mix)


@pytest.mark.slow
def test_two_modes_the_self_check_warns_and_mala_draws_reach_both():
    """AutoDAIS's defaults put q0 (and its end points) in one mode of a 2-D mixture; the
    self-check's chains, adapted from q0, cross to the other and fail q0 with
    ``method='mala'`` as the fix, whose draws hold both modes (measured 51% and 52% on two
    seeds; tolerance ±15%, far from the 97% of q0's one mode) with the mixture's sd √5
    (±20%)."""
    guide = AutoDAIS(_two_modes)
    svi = SVI(_two_modes, guide, optax.adam(1e-2), Trace_ELBO())
    with pytest.warns(UserWarning, match=r"q0 is narrower than the posterior at z\[.\].*mala"):
        run = run_until_converged(svi, jax.random.key(0), progress_bar=False)
        guide.sample_posterior(jax.random.key(1), run.params, sample_shape=(10,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z = guide.sample_posterior(
            jax.random.key(3), run.params, sample_shape=(4000,), method="mala"
        )["z"]
    assert 0.35 < float((z[:, 0] > 0).mean()) < 0.65
    np.testing.assert_allclose(z.std(0), 5**0.5, rtol=0.2)
