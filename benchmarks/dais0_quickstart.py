"""DAIS₀ on the quick-start model: is ``q0`` a posterior users can trust by default?

The quick-start's Bayesian logistic regression (400 rows, 8 correlated features plus an
intercept; ``examples/quickstart.py``), fitted from several seeds with the quick-start's
settings (``K = 8``, ``N = 8``, Adam lr 1e-2). Against a long NUTS run, per seed:

* ``AutoNormal`` (mean-field VI), the baseline of the targets;
* ``AutoDAIS`` with defaults: ``q0`` is the posterior, so the DAIS₀ regime
  (``sym_kl_weight=1``);
* the same defaults trained twice as long, to separate what is not yet converged from where
  the regime converges to;
* ``AutoDAIS(sym_kl_weight=0)``: ``q0`` trained on the bound alone (the earlier default);
* ``symKL*``, a reference rather than a fit: the mean-field Gaussian minimising
  ``KL(q‖p) + KL(p‖q)``, the limit the theorem gives ``q0`` as K → ∞
  (:func:`benchmarks._compact.symkl_optimum`, forward half on the NUTS draws).

For each: MAE of the posterior mean and std of ``q0`` and of the importance-resampled end
points, the bound (mean of the last 10 % of the losses) and the transport check's verdict
(with the self-check's draw count).
Targets: ``q0`` mean MAE ≤ 1.5 × AutoNormal's and std MAE ≤ 0.5 × AutoNormal's on every seed;
the default's bound no more than 0.2 nats below the bound-only regime's.

Run from the repository root:
``python -m benchmarks.dais0_quickstart [--quick|--smoke] [--steps S]``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer import util as infer_util
from numpyro.infer.autoguide import AutoNormal

from benchmarks._common import (
    Stopwatch,
    markdown_table,
    output_name,
    parse_args,
    quickstart_module,
    write_results,
)
from benchmarks._compact import symkl_optimum
from numpyro_dais import AutoDAIS
from numpyro_dais.annealed.posterior import selfcheck

NAME = "dais0_quickstart"
MODULE = f"benchmarks.{NAME}"
K, N, LR = 8, 8, 1e-2
SETTINGS = {
    "full": dict(seeds=3, steps=3000, nuts=(1000, 10_000), draws=4000, symkl=(4000, 5000)),
    "quick": dict(seeds=2, steps=1500, nuts=(500, 4000), draws=2000, symkl=(2000, 2000)),
    "smoke": dict(seeds=1, steps=30, nuts=(50, 100), draws=100, symkl=(50, 20)),
}


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


def extra_args(parser):
    parser.add_argument("--steps", type=int, help="override the mode's training steps")


DEFAULT = "AutoDAIS (default: DAIS₀ regime)"
LONG = "AutoDAIS (default), 2× steps"
BOUND_ONLY = "AutoDAIS, sym_kl_weight=0"
SYMKL = "symKL* (theorem's K → ∞ limit)"


def symkl_reference(qs, X, y, samples, key, num_draws, num_steps):
    """``(mean, std)`` of :func:`benchmarks._compact.symkl_optimum` on the quick-start model,
    in ``qs.summary``'s order (``b`` then ``w``)."""
    flat = qs.flatten(samples)

    def log_p(z):
        return infer_util.log_density(qs.model, (X, y), {}, {"b": z[0], "w": z[1:]})[0]

    return symkl_optimum(log_p, flat, jnp.zeros(flat.shape[1]), key, num_draws, num_steps)


