"""Reliability probes: inputs and models that once failed silently or deep inside JAX.

Each test is one probe of an adversarial but fair user (stiff posteriors, flat priors,
prediction on new inputs, a model whose density is NaN on part of the space, checkpoints,
foreign params, mutated options, bad arguments); it fails if the probe regresses to a
silent wrong answer or an unexplained error.
"""

import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.distributions import constraints
from numpyro.infer import SVI, Predictive, RenyiELBO, Trace_ELBO

from numpyro_dais import AutoDAIS, AutoDSMCS, AutoGPVI, AutoSurrogateLikelihoodDAIS
from numpyro_dais.annealed import setup
from numpyro_dais.bridge import numpyro_private
from numpyro_dais.engine.validation import SubsamplingNotSupportedError
from tests import models

ROOT = Path(__file__).resolve().parents[1]


def regression(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Normal(X @ w, 1.0), obs=y)


@pytest.fixture(scope="module")
def data():
    X = jax.random.normal(jax.random.key(0), (50, 2))
    return X, X @ jnp.array([1.0, -1.0]) + 0.5 * jax.random.normal(jax.random.key(1), (50,))


@pytest.fixture(scope="module")
def trained(data):
    guide = AutoDAIS(regression, K=2, num_particles=2)
    svi = SVI(regression, guide, optax.adam(1e-2), Trace_ELBO())
    return guide, svi.run(jax.random.key(0), 50, *data, progress_bar=False).params


# -- stiffness ------------------------------------------------------------------------------


def stiff_data():
    """One unscaled covariate (x·15, n = 1000): the posterior sd of ``w`` is 0.0021, ~50×
    narrower than q0 at the start (``init_scale=0.1``)."""
    x = 15 * jax.random.normal(jax.random.key(0), (1000, 1))
    y = x[:, 0] + jax.random.normal(jax.random.key(1), (1000,))
    precision = 1.0 + jnp.sum(x**2)
    return x, y, jnp.sum(x[:, 0] * y) / precision, precision**-0.5


@pytest.mark.parametrize("Guide, tol", [(AutoDAIS, 0.2), (AutoDSMCS, 0.1)])
def test_stiff_regression_trains_to_the_exact_posterior(Guide, tol):
    """Default arguments: q0 starts at the Laplace fit of the set-up curvature and Adam moves
    its location in the posterior's own units, so the fit is as precise as on a well-scaled
    posterior (without them: 1.3-1.9 sd off in the mean, q0's std 11-17× too wide, silently).
    Tolerances: AutoDSMCS draws end points (0.03-0.05 sd measured over seeds 0-2); AutoDAIS
    draws q0, whose location is an Adam iterate (0.01-0.10 sd measured with this decaying
    learning rate; 0.2-0.3 sd with a constant 1e-2, as on a well-scaled posterior); the
    2000 draws add ~0.02 sd."""
    x, y, mean, sd = stiff_data()
    guide = Guide(regression)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        optim = optax.adam(optax.exponential_decay(1e-2, 300, 0.1))
        params = (
            SVI(regression, guide, optim, Trace_ELBO())
            .run(jax.random.key(0), 300, x, y, progress_bar=False)
            .params
        )
    w = guide.sample_posterior(jax.random.key(1), params, x, y, sample_shape=(2000,))["w"][:, 0]
    assert abs(float(jnp.mean(w)) - mean) < tol * sd
    assert 0.8 < float(jnp.std(w)) / sd < 1.25


@pytest.mark.parametrize("how", ["too large", "laplace_init=False"])
def test_stiff_posterior_without_the_laplace_start_is_reported(how, monkeypatch):
    """Above ``MAX_DENSE_DIM`` latent dimensions the set-up forms no Hessian, and with
    ``laplace_init=False`` q0 starts exactly at ``init_loc_fn`` with ``init_scale``: a stiff
    posterior is then loud at set-up, with the measured curvature and the fix."""
    if how == "too large":
        monkeypatch.setattr(setup, "MAX_DENSE_DIM", 0)
    x, y, _, _ = stiff_data()
    guide = AutoDAIS(regression, laplace_init=how != "laplace_init=False", init_scale=0.3)
    svi = SVI(regression, guide, optax.adam(1e-2), Trace_ELBO())
    with pytest.warns(UserWarning, match=r"stiff.*λ ≈ 2\.\d+e\+05.*standardise the covariates"):
        params = svi.get_params(svi.init(jax.random.key(0), x, y))
    assert guide.curvature > 1e5
    np.testing.assert_array_equal(params["auto_z_0_loc"], guide._init_point)
    np.testing.assert_allclose(params["auto_z_0_scale"], 0.3, rtol=1e-6)


