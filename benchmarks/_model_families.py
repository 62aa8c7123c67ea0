"""Models of the families that ``real_models`` leaves out, on simulated data: constrained
latents (ordered vectors, simplexes, LKJ Cholesky factors), marginalised discrete latents
(mixtures, a hidden Markov model), count, ordinal, categorical and censored likelihoods,
item response, separation and a latent time series. Each builder returns ``(model, args,
description)``; the data come from the builder's own seed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions.transforms import OrderedTransform


def _ordered(scale, size):
    """An ordered vector: ``size`` N(0, scale) draws, sorted (Stan's ``ordered``)."""
    return dist.TransformedDistribution(dist.Normal(0, scale).expand([size]), OrderedTransform())


def gauss_mix(seed=0):
    y = np.random.default_rng(seed).normal([-1.5] * 120 + [2.0] * 80, 1.0)

    def model(y):
        mu = numpyro.sample("mu", _ordered(2.0, 2))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2).expand([2]).to_event(1))
        theta = numpyro.sample("theta", dist.Beta(5, 5))
        log_w = jnp.log(jnp.stack([theta, 1 - theta]))
        lp = log_w[:, None] + dist.Normal(mu[:, None], sigma[:, None]).log_prob(y)
        numpyro.factor("y", jax.scipy.special.logsumexp(lp, 0).sum())

    return model, (jnp.asarray(y),), "two-component normal mixture, ordered means, n = 200"


def dirichlet_mix(seed=1):
    y = np.random.default_rng(seed).normal([-3.0] * 60 + [0.0] * 80 + [3.0] * 60, 1.0)

    def model(y):
        w = numpyro.sample("w", dist.Dirichlet(jnp.ones(3)))
        mu = numpyro.sample("mu", _ordered(5.0, 3))
        lp = jnp.log(w)[:, None] + dist.Normal(mu[:, None], 1.0).log_prob(y)
        numpyro.factor("y", jax.scipy.special.logsumexp(lp, 0).sum())

    return model, (jnp.asarray(y),), "three-component mixture, simplex weights, ordered means"


def lkj(seed=2):
    sd = np.array([1.0, 2.0, 0.5])
    corr = np.array([[1, 0.6, -0.3], [0.6, 1, 0.2], [-0.3, 0.2, 1]])
    y = np.random.default_rng(seed).multivariate_normal([1, -1, 0], corr * np.outer(sd, sd), 100)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0, 5).expand([3]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5).expand([3]).to_event(1))
        L = numpyro.sample("L", dist.LKJCholesky(3, 2.0))
        with numpyro.plate("n", y.shape[0]):
            numpyro.sample("y", dist.MultivariateNormal(mu, scale_tril=sigma[:, None] * L), obs=y)

    return model, (jnp.asarray(y),), "trivariate normal, LKJ(2) Cholesky factor, n = 100"


def irt2pl(seed=3, items=20, persons=100):
    rng = np.random.default_rng(seed)
    ability, a, b = (
        rng.normal(size=persons),
        np.exp(rng.normal(0, 0.4, items)),
        rng.normal(size=items),
    )
    y = rng.random((persons, items)) < 1 / (1 + np.exp(-a * (ability[:, None] - b)))

    def model(y):
        sigma_b = numpyro.sample("sigma_b", dist.HalfCauchy(2.0))
        a = numpyro.sample("a", dist.LogNormal(0, 0.5).expand([items]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0, sigma_b).expand([items]).to_event(1))
        theta = numpyro.sample("theta", dist.Normal(0, 1).expand([persons]).to_event(1))
        logits = a * (theta[:, None] - b)
        numpyro.sample("y", dist.Bernoulli(logits=logits).to_event(2), obs=y)

    return model, (jnp.asarray(y, jnp.float32),), "2PL item response, 20 items × 100 persons"


