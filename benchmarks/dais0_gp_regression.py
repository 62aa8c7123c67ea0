"""DAIS₀ paper, sec. 5.2 / app. C, Table 1 and Figure 5: GP regression vs the analytic posterior.

75 grid points on [0, 10]; RBF kernel ``exp(−(t−s)²/(2ρ²))``, RBF₁ ρ = 0.8, RBF₂ ρ = 3.0;
``f ~ GP(0, k)`` drawn once per setting, ``d`` observed positions drawn at random,
``y ~ N(f_I, 0.1·I)``. The latent is ``f_I`` (``d``-dimensional); every ``q`` is mean-field
and starts at ``N(0, I)``. MAE of the mean and of the std of ``q`` (or of the samples)
against the analytic posterior marginals, mean ± std over training seeds (data fixed).

Run from the repository root: ``python -m benchmarks.dais0_gp_regression [--quick|--smoke]``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer.initialization import init_to_value

from benchmarks._common import (
    Stopwatch,
    markdown_table,
    output_name,
    parse_args,
    sci,
    write_results,
)
from benchmarks._compact import fit_compact_methods, mae

NAME = "dais0_gp_regression"
MODULE = f"benchmarks.{NAME}"
GRID = np.linspace(0.0, 10.0, 75)
NOISE_VAR = 0.1
# Added to the prior covariance (the paper does not state its jitter). With 1e-6 the
# smooth kernels make the posterior precision's eigenvalues reach 1e6 in directions that are
# not axis-aligned: the reparameterisation noise of a mean-field q then swamps the gradient
# of its mean, and no method's mean converged in 20,000 steps (MAE 0.04–1.0; see
# results/dais0_gp_regression_jitter1e-06.md). 1e-3 (condition number ~100) is the smallest
# of 1e-6, 1e-4, 1e-3, 1e-2 at which IWVI's mean reaches the 1e-2 level in that budget.
JITTER = 1e-3
LR = 1e-3
N_PARTICLES = 16
K = 16
RHO = {"RBF1": 0.8, "RBF2": 3.0}
METHODS = ("IWVI", "IWVI_SIR", "DAIS0(16)", "DAIS(16)", "MSC8c")

# Table 1 of the paper: (mean MAE, std MAE) per method.
PAPER = {
    ("RBF1", 10): {
        "IWVI": (5.60e-4, 4.34e-2),
        "IWVI_SIR": (2.83e-4, 3.50e-2),
        "DAIS0(16)": (1.77e-3, 4.54e-3),
        "DAIS(16)": (7.72e-3, 3.03e-3),
        "MSC8c": (1.74e-2, 3.66e-2),
    },
    ("RBF1", 25): {
        "IWVI": (3.57e-4, 3.83e-2),
        "IWVI_SIR": (4.17e-5, 3.62e-2),
        "DAIS0(16)": (9.58e-4, 1.03e-2),
        "DAIS(16)": (1.39e-2, 2.16e-2),
        "MSC8c": (1.14e-2, 3.77e-2),
    },
    ("RBF2", 10): {
        "IWVI": (1.77e-3, 2.54e-3),
        "IWVI_SIR": (4.00e-5, 9.71e-3),
        "DAIS0(16)": (2.44e-3, 6.72e-3),
        "DAIS(16)": (9.64e-4, 4.50e-4),
        "MSC8c": (1.57e-3, 7.85e-4),
    },
    ("RBF2", 25): {
        "IWVI": (5.21e-4, 4.14e-2),
        "IWVI_SIR": (1.11e-4, 3.81e-2),
        "DAIS0(16)": (1.15e-3, 1.31e-2),
        "DAIS(16)": (1.99e-2, 1.34e-2),
        "MSC8c": (2.16e-2, 4.07e-2),
    },
}

SETTINGS = {
    "full": dict(
        settings=(("RBF1", 10), ("RBF1", 25), ("RBF2", 10), ("RBF2", 25)),
        seeds=3,
        steps=50_000,
        dais_draws=100_000,
        sir=(1000, 1000),
    ),
    "quick": dict(
        settings=(("RBF1", 10), ("RBF2", 25)),
        seeds=2,
        steps=3000,
        dais_draws=10_000,
        sir=(1000, 1000),
    ),
    "smoke": dict(settings=(("RBF1", 10),), seeds=1, steps=4, dais_draws=100, sir=(20, 20)),
}

# AutoDAIS reports "0 of N trajectories diverged" when vmapped (see the results file).
warnings.filterwarnings("ignore", message=r"AutoDAIS: 0 of ")


SHORTFALL = """\
* The paper's 50,000 steps at lr 1e-3 in full mode (quick mode: far fewer, not converged):
  Adam's noise floor still shows at the 1e-3 level of these MAEs.
* Our own data draw (ground truth, positions, noise) per setting: the paper's draws are not
  published, so individual MAEs are comparable in order of magnitude, not digit by digit.
  The seeds vary the training only, not the data.