def logistic(X, y=None, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=subsample_size):
        X, y = numpyro.subsample(X, event_dim=1), numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


@pytest.mark.parametrize("Guide", [AutoDAIS, AutoSurrogateLikelihoodDAIS])
def test_laplace_start_is_the_mode_from_a_saturated_initial_point(Guide):
    """``init_to_uniform`` draws ``w`` in (−2, 2)⁴; with covariates of sd 3 most logits are
    then ±10 or beyond, where the likelihood saturates and its Hessian is far smaller than
    at the mode: one Newton step from there (the former start) left q0 ~10 posterior sd
    off, which Adam, moving q0 in posterior units, took thousands of steps to cross. The
    start is the mode (BFGS on the log joint, an independent optimiser), to 0.1 sd.
    SL-DAIS's start is the full-data mode too, not its surrogate's: the mode of a surrogate
    on 100 of the 2,000 rows lies ~sqrt(20) posterior sd from it."""
    rng = np.random.default_rng(0)
    X = jnp.asarray(3.0 * rng.normal(size=(2000, 4)), jnp.float32)
    y = jnp.asarray(
        rng.uniform(size=2000) < 1 / (1 + np.exp(-np.asarray(X) @ [0.5, -0.3, 0.2, 0.1])),
        jnp.float32,
    )
    if Guide is AutoDAIS:
        model, guide = logistic, AutoDAIS(logistic)
    else:
        model = partial(logistic, subsample_size=100)
        guide = AutoSurrogateLikelihoodDAIS(model, num_surrogate=100)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), X, y))
    log_joint = lambda w: numpyro.infer.util.log_density(logistic, (X, y), {}, {"w": w})[0]
    mode = jax.scipy.optimize.minimize(lambda w: -log_joint(w), jnp.zeros(4), method="BFGS").x
    sd = jnp.sqrt(jnp.diag(jnp.linalg.inv(-jax.hessian(log_joint)(mode))))
    assert jnp.all(jnp.abs(guide.get_posterior(params).mean - mode) < 0.1 * sd)


def test_well_scaled_posterior_is_not_reported(data):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        guide = AutoDAIS(regression)
        SVI(regression, guide, optax.adam(1e-2), Trace_ELBO()).init(jax.random.key(0), *data)


# -- models and prediction -------------------------------------------------------------------


