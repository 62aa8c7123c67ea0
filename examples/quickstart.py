"""Quick-start: Bayesian logistic regression with AutoDAIS (DAIS₀) and numpyro's AutoNormal.

Fits both guides with SVI on a generated data set with correlated features (so the posterior
is correlated and a mean-field Gaussian is not exact), each until its loss stops improving
(``run_until_converged``), and compares the bound, an estimate of log p(y), and posterior
means and standard deviations against a NUTS reference.

    python dev.py quickstart               # about a minute on 2 CPU cores
    python dev.py quickstart --steps 500   # a fixed number of steps instead: faster, rougher
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import MCMC, NUTS, SVI, RenyiELBO, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_dais import AutoDAIS, run_until_converged


def make_data(n=400, d=8, seed=0):
    """Correlated Gaussian features (ρ = 0.6 between neighbours) and Bernoulli labels."""
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    cov = 0.6 ** jnp.abs(jnp.arange(d)[:, None] - jnp.arange(d)[None, :])
    X = jax.random.normal(k1, (n, d)) @ jnp.linalg.cholesky(cov).T
    w = jax.random.normal(k2, (d,))
    y = jax.random.bernoulli(k3, jax.nn.sigmoid(X @ w + 0.5)).astype(jnp.float32)
    return X, y


def model(X, y=None):
    d = X.shape[1]
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    w = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w + b), obs=y)


def fit(guide, X, y, steps=None, lr=0.01):
    """``(result, seconds)``: ``svi.run`` of ``steps`` steps, or (``steps=None``) SVI until the
    loss stops improving; set-up and compilation included."""
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    start = time.perf_counter()
    if steps is None:
        result = run_until_converged(svi, jax.random.key(0), X, y, progress_bar=False)
    else:
        result = svi.run(jax.random.key(0), steps, X, y, progress_bar=False)
    jax.block_until_ready(result.params)
    return result, time.perf_counter() - start


def flatten(samples):
    """Draws of ``b`` and ``w`` as one array ``(S, 1 + d)``, ``b`` first."""
    return jnp.concatenate([samples["b"][:, None], samples["w"]], axis=1)


def summary(samples):
    flat = flatten(samples)
    return flat.mean(0), flat.std(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=None, help="fixed steps (default: until converged)"
    )
    args = parser.parse_args()
    X, y = make_data()
    key = jax.random.key(1)

    start = time.perf_counter()
    mcmc = MCMC(NUTS(model), num_warmup=500, num_samples=2000, progress_bar=False)
    mcmc.run(key, X, y)
    ref_mean, ref_std = summary(mcmc.get_samples())
    nuts_time = time.perf_counter() - start

    rows = []
    normal = AutoNormal(model)
    result, seconds = fit(normal, X, y, args.steps)
    draws = normal.sample_posterior(key, result.params, sample_shape=(4000,))
    log_Z = -RenyiELBO(alpha=0, num_particles=4000).loss(key, result.params, model, normal, X, y)
    rows.append(("AutoNormal (VI)", -result.losses[-200:].mean(), log_Z, draws, seconds, result))

    dais = AutoDAIS(model, K=8, num_particles=8)
    result, seconds = fit(dais, X, y, args.steps)
    estimate = dais.log_evidence(key, result.params, X, y, num_particles=4000)
    q0 = dais.sample_posterior(key, result.params, sample_shape=(4000,))  # DAIS₀: q0 draws
    end_points = dais.sample_posterior(
        key, result.params, X, y, sample_shape=(4000,), method="importance"
    )
    check = dais.transport_check(key, result.params, X, y, warn=False)
    bound = -result.losses[-200:].mean()
    rows.append(("AutoDAIS, q0 (DAIS₀)", bound, estimate.log_Z, q0, seconds, result))
    rows.append(("AutoDAIS, resampled z_K", bound, estimate.log_Z, end_points, seconds, result))

    print(f"Bayesian logistic regression, {X.shape[0]} rows, {X.shape[1]} features + intercept")
    print(f"reference: NUTS, 2000 draws ({nuts_time:.1f} s)\n")
    header = (
        f"{'guide':<26}{'bound':>10}{'log p(y) est.':>15}{'mean MAE':>10}"
        f"{'std MAE':>10}{'steps':>8}{'fit time':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, bound, log_Z, draws, seconds, result in rows:
        mean, std = summary(draws)
        print(
            f"{name:<26}{float(bound):>10.2f}{float(log_Z):>15.2f}"
            f"{float(jnp.mean(jnp.abs(mean - ref_mean))):>10.4f}"
            f"{float(jnp.mean(jnp.abs(std - ref_std))):>10.4f}"
            f"{len(result.losses):>8}{seconds:>9.1f}s"
        )
    print(f"\ntransport check: {check.message}")
    print("\nbound: the training objective (ELBO for AutoNormal, 8-particle DAIS bound, K = 8);")
    print("log p(y) est.: importance-weighted (AutoNormal, 4000 draws) / AIS (AutoDAIS, 4000")
    print("particles). MAE of posterior mean and std against NUTS, over all 9 coefficients;")
    print("steps: taken until the loss stopped improving; fit time: set-up and compilation")
    print("included.\n")
    mean, std = summary(q0)
    print("DAIS₀ posterior (q0)  vs  NUTS:")
    names = ["b"] + [f"w[{i}]" for i in range(X.shape[1])]
    for i, name in enumerate(names):
        print(
            f"  {name:<5} {float(mean[i]):+.3f} ± {float(std[i]):.3f}   "
            f"{float(ref_mean[i]):+.3f} ± {float(ref_std[i]):.3f}"
        )


if __name__ == "__main__":
    main()
