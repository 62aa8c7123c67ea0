"""numpyro's own SL-DAIS accuracy case, run with our ``AutoSurrogateLikelihoodDAIS``.

The case of numpyro's ``test/infer/test_autoguide.py::test_autosldais`` (rewritten here, not
copied): a logistic regression on ``N = 64`` rows and ``D = 3`` covariates, the third the
sum of the other two (exactly collinear), mini-batches of 48 rows, a user-given surrogate on
the first 32 rows with learnable weights, ``K = 3, eta_max = 0.25, eta_init = 0.005``, and
Adam with numpyro's ``piecewise_constant_schedule(1e-3, {15000: 1e-4, 30000: 1e-5})`` over
40,000 steps (optax multiplies the scales: the rate is 1e-7 after 3/8 of the steps, so
training is the first 15,000). numpyro asserts that the guide's ELBO (2,000 draws) beats
``AutoNormal``'s by more than 0.1 nats.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_dais import AutoSurrogateLikelihoodDAIS

N, BATCH, NUM_SURROGATE, D = 64, 48, 32, 3


def _model(X, Y):
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    with numpyro.plate("N", N, subsample_size=BATCH):
        x, y = numpyro.subsample(X, event_dim=1), numpyro.subsample(Y, event_dim=0)
        numpyro.sample("obs", dist.Bernoulli(logits=x @ theta), obs=y)


def _surrogate(X, Y):
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    omegas = numpyro.param(
        "omegas", 2.0 * jnp.ones(NUM_SURROGATE), constraint=dist.constraints.positive
    )
    with numpyro.plate("N", NUM_SURROGATE), numpyro.handlers.scale(scale=omegas):
        numpyro.sample("obs", dist.Bernoulli(logits=X @ theta), obs=Y)


def _optimiser(num_steps):
    schedule = optax.piecewise_constant_schedule(
        1e-3, {3 * num_steps // 8: 1e-4, 3 * num_steps // 4: 1e-5}
    )
    return optax.chain(optax.scale_by_adam(), optax.scale_by_schedule(schedule), optax.scale(-1))


def run(num_steps=40_000, num_samples=2000):
    """``(our SL-DAIS ELBO, AutoNormal's ELBO)`` on numpyro's case, each from
    ``Trace_ELBO(num_particles=num_samples)`` at the trained parameters."""
    X = np.random.RandomState(0).randn(N, D)
    X[:, 2] = X[:, 0] + X[:, 1]
    Y = dist.Bernoulli(logits=X[:, 0] - 0.5 * X[:, 1]).sample(jax.random.key(0))
    model = partial(_model, X, Y)
    surrogate = partial(_surrogate, X[:NUM_SURROGATE], Y[:NUM_SURROGATE])
    guide = AutoSurrogateLikelihoodDAIS(
        model, surrogate_model=surrogate, K=3, eta_max=0.25, eta_init=0.005
    )
    params = (
        SVI(model, guide, _optimiser(num_steps), Trace_ELBO())
        .run(jax.random.key(1), num_steps, progress_bar=False)
        .params
    )
    elbo = Trace_ELBO(num_particles=num_samples)
    ours = -float(elbo.loss(jax.random.key(0), params, model, guide))
    normal = AutoNormal(model, create_plates=lambda: numpyro.plate("N", N, subsample_size=BATCH))
    normal_params = (
        SVI(model, normal, _optimiser(num_steps), Trace_ELBO())
        .run(jax.random.key(0), num_steps, progress_bar=False)
        .params
    )
    return ours, -float(elbo.loss(jax.random.key(1), normal_params, model, normal))