* Our AutoDAIS learns a diagonal mass matrix, a momentum damping and K step sizes bounded by
  eta_max = min(0.1, 1/sqrt(λ_max)) of the posterior precision (about 0.03 here, see
  `step_size_bounds`); the paper follows Zhang et al. (2021).
* Prior jitter 1e-3 (the paper does not state its own; see `JITTER`). It changes the
  posterior a little (all MAEs are against the analytic posterior of the same model) and
  the conditioning a lot: with 1e-6 no method's mean converged
  (`dais0_gp_regression_jitter1e-06.md`)."""


def rbf(t, s, rho):
    return np.exp(-((t[:, None] - s[None, :]) ** 2) / (2 * rho**2))


def make_data(kernel, d, seed=0, jitter=JITTER):
    """Ground truth ``f`` on the grid, observed indices, ``y``, prior covariance on them."""
    rng = np.random.default_rng([seed, d, int(RHO[kernel] * 10)])
    K_gg = rbf(GRID, GRID, RHO[kernel]) + jitter * np.eye(GRID.size)
    f = np.linalg.cholesky(K_gg) @ rng.standard_normal(GRID.size)
    idx = np.sort(rng.choice(GRID.size, size=d, replace=False))
    y = f[idx] + np.sqrt(NOISE_VAR) * rng.standard_normal(d)
    return dict(f=f, idx=idx, y=y, K_oo=K_gg[np.ix_(idx, idx)], K_go=K_gg[:, idx], K_gg=K_gg)


def analytic_posterior(data):
    """Mean and covariance of ``p(f_I | y)`` (eqs. 43–44 of the paper)."""
    K_oo = data["K_oo"]
    gain = K_oo @ np.linalg.inv(K_oo + NOISE_VAR * np.eye(len(K_oo)))
    return gain @ data["y"], K_oo - gain @ K_oo


def model(K_oo, y):
    f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(len(y)), K_oo))
    numpyro.sample("y", dist.Normal(f, np.sqrt(NOISE_VAR)), obs=y)


def train(cfg, data, key):
    """All methods on one data set; returns ``{method: (means (S, d), stds (S, d))}``."""
    d = len(data["y"])
    args = (jnp.asarray(data["K_oo"]), jnp.asarray(data["y"]))
    init = init_to_value(values={"f": jnp.zeros(d)})
    keys = (*jax.random.split(key, 4), jax.random.fold_in(key, 7))
    return fit_compact_methods(
        model,
        args,
        "f",
        init,
        1.0,
        cfg,
        keys,
        K=K,
        num_particles=N_PARTICLES,
        lr=LR,
        dais_batch_size=10_000,
        dais_kwargs=step_size_bounds(data),
    )


def step_size_bounds(data):
    """Leapfrog is stable for ``η < 2 / sqrt(λ_max)`` of the posterior precision; the jitter
    of a smooth GP prior makes ``λ_max`` about 1 / jitter here (1e3; 1e6 with jitter 1e-6,
    where the library's default cap, 0.1, diverges on the first step). Cap at
    ``1 / sqrt(λ_max)``, start at a tenth of it (the defaults' ratio)."""
    _, cov = analytic_posterior(data)
    lam_max = float(np.linalg.eigvalsh(np.linalg.inv(cov)).max())
    eta_max = min(0.1, 1.0 / np.sqrt(lam_max))
    return dict(eta_max=eta_max, eta_init=eta_max / 10)


def predictive(data, mean, cov):
    """Mean and std on the whole grid given ``f_I ~ N(mean, cov)`` (eq. 42)."""
    A = data["K_go"] @ np.linalg.inv(data["K_oo"])
    cov_g = A @ cov @ A.T + data["K_gg"] - A @ data["K_go"].T
    return A @ mean, np.sqrt(np.clip(np.diag(cov_g), 0.0, None))


def figure5(panels, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"IWVI": "tab:red", "DAIS0(16)": "tab:blue", "MSC8c": "goldenrod"}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.4), squeeze=False)
    for ax, (title, data, (m_post, S_post), fits) in zip(axes[0], panels, strict=True):
        m, s = predictive(data, m_post, np.diag(np.diag(S_post)))
        ax.fill_between(GRID, m - 1.96 * s, m + 1.96 * s, color="0.85", label="analytic (diag.)")
        ax.plot(GRID, m, "k", lw=1.5, label="analytic mean")
        for name, c in colors.items():
            mean, std = fits[name][0][0], fits[name][1][0]
            mq, sq = predictive(data, mean, np.diag(std**2))
            ax.plot(GRID, mq + 1.96 * sq, color=c, lw=1, label=name)
            ax.plot(GRID, mq - 1.96 * sq, color=c, lw=1)
        ax.plot(GRID[data["idx"]], data["y"], "k.", ms=4, label="data")
        ax.set_title(title)
        ax.set_xlabel("t")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def extra_args(parser):
    parser.add_argument("--steps", type=int, help="override the mode's training steps")
    parser.add_argument("--seeds", type=int, help="override the mode's number of seeds")
    parser.add_argument(
        "--jitter",
        type=float,
        default=JITTER,
        help=f"added to the prior covariance (default {JITTER}); another value writes "
        "its own results file",
    )


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv, extra_args)
    cfg = dict(SETTINGS[args.mode])
    cfg["steps"] = args.steps or cfg["steps"]
    cfg["seeds"] = args.seeds or cfg["seeds"]
    sw = Stopwatch()
    rows, headline, panels = [], [], []
    for i, (kernel, d) in enumerate(cfg["settings"]):
        data = make_data(kernel, d, jitter=args.jitter)
        m_post, S_post = analytic_posterior(data)
        s_post = np.sqrt(np.diag(S_post))
        with sw.lap(f"{kernel}, d={d}"):
            fits = train(cfg, data, jax.random.PRNGKey(i))
        errs = {m: (mae(fits[m][0], m_post), mae(fits[m][1], s_post)) for m in METHODS}
        for j, stat in enumerate(("mean", "std")):
            row = [f"{kernel}, {d}", stat]
            for m in METHODS:
                e = errs[m][j]
                row.append(f"{sci(e.mean())} ±{sci(e.std(), 1)} ({sci(PAPER[(kernel, d)][m][j])})")
            rows.append(row)
        compact = ("IWVI", "DAIS0(16)", "MSC8c")
        best = min(compact, key=lambda m: errs[m][1].mean())
        ratio = errs["IWVI"][1].mean() / errs["DAIS0(16)"][1].mean()
        paper = PAPER[(kernel, d)]["IWVI"][1] / PAPER[(kernel, d)]["DAIS0(16)"][1]
        headline.append(
            f"* {kernel}, d = {d}: best compact std MAE: {best}; std MAE ratio "
            f"IWVI ÷ DAIS₀ {ratio:.2f} (paper {paper:.2f})"
        )
        if (kernel, d) in (("RBF1", 10), ("RBF2", 25)):
            panels.append((f"{kernel}, d = {d}", data, (m_post, S_post), fits))
        print(f"{kernel} d={d} done ({sw.elapsed():.0f} s)", flush=True)
    name = NAME if args.jitter == JITTER else f"{NAME}_jitter{args.jitter:.0e}"
    stem = output_name(name, args.mode)
    if panels:
        figure5(panels, args.out_dir / f"{stem}_fig5.png")
    table = markdown_table(["setting", "MAE"] + [f"{m} ours (paper)" for m in METHODS], rows)
    print(table)
    print("\n".join(headline))
    draws, props = cfg["sir"]
    settings = (
        f"Prior jitter {args.jitter:g} (see `JITTER`). "
        f"N = {N_PARTICLES}, K = {K}, Adam lr {LR}, {cfg['steps']} steps (paper: 50,000), "
        f"{cfg['seeds']} training seeds on one data set per setting (data seed fixed). "
        "IWVI: AutoDiagonalNormal + RenyiELBO(alpha=0, num_particles=16). IWVI_SIR: "
        f"{draws} draws, each resampled from {props} proposals of the trained IWVI q "
        "(paper: 10³ × 10³). DAIS₀(16): AutoDAIS (HMC, step sizes capped at "
        "1/sqrt(λ_max) of the posterior precision, library defaults for mass and damping; "
        "init N(0, I)), q0 via get_posterior. DAIS(16): "
        f"{cfg['dais_draws']} end points z_K of the same trained guide "
        "(sample_posterior(method='dais'); paper: 10⁵). MSC8c: benchmarks/baselines/msc.py, CIS "
        f"kernel with {N_PARTICLES} particles, 8 chains, Adam lr {LR}."
    )
    body = "\n\n".join(
        [
            "## Settings",
            settings,
            "## Table 1: MAE against the analytic posterior, ours ± std over seeds (paper)",
            table,
            "## Headline check",
            "Paper: among compact methods DAIS₀ has the best std MAE in 3 "
            "of 4 settings (3–9× better than IWVI).\n\n" + "\n".join(headline),
            "## Figure",
            f"* `{stem}_fig5.png`: 97.5% bands of the predictive on [0, 10] (eq. 42 "
            "of the paper) for the analytic posterior with its covariance diagonalised (grey), "
            "IWVI, DAIS₀ and MSC8c (first seed), for RBF₁ d = 10 and RBF₂ d = 25.",
            "## Where we fall short of the paper (by construction)",
            SHORTFALL,
        ]
    )
    path = write_results(
        args.out_dir,
        name,
        args.mode,
        "DAIS₀ paper, GP regression (sec. 5.2, Table 1, Figure 5)",
        MODULE,
        body,
        sw,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
