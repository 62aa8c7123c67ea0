"""AutoDAIS against numpyro's built-in AutoDAIS on the same model, K and data, in one run.

Speed (ratios, so machine noise cancels; the configurations take turns block by block): SVI
step time at N = 1 (ours / numpyro's) on logistic regression (K = 8) and the non-centred eight
schools (K = 4); every guide's step as a ratio to its *gradient floor*, the time of the
``(K + 1)·N`` vmapped, jitted log-joint gradients a step evaluates, and to the *chain floor*,
the value and gradient of ``N`` chains of ``K`` plain gradient steps (what differentiating
through ``K`` transitions costs at least); ``sample_posterior`` of 10,000 draws (numpyro's /
ours); ``svi.init`` on a fresh guide (its set-up and first run, compilation included) and
the first training step's compilation (``jit(svi.update)`` traced, lowered and compiled);
the first posterior queries after a fit; the quick-start's fits (``examples/quickstart.py``,
AutoDAIS against AutoNormal, 3,000 steps from a fresh guide, wall time);
AutoGPVI against amortized SVGD also on a likelihood-heavy task (logistic regression on
10⁵ generated rows), where the gradients, not the generator's Jacobian solves, dominate.
Quality: posterior mean and std MAE against a long NUTS run on a real data set
(scikit-learn's bundled breast-cancer data if installed, else a generated one) for DAIS₀ (q0),
DAIS end points, and AutoNormal.

    python -m benchmarks.autodais_vs_numpyro            # full (~10 min on 2 cores)
    python -m benchmarks.autodais_vs_numpyro --quick    # ~2 min
"""

import json
import statistics
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS as NumpyroAutoDAIS
from numpyro.infer.autoguide import AutoNormal

from benchmarks import _real_models
from benchmarks._common import (
    Stopwatch,
    chain_floor,
    flat_log_joint,
    gradient_floor,
    parse_args,
    quickstart_module,
    svi_stepper,
    time_interleaved,
    write_results,
)
from numpyro_dais import AutoDAIS, AutoDSMCS, AutoGPVI


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


# Eight schools (Rubin 1981), non-centred; the data of benchmarks/_real_models.py
SCHOOLS_Y = jnp.asarray(_real_models.SCHOOLS_Y, jnp.float32)
SCHOOLS_SIGMA = jnp.asarray(_real_models.SCHOOLS_SIGMA, jnp.float32)


