"""DAIS₀ on the quick-start model: is ``q0`` a posterior users can trust by default?

The quick-start's Bayesian logistic regression (400 rows, 8 correlated features plus an
intercept; ``examples/quickstart.py``), fitted from several seeds with the quick-start's
settings (``K = 8``, ``N = 8``, Adam lr 1e-2). Against a long NUTS run, per seed:

* ``AutoNormal`` (mean-field VI), the baseline of the targets;
* ``AutoDAIS`` with defaults: ``q0`` is the posterior, so the DAIS₀ regime
  (``sym_kl_weight=1``);
* ``AutoDAIS(sym_kl_weight=0)``: ``q0`` trained on the bound alone (the earlier default).

For each: MAE of the posterior mean and std of ``q0`` and of the importance-resampled end
points, the bound (mean of the last 10 % of the losses) and the transport check's verdict.
Targets: ``q0`` mean MAE ≤ 1.5 × AutoNormal's and std MAE ≤ 0.5 × AutoNormal's on every seed;
the default's bound no more than 0.2 nats below the bound-only regime's.

Run from the repository root: ``python -m benchmarks.dais0_quickstart [--quick|--smoke]``.
"""

import importlib.util
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from benchmarks._common import Stopwatch, markdown_table, output_name, parse_args, write_results
from numpyro_dais import AutoDAIS

NAME = "dais0_quickstart"
MODULE = f"benchmarks.{NAME}"
K, N, LR = 8, 8, 1e-2
SETTINGS = {
    "full": dict(seeds=3, steps=3000, nuts=(1000, 10_000), draws=4000),
    "quick": dict(seeds=2, steps=1500, nuts=(500, 4000), draws=2000),
    "smoke": dict(seeds=1, steps=30, nuts=(50, 100), draws=100),
}