def test_flat_prior_fits():
    """``ImproperUniform`` (Stan's unbounded flat prior): the posterior of μ is N(ȳ, 1/n)."""

    def flat(y):
        mu = numpyro.sample("mu", dist.ImproperUniform(constraints.real, (), ()))
        with numpyro.plate("N", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = 3.0 + jax.random.normal(jax.random.key(2), (100,))
    guide = AutoDAIS(flat, K=2, num_particles=4)
    svi = SVI(flat, guide, optax.adam(3e-2), Trace_ELBO())
    params = svi.run(jax.random.key(0), 600, y, progress_bar=False).params
    draws = guide.sample_posterior(jax.random.key(1), params, sample_shape=(2000,))["mu"]
    # posterior sd 0.1; 0.05 allows Adam's jitter at lr 3e-2 plus Monte Carlo error
    np.testing.assert_allclose(draws.mean(), y.mean(), atol=0.05)


@pytest.mark.parametrize("method", ["q0", "importance", "dais"])
def test_predictive_on_new_inputs(data, trained, method):
    """q0 needs no data; the annealed methods need the observations and say so."""
    X, y = data
    _, params = trained  # the same K and N: the parameters fit any posterior_method
    guide = AutoDAIS(regression, K=2, num_particles=2, posterior_method=method)
    SVI(regression, guide, optax.adam(1e-2), Trace_ELBO()).init(jax.random.key(0), X, y)
    predictive = Predictive(regression, guide=guide, params=params, num_samples=10)
    assert predictive(jax.random.key(1), X, y)["y"].shape == (10, 50)
    if method == "q0":
        assert predictive(jax.random.key(1), X[:5])["y"].shape == (10, 5)
    else:
        with pytest.raises(ValueError, match=r"unobserved.*posterior_method='q0'"):
            predictive(jax.random.key(1), X[:5])


def test_gpvi_steers_out_of_a_nan_region():
    """ℓ is NaN on the half-plane z₀ > 1 (16 % of the prior's mass). Before the fix 94–100 %
    of the draws ended there with NaN losses; now particles there follow the score of the
    Gaussian fitted to the finite ones, so the losses stay finite and the draws return."""

    def model():
        z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        numpyro.factor("f", jnp.where(z[0] > 1.0, jnp.nan, 0.0))

    guide = AutoGPVI(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = SVI(model, guide, optax.adam(1e-2), Trace_ELBO()).run(
            jax.random.key(0), 300, progress_bar=False
        )
        jax.block_until_ready(result)  # the warnings come as the steps run
    assert np.all(np.isfinite(result.losses))
    draws = guide.sample_posterior(jax.random.key(1), result.params, sample_shape=(2000,))["z"]
    # the generator is smooth, so some mass stays past the edge: 0.12 measured, 0.25 bound
    assert float(jnp.mean(draws[:, 0] > 1.0)) < 0.25
    messages = [str(w.message) for w in caught if "non-finite log joint" in str(w.message)]
    assert 1 <= len(messages) <= 3  # reported at the 1st, 10th, 100th such step, not each
    # the count is the guide's own: a fresh guide reports its own first such step
    with pytest.warns(RuntimeWarning, match="non-finite log joint"):
        fresh = SVI(model, AutoGPVI(model), optax.adam(1e-2), Trace_ELBO())
        jax.block_until_ready(fresh.run(jax.random.key(0), 3, progress_bar=False))


# -- state and params --------------------------------------------------------------------------

RELOAD_SCRIPT = textwrap.dedent(
    """
    import pickle, sys
    import jax
    sys.path.insert(0, {tests!r})
    from test_reliability import sl_problem
    model, guide, svi, data = sl_problem()
    with open({path!r}, "rb") as f:
        state = pickle.load(f)
    svi.init(jax.random.key(123), *data)  # another set-up key than the first process
    update = jax.jit(svi.update)
    for _ in range(20):
        state, _ = update(state, *data)
    with open({path!r}, "wb") as f:
        pickle.dump(jax.device_get(svi.get_params(state)), f)
    """
)


def sl_problem():
    """A subsampled logistic regression with an RAND surrogate, and its SVI."""
    X = jax.random.normal(jax.random.key(3), (400, 3))
    y = (X @ jnp.array([1.0, -2.0, 0.5]) > 0).astype(jnp.float32)

    def model(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with numpyro.plate("N", X.shape[0], subsample_size=32) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])

    # explicit step bounds: the default ones come from the curvature at the initial point,
    # which init_to_uniform draws with the set-up key (see the README on checkpoints)
    guide = AutoSurrogateLikelihoodDAIS(model, K=2, num_surrogate=16, eta_init=0.01, eta_max=0.1)
    return model, guide, SVI(model, guide, optax.adam(1e-2), Trace_ELBO()), (X, y)


def test_sldais_checkpoint_resumes_exactly_in_a_fresh_process(tmp_path):
    """Everything the trained guide needs is in ``params``: 20 + 20 steps with a reload into
    a new process (set up with another key) equal 40 uninterrupted steps, bit for bit."""
    model, guide, svi, data = sl_problem()
    state = svi.init(jax.random.key(0), *data)
    update = jax.jit(svi.update)
    for _ in range(20):
        state, _ = update(state, *data)
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps(jax.device_get(state)))
    for _ in range(20):
        state, _ = update(state, *data)
    script = RELOAD_SCRIPT.format(tests=str(ROOT / "tests"), path=str(path))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = pickle.loads(path.read_bytes())
    for name, value in svi.get_params(state).items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_foreign_or_empty_params_are_a_key_error(trained, data):
    guide, _ = trained
    with pytest.raises(KeyError, match=r"params lack.*auto_z_0_loc"):
        guide.sample_posterior(jax.random.key(0), {})
    gpvi = AutoGPVI(regression)
    params = (
        SVI(regression, gpvi, optax.adam(1e-3), Trace_ELBO())
        .run(jax.random.key(0), 2, *data, progress_bar=False)
        .params
    )
    with pytest.raises(KeyError, match="params lack"):
        guide.sample_posterior(jax.random.key(0), params)


