"""DAIS₀ paper, sec. 5.1 / app. B: mass-covering vs mode-seeking on a bimodal target.

Target ``p = ½N(0, 0.25²I) + ½N(1, 0.25²I)`` in ``d`` dimensions; every ``q`` starts at
``N(½·1, I)`` (mean-field, mean and scale learned); Adam. Methods: VI (``AutoDiagonalNormal``
+ ``Trace_ELBO(num_particles=N)``), IWVI (``RenyiELBO(alpha=0, num_particles=N)``), MSC with 1
and 8 chains (``benchmarks/baselines/msc.py``, lr 1e-4 as in the paper) and DAIS₀(K) (``AutoDAIS``,
``q0`` read off with ``get_posterior``). Reference row ``symKL*``: the mean-field Gaussian that
minimises ``KL(q‖p) + KL(p‖q)`` (the large-K limit of DAIS₀, Zenn & Bamler 2023, Thm. 4.1),
found by deterministic optimisation on fixed draws.
Score: ``E_{z~p}[log q(z)]`` on 1,000 target draws;
class: nearest of {mode 0, midpoint, mode 1} to the mean of ``q`` (distances ``/√d``),
``u`` when the nearest is further than 0.125, ``-`` when the fit is not finite.

Run from the repository root: ``python -m benchmarks.dais0_bimodal [--quick|--smoke]``;
``--dims 1 3 7 --Ks 16 --steps 7500`` replaces the grid (N = 4 only), the K values and the
steps of every method.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, RenyiELBO, Trace_ELBO
from numpyro.infer.autoguide import AutoDiagonalNormal
from numpyro.infer.initialization import init_to_value

from benchmarks._common import (
    Stopwatch,
    fit_svi,
    gaussian_moments,
    markdown_table,
    output_name,
    parse_args,
    write_results,
)
from benchmarks._compact import symkl_optimum
from benchmarks.baselines import msc
from numpyro_dais import AutoDAIS

NAME = "dais0_bimodal"
MODULE = f"benchmarks.{NAME}"
SIGMA = 0.25
LR = 1e-2
MSC_LR = 1e-4
THRESHOLD = 0.125
PAPER_STEPS = 7500

SETTINGS = {
    "full": dict(
        grid={4: tuple(range(1, 16)), 1: (3,)},
        Ks=(2, 4, 8, 16),
        steps=PAPER_STEPS,
        dais_steps=PAPER_STEPS,
        msc_steps=PAPER_STEPS,
        symkl=(4000, 3000),
    ),
    "quick": dict(
        grid={4: (1, 3, 7)},
        Ks=(2, 16),
        steps=1000,
        dais_steps=1000,
        msc_steps=PAPER_STEPS,
        symkl=(4000, 3000),
    ),
    "smoke": dict(grid={2: (2,)}, Ks=(2,), steps=4, dais_steps=4, msc_steps=4, symkl=(50, 20)),
}

SHORTFALL = """\
* A reduced grid (see Settings; the paper: N ∈ {1, 2, 4, 8, 16}): the paper's K and d
  ranges, but N = 4 (its headline) over all d and N = 1 only at d = 3 (its Figure 4).
  Every (method, N, K, d) cell has its own shapes, hence its own XLA compilation, and
  cells cannot be vmapped; the whole grid would take hours on 2 cores.
* A `*` flags cells whose class changed in the second half of training.
* One seed per cell; the classification is automatic (threshold above), not checked by
  hand as in the paper.
* Our AutoDAIS learns a diagonal mass matrix, a momentum damping and K step sizes bounded by
  eta_max (library defaults, set from the curvature); the paper follows Zhang et al. (2021),
  scalar mass c·I.
* MSC at the paper's lr 1e-4: in 7,500 Adam steps a parameter moves by at most about
  0.75, so q hardly leaves its start N(½·1, I) (see the mean σ column); its `c` reflects
  the initialisation at the midpoint more than a fit.