def main():
    args = parse_args(__doc__.splitlines()[0], extra=extra_args)
    cfg = dict(SETTINGS[args.mode])
    if args.steps:
        cfg["steps"] = args.steps
    stopwatch = Stopwatch()
    qs = quickstart_module()
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
    with stopwatch.lap("symKL*"):
        sym = symkl_reference(qs, X, y, mcmc.get_samples(), jax.random.key(7), *cfg["symkl"])
    sym_errors = tuple(
        float(jnp.mean(jnp.abs(a - b))) for a, b in zip(sym, (ref_mean, ref_std), strict=True)
    )

    def errors(draws):
        mean, std = qs.summary(draws)
        return float(jnp.mean(jnp.abs(mean - ref_mean))), float(jnp.mean(jnp.abs(std - ref_std)))

    # name -> (guide, training steps); LONG is DEFAULT's run continued from its last state
    # for as many steps again, the same updates with the same keys as one run of 2× steps
    guides = {
        "AutoNormal": (lambda: AutoNormal(qs.model), cfg["steps"]),
        DEFAULT: (lambda: AutoDAIS(qs.model, K=K, num_particles=N), cfg["steps"]),
        LONG: (DEFAULT, 2 * cfg["steps"]),
        BOUND_ONLY: (
            lambda: AutoDAIS(qs.model, K=K, num_particles=N, sym_kl_weight=0.0),
            cfg["steps"],
        ),
    }
    results = {}  # (guide, seed) -> dict
    for seed in range(cfg["seeds"]):
        key = jax.random.key(100 + seed)
        fits = {}  # name -> (guide, svi, fit)
        for name, (make, steps) in guides.items():
            with stopwatch.lap(name), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                if make in fits:
                    guide, svi, start = fits[make]
                    more = steps - len(start.losses)
                    fit = svi.run(None, more, X, y, progress_bar=False, init_state=start.state)
                else:
                    guide = make()
                    svi = SVI(qs.model, guide, optax.adam(LR), Trace_ELBO())
                    fit = svi.run(jax.random.key(seed), steps, X, y, progress_bar=False)
            fits[name] = guide, svi, fit
            tail = max(1, steps // 10)
            row = {"bound": float(-np.mean(fit.losses[-tail:]))}
            q0 = guide.sample_posterior(key, fit.params, sample_shape=(cfg["draws"],))
            row["q0"] = errors(q0)
            if isinstance(guide, AutoDAIS):
                end = guide.sample_posterior(
                    key, fit.params, X, y, sample_shape=(cfg["draws"],), method="importance"
                )
                row["end"] = errors(end)
                # the self-check's draw count: its compiled program, and its verdict
                row["check"] = guide.transport_check(
                    key, fit.params, X, y, num_samples=selfcheck.NUM_SAMPLES, warn=False
                )
            if seed == 0:
                row["draws"] = qs.summary(q0)
            results[name, seed] = row
            print(name, seed, {k: row[k] for k in ("bound", "q0", "end") if k in row}, flush=True)

    seeds = range(cfg["seeds"])
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
    rows.append([SYMKL, "—", "—", f"{sym_errors[0]:.4f}", f"{sym_errors[1]:.4f}", "—", "—", "—"])
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

    def span(xs, fmt):
        return f"{fmt.format(min(xs))} – {fmt.format(max(xs))}"

    def ratios(i, name):
        """``name``'s q0 MAE over AutoNormal's (0: mean, 1: std), as a span over seeds."""
        errors = [sym_errors[i] if name == SYMKL else results[name, s]["q0"][i] for s in seeds]
        normal = [results["AutoNormal", s]["q0"][i] for s in seeds]
        return span([e / n for e, n in zip(errors, normal, strict=True)], "{:.2f}")

    def gains(name):
        return span(
            [results[name, s]["bound"] - results[BOUND_ONLY, s]["bound"] for s in seeds], "{:+.3f}"
        )

    targets = markdown_table(
        [
            "check (defaults, every seed)",
            "sym_kl_weight=0 (before)",
            "default (now)",
            f"default, {2 * cfg['steps']} steps",
            "symKL* (limit)",
            "target",
        ],
        [
            [f"q0 {stat} MAE / AutoNormal's"]
            + [ratios(i, g) for g in (BOUND_ONLY, DEFAULT, LONG, SYMKL)]
            + [target]
            for i, (stat, target) in enumerate((("mean", "≤ 1.5"), ("std", "≤ 0.5")))
        ]
        + [
            ["bound − bound of sym_kl_weight=0 (nats)", "0", gains(DEFAULT), gains(LONG)]
            + ["—", "≥ −0.2"],
        ],
    )
    body = "\n\n".join(
        [
            f"Quick-start model, {X.shape[0]} rows, {X.shape[1]} features + intercept; "
            f"K = {K}, N = {N}, {cfg['steps']} Adam steps at lr {LR}, seeds 0–"
            f"{cfg['seeds'] - 1} (the quick-start itself is seed 0). Reference: NUTS, "
            f"{cfg['nuts'][1]} draws after {cfg['nuts'][0]} warm-up. MAE over the 9 "
            f"coefficients; {cfg['draws']} posterior draws per method. AutoNormal's ratios are "
            f"to its own {cfg['steps']}-step fit.",
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