def test_mis_shaped_params_are_a_value_error_on_every_call(trained, data):
    """The expected shapes are traced once per guide and cached: a call after a good one
    still refuses params of another shape (here a K = 5 schedule for a K = 2 guide), for
    the annealed guides' parameters and for GPVI's generator."""
    guide, params = trained
    guide.median(params)
    guide.median(params)  # the second call reads the cached shapes
    wrong = {**params, "auto_beta_increments": jnp.ones(5)}
    with pytest.raises(ValueError, match=r"wrong shapes.*auto_beta_increments.*\(5,\), \(2,\)"):
        guide.median(wrong)
    gpvi = AutoGPVI(regression)
    gpvi_params = (
        SVI(regression, gpvi, optax.adam(1e-3), Trace_ELBO())
        .run(jax.random.key(0), 2, *data, progress_bar=False)
        .params
    )
    gpvi.median(gpvi_params)
    name = next(k for k in gpvi_params if k.startswith("auto_generator"))
    bad = {**gpvi_params, name: jnp.zeros(gpvi_params[name].shape + (1,))}
    with pytest.raises(ValueError, match=f"wrong shapes.*{name}"):
        gpvi.median(bad)


def test_options_are_fixed_after_construction(trained):
    guide, _ = trained
    with pytest.raises(AttributeError, match=r"`kernel`.*fixed at construction.*kernel=\.\.\."):
        guide.kernel = "langevin"


def test_posterior_before_set_up_says_how():
    guide = AutoDAIS(regression)
    with pytest.raises(RuntimeError, match=r"not set up yet.*svi\.init"):
        guide.sample_posterior(jax.random.key(0), {})
    with pytest.raises(RuntimeError, match="not set up yet"):
        guide.quantiles({}, [0.5])


# -- bad arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(eta_max=float("inf")), ValueError, "`eta_max` must be a finite positive"),
        (dict(eta_init=-0.1), ValueError, "`eta_init`"),
        (dict(K=0), ValueError, "`K` must be an integer >= 1"),
        (dict(K=2.5), TypeError, "`K`"),
        (dict(num_particles=0), ValueError, "`num_particles`"),
        (dict(init_scale=0.0), ValueError, "`init_scale`"),
        (dict(laplace_init="yes"), TypeError, "`laplace_init` must be True or False"),
        (dict(kernel="nuts"), ValueError, "`kernel`"),
    ],
)
def test_bad_constructor_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        AutoDAIS(regression, **kwargs)


def test_numpy_integers_are_integers():
    guide = AutoDAIS(regression, K=np.int64(3), num_particles=np.int32(2))
    assert guide.K == 3 and guide.num_particles == 2


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda g, p, d: g.quantiles(p, [0.0, 1.5]), ValueError, "`quantiles` must lie"),
        (
            lambda g, p, d: g.sample_posterior(jax.random.key(0), p, sample_shape=(-1,)),
            ValueError,
            "`sample_shape`",
        ),
        (
            lambda g, p, d: g.sample_posterior(jax.random.key(0), p, sample_shape="abc"),
            ValueError,
            "`sample_shape`",
        ),
        (
            lambda g, p, d: g.sample_posterior(
                jax.random.key(0), p, *d, sample_shape=(4,), method="dais", batch_size=0
            ),
            ValueError,
            "`batch_size` must be an integer >= 1",
        ),
        (
            lambda g, p, d: g.sample_posterior(jax.random.key(0), p, method="nuts"),
            ValueError,
            "`method`",
        ),
    ],
)
def test_bad_call_arguments_name_themselves(trained, data, call, error, match):
    guide, params = trained
    with pytest.raises(error, match=match):
        call(guide, params, data)