* Figure 4 has no Jensen–Shannon-optimal reference curve (the paper's dashed line)."""

SYMKL_NOTE = """\
`symKL*` is the theorem's limit (K → ∞, transitions that mix): the mean-field Gaussian with the
least `KL(q‖p) + KL(p‖q)`. From d = 3 on it is not at the midpoint: the reverse KL of a broad
`q` over two narrow modes grows faster with d than the forward KL of a `q` nearer one mode,
so the optimum drifts towards a mode (class `u`). The default DAIS₀ regime adds an explicit
symmetrised-KL term whose forward half sees only the modes the N end points reached;
`DAIS0w0` is q0 on the bound alone. Coverage beyond d = 2 is thus beyond the theorem's
limit: where the tables below show it, the finite-K dynamics, not the limit, keep q0 at the
midpoint."""

# AutoDAIS reports "0 of N trajectories diverged" when vmapped (see the results file).
warnings.filterwarnings("ignore", message=r"AutoDAIS: 0 of ")


def model(d):
    """The bimodal target as a NumPyro model with one latent site ``z`` of size ``d``."""
    numpyro.sample("z", bimodal(d))


def bimodal(d):
    locs = jnp.stack([jnp.zeros(d), jnp.ones(d)])
    return dist.MixtureSameFamily(
        dist.Categorical(probs=jnp.full(2, 0.5)), dist.Normal(locs, SIGMA).to_event(1)
    )


def masked_log_p(z, mask):
    """``log p`` over the coordinates where ``mask`` is 1 (padding for the vmapped MSC)."""
    comps = jnp.stack([jnp.sum(mask * dist.Normal(m, SIGMA).log_prob(z)) for m in (0.0, 1.0)])
    return jax.scipy.special.logsumexp(comps) - jnp.log(2.0)


def classify(loc):
    """``c`` (mean at the midpoint), ``s`` (on a mode), ``u`` (neither) or ``-``."""
    loc = np.asarray(loc)
    if not np.all(np.isfinite(loc)):
        return "-"
    d = loc.shape[-1]
    dists = [np.linalg.norm(loc - c) / np.sqrt(d) for c in (0.0, 0.5, 1.0)]
    i = int(np.argmin(dists))
    if dists[i] > THRESHOLD:
        return "u"
    return "c" if i == 1 else "s"


def score(loc, scale, z_target):
    """``E_{z~p}[log q(z)]`` for ``q = N(loc, diag(scale²))``; ``nan`` if not finite."""
    s = float(jnp.mean(dist.Normal(loc, scale).to_event(1).log_prob(z_target)))
    return s if np.isfinite(s) else float("nan")


def fit_numpyro(method, N, K, d, steps, key):
    """Train one numpyro method; returns ``[(loc, scale)]`` at the half-way and final step."""
    init = init_to_value(values={"z": jnp.full(d, 0.5)})
    if method.startswith("DAIS"):
        extra = dict(sym_kl_weight=0.0) if method.startswith("DAIS0w0") else {}
        guide = AutoDAIS(model, K=K, num_particles=N, init_scale=1.0, init_loc_fn=init, **extra)
        loss = Trace_ELBO()
    else:
        guide = AutoDiagonalNormal(model, init_scale=1.0, init_loc_fn=init)
        loss = Trace_ELBO(num_particles=N) if method == "VI" else RenyiELBO(0.0, N)
    svi = SVI(model, guide, optax.adam(LR), loss)
    params, _ = fit_svi(svi, (d,), key[None], steps, num_checkpoints=2)
    out = []
    for c in range(2):
        out.append(
            gaussian_moments(guide.get_posterior(jax.tree.map(lambda x, c=c: x[0, c], params)))
        )
    return out


def symkl_reference(d, key, num_draws, num_steps):
    """:func:`benchmarks._compact.symkl_optimum` on the bimodal target, from ``½·1`` plus
    small noise; returns ``[(loc, scale)]`` twice (no half-way point: not a training run)."""
    k_p, k_init, k_fit = jax.random.split(key, 3)
    init = 0.5 + 0.01 * jax.random.normal(k_init, (d,))
    z_p = bimodal(d).sample(k_p, (num_draws,))
    fit = symkl_optimum(bimodal(d).log_prob, z_p, init, k_fit, num_draws, num_steps)
    return [fit, fit]


def fit_msc_all_dims(N, chains, dims, steps, key):
    """MSC for every ``d`` at once (padded to ``max(dims)`` and vmapped)."""
    D = max(dims)
    masks = jnp.stack([(jnp.arange(D) < d).astype(float) for d in dims])

    def one(mask, k):
        return msc.fit(
            k,
            lambda z: masked_log_p(z, mask),
            jnp.full(D, 0.5),
            1.0,
            num_particles=N,
            num_chains=chains,
            num_steps=steps,
            learning_rate=MSC_LR,
            num_checkpoints=2,
            mask=mask,
        )

    res = jax.jit(jax.vmap(one))(masks, jax.random.split(key, len(dims)))
    return {
        d: [(np.asarray(res.loc[i, c, :d]), np.asarray(res.scale[i, c, :d])) for c in range(2)]
        for i, d in enumerate(dims)
    }


def run_grid(cfg, sw):
    """All fits; returns ``{(method, N, d): [(loc, scale) half-way, (loc, scale) final]}``."""
    fits = {}
    key = jax.random.PRNGKey(0)
    for N, dims in cfg["grid"].items():
        for chains in (1, 8):
            with sw.lap(f"MSC{chains}c"):
                key, sub = jax.random.split(key)
                for d, f in fit_msc_all_dims(N, chains, dims, cfg["msc_steps"], sub).items():
                    fits[(f"MSC{chains}c", N, d)] = f
        for d in dims:
            key, sub = jax.random.split(key)
            fits[("symKL*", N, d)] = symkl_reference(d, sub, *cfg["symkl"])
            for method in ["VI", "IWVI"] + dais_methods(cfg):
                key, sub = jax.random.split(key)
                K = int(method[method.index("(") + 1 : -1]) if method.startswith("DAIS") else 0
                steps = cfg["dais_steps"] if K else cfg["steps"]
                with sw.lap(method.split("(")[0]):
                    fits[(method, N, d)] = fit_numpyro(method, N, K, d, steps, sub)
            print(f"N={N} d={d} done ({sw.elapsed():.0f} s)", flush=True)
    return fits


def dais_methods(cfg):
    """DAIS₀(K) with the library defaults for every K, and ``DAIS0w0(K)`` (``q0`` on the
    bound alone, ``sym_kl_weight=0``) for the largest K."""
    return [f"DAIS0({K})" for K in cfg["Ks"]] + [f"DAIS0w0({max(cfg['Ks'])})"]


def methods(cfg):
    return ["symKL*", "VI", "IWVI", "MSC1c", "MSC8c"] + dais_methods(cfg)


def evaluate(cfg, fits):
    """Scores and classes; a ``*`` marks a class that changed in the second half of training."""
    table = {}
    for N, dims in cfg["grid"].items():
        for d in dims:
            z_target = bimodal(d).sample(jax.random.PRNGKey(1000 + d), (1000,))
            for m in methods(cfg):
                half, final = fits[(m, N, d)]
                cls = classify(final[0])
                moved = "*" if classify(half[0]) != cls else ""
                table[(m, N, d)] = (score(*final, z_target), cls + moved, float(np.mean(final[1])))
    return table


def covered_up_to(table, m, N, dims):
    """Largest ``d`` such that the fit is mass-covering ``c`` at every grid ``d' ≤ d``."""
    best = 0
    for d in dims:
        if table[(m, N, d)][1].rstrip("*") != "c":
            break
        best = d
    return best


def heatmap(cfg, table, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms, grid = methods(cfg), cfg["grid"]
    width = sum(0.5 * len(dims) + 1.5 for dims in grid.values())
    fig, axes = plt.subplots(
        1,
        len(grid),
        figsize=(width + 1, 3.2),
        squeeze=False,
        width_ratios=[len(dims) + 2 for dims in grid.values()],
    )
    for ax, (N, dims) in zip(axes[0], grid.items(), strict=True):
        vals = np.array([[table[(m, N, d)][0] / d for d in dims] for m in ms])
        im = ax.imshow(np.nan_to_num(vals, nan=-10), cmap="viridis", vmin=-4, vmax=0, aspect="auto")
        for i, m in enumerate(ms):
            for j, d in enumerate(dims):
                ax.text(j, i, table[(m, N, d)][1], ha="center", va="center", fontsize=7, color="w")
        ax.set_xticks(range(len(dims)), dims)
        ax.set_yticks(range(len(ms)), ms)
        ax.set_xlabel("d")
        ax.set_title(f"N = {N}")
    fig.colorbar(im, ax=axes[0].tolist(), label="E_p[log q] / d")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def diagonal_plot(cfg, fits, N, d, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.linspace(-0.75, 1.75, 301)
    line = jnp.asarray(t[:, None] * np.ones(d))
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(t, np.exp(bimodal(d).log_prob(line)), "k", lw=2, label="target p")
    for m in ["VI", "IWVI"] + [f"DAIS0({K})" for K in cfg["Ks"]]:
        loc, scale = fits[(m, N, d)][1]
        ax.plot(t, np.exp(dist.Normal(loc, scale).to_event(1).log_prob(line)), label=m)
    ax.set_xlabel("t  (z = t·1)")
    ax.set_ylabel("density")
    ax.set_title(f"density along the diagonal, d = {d}, N = {N}")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def extra_args(parser):
    parser.add_argument("--dims", nargs="+", type=int, help="grid d values (N = 4 only)")
    parser.add_argument("--Ks", nargs="+", type=int, help="AutoDAIS K values")
    parser.add_argument("--steps", type=int, help="training steps of every method")


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv, extra_args)
    cfg = dict(SETTINGS[args.mode])
    if args.dims:
        cfg["grid"] = {4: tuple(args.dims)}
    if args.Ks:
        cfg["Ks"] = tuple(args.Ks)
    if args.steps:
        cfg.update(steps=args.steps, dais_steps=args.steps, msc_steps=args.steps)
    sw = Stopwatch()
    fits = run_grid(cfg, sw)
    table = evaluate(cfg, fits)
    stem = output_name(NAME, args.mode)
    heatmap(cfg, table, args.out_dir / f"{stem}_fig3.png")
    fig4_N = 1 if 1 in cfg["grid"] else next(iter(cfg["grid"]))
    dims = cfg["grid"][fig4_N]
    fig4_d = 3 if 3 in dims else dims[0]
    diagonal_plot(cfg, fits, fig4_N, fig4_d, args.out_dir / f"{stem}_fig4.png")

    sections = []
    for N, dims in cfg["grid"].items():
        rows = [
            [m] + ["{:.1f} {} ({:.2f})".format(*table[(m, N, d)]) for d in dims]
            for m in methods(cfg)
        ]
        sections.append(
            f"### N = {N}: E_p[log q], class (mean σ of q)\n\n"
            + markdown_table(["method"] + [f"d={d}" for d in dims], rows)
        )
    summary = [
        [m] + [covered_up_to(table, m, N, dims) for N, dims in cfg["grid"].items()]
        for m in methods(cfg)
    ]
    summary_md = markdown_table(["method"] + [f"N={N}" for N in cfg["grid"]], summary)
    print("\n\n".join(sections))
    print("\nMass-covering at every grid d up to (0: not even at the smallest d):\n" + summary_md)
    settings = (
        "Grid: "
        + "; ".join(f"N = {N}: d ∈ {dims}" for N, dims in cfg["grid"].items())
        + f"; K ∈ {cfg['Ks']}; one seed per cell. "
        f"Adam lr {LR}: VI and IWVI {cfg['steps']} steps, DAIS₀ {cfg['dais_steps']} steps; "
        f"MSC Adam lr {MSC_LR}, {cfg['msc_steps']} steps (the paper: 7,500 steps for all, "
        "MSC lr 1e-4). AutoDAIS: HMC kernel, library defaults (DAIS₀ regime, "
        "sym_kl_weight 1 (DAIS0w0: sym_kl_weight 0, q0 on the bound alone); "
        "eta_max = 1/√λ from the curvature λ at the initial point, "
        "eta_init = eta_max/10; gamma_init 0.9, learned diagonal mass, learned schedule), "
        "init_scale 1, loc ½·1.\n\n"
        f"Class: `c` mean at the midpoint, `s` on a mode, `u` neither (nearest further than "
        f"{THRESHOLD}·√d), `-` not finite; a `*` marks a class that differs from the class "
        "at half the steps (the fit was still moving)."
    )
    body = "\n\n".join(
        [
            "## Settings",
            settings,
            "## Headline check",
            "Paper (N = 4): DAIS₀(16) mass-covering up to d = 7, VI "
            "and IWVI collapse onto one mode after d = 1 and d = 2.\n\n"
            + SYMKL_NOTE
            + "\n\nOurs, largest grid d up to which every fit is `c` "
            "(a `*` counts as its final class):\n\n" + summary_md,
            "## Tables",
            *sections,
            "## Figures",
            f"* `{stem}_fig3.png`: heat map (colour E_p[log q]/d, letters: class)\n"
            f"* `{stem}_fig4.png`: densities along the diagonal, d = {fig4_d}, N = {fig4_N}",
            "## Where we fall short of the paper (by construction)",
            SHORTFALL,
        ]
    )
    path = write_results(
        args.out_dir,
        NAME,
        args.mode,
        "DAIS₀ paper, bimodal target (sec. 5.1, Figures 3–4)",
        MODULE,
        body,
        sw,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
