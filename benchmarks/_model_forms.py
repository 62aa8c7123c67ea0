"""The hierarchical models of :mod:`benchmarks._real_models` written other ways: the same
posterior, sites and data, with the local latents sampled first, or with ``.to_event``
instead of a ``plate``. A guide's answer must not depend on how the model is written, so
these cases reuse their base model's data and NUTS reference (its coordinates in the base
model's site order).

``FORMS``: ``{"<base>:<form>": (base name, model)}``; the model takes the base's data.
"""

import functools

import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist

from benchmarks import _real_models as rm


def eight_schools_noncentred_locals_first(sigma, y=None):
    theta_tilde = numpyro.sample(
        "theta_tilde", dist.Normal(0.0, 1.0).expand([sigma.shape[0]]).to_event(1)
    )
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
    numpyro.sample("y", dist.Normal(theta, sigma).to_event(1), obs=y)


def eight_schools_noncentred_to_event(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    theta_tilde = numpyro.sample(
        "theta_tilde", dist.Normal(0.0, 1.0).expand([sigma.shape[0]]).to_event(1)
    )
    numpyro.sample("y", dist.Normal(mu + tau * theta_tilde, sigma).to_event(1), obs=y)


def eight_schools_centred_to_event(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    theta = numpyro.sample("theta", dist.Normal(mu, tau).expand([sigma.shape[0]]).to_event(1))
    numpyro.sample("y", dist.Normal(theta, sigma).to_event(1), obs=y)


def hier_logistic_locals_first(X, group, y=None, *, num_groups):
    with numpyro.plate("groups", num_groups):
        a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    logits = mu + sigma * a_raw[group] + X @ beta
    numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def hier_logistic_centred_to_event(X, group, y=None, *, num_groups):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    a = numpyro.sample("a", dist.Normal(mu, sigma).expand([num_groups]).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=a[group] + X @ beta), obs=y)


def radon_to_event(floor, county, uranium, y=None):
    g = numpyro.sample("gamma", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    b = numpyro.sample("b_floor", dist.Normal(0.0, 10.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(2.0))
    sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(2.0))
    a = numpyro.sample("a", dist.Normal(g[0] + g[1] * uranium, sigma_a).to_event(1))
    numpyro.sample("y", dist.Normal(a[county] + b * floor, sigma_y).to_event(1), obs=y)


def gp_poisson_locals_first(x, k=None):
    f_tilde = numpyro.sample("f_tilde", dist.Normal(0.0, 1.0).expand([x.shape[0]]).to_event(1))
    alpha = numpyro.sample("alpha", dist.LogNormal(0.0, 1.0))
    rho = numpyro.sample("rho", dist.InverseGamma(5.0, 20.0))
    d2 = (x[:, None] - x[None, :]) ** 2
    cov = alpha**2 * jnp.exp(-0.5 * d2 / rho**2) + 1e-8 * jnp.eye(x.shape[0])
    f = jnp.linalg.cholesky(cov) @ f_tilde
    numpyro.sample("k", dist.Poisson(jnp.exp(f)), obs=k)


FORMS = {
    "eight_schools_noncentred:locals_first": (
        "eight_schools_noncentred",
        eight_schools_noncentred_locals_first,
    ),
    "eight_schools_noncentred:to_event": (
        "eight_schools_noncentred",
        eight_schools_noncentred_to_event,
    ),
    "eight_schools_centred:to_event": ("eight_schools_centred", eight_schools_centred_to_event),
    "hier_logistic:locals_first": (
        "hier_logistic",
        functools.partial(hier_logistic_locals_first, num_groups=rm.HIER_GROUPS),
    ),
    "hier_logistic_centred:to_event": (
        "hier_logistic_centred",
        functools.partial(hier_logistic_centred_to_event, num_groups=rm.HIER_GROUPS),
    ),
    "radon:to_event": ("radon", radon_to_event),
    "gp_poisson:locals_first": ("gp_poisson", gp_poisson_locals_first),
}
