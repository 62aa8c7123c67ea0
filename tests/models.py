"""Small models with known answers, shared by the tests."""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.stats import multivariate_normal

# Eight schools (Rubin 1981): observed effects and their standard errors.
SCHOOLS_Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])

# Linear-Gaussian model z ~ N(0, I_2), y ~ N(A z, σ² I_m): correlated posterior, known log Z.
A = jnp.array([[1.0, 0.9], [0.9, 1.0], [1.0, 1.0], [0.5, 0.8]])
SIGMA = 0.5


def linear_gaussian(y):
    z = numpyro.sample("z", dist.Normal(jnp.zeros(2), 1.0).to_event(1))
    numpyro.sample("y", dist.Normal(A @ z, SIGMA).to_event(1), obs=y)


def linear_gaussian_data(seed=0):
    z = jax.random.normal(jax.random.key(seed), (2,))
    return A @ z + SIGMA * jax.random.normal(jax.random.key(seed + 1), (A.shape[0],))


def linear_gaussian_log_Z(y):
    cov = SIGMA**2 * jnp.eye(A.shape[0]) + A @ A.T
    return multivariate_normal.logpdf(y, jnp.zeros(A.shape[0]), cov)


def linear_gaussian_posterior(y):
    precision = jnp.eye(2) + A.T @ A / SIGMA**2
    cov = jnp.linalg.inv(precision)
    return cov @ A.T @ y / SIGMA**2, cov
