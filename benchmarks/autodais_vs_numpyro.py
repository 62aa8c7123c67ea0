"""AutoDAIS against numpyro's built-in AutoDAIS on the same model, K and data, in one run.

Speed (ratios, so machine noise cancels): SVI step time at N = 1 (ours / numpyro's), our step
time at N = 16 relative to N = 1, and ``sample_posterior`` of 10,000 draws (numpyro's / ours).
Quality: posterior mean and std MAE against a long NUTS run on a real data set
(scikit-learn's bundled breast-cancer data if installed, else a generated one) for DAIS₀ (q0),
DAIS end points, and AutoNormal.

    python -m benchmarks.autodais_vs_numpyro            # full (~10 min on 2 cores)
    python -m benchmarks.autodais_vs_numpyro --quick    # ~2 min
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS as NumpyroAutoDAIS
from numpyro.infer.autoguide import AutoNormal

from benchmarks._common import Stopwatch, parse_args, time_steps, write_results
from numpyro_dais import AutoDAIS


def load_data():
    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError:
        key1, key2 = jax.random.split(jax.random.key(0))
        X = jax.random.normal(key1, (569, 30))
        y = jax.random.bernoulli(key2, jax.nn.sigmoid(X[:, :5].sum(1))).astype(jnp.float32)
        return X, y, "generated logistic data (569 x 30; scikit-learn not installed)"
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32), "breast cancer (569 x 30)"


def model(X, y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    w = numpyro.sample("w", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w + b), obs=y)


def step_time(guide, X, y, repeats, steps):
    """Median seconds per jitted ``svi.update`` (warm), over ``repeats`` blocks of ``steps``."""
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    update = jax.jit(svi.update)
    return time_steps(lambda s: update(s, X, y), svi.init(jax.random.key(0), X, y), repeats, steps)


def posterior_time(guide, params, X, y, repeats, method=None):
    kwargs = {} if method is None else {"method": method}

    def draw():
        out = guide.sample_posterior(
            jax.random.key(1), params, X, y, sample_shape=(10_000,), **kwargs
        )
        jax.block_until_ready(out)

    draw()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        draw()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit(guide, X, y, steps, lr):
    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    return svi.run(jax.random.key(0), steps, X, y, progress_bar=False).params


def flat(samples):
    return jnp.concatenate([samples["b"][:, None], samples["w"]], axis=1)


def main():
    args = parse_args(__doc__.splitlines()[0])
    stopwatch = Stopwatch()
    K = 8
    repeats, steps, fit_steps = {
        "full": (7, 50, 10_000),
        "quick": (3, 20, 2000),
        "smoke": (1, 2, 20),
    }[args.mode]
    X, y, data_name = load_data()
    lines = [
        f"data: {data_name}; K = {K}; step times: median of {repeats} blocks of "
        f"{steps} jitted steps",
        "",
    ]

    t_np = step_time(NumpyroAutoDAIS(model, K=K), X, y, repeats, steps)
    t_1 = step_time(AutoDAIS(model, K=K, num_particles=1), X, y, repeats, steps)
    t_1q = step_time(
        AutoDAIS(model, K=K, num_particles=1, report_divergences=False), X, y, repeats, steps
    )
    t_16 = step_time(AutoDAIS(model, K=K, num_particles=16), X, y, repeats, steps)

    ours = AutoDAIS(model, K=K, num_particles=16)
    ours_params = fit(ours, X, y, fit_steps, 1e-2)
    theirs = NumpyroAutoDAIS(model, K=K)
    theirs_params = fit(theirs, X, y, 200, 1e-2)
    s_np = posterior_time(theirs, theirs_params, X, y, max(1, repeats // 3))
    s_q0 = posterior_time(ours, ours_params, X, y, repeats)
    s_dais = posterior_time(ours, ours_params, X, y, max(1, repeats // 3), method="dais")

    lines += [
        "| speed | value | target |",
        "|---|---|---|",
        f"| SVI step, N=1: ours / numpyro | {t_1 / t_np:.2f} ({t_1 * 1e3:.2f} ms / "
        f"{t_np * 1e3:.2f} ms) | <= 1 |",
        f"| SVI step, N=1, report_divergences=False: ours / numpyro | {t_1q / t_np:.2f} "
        f"({t_1q * 1e3:.2f} ms) | <= 1 |",
        f"| SVI step, ours N=16 / N=1 | {t_16 / t_1:.2f} ({t_16 * 1e3:.2f} ms) | <= 4 |",
        f"| sample_posterior 10,000 draws: numpyro / ours (q0, default) | {s_np / s_q0:.1f} "
        f"({s_np:.2f} s / {s_q0:.3f} s) | >= 10 |",
        f"| sample_posterior 10,000 draws: numpyro / ours (method='dais', same work) | "
        f"{s_np / s_dais:.1f} ({s_dais:.2f} s) | |",
        "",
    ]

    num_nuts = {"full": 4000, "quick": 1000, "smoke": 50}[args.mode]
    mcmc = MCMC(
        NUTS(model), num_warmup=min(1000, num_nuts), num_samples=num_nuts, progress_bar=False
    )
    mcmc.run(jax.random.key(2), X, y)
    ref = flat(mcmc.get_samples())
    normal = AutoNormal(model)
    normal_params = fit(normal, X, y, fit_steps, 1e-2)
    key = jax.random.key(3)
    rows = {
        "AutoNormal": normal.sample_posterior(key, normal_params, sample_shape=(4000,)),
        "DAIS₀ (q0), N=16": ours.sample_posterior(key, ours_params, sample_shape=(4000,)),
        "DAIS end points, N=16": ours.sample_posterior(
            key, ours_params, X, y, sample_shape=(4000,), method="dais"
        ),
        "DAIS importance-resampled, N=16": ours.sample_posterior(
            key, ours_params, X, y, sample_shape=(4000,), method="importance"
        ),
    }
    lines += [
        f"posterior quality against NUTS ({ref.shape[0]} draws); SVI: {fit_steps} Adam "
        "steps, lr 1e-2",
        "",
        "| method | mean MAE | std MAE |",
        "|---|---|---|",
    ]
    for name, samples in rows.items():
        s = flat(samples)
        lines.append(
            f"| {name} | {float(jnp.mean(jnp.abs(s.mean(0) - ref.mean(0)))):.4f} | "
            f"{float(jnp.mean(jnp.abs(s.std(0) - ref.std(0)))):.4f} |"
        )
    body = "\n".join(lines)
    print(body)
    write_results(
        args.out_dir,
        "autodais_vs_numpyro",
        args.mode,
        "AutoDAIS against numpyro's AutoDAIS",
        "benchmarks.autodais_vs_numpyro",
        body,
        stopwatch,
    )


if __name__ == "__main__":
    main()