def _quickstart():
    """The quick-start module (``examples/`` is not a package): its model and data."""
    path = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
    spec = importlib.util.spec_from_file_location("quickstart", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plot_seed0(results, guides, ref_mean, ref_std, d):
    """Seed 0: each guide's q0 mean ± std per coefficient beside NUTS's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["b"] + [f"w[{i}]" for i in range(d)]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.errorbar(x, ref_mean, ref_std, fmt="o", color="k", capsize=3, label="NUTS")
    for i, name in enumerate(guides):
        mean, std = results[name, 0]["draws"]
        ax.errorbar(x + 0.15 * (i + 1), mean, std, fmt="s", capsize=3, label=name, ms=4)
    ax.set_xticks(x + 0.2, names)
    ax.set_ylabel("posterior mean ± std")
    ax.set_title("q0 (or the VI posterior) against NUTS, seed 0")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def main():
    args = parse_args(__doc__.splitlines()[0])
    cfg = SETTINGS[args.mode]
    stopwatch = Stopwatch()
    qs = _quickstart()
    X, y = qs.make_data()
    with stopwatch.lap("NUTS"):
        mcmc = MCMC(
            NUTS(qs.model),
            num_warmup=cfg["nuts"][0],
            num_samples=cfg["nuts"][1],
            progress_bar=False,
        )
        mcmc.run(jax.random.key(1), X, y)
        ref_mean, ref_std = qs.summary(mcmc.get_samples())

    def errors(draws):
        mean, std = qs.summary(draws)
        return float(jnp.mean(jnp.abs(mean - ref_mean))), float(jnp.mean(jnp.abs(std - ref_std)))

    guides = {
        "AutoNormal": lambda: AutoNormal(qs.model),
        "AutoDAIS (default: DAIS₀ regime)": lambda: AutoDAIS(qs.model, K=K, num_particles=N),
        "AutoDAIS, sym_kl_weight=0": lambda: AutoDAIS(
            qs.model, K=K, num_particles=N, sym_kl_weight=0.0
        ),
    }
    results = {}  # (guide, seed) -> dict
    for seed in range(cfg["seeds"]):
        key = jax.random.key(100 + seed)
        for name, make in guides.items():
            guide = make()
            svi = SVI(qs.model, guide, optax.adam(LR), Trace_ELBO())
            with stopwatch.lap(name), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                fit = svi.run(jax.random.key(seed), cfg["steps"], X, y, progress_bar=False)
            tail = max(1, cfg["steps"] // 10)
            row = {"bound": float(-np.mean(fit.losses[-tail:]))}
            q0 = guide.sample_posterior(key, fit.params, sample_shape=(cfg["draws"],))
            row["q0"] = errors(q0)
            if isinstance(guide, AutoDAIS):
                end = guide.sample_posterior(
                    key, fit.params, X, y, sample_shape=(cfg["draws"],), method="importance"
                )
                row["end"] = errors(end)
                row["check"] = guide.transport_check(key, fit.params, X, y, warn=False)
            if seed == 0:
                row["draws"] = qs.summary(q0)
            results[name, seed] = row
            print(name, seed, {k: row[k] for k in ("bound", "q0", "end") if k in row}, flush=True)

    seeds = range(cfg["seeds"])
    normal = [results["AutoNormal", s] for s in seeds]
    rows = []
    for name in guides:
        for s in seeds:
            r = results[name, s]
            check = r.get("check")
            rows.append(
                [
                    name,
                    s,
                    f"{r['bound']:.2f}",
                    f"{r['q0'][0]:.4f}",
                    f"{r['q0'][1]:.4f}",
                    f"{r['end'][0]:.4f}" if "end" in r else "—",
                    f"{r['end'][1]:.4f}" if "end" in r else "—",
                    "—" if check is None else ("ok" if check.ok else f"fails ({check.worst})"),
                ]
            )
    table = markdown_table(
        [
            "guide",
            "seed",
            "bound",
            "q0 mean MAE",
            "q0 std MAE",
            "end-point mean MAE",
            "end-point std MAE",
            "transport check",
        ],
        rows,
    )
    default = "AutoDAIS (default: DAIS₀ regime)"
    dflt = [results[default, s] for s in seeds]
    bound_only = [results["AutoDAIS, sym_kl_weight=0", s] for s in seeds]
    mean_ratio = [d["q0"][0] / n["q0"][0] for d, n in zip(dflt, normal, strict=True)]
    std_ratio = [d["q0"][1] / n["q0"][1] for d, n in zip(dflt, normal, strict=True)]
    bound_diff = [d["bound"] - b["bound"] for d, b in zip(dflt, bound_only, strict=True)]
    old_mean = [b["q0"][0] for b in bound_only]

    def span(xs, fmt):
        return f"{fmt.format(min(xs))} – {fmt.format(max(xs))}"

    targets = markdown_table(
        ["check (defaults, every seed)", "sym_kl_weight=0 (before)", "default (now)", "target"],
        [
            [
                "q0 mean MAE / AutoNormal's",
                span([b / n["q0"][0] for b, n in zip(old_mean, normal, strict=True)], "{:.2f}"),
                span(mean_ratio, "{:.2f}"),
                "≤ 1.5",
            ],
            [
                "q0 std MAE / AutoNormal's",
                span(
                    [b["q0"][1] / n["q0"][1] for b, n in zip(bound_only, normal, strict=True)],
                    "{:.2f}",
                ),
                span(std_ratio, "{:.2f}"),
                "≤ 0.5",
            ],
            ["bound − bound of sym_kl_weight=0 (nats)", "0", span(bound_diff, "{:+.3f}"), "≥ −0.2"],
        ],
    )
    body = "\n\n".join(
        [
            f"Quick-start model, {X.shape[0]} rows, {X.shape[1]} features + intercept; "
            f"K = {K}, N = {N}, {cfg['steps']} Adam steps at lr {LR}, seeds 0–"
            f"{cfg['seeds'] - 1} (the quick-start itself is seed 0). Reference: NUTS, "
            f"{cfg['nuts'][1]} draws after {cfg['nuts'][0]} warm-up. MAE over the 9 "
            f"coefficients; {cfg['draws']} posterior draws per method.",
            "## Targets",
            targets,
            "## Per seed",
            table,
        ]
    )
    figure = plot_seed0(results, guides, ref_mean, ref_std, X.shape[1])
    figure.savefig(args.out_dir / f"{output_name(NAME, args.mode)}_q0.png", dpi=110)
    print(body)
    write_results(
        args.out_dir, NAME, args.mode, "DAIS₀ on the quick-start model", MODULE, body, stopwatch
    )


if __name__ == "__main__":
    main()