def test_gpvi_refuses_an_objective_that_would_reweight_its_surrogate(data):
    guide = AutoGPVI(regression)
    svi = SVI(regression, guide, optax.adam(1e-3), RenyiELBO())
    with pytest.raises(ValueError, match=r"Trace_ELBO.*got RenyiELBO"):
        svi.run(jax.random.key(0), 2, *data, progress_bar=False)


# -- numpyro's own test_subsample (test/infer/test_autoguide.py), our guides substituted ------


def _upstream_subsample(guide_cls):
    def model(n, x):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1))
        with numpyro.plate("n", n, subsample_size=x.size):
            numpyro.sample("x", dist.Normal(mu, sigma), obs=x)

    x = 5 + jax.random.normal(jax.random.key(1), (20,))
    svi = SVI(model, guide_cls(model), optax.adam(0.1), Trace_ELBO(), n=20)
    state = svi.init(jax.random.key(2), x=x)  # full data: the plate does not subsample
    return svi.update(state, x=x[:10])  # now it subsamples 10 of 20


@pytest.mark.parametrize(
    "guide_cls, match",
    [
        (AutoDAIS, r"needs the full data.*'n' subsamples 10 of 20.*AutoSurrogateLikelihoodDAIS"),
        (AutoDSMCS, r"needs the full data.*'n' subsamples 10 of 20"),
        (AutoSurrogateLikelihoodDAIS, r"fixed its subsample plates at set-up.*\(20, 10\)"),
    ],
)
def test_upstream_subsample_case_is_a_clear_error(guide_cls, match):
    """Initialised on the full data, then updated on a subset: numpyro's mean-field guides
    accept it; ours need the full data (DAIS, DSMCS) or a fixed mini-batch size (SL-DAIS),
    and say so instead of an UnexpectedTracerError from inside the sampler."""
    with pytest.raises(ValueError, match=match):
        _upstream_subsample(guide_cls)


def test_upstream_autodais_subsampling_error():
    """numpyro's own ``test_autodais_subsampling_error`` (test/infer/test_autoguide.py), our
    AutoDAIS substituted: a plate that subsamples at set-up is a ``NotImplementedError``
    matching "data subsampling", as numpyro's guide raises, and also a ``ValueError``, as
    our other refusals are."""
    data = jnp.array([1.0] * 8 + [0.0] * 2)

    def model(data):
        f = numpyro.sample("beta", dist.Beta(1, 1))
        with numpyro.plate("plate", 20, 10, dim=-1):
            numpyro.sample("obs", dist.Bernoulli(f), obs=data)

    svi = SVI(model, AutoDAIS(model), optax.adam(0.01), Trace_ELBO())
    with pytest.raises(NotImplementedError, match=".*data subsampling.*") as info:
        svi.init(jax.random.key(1), data)
    assert isinstance(info.value, SubsamplingNotSupportedError)
    assert "AutoSurrogateLikelihoodDAIS" in str(info.value)
    with pytest.raises(ValueError, match="needs the full data set"):
        raise info.value


def test_upstream_subsample_case_trains_gpvi():
    """AutoGPVI's gradient is a mini-batch estimate like AutoNormal's: the case just works."""
    _, loss = _upstream_subsample(AutoGPVI)
    assert np.isfinite(loss)


# -- eager calls compile one program ------------------------------------------------------


@pytest.mark.parametrize("guide_cls", [AutoDAIS, AutoGPVI])
def test_eager_loss_equals_the_jitted_loss(guide_cls):
    """A loss evaluated outside ``jit`` runs the guide's bound as one compiled program,
    with its own seed for the keys the model's plate asks numpyro for: the same value as the
    jitted loss, to float32 round-off, and the model's plate draws no key from outside that
    program."""

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = 1.0 + jax.random.normal(jax.random.key(0), (20,))
    guide = guide_cls(model, num_particles=2)
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(1), y))
    loss = lambda p, key: Trace_ELBO().loss(key, p, model, guide, y)
    for seed in range(2):
        key = jax.random.key(seed)
        np.testing.assert_allclose(loss(params, key), jax.jit(loss)(params, key), rtol=1e-5)