def student_t(seed=4, n=100):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 1 + 2 * x + rng.standard_t(3, n)

    def model(x, y):
        a = numpyro.sample("a", dist.Normal(0, 10))
        b = numpyro.sample("b", dist.Normal(0, 10))
        s = numpyro.sample("s", dist.HalfNormal(5))
        nu = numpyro.sample("nu", dist.Gamma(2, 0.1))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.StudentT(nu, a + b * x, s), obs=y)

    return model, (jnp.asarray(x), jnp.asarray(y)), "robust regression, Student-t with unknown nu"


def negbin(seed=5, n=200):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    mean = np.exp(1 + x @ [0.5, -0.3])
    y = rng.negative_binomial(3, 3 / (3 + mean))

    def model(x, y):
        beta = numpyro.sample("beta", dist.Normal(0, 5).expand([2]).to_event(1))
        a = numpyro.sample("a", dist.Normal(0, 5))
        phi = numpyro.sample("phi", dist.Exponential(0.1))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + x @ beta), phi), obs=y)

    return model, (jnp.asarray(x), jnp.asarray(y)), "negative-binomial regression, log link"


def ordinal(seed=6, n=200):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    latent = x @ [1.0, -0.5] + rng.logistic(size=n)
    y = (latent[:, None] > np.array([-1.0, 0.5, 2.0])).sum(1)

    def model(x, y):
        beta = numpyro.sample("beta", dist.Normal(0, 5).expand([2]).to_event(1))
        c = numpyro.sample("c", _ordered(5.0, 3))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.OrderedLogistic(x @ beta, c), obs=y)

    return model, (jnp.asarray(x), jnp.asarray(y)), "ordinal logistic, 4 levels, ordered cutpoints"


def flat_uncentred(seed=7, n=50):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) * [1, 10, 100] + [0, 50, 0]
    y = x @ [1, 0.1, 0.01] + 3 + rng.normal(size=n)

    def model(x, y):
        beta = numpyro.sample("beta", dist.ImproperUniform(dist.constraints.real, (), (3,)))
        a = numpyro.sample("a", dist.ImproperUniform(dist.constraints.real, (), ()))
        s = numpyro.sample("s", dist.ImproperUniform(dist.constraints.positive, (), ()))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.Normal(a + x @ beta, s), obs=y)

    description = "regression, improper flat priors (Stan's default), covariates of scale 1-100"
    return model, (jnp.asarray(x), jnp.asarray(y)), description


def poisson_exposure(seed=8, n=150):
    rng = np.random.default_rng(seed)
    x, exposure = rng.normal(size=n), rng.uniform(1, 100, n)
    y = rng.poisson(exposure * np.exp(-2 + 0.4 * x))

    def model(x, exposure, y):
        a = numpyro.sample("a", dist.Normal(0, 5))
        b = numpyro.sample("b", dist.Normal(0, 5))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.Poisson(exposure * jnp.exp(a + b * x)), obs=y)

    args = (jnp.asarray(x), jnp.asarray(exposure), jnp.asarray(y))
    return model, args, "Poisson regression with an exposure offset"


def hmm(seed=9, T=150):
    rng = np.random.default_rng(seed)
    transition = np.array([[0.9, 0.1], [0.2, 0.8]])
    states = [0]
    for _ in range(T - 1):
        states.append(rng.choice(2, p=transition[states[-1]]))
    y = np.array([-1.0, 1.5])[states] + 0.7 * rng.normal(size=T)

    def model(y):
        p = numpyro.sample("p", dist.Dirichlet(jnp.ones(2)).expand([2]).to_event(1))
        mu = numpyro.sample("mu", _ordered(3.0, 2))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2))
        emission = dist.Normal(mu, sigma).log_prob(y[:, None])  # (T, 2)

        def forward(alpha, log_e):
            alpha = jax.scipy.special.logsumexp(alpha[:, None] + jnp.log(p), 0) + log_e
            return alpha, None

        alpha, _ = jax.lax.scan(forward, jnp.log(0.5) + emission[0], emission[1:])
        numpyro.factor("y", jax.scipy.special.logsumexp(alpha))

    description = "two-state Gaussian hidden Markov model, states summed out (forward algorithm)"
    return model, (jnp.asarray(y),), description


