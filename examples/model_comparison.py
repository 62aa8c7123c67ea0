"""Compare two models by their evidence, with error bars: ``log_evidence`` and its ``se``.

Data from a linear regression with a slope; model "slope" has one, model "mean" has only an
intercept. Both are conjugate, so the exact ``log p(y)`` of each is known and printed next to
the estimates. Run it with ``python examples/model_comparison.py [--steps N]``.
"""

import argparse

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from jax.scipy.stats import multivariate_normal
from numpyro.infer import SVI, Trace_ELBO

from numpyro_dais import AutoDAIS

NOISE = 0.5  # known observation noise; the priors on intercept and slope are N(0, 1)


def slope_model(x, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(a + b * x, NOISE), obs=y)


def mean_model(x, y=None):
    a = numpyro.sample("a", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(a, NOISE), obs=y)


def exact_log_Z(design, y):
    """``log p(y)`` of ``y ~ N(design @ w, NOISE² I)``, ``w ~ N(0, I)``: ``y`` is Gaussian."""
    cov = NOISE**2 * jnp.eye(y.shape[0]) + design @ design.T
    return float(multivariate_normal.logpdf(y, jnp.zeros(y.shape[0]), cov))


def log_evidence(model, x, y, steps, seed=0):
    """Train an AutoDAIS on ``model`` and estimate its ``log p(y)``: ``(log_Z, ess, se)``."""
    guide = AutoDAIS(model, K=8, num_particles=8)
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    result = svi.run(jax.random.key(seed), steps, x, y, progress_bar=False)
    return guide.log_evidence(jax.random.key(seed + 1), result.params, x, y, num_particles=4000)


def main(steps=1500, num_data=30):
    key_x, key_y = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (num_data,))
    y = 0.3 + 0.15 * x + NOISE * jax.random.normal(key_y, (num_data,))
    designs = {
        "slope": jnp.stack([jnp.ones_like(x), x], axis=1),
        "mean": jnp.ones((num_data, 1)),
    }
    results = {}
    for name, model in (("slope", slope_model), ("mean", mean_model)):
        ev = log_evidence(model, x, y, steps)
        exact = exact_log_Z(designs[name], y)
        results[name] = (ev, exact)
        print(
            f"{name:>5}: log Z = {float(ev.log_Z):8.3f} ± {float(ev.se):.3f} "
            f"(ESS {float(ev.ess):6.0f} of 4000; exact {exact:8.3f})"
        )
    (ev1, exact1), (ev2, exact2) = results["slope"], results["mean"]
    diff = float(ev1.log_Z - ev2.log_Z)
    se = float(jnp.sqrt(ev1.se**2 + ev2.se**2))  # independent estimates
    print(
        f"log Bayes factor, slope vs mean: {diff:.3f} ± {se:.3f} "
        f"(exact {exact1 - exact2:.3f}); {abs(diff) / se:.0f} standard errors from 0"
    )
    return diff, se, exact1 - exact2


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1500, help="SVI steps per model")
    main(parser.parse_args().steps)
