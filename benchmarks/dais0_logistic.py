"""DAIS₀ paper, sec. 5.3 / app. D, Table 2: Bayesian logistic regression against NUTS.

The paper's data sets (sonar, ionosphere, heart disease, heart attack, loan) are not
available offline; we use scikit-learn's bundled binary problems instead (see ``DATASETS``),
features standardised, plus an intercept column. Model: ``w ~ N(0, I)``,
``y ~ Bernoulli(sigmoid(X w))``; every ``q`` is mean-field, starts at ``N(0, 0.1² I)``.
Reference: NUTS (numpyro). MAE of the mean and std of each method against the NUTS mean
and std, mean ± std over training seeds.

Run from the repository root: ``python -m benchmarks.dais0_logistic [--quick|--smoke]``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.initialization import init_to_value

from benchmarks._common import (
    Stopwatch,
    fit_svi,
    log_joint_fn,
    markdown_table,
    output_name,
    parse_args,
    sci,
    write_results,
)
from benchmarks._compact import fit_compact_methods, mae, symkl_optimum

NAME = "dais0_logistic"
MODULE = f"benchmarks.{NAME}"
LR = 1e-3
N_PARTICLES = 16
K = 16
INIT_SCALE = 0.1
METHODS = ("symKL*", "AutoNormal", "IWVI", "IWVI_SIR", "DAIS0(16)", "DAIS(16)", "MSC8c")

SETTINGS = {
    "full": dict(
        datasets=("breast_cancer", "wine", "iris", "digits_3v8"),
        seeds=3,
        steps=10_000,
        nuts=(1000, 5000, 2),
        dais_draws=10_000,
        sir=(1000, 1000),
        symkl=(4000, 3000),
    ),
    "quick": dict(
        datasets=("breast_cancer", "iris"),
        seeds=2,
        steps=2000,
        nuts=(500, 2000, 1),
        dais_draws=2000,
        sir=(500, 500),
        symkl=(2000, 1000),
    ),
    "smoke": dict(
        datasets=("iris",),
        seeds=1,
        steps=4,
        nuts=(20, 20, 1),
        dais_draws=50,
        sir=(20, 20),
        symkl=(50, 20),
    ),
}

# AutoDAIS reports "0 of N trajectories diverged" when vmapped (see the results file).
warnings.filterwarnings("ignore", message=r"AutoDAIS: 0 of ")


SHORTFALL = """\
* Different data: the paper's five UCI/Kaggle sets are not available offline, so the
  numbers are not comparable with the paper's one to one; compare the ranking of methods.
* Far fewer steps than the paper's 100,000 (see Settings): the fits may not have converged,
  which hurts the methods that converge slowest (DAIS₀/DAIS train K = 16 transitions'
  parameters too) and MSC (forward KL, high-variance gradients).
* Reference: NUTS (adaptive) instead of the paper's fixed-step HMC; stds of the reference
  carry Monte Carlo error of order std/√ESS.
* Our AutoDAIS learns a diagonal mass matrix, a momentum damping and K step sizes bounded by
  eta_max = 0.1 (library defaults); the paper follows Zhang et al. (2021).