def softmax_regression(seed=10, n=150, d=3, k=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    weights = np.concatenate([np.zeros((d, 1)), rng.normal(size=(d, k - 1))], 1)
    p = np.exp(x @ weights)
    y = np.array([rng.choice(k, p=row / row.sum()) for row in p])

    def model(x, y):
        b = numpyro.sample("b", dist.Normal(0, 5).expand([k - 1]).to_event(1))
        W = numpyro.sample("W", dist.Normal(0, 5).expand([d, k - 1]).to_event(2))
        logits = jnp.concatenate([jnp.zeros((n, 1)), b + x @ W], 1)
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.Categorical(logits=logits), obs=y)

    return model, (jnp.asarray(x), jnp.asarray(y)), "multinomial logit, 3 classes"


def weibull_censored(seed=11, n=100):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    t = rng.weibull(1.5, n) * np.exp(0.5 + 0.3 * x)
    censored, t = t > 2.0, np.minimum(t, 2.0)

    def model(x, t, censored):
        a = numpyro.sample("a", dist.Normal(0, 5))
        b = numpyro.sample("b", dist.Normal(0, 5))
        k = numpyro.sample("k", dist.Gamma(2, 1))
        scale = jnp.exp(a + b * x)
        survival = -((t / scale) ** k)  # log P(T > t)
        numpyro.factor("t", jnp.where(censored, survival, dist.Weibull(scale, k).log_prob(t)).sum())

    args = (jnp.asarray(x), jnp.asarray(t), jnp.asarray(censored))
    return model, args, "Weibull survival regression, right-censored at t = 2"


def separation(seed=12, n=40):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = (x + 0.3 * rng.normal(size=n) > 0).astype(float)

    def model(x, y):
        a = numpyro.sample("a", dist.Normal(0, 10))
        b = numpyro.sample("b", dist.Normal(0, 10))
        with numpyro.plate("n", n):
            numpyro.sample("y", dist.Bernoulli(logits=a + b * x), obs=y)

    return (
        model,
        (jnp.asarray(x), jnp.asarray(y)),
        "logistic regression, nearly separated, N(0, 10)",
    )


def stochastic_volatility(seed=13, T=100):
    rng = np.random.default_rng(seed)
    h = np.zeros(T)
    h[0] = 0.3 / np.sqrt(1 - 0.81) * rng.normal()
    for t in range(1, T):
        h[t] = 0.9 * h[t - 1] + 0.3 * rng.normal()
    y = np.exp(h / 2) * rng.normal(size=T)

    def model(y):
        mu = numpyro.sample("mu", dist.Cauchy(0, 10))
        phi = numpyro.sample("phi", dist.Uniform(-1, 1))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(5))
        h_std = numpyro.sample("h_std", dist.Normal(0, 1).expand([T]).to_event(1))

        def step(prev, e):
            h = mu + phi * (prev - mu) + sigma * e
            return h, h

        h0 = mu + sigma * h_std[0] / jnp.sqrt(1 - phi**2)
        h = jnp.concatenate([h0[None], jax.lax.scan(step, h0, h_std[1:])[1]])
        numpyro.sample("y", dist.Normal(0, jnp.exp(h / 2)).to_event(1), obs=y)

    description = "stochastic volatility, non-centred, Cauchy / HalfCauchy priors, T = 100"
    return model, (jnp.asarray(y),), description


MODELS = {
    f.__name__: f
    for f in (
        gauss_mix,
        dirichlet_mix,
        lkj,
        irt2pl,
        student_t,
        negbin,
        ordinal,
        flat_uncentred,
        poisson_exposure,
        hmm,
        softmax_regression,
        weibull_censored,
        separation,
        stochastic_volatility,
    )
}