def eight_schools(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        numpyro.sample("obs", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)


def speed_table(name, mdl, data, K, repeats, steps, all_guides):
    """Markdown rows: our step against numpyro's and every guide against its floors."""
    N = 16
    ell, z_init = flat_log_joint(mdl, data)

    def step(guide):
        return svi_stepper(SVI(mdl, guide, optax.adam(1e-3), Trace_ELBO()), *data)

    calls = {
        "numpyro": step(NumpyroAutoDAIS(mdl, K=K)),
        "ours 1": step(AutoDAIS(mdl, K=K, num_particles=1)),
        "ours 1 quiet": step(AutoDAIS(mdl, K=K, num_particles=1, report_divergences=False)),
        "ours N": step(AutoDAIS(mdl, K=K, num_particles=N)),
        "floor 1": gradient_floor(ell, z_init, K + 1),
        "floor N": gradient_floor(ell, z_init, (K + 1) * N),
        "chain 1": chain_floor(ell, z_init, K, 1),
        "chain N": chain_floor(ell, z_init, K, N),
    }
    if all_guides:
        # the cost of resampling in the training step: train through each rule
        dsmcs = lambda when: AutoDSMCS(
            mdl, K=K, num_particles=N, resample_when=when, train_resample_when=None
        )
        calls["dsmcs bernoulli"] = step(dsmcs("bernoulli"))
        calls["dsmcs never"] = step(dsmcs("never"))
        calls["gpvi"] = step(AutoGPVI(mdl, num_particles=N, algorithm="gpvi"))
        calls["svgd"] = step(AutoGPVI(mdl, num_particles=N, algorithm="amortized_svgd"))
        calls["floor gpvi"] = gradient_floor(ell, z_init, N)
    t = time_interleaved(calls, repeats, steps)
    ms = lambda key: f"{t[key] * 1e3:.3f} ms"
    rows = [
        f"| {name}: AutoDAIS step, N=1, defaults / numpyro's AutoDAIS | "
        f"{t['ours 1'] / t['numpyro']:.2f} | {ms('ours 1')} / {ms('numpyro')} | <= 1 |",
        f"| {name}: same, report_divergences=False | {t['ours 1 quiet'] / t['numpyro']:.2f} | "
        f"{ms('ours 1 quiet')} | |",
        f"| {name}: AutoDAIS step, N={N} / gradient floor | {t['ours N'] / t['floor N']:.2f} | "
        f"{ms('ours N')} / {ms('floor N')} | <= 1.3 |",
        f"| {name}: AutoDAIS step, N={N} / chain floor | {t['ours N'] / t['chain N']:.2f} | "
        f"{ms('chain N')} | |",
        f"| {name}: AutoDAIS step, N=1 / gradient floor; / chain floor | "
        f"{t['ours 1'] / t['floor 1']:.2f}; {t['ours 1'] / t['chain 1']:.2f} | "
        f"{ms('floor 1')}; {ms('chain 1')} | |",
        f"| {name}: numpyro's AutoDAIS step / gradient floor; / chain floor (N=1) | "
        f"{t['numpyro'] / t['floor 1']:.2f}; {t['numpyro'] / t['chain 1']:.2f} | | |",
        f"| {name}: AutoDAIS step, N={N} / N=1 | {t['ours N'] / t['ours 1']:.2f} | | <= 4 |",
    ]
    if all_guides:
        rows += [
            f"| {name}: AutoDSMCS (bernoulli), N={N} / gradient floor; / chain floor | "
            f"{t['dsmcs bernoulli'] / t['floor N']:.2f}; "
            f"{t['dsmcs bernoulli'] / t['chain N']:.2f} | {ms('dsmcs bernoulli')} | |",
            f"| {name}: AutoDSMCS bernoulli / never | "
            f"{t['dsmcs bernoulli'] / t['dsmcs never']:.2f} | {ms('dsmcs never')} | |",
            f"| {name}: AutoGPVI (gpvi), N={N} / its floor ({N} gradients) | "
            f"{t['gpvi'] / t['floor gpvi']:.2f} | {ms('gpvi')} / {ms('floor gpvi')} | |",
            f"| {name}: AutoGPVI (amortized_svgd), N={N} / its floor | "
            f"{t['svgd'] / t['floor gpvi']:.2f} | {ms('svgd')} | |",
            f"| {name}: AutoGPVI gpvi / amortized_svgd | {t['gpvi'] / t['svgd']:.2f} | | |",
        ]
    return rows


def dsmcs_resampling_rows(X, y, repeats, K=32, N=64):
    """What resampling costs AutoDSMCS at the DSMCS paper's size (K = 32, N = 64): its
    default Bernoulli rule against a run that never resamples, interleaved."""

    def step(when):
        guide = AutoDSMCS(model, K=K, num_particles=N, resample_when=when, train_resample_when=None)
        return svi_stepper(SVI(model, guide, optax.adam(1e-3), Trace_ELBO()), X, y)

    t = time_interleaved({"bernoulli": step("bernoulli"), "never": step("never")}, repeats, 5)
    return [
        f"| breast cancer LR, K={K}: AutoDSMCS bernoulli / never, N={N} | "
        f"{t['bernoulli'] / t['never']:.2f} | {t['bernoulli'] * 1e3:.1f} ms / "
        f"{t['never'] * 1e3:.1f} ms | <= 1.05 |"
    ]


def gpvi_heavy_rows(num_data, repeats, steps):
    """GPVI against amortized SVGD where the likelihood dominates a step: logistic
    regression on ``num_data`` generated rows, D = 28 (the SL-DAIS benchmark's generator).
    GPVI's extra cost over SVGD (the generator's Jacobian solves, ``O(N D³)``) does not grow
    with the data; the gradients do."""
    from benchmarks.sldais_scaling import logistic, make_data, power_of_ten

    N = 16
    data = make_data(num_data)
    ell, z_init = flat_log_joint(logistic, data)

    def step(guide):
        return svi_stepper(SVI(logistic, guide, optax.adam(1e-3), Trace_ELBO()), *data)

    calls = {
        "gpvi": step(AutoGPVI(logistic, num_particles=N, algorithm="gpvi")),
        "svgd": step(AutoGPVI(logistic, num_particles=N, algorithm="amortized_svgd")),
        "floor": gradient_floor(ell, z_init, N),
    }
    t = time_interleaved(calls, repeats, steps)
    ms = lambda key: f"{t[key] * 1e3:.2f} ms"
    name = f"likelihood-heavy LR (Nd = {power_of_ten(num_data)}, D = 28)"
    return [
        f"| {name}: AutoGPVI gpvi / amortized_svgd, N={N} | {t['gpvi'] / t['svgd']:.2f} | "
        f"{ms('gpvi')} / {ms('svgd')} | <= 1.3 |",
        f"| {name}: AutoGPVI (gpvi) / its floor ({N} gradients) | "
        f"{t['gpvi'] / t['floor']:.2f} | {ms('floor')} | |",
    ]


def set_up_times(guide, X, y, seed=0):
    """Seconds of ``svi.init`` on ``guide`` and of its first training step's compilation
    (``jit(svi.update)`` traced, lowered and compiled)."""
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    start = time.perf_counter()
    state = jax.block_until_ready(svi.init(jax.random.key(seed), X, y))
    middle = time.perf_counter()
    jax.jit(svi.update).lower(state, X, y).compile()
    return middle - start, time.perf_counter() - middle


def fresh_guide_times(makers, X, y, repeats):
    """Median seconds of ``svi.init`` on a fresh guide (set-up and the guide's first, eager
    run: compilation included) and of the first training step's compilation after it
    (``jit(svi.update)`` traced, lowered and compiled: what a user waits for before the
    first step), the guides taking turns; one warm-up round first, so that JAX's own
    first-use costs fall on no guide. Returns ``(setup, first_step)``, each ``{name: s}``."""
    times = {name: ([], []) for name in makers}
    for round_ in range(repeats + 1):
        for name, make in makers.items():
            setup, first = set_up_times(make(), X, y, round_)
            if round_:
                times[name][0].append(setup)
                times[name][1].append(first)
    return tuple(
        {name: statistics.median(t[which]) for name, t in times.items()} for which in (0, 1)
    )


COLD_SCRIPT = """
import json
from benchmarks import autodais_vs_numpyro as bench
X, y, _ = bench.load_data()
print(json.dumps(bench.set_up_times(bench.GUIDE_MAKERS[{name!r}](), X, y)))
"""

#: the guides whose set-up is timed, breast cancer LR, K = 8
GUIDE_MAKERS = {
    "numpyro": lambda: NumpyroAutoDAIS(model, K=8),
    "ours": lambda: AutoDAIS(model, K=8),
    "gpvi": lambda: AutoGPVI(model, num_particles=16, algorithm="gpvi"),
    "normal": lambda: AutoNormal(model),
}
COLD = ("numpyro", "ours", "normal")


def cold_guide_times(repeats):
    """As :func:`fresh_guide_times`, each guide in a new Python process (imports and data
    loading not timed): what a script or a new notebook kernel waits for, where no other
    guide has compiled numpyro's per-operation programs before. Returns ``(setup,
    first_step)``, each ``{name: s}``."""
    times = {name: ([], []) for name in COLD}
    for _ in range(repeats):
        for name in COLD:
            out = subprocess.run(
                [sys.executable, "-c", COLD_SCRIPT.format(name=name)],
                capture_output=True,
                text=True,
                check=True,
            )
            setup, first = json.loads(out.stdout.strip().splitlines()[-1])
            times[name][0].append(setup)
            times[name][1].append(first)
    return tuple(
        {name: statistics.median(t[which]) for name, t in times.items()} for which in (0, 1)
    )


def cold_rows(repeats):
    """The table of :func:`cold_guide_times`."""
    setup, first = cold_guide_times(repeats)
    row = lambda t, name, label: (
        f"| {label} | {t[name] / t['numpyro']:.2f} | {t[name]:.2f} s / {t['numpyro']:.2f} s |"
    )
    return [
        "| in a new process: svi.init; then the first step's compilation | ratio | "
        "times (guide / numpyro's AutoDAIS) |",
        "|---|---|---|",
        row(setup, "ours", "svi.init: AutoDAIS, defaults, K=8 / numpyro's AutoDAIS"),
        row(setup, "normal", "svi.init: AutoNormal / numpyro's AutoDAIS"),
        row(first, "ours", "first step's compilation: AutoDAIS / numpyro's AutoDAIS"),
        "",
    ]


FIRST_QUERIES = {
    "q0": lambda g, k, p, X, y, n: g.sample_posterior(k, p, X, y, sample_shape=(n,)),
    "importance": lambda g, k, p, X, y, n: g.sample_posterior(
        k, p, X, y, sample_shape=(n,), method="importance"
    ),
    "log_evidence": lambda g, k, p, X, y, n: g.log_evidence(k, p, X, y, num_particles=n),
}


def first_query_times(X, y, repeats, fit_steps=200, num=1000):
    """Median seconds of the first posterior queries a user makes after fitting a fresh
    AutoDAIS (defaults, K=8; compilation included, JAX already warm): ``q0`` draws (the
    self-check runs its transport check then), then ``method="importance"`` draws, then
    ``log_evidence``, ``num`` each. Returns ``{query: s}``."""
    times = {"q0": [], "importance": [], "log_evidence": []}
    for round_ in range(repeats + 1):
        guide = AutoDAIS(model, K=8)
        params = fit(guide, X, y, fit_steps, 1e-2)
        key = jax.random.key(round_)
        for name, query in FIRST_QUERIES.items():
            start = time.perf_counter()
            jax.block_until_ready(query(guide, key, params, X, y, num))
            if round_:  # the first round warms JAX itself up
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def first_query_rows(X, y, repeats):
    """The table of :func:`first_query_times`."""
    with warnings.catch_warnings():  # a short fit: the self-check may say so
        warnings.simplefilter("ignore")
        queries = first_query_times(X, y, repeats)
    together = queries["importance"] + queries["log_evidence"]
    return [
        "| first queries after a fit (fresh AutoDAIS, defaults, K=8, 1,000 each; compilation "
        "included) | time | target |",
        "|---|---|---|",
        f"| `sample_posterior` (q0; its self-check runs the transport check) | "
        f"{queries['q0']:.2f} s | |",
        f"| then `method='importance'` | {queries['importance']:.2f} s | |",
        f"| then `log_evidence` | {queries['log_evidence']:.2f} s | |",
        f"| importance + log_evidence | {together:.2f} s | <= 1 s |",
        "",
    ]


def quickstart_fit_rows(repeats, steps=3000):
    """The quick-start's fits (``examples/quickstart.py``: its model, data, guides and
    ``fit``, ``svi.run`` of ``steps`` steps from a fresh guide: set-up, compilation and
    steps), wall time, the guides taking turns after one warm-up round."""
    qs = quickstart_module()
    X, y = qs.make_data()
    makers = {
        "normal": lambda: AutoNormal(qs.model),
        "ours": lambda: AutoDAIS(qs.model, K=8, num_particles=8),
    }
    times = {name: [] for name in makers}
    for round_ in range(repeats + 1):
        for name, make in makers.items():
            seconds = qs.fit(make(), X, y, steps, 0.01)[1]
            if round_:
                times[name].append(seconds)
    normal, ours = (statistics.median(times[name]) for name in ("normal", "ours"))
    return [
        f"| quick-start ({steps:,} steps, fresh guide, compilation included) | ratio | times "
        "| target |",
        "|---|---|---|---|",
        f"| AutoDAIS (K=8, N=8) fit / AutoNormal fit | {ours / normal:.2f} | {ours:.1f} s / "
        f"{normal:.1f} s | <= 3 |",
        "",
    ]


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
        "full": (9, 50, 10_000),
        "quick": (5, 30, 2000),
        "smoke": (1, 2, 20),
    }[args.mode]
    X, y, data_name = load_data()
    lines = [
        f"data: {data_name}; K = {K}; step times: median of {repeats} blocks of "
        f"{steps} jitted steps, the configurations taking turns",
        "",
    ]

    # smoke mode (the test suite) times AutoDAIS alone: every compilation costs seconds
    full_table = args.mode != "smoke"
    lines += [
        "| speed | ratio | times | target |",
        "|---|---|---|---|",
        *speed_table("breast cancer LR, K=8", model, (X, y), K, repeats, steps, full_table),
    ]
    if full_table:
        schools = (SCHOOLS_SIGMA, SCHOOLS_Y)
        lines += speed_table("eight schools, K=4", eight_schools, schools, 4, repeats, steps, False)
        lines += dsmcs_resampling_rows(X, y, repeats)
        heavy = {"full": 10**5, "quick": 2 * 10**4}[args.mode]
        lines += gpvi_heavy_rows(heavy, repeats, max(1, steps // 10))
    lines += [
        "",
        "Gradient floor: (K + 1)·N vmapped, jitted log-joint gradients (numpyro's potential, "
        "one call). Chain floor: value and gradient (start points, step size) of N vmapped "
        "chains of K plain gradient steps, the least a step that differentiates through K "
        "transitions costs.",
        "",
    ]

    setup, first = fresh_guide_times(GUIDE_MAKERS, X, y, max(1, repeats // 3))
    lines += [
        "| set-up: svi.init on a fresh guide (compilation included), breast cancer LR | "
        "ratio | times | target |",
        "|---|---|---|---|",
        f"| AutoDAIS, defaults, K={K} / numpyro's AutoDAIS | "
        f"{setup['ours'] / setup['numpyro']:.2f} | {setup['ours']:.2f} s / "
        f"{setup['numpyro']:.2f} s | <= 1 |",
        f"| AutoGPVI, N=16 / numpyro's AutoDAIS | {setup['gpvi'] / setup['numpyro']:.2f} | "
        f"{setup['gpvi']:.2f} s | |",
        f"| AutoNormal / numpyro's AutoDAIS | {setup['normal'] / setup['numpyro']:.2f} | "
        f"{setup['normal']:.2f} s | |",
        "",
        "| first step: jit(svi.update) traced, lowered and compiled, breast cancer LR | "
        "ratio | times | target |",
        "|---|---|---|---|",
        f"| AutoDAIS, defaults, K={K} / numpyro's AutoDAIS | "
        f"{first['ours'] / first['numpyro']:.2f} | {first['ours']:.2f} s / "
        f"{first['numpyro']:.2f} s | <= 1 |",
        f"| AutoGPVI, N=16 / numpyro's AutoDAIS | {first['gpvi'] / first['numpyro']:.2f} | "
        f"{first['gpvi']:.2f} s | |",
        f"| AutoNormal / numpyro's AutoDAIS | {first['normal'] / first['numpyro']:.2f} | "
        f"{first['normal']:.2f} s | |",
        "",
    ]

    if full_table:  # smoke mode: each round compiles a fit and three queries
        lines += cold_rows(max(1, repeats // 3))
        lines += first_query_rows(X, y, max(1, repeats // 3))
        lines += quickstart_fit_rows(max(1, repeats // 3))

    ours = AutoDAIS(model, K=K, num_particles=16)
    ours_params = fit(ours, X, y, fit_steps, 1e-2)
    theirs = NumpyroAutoDAIS(model, K=K)
    theirs_params = fit(theirs, X, y, 200, 1e-2)
    s_np = posterior_time(theirs, theirs_params, X, y, max(1, repeats // 3))
    s_q0 = posterior_time(ours, ours_params, X, y, repeats)
    s_dais = posterior_time(ours, ours_params, X, y, max(1, repeats // 3), method="dais")

    lines += [
        "| sample_posterior, 10,000 draws | value | target |",
        "|---|---|---|",
        f"| numpyro / ours (q0, default) | {s_np / s_q0:.1f} ({s_np:.2f} s / {s_q0:.3f} s) "
        "| >= 10 |",
        f"| numpyro / ours (method='dais', same work) | {s_np / s_dais:.1f} ({s_dais:.2f} s) | |",
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