* Initial scale 0.1 for every q (the paper does not state it)."""


SYMKL_NOTE = """\
`symKL*` is a reference, not a method: the mean-field Gaussian minimising
KL(q‖p) + KL(p‖q), the limit DAIS₀ approaches as K → ∞ with transitions that mix
(Thm. 4.1 of the paper), found by deterministic optimisation on the NUTS draws (forward half)
and 4000 fixed reparameterised draws (reverse half). The forward-KL limit of MSC is the
exact marginal means and stds (MAE 0 against the reference): a converged MSC beats every
symmetrised-KL fit on std MAE, so DAIS₀ can lead the compact methods only where MSC has not
converged."""


def load(name):
    """``(X with intercept, y)`` for one bundled binary problem (see ``DATASETS``)."""
    from sklearn import datasets

    if name == "breast_cancer":
        X, y = datasets.load_breast_cancer(return_X_y=True)
    elif name == "wine":  # class 0 vs classes 1, 2
        X, y = datasets.load_wine(return_X_y=True)
        y = (y == 0).astype(int)
    elif name == "iris":  # versicolor vs virginica (setosa is separable)
        X, y = datasets.load_iris(return_X_y=True)
        X, y = X[y > 0], (y[y > 0] == 2).astype(int)
    elif name == "digits_3v8":  # 8×8 digits, 3 vs 8, constant pixels dropped
        X, y = datasets.load_digits(return_X_y=True)
        keep = (y == 3) | (y == 8)
        X, y = X[keep], (y[keep] == 8).astype(int)
        X = X[:, X.std(0) > 0]
    else:
        raise ValueError(name)
    X = (X - X.mean(0)) / X.std(0)
    return np.hstack([X, np.ones((len(X), 1))]).astype(np.float32), y.astype(np.float32)


DATASETS = {
    "breast_cancer": "load_breast_cancer, malignant vs benign",
    "wine": "load_wine, class 0 vs classes 1–2",
    "iris": "load_iris, versicolor vs virginica",
    "digits_3v8": "load_digits, digit 3 vs digit 8, constant pixels dropped",
}


def model(X, y):
    w = numpyro.sample("w", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def reference(X, y, cfg, key):
    warmup, samples, chains = cfg["nuts"]
    mcmc = MCMC(
        NUTS(model),
        num_warmup=warmup,
        num_samples=samples,
        num_chains=chains,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(key, X, y)
    return mcmc.get_samples()["w"]


def train(cfg, X, y, key):
    """All methods on one data set; returns ``{method: (means (S, D), stds (S, D))}``."""
    D, seeds = X.shape[1], cfg["seeds"]
    args = (jnp.asarray(X), jnp.asarray(y))
    init = init_to_value(values={"w": jnp.zeros(D)})
    keys = jax.random.split(key, 6)
    out = {}

    normal = AutoNormal(model, init_scale=INIT_SCALE, init_loc_fn=init)
    svi = SVI(model, normal, optax.adam(LR), Trace_ELBO(num_particles=N_PARTICLES))
    params, _ = fit_svi(svi, args, jax.random.split(keys[0], seeds), cfg["steps"])
    out["AutoNormal"] = (
        np.asarray(params["w_auto_loc"][:, -1]),
        np.asarray(params["w_auto_scale"][:, -1]),
    )

    out.update(
        fit_compact_methods(
            model,
            args,
            "w",
            init,
            INIT_SCALE,
            cfg,
            keys[1:],
            K=K,
            num_particles=N_PARTICLES,
            lr=LR,
            dais_batch_size=1000,
        )
    )
    return out


def std_figure(name, ref_std, fits, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "AutoNormal": "tab:green",
        "IWVI": "tab:red",
        "DAIS0(16)": "tab:blue",
        "MSC8c": "goldenrod",
    }
    fig, ax = plt.subplots(figsize=(7, 3))
    idx = np.arange(len(ref_std))
    ax.plot(idx, ref_std, "k--", lw=1.5, label="NUTS")
    for m, c in colors.items():
        ax.plot(idx, fits[m][1][0], color=c, lw=1, label=m)
    ax.set_xlabel("weight index")
    ax.set_ylabel("posterior std")
    ax.set_title(f"{name}: posterior standard deviations (first seed)")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def extra_args(parser):
    parser.add_argument(
        "--datasets", nargs="+", choices=sorted(DATASETS), help="override the mode's data sets"
    )
    parser.add_argument("--steps", type=int, help="override the mode's training steps")


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv, extra_args)
    cfg = dict(SETTINGS[args.mode])
    if args.datasets:
        cfg["datasets"] = tuple(args.datasets)
    if args.steps:
        cfg["steps"] = args.steps
    sw = Stopwatch()
    stem = output_name(NAME, args.mode)
    rows, best = [], []
    for i, name in enumerate(cfg["datasets"]):
        X, y = load(name)
        with sw.lap(f"NUTS {name}"):
            w_ref = reference(X, y, cfg, jax.random.PRNGKey(100 + i))
        ref_mean, ref_std = np.asarray(w_ref.mean(0)), np.asarray(w_ref.std(0))
        with sw.lap(f"training {name}"):
            fits = train(cfg, X, y, jax.random.PRNGKey(i))
        log_p = log_joint_fn(model, (jnp.asarray(X), jnp.asarray(y)), "w")
        loc, scale = symkl_optimum(
            log_p, w_ref, jnp.zeros(X.shape[1]), jax.random.PRNGKey(200 + i), *cfg["symkl"]
        )
        fits["symKL*"] = (loc[None], scale[None])
        errs = {m: (mae(fits[m][0], ref_mean), mae(fits[m][1], ref_std)) for m in METHODS}
        for j, stat in enumerate(("mean", "std")):
            rows.append(
                [f"{name} ({X.shape[0]}×{X.shape[1]})", stat]
                + [
                    sci(e.mean()) if len(e) == 1 else f"{sci(e.mean())} ±{sci(e.std(), 1)}"
                    for e in (errs[m][j] for m in METHODS)
                ]
            )
        compact = ("AutoNormal", "IWVI", "DAIS0(16)", "MSC8c")
        best.append(
            f"* {name}: lowest std MAE among compact methods: "
            f"{min(compact, key=lambda m: errs[m][1].mean())}; over all: "
            f"{min(METHODS[1:], key=lambda m: errs[m][1].mean())}; DAIS₀ "
            f"{sci(errs['DAIS0(16)'][1].mean())} against its K → ∞ limit symKL* "
            f"{sci(errs['symKL*'][1].mean())}"
        )
        std_figure(name, ref_std, fits, args.out_dir / f"{stem}_{name}_std.png")
        print(f"{name} done ({sw.elapsed():.0f} s)", flush=True)
    table = markdown_table(["data set (n×D)", "MAE"] + list(METHODS), rows)
    print(table)
    print("\n".join(best))
    warmup, samples, chains = cfg["nuts"]
    settings = (
        "Data sets (scikit-learn, bundled, standardised, plus intercept): "
        + "; ".join(f"`{k}` = {v}" for k, v in DATASETS.items() if k in cfg["datasets"])
        + f".\n\nReference: NUTS, {chains} chain(s) × ({warmup} warm-up + {samples} draws). "
        f"N = {N_PARTICLES}, K = {K}, Adam lr {LR}, {cfg['steps']} steps (paper: 100,000), "
        f"{cfg['seeds']} seeds, init N(0, {INIT_SCALE}² I). AutoNormal: "
        f"Trace_ELBO(num_particles={N_PARTICLES}). IWVI: AutoDiagonalNormal + "
        f"RenyiELBO(alpha=0, num_particles={N_PARTICLES}). IWVI_SIR: {cfg['sir'][0]} draws "
        f"each resampled from {cfg['sir'][1]} proposals of the IWVI q. DAIS₀(16): AutoDAIS "
        "(HMC, library defaults), q0 via get_posterior. DAIS(16): "
        f"{cfg['dais_draws']} end points of the same guide. MSC8c: benchmarks/baselines/msc.py, "
        f"CIS kernel with {N_PARTICLES} particles, 8 chains, Adam lr {LR}.\n\n" + SYMKL_NOTE
    )
    paper = markdown_table(
        ["data set (d)", "MAE", "IWVI", "IWVI_SIR", "DAIS0(16)", "DAIS(16)", "MSC8c"],
        [
            ["sonar (61)", "mean", "8.66e-2", "8.86e-2", "8.58e-2", "1.10e-1", "1.33e-1"],
            ["", "std", "7.95e-2", "8.26e-2", "**4.27e-2**", "6.23e-2", "7.26e-2"],
            ["ionosphere (35)", "mean", "4.39e-2", "7.18e-2", "4.34e-2", "1.06e-1", "2.14e-1"],
            ["", "std", "4.73e-2", "8.34e-2", "**3.25e-2**", "7.64e-2", "8.55e-2"],
            ["heart disease (16)", "mean", "2.16e-2", "2.30e-2", "2.26e-2", "2.22e-2", "3.37e-1"],
            ["", "std", "2.59e-2", "2.67e-2", "**1.08e-2**", "1.18e-2", "2.81e-2"],
            ["heart attack (14)", "mean", "5.05e-2", "4.81e-2", "4.68e-2", "4.67e-2", "1.75e-1"],
            ["", "std", "2.80e-2", "3.11e-2", "3.35e-2", "3.28e-2", "7.41e-2"],
            ["loan (12)", "mean", "1.67e-2", "2.38e-2", "2.02e-2", "2.06e-2", "1.76e-1"],
            ["", "std", "9.23e-3", "1.14e-2", "1.28e-2", "1.32e-2", "5.08e-2"],
        ],
    )
    body = "\n\n".join(
        [
            "## Settings",
            settings,
            "## Table 2 (substitute data sets): MAE against NUTS, ours ± std over seeds",
            table,
            "## The paper's Table 2 (other data sets, for shape only)",
            paper,
            "## Headline check",
            "Paper: DAIS₀ has the lowest std MAE on 3 of 5 data sets.\n\n" + "\n".join(best),
            "## Figures",
            "\n".join(
                f"* `{stem}_{n}_std.png`: posterior stds per weight vs NUTS"
                for n in cfg["datasets"]
            ),
            "## Where we fall short of the paper (by construction)",
            SHORTFALL,
        ]
    )
    path = write_results(
        args.out_dir,
        NAME,
        args.mode,
        "DAIS₀ paper, Bayesian logistic regression (sec. 5.3, Table 2)",
        MODULE,
        body,
        sw,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
