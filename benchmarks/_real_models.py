"""The model zoo of ``benchmarks.real_models``: realistic posteriors with simulated or bundled data.

:func:`load` builds a :class:`RealModel` by name (:data:`NAMES`): a numpyro model, its data
(``args``, ``kwargs``: numpy float64 arrays, converted by the caller once x64 is on) and a
description.
Simulated data come from ``numpy.random.default_rng(seed)`` with the seed given in
:data:`SEEDS`; nothing here downloads anything. Priors that say "flat" are
``ImproperUniform`` (real line or positive half-line).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

#: seeds of the simulated data sets
SEEDS = {
    "regression_uncentred": 1,
    "kid_score": 2,
    "collinear": 3,
    "badly_scaled": 4,
    "hier_logistic": 5,
    "radon": 6,
    "gp_poisson": 7,
    "ar2": 8,
    "garch11": 9,
}


class RealModel(NamedTuple):
    name: str
    model: object
    args: tuple
    kwargs: dict
    description: str


def flat(shape=()):
    """An improper flat prior on the real line, event shape ``shape``."""
    return dist.ImproperUniform(constraints.real, (), shape)


def flat_positive():
    """An improper flat prior on ``(0, ∞)``."""
    return dist.ImproperUniform(constraints.positive, (), ())


# -- eight schools ----------------------------------------------------------------------------

SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools_centred(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def eight_schools_noncentred(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)


# -- linear regressions -----------------------------------------------------------------------


def regression_uncentred(x, y=None):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 1000.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 100.0))
    sigma = numpyro.sample("sigma", flat_positive())
    numpyro.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


def regression_uncentred_data(seed):
    """62 yearly values, covariate 3952, …, 4013 (uncentred), a slow trend plus noise."""
    rng = np.random.default_rng(seed)
    x = np.arange(3952.0, 4014.0)
    y = 8.5 + 0.02 * (x - x.mean()) + rng.normal(0.0, 1.1, x.shape)
    return (x,), {"y": y}


def kid_score(iq, hs, y=None):
    coef = numpyro.sample("beta", flat((4,)))
    sigma = numpyro.sample("sigma", flat_positive())
    mean = coef[0] + coef[1] * hs + coef[2] * iq + coef[3] * hs * iq
    numpyro.sample("y", dist.Normal(mean, sigma), obs=y)


def kid_score_data(seed, n=434):
    """IQ-like ``iq ~ N(100, 15)``, ``hs ~ Bernoulli(0.8)``, outcome about 85 ± 20."""
    rng = np.random.default_rng(seed)
    iq = rng.normal(100.0, 15.0, n)
    hs = (rng.random(n) < 0.8).astype(float)
    y = -11.0 + 51.0 * hs + 0.97 * iq - 0.48 * hs * iq + rng.normal(0.0, 18.0, n)
    return (iq, hs), {"y": y}


def flat_regression(X, y=None):
    intercept = numpyro.sample("intercept", flat())
    coef = numpyro.sample("beta", flat((X.shape[1],)))
    sigma = numpyro.sample("sigma", flat_positive())
    numpyro.sample("y", dist.Normal(intercept + X @ coef, sigma), obs=y)


def collinear_data(seed, n=200, d=24, factors=3):
    """Predictors from 3 factors plus 10% noise (pairwise correlations up to 0.98, median
    0.46), and a "price" around 15,000."""
    rng = np.random.default_rng(seed)
    F = rng.normal(size=(n, factors))
    X = F @ rng.normal(size=(factors, d)) + 0.1 * rng.normal(size=(n, d))
    coef = rng.normal(0.0, 300.0, d)
    y = 15_000.0 + X @ coef + rng.normal(0.0, 1000.0, n)
    return (X,), {"y": y}


def badly_scaled_data(seed, n=100):
    """Three covariates of scales 100, 200 and 400 (uncentred), noise sd 2: coefficient
    posterior sds about 1e-3."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * np.array([100.0, 200.0, 400.0]) + np.array([50.0, 300.0, 0.0])
    y = 3.0 + X @ np.array([0.01, -0.005, 0.002]) + rng.normal(0.0, 2.0, n)
    return (X,), {"y": y}


# -- hierarchical models ----------------------------------------------------------------------


HIER_GROUPS = 40


def hier_logistic(X, group, y=None, *, num_groups):
    """Non-centred varying intercepts over groups, common slopes."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
    logits = mu + sigma * a_raw[group] + X @ beta
    numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def hier_logistic_centred(X, group, y=None, *, num_groups):
    """Centred varying intercepts over groups, common slopes (the same posterior as
    :func:`hier_logistic`, written as most models are)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        a = numpyro.sample("a", dist.Normal(mu, sigma))
    numpyro.sample("y", dist.Bernoulli(logits=a[group] + X @ beta), obs=y)