def test_set_up_finds_numpyros_initial_point_in_one_program():
    """numpyro's set-up (``initialize_model``) with its initial-point search under ``jit``
    (:func:`~numpyro_dais.bridge.numpyro_private.compiled_initialization`) finds the initial point
    in one compiled program: the same values, in the model's site order (the flat latent's layout),
    as its search outside ``jit``, which compiles each operation of the log density and its gradient
    on its own. Shapes of this test only, so that no program of another test is reused; the compiled
    search runs first, so the eager one reuses the model's forward operations and the count compares
    the gradients' programs alone."""
    from jax import monitoring
    from numpyro.infer.autoguide import AutoNormal

    X = jax.random.normal(jax.random.key(0), (37, 13))
    y = (X[:, 0] > 0).astype(jnp.float32)

    def model(X, y):
        b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([13]).to_event(1))
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        a = numpyro.sample("a", dist.Normal(0.0, s))
        numpyro.sample("y", dist.Bernoulli(logits=a + X @ b), obs=y)

    found, lowered = [], []
    listener = lambda event, *_, **__: lowered.append("mlir_module" in event)
    monitoring.register_event_duration_secs_listener(listener)
    try:
        for compiled in (True, False):
            lowered.clear()
            guide = AutoNormal(model)
            with numpyro.handlers.seed(rng_seed=3):
                if compiled:
                    with numpyro_private.compiled_initialization():
                        guide._setup_prototype(X, y)
                else:
                    guide._setup_prototype(X, y)
            found.append((guide._init_locs, sum(lowered)))
    finally:
        monitoring.unregister_event_duration_listener(listener)
    (one, n_one), (eager, n_eager) = found
    assert list(one) == list(eager) == ["b", "s", "a"]
    jax.tree.map(np.testing.assert_array_equal, one, eager)
    assert n_one < n_eager / 2, (n_one, n_eager)


def test_svi_init_is_recognised():
    """Inside ``SVI.init`` the guides skip their bound (only parameters and a latent value
    are kept there); if numpyro renames ``SVI.init`` this fails, instead of every set-up
    silently compiling a bound it does not use."""
    seen = []

    def model():
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    def guide():
        seen.append(numpyro_private.in_svi_init())
        numpyro.sample("x", dist.Normal(numpyro.param("loc", 0.0), 1.0))

    svi = SVI(model, guide, optax.adam(0.1), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0)))
    Trace_ELBO().loss(jax.random.key(1), params, model, guide)
    assert seen == [True, False]


def test_repeated_calls_reuse_their_compiled_programs():
    """Each posterior method compiles once per guide: a second call with new keys (and new
    parameter values) traces, lowers and compiles nothing, where a program rebuilt per call
    would do all three again (seconds each on CPU). Tracing is what gives a rebuild away:
    the suite's compilation cache would serve the compile itself."""
    from jax import monitoring

    y = models.linear_gaussian_data()
    guide = AutoDSMCS(models.linear_gaussian, K=2, num_particles=4)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), y))
    calls = [
        lambda p, k: guide.sample_posterior(k, p, y, sample_shape=(3,)),
        lambda p, k: guide.log_evidence(k, p, y, num_particles=8),
        lambda p, k: guide.diagnostics(k, p, y, num_systems=2),
        lambda p, k: guide.transport_check(k, p, y, num_samples=8, warn=False).ok,
    ]
    moved = jax.tree.map(lambda x: x * 1.01, params)
    compiles = []
    listener = lambda event, *_, **__: compiles.append(event)
    for i, call in enumerate(calls):
        jax.block_until_ready(call(params, jax.random.key(1)))
        compiles.clear()
        monitoring.register_event_duration_secs_listener(listener)
        try:
            jax.block_until_ready(call(moved, jax.random.key(2)))
        finally:
            monitoring.unregister_event_duration_listener(listener)
        rebuilt = {"/jax/core/compile/jaxpr_trace_duration"} | {
            f"/jax/core/compile/{stage}_duration"
            for stage in ("jaxpr_to_mlir_module", "backend_compile")
        }
        assert not rebuilt & set(compiles), (i, compiles)