def hier_logistic_data(seed, groups=HIER_GROUPS, per_group=10):
    rng = np.random.default_rng(seed)
    group = np.repeat(np.arange(groups), per_group)
    X = rng.normal(size=(group.size, 2))
    a = -0.5 + 0.8 * rng.normal(size=groups)
    logits = a[group] + X @ np.array([1.0, -0.5])
    y = (rng.random(group.size) < 1 / (1 + np.exp(-logits))).astype(float)
    return (X, group), {"y": y}


def radon(floor, county, uranium, y=None):
    """Centred varying intercepts over counties with a county-level covariate."""
    g = numpyro.sample("gamma", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    b = numpyro.sample("b_floor", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    with numpyro.plate("county", uranium.shape[0]):
        a = numpyro.sample("a", dist.Normal(g[0] + g[1] * uranium, sigma_a))
    numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y), obs=y)


def radon_data(seed, counties=30):
    """Unbalanced counties (1 to ~40 houses), log-uranium per county, a floor indicator."""
    rng = np.random.default_rng(seed)
    sizes = 1 + rng.poisson(rng.gamma(1.0, 10.0, counties))
    county = np.repeat(np.arange(counties), sizes)
    uranium = rng.normal(0.0, 0.4, counties)
    a = 1.5 + 0.7 * uranium + 0.15 * rng.normal(size=counties)
    floor = (rng.random(county.size) < 0.2).astype(float)
    y = a[county] - 0.6 * floor + rng.normal(0.0, 0.75, county.size)
    return (floor, county, uranium), {"y": y}


# -- latent GP, time series, funnel, logistic regression -------------------------------------------

GP_X = np.arange(-10.0, 11.0, 2.0)


def gp_poisson(x, k=None):
    """Non-centred latent GP ``f = L f_tilde``, squared-exponential kernel."""
    rho = numpyro.sample("rho", dist.InverseGamma(5.0, 20.0))
    alpha = numpyro.sample("alpha", dist.LogNormal(0.0, 1.0))
    f_tilde = numpyro.sample("f_tilde", dist.Normal(0.0, 1.0).expand([x.shape[0]]).to_event(1))
    d2 = (x[:, None] - x[None, :]) ** 2
    cov = alpha**2 * jnp.exp(-0.5 * d2 / rho**2) + 1e-8 * jnp.eye(x.shape[0])
    f = jnp.linalg.cholesky(cov) @ f_tilde
    numpyro.sample("k", dist.Poisson(jnp.exp(f)), obs=k)


def gp_poisson_data(seed):
    rng = np.random.default_rng(seed)
    f = 1.5 + 1.2 * np.sin(GP_X / 3.0)
    return (GP_X,), {"k": rng.poisson(np.exp(f)).astype(float)}


def ar2(y):
    c = numpyro.sample("c", dist.Normal(0.0, 10.0))
    phi = numpyro.sample("phi", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    mean = c + phi[0] * y[1:-1] + phi[1] * y[:-2]
    numpyro.sample("y", dist.Normal(mean, sigma), obs=y[2:])


def ar2_data(seed, n=200):
    rng = np.random.default_rng(seed)
    y = np.zeros(n + 50)
    for t in range(2, n + 50):
        y[t] = 0.5 + 0.6 * y[t - 1] - 0.3 * y[t - 2] + rng.normal()
    return (y[50:],), {}


def garch11(r, sigma1):
    """``σ_t² = α₀ + α₁ (r_{t-1} − μ)² + β₁ σ_{t-1}²``; α₁, β₁ ~ U(0, 1) each (``α₁ + β₁ < 1``
    not imposed)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    alpha0 = numpyro.sample("alpha0", dist.HalfNormal(1.0))
    alpha1 = numpyro.sample("alpha1", dist.Uniform(0.0, 1.0))
    beta1 = numpyro.sample("beta1", dist.Uniform(0.0, 1.0))

    def step(var, r_prev):
        var = alpha0 + alpha1 * (r_prev - mu) ** 2 + beta1 * var
        return var, var

    _, var = jax.lax.scan(step, sigma1**2, r[:-1])
    scale = jnp.sqrt(jnp.concatenate([jnp.reshape(sigma1**2, (1,)), var]))
    numpyro.sample("r", dist.Normal(mu, scale), obs=r)


def garch11_data(seed, n=200):
    rng = np.random.default_rng(seed)
    mu, a0, a1, b1 = 0.1, 0.2, 0.2, 0.7
    var = a0 / (1 - a1 - b1)
    r = np.zeros(n + 100)
    for t in range(n + 100):
        r[t] = mu + np.sqrt(var) * rng.normal()
        var = a0 + a1 * (r[t] - mu) ** 2 + b1 * var
    r = r[100:]
    return (r, np.std(r)), {}


def funnel(dim=5):
    v = numpyro.sample("v", dist.Normal(0.0, 3.0))
    numpyro.sample("x", dist.Normal(0.0, jnp.exp(v / 2)).expand([dim]).to_event(1))


BREAST_CANCER_FEATURES = (
    "mean radius",
    "mean texture",
    "mean area",
    "mean smoothness",
    "mean concave points",
)


def logistic_wide(X, y=None):
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 10.0))
    coef = numpyro.sample("beta", dist.Normal(0.0, 10.0).expand([X.shape[1]]).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=intercept + X @ coef), obs=y)


def breast_cancer_data():
    """scikit-learn's bundled breast cancer data, five raw (unstandardised) features."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    cols = [list(data.feature_names).index(f) for f in BREAST_CANCER_FEATURES]
    return (data.data[:, cols].astype(float),), {"y": data.target.astype(float)}


def _registry():
    s = SEEDS
    schools = lambda: ((SCHOOLS_SIGMA,), {"y": SCHOOLS_Y})
    return {
        "eight_schools_centred": (
            eight_schools_centred,
            schools,
            "eight schools, centred: mu ~ N(0, 5), tau ~ HalfCauchy(5), theta ~ N(mu, tau)",
        ),
        "eight_schools_noncentred": (
            eight_schools_noncentred,
            schools,
            "eight schools, non-centred: theta = mu + tau * theta_tilde",
        ),
        "regression_uncentred": (
            regression_uncentred,
            lambda: regression_uncentred_data(s["regression_uncentred"]),
            "linear regression, n = 62, covariate 3952..4013 uncentred, N(0, 1000) / "
            "N(0, 100) priors, flat sigma: intercept and slope correlated about -0.99999",
        ),
        "kid_score": (
            kid_score,
            lambda: kid_score_data(s["kid_score"]),
            "regression, n = 434: outcome ~ 85 ± 20 on IQ-like (100 ± 15), binary and their "
            "interaction, flat priors on coefficients and sigma",
        ),
        "collinear": (
            flat_regression,
            lambda: collinear_data(s["collinear"]),
            "regression of a price (~15,000) on 24 predictors from 3 factors + 10% noise, "
            "n = 200, flat priors",
        ),
        "badly_scaled": (
            flat_regression,
            lambda: badly_scaled_data(s["badly_scaled"]),
            "regression, n = 100, 3 uncentred covariates of scale 100-400, flat priors: "
            "coefficient sds ~1e-3",
        ),
        "hier_logistic": (
            functools.partial(hier_logistic, num_groups=HIER_GROUPS),
            lambda: hier_logistic_data(s["hier_logistic"]),
            f"hierarchical logistic regression, {HIER_GROUPS} groups × 10 rows, 2 covariates, "
            "non-centred varying intercepts",
        ),
        "hier_logistic_centred": (
            functools.partial(hier_logistic_centred, num_groups=HIER_GROUPS),
            lambda: hier_logistic_data(s["hier_logistic"]),
            f"hierarchical logistic regression, {HIER_GROUPS} groups × 10 rows, 2 covariates, "
            "centred varying intercepts (the data of hier_logistic)",
        ),
        "radon": (
            radon,
            lambda: radon_data(s["radon"]),
            "radon-style linear model, 30 unbalanced counties, centred varying intercepts "
            "with a county-level covariate, floor indicator",
        ),
        "gp_poisson": (
            gp_poisson,
            lambda: gp_poisson_data(s["gp_poisson"]),
            "latent GP Poisson regression, 11 inputs, SE kernel, rho ~ InvGamma(5, 20), "
            "alpha ~ LogNormal(0, 1), non-centred f",
        ),
        "ar2": (
            ar2,
            lambda: ar2_data(s["ar2"]),
            "AR(2), n = 200 simulated, conditional likelihood",
        ),
        "garch11": (
            garch11,
            lambda: garch11_data(s["garch11"]),
            "GARCH(1,1), n = 200 simulated, alpha1, beta1 ~ U(0, 1) (stationarity not imposed)",
        ),
        "funnel": (
            funnel,
            lambda: ((), {}),
            "Neal's funnel: v ~ N(0, 3), x_1..5 ~ N(0, exp(v/2))",
        ),
        "breast_cancer_raw": (
            logistic_wide,
            breast_cancer_data,
            "logistic regression, sklearn breast cancer, 5 raw (unstandardised) features, "
            "N(0, 10) priors",
        ),
    }


_REGISTRY = _registry()
#: the model names, in the order of the tables
NAMES = tuple(_REGISTRY)


def load(name):
    """The :class:`RealModel` called ``name`` (its data built now)."""
    model, data, description = _REGISTRY[name]
    args, kwargs = data()
    return RealModel(name, model, args, kwargs, description)
