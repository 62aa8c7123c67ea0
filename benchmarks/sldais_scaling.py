"""SL-DAIS scaling benchmark: time per SVI step against the data size, and the ELBO.

Synthetic logistic regression (offline substitute for the paper's UCI sets,
reproduction-targets.md): features with one common factor, ``x_n = sqrt(ρ) c_n 1 +
sqrt(1 − ρ) e_n`` with ``c_n ~ N(0, 1)``, ``e_n ~ N(0, I_28)`` (pairwise correlation
``ρ = 0.9`` by default, ``--rho``; real features such as Higgs/SUSY are correlated, which
is what a mean-field guide cannot fit), ``θ* ~ N(0, I_28) · 2 / sqrt(28)``,
``y_n ~ Bernoulli(sigmoid(x_n · θ*))``; model
``θ ~ N(0, I_28)`` with the likelihood in ``numpyro.plate("N", Nd, subsample_size=B)``.

Guides: SL-DAIS (RAND surrogate, ``N_s = 256``, ``K = 8``), NS-DAIS (``B = 256``, ``K = 8``),
full-data AutoDAIS (``K = 8`` and ``K = 2``) and AutoNormal (``B = 256``). Step time: jitted
``svi.update``, warm, median of repeats. ELBO: after ``--steps`` Adam steps, estimated on
the *full* data (no subsampling) from ``--elbo-draws`` draws.

Reference: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling", Sec. 7.3 and Fig. 3.

Usage: ``python benchmarks/sldais_scaling.py [--quick]``
"""

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.initialization import init_to_median

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks._common import machine_line, time_steps  # noqa: E402
from numpyro_dais import AutoDAIS, AutoSurrogateLikelihoodDAIS  # noqa: E402

D, B, NUM_SURROGATE = 28, 256, 256
RHO = 0.9  # correlation between any two features
INIT = dict(init_loc_fn=init_to_median, init_scale=0.01)
DAIS_STEP = dict(eta_init=0.002, eta_max=0.05)


def make_data(num_data, seed=0, rho=RHO):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=D) * 2.0 / np.sqrt(D)
    common = rng.normal(size=(num_data, 1))
    X = np.sqrt(rho) * common + np.sqrt(1 - rho) * rng.normal(size=(num_data, D))
    X = X.astype(np.float32)
    Y = (rng.uniform(size=num_data) < 1.0 / (1.0 + np.exp(-X @ theta))).astype(np.float32)
    return jnp.asarray(X), jnp.asarray(Y)


def logistic(X, Y, subsample_size=None):
    theta = numpyro.sample("theta", dist.Normal(jnp.zeros(D), 1.0).to_event(1))
    with numpyro.plate("N", X.shape[0], subsample_size=subsample_size):
        X_batch = numpyro.subsample(X, event_dim=1)
        Y_batch = numpyro.subsample(Y, event_dim=0)
        numpyro.sample("obs", dist.Bernoulli(logits=X_batch @ theta), obs=Y_batch)


SUBSAMPLED = partial(logistic, subsample_size=B)

GUIDES = {
    "SL-DAIS K=8": lambda: (
        SUBSAMPLED,
        AutoSurrogateLikelihoodDAIS(
            SUBSAMPLED, K=8, num_surrogate=NUM_SURROGATE, **INIT, **DAIS_STEP
        ),
    ),
    "NS-DAIS K=8": lambda: (
        SUBSAMPLED,
        AutoSurrogateLikelihoodDAIS(SUBSAMPLED, K=8, dynamics="naive", **INIT, **DAIS_STEP),
    ),
    "DAIS K=8 (full data)": lambda: (logistic, AutoDAIS(logistic, K=8, **INIT, **DAIS_STEP)),
    "DAIS K=2 (full data)": lambda: (logistic, AutoDAIS(logistic, K=2, **INIT, **DAIS_STEP)),
    "AutoNormal": lambda: (SUBSAMPLED, AutoNormal(SUBSAMPLED, **INIT)),
}
TIMED = ["SL-DAIS K=8", "NS-DAIS K=8", "DAIS K=8 (full data)", "AutoNormal"]


def step_time(name, X, Y, repeats, budget_s=0.2):
    """Median seconds per jitted ``svi.update`` step, warm."""
    model, guide = GUIDES[name]()
    svi = SVI(model, guide, optax.adam(1e-3), Trace_ELBO())
    state = svi.init(jax.random.key(0), X, Y)
    update = jax.jit(svi.update)

    def step(s):
        return update(s, X, Y)

    one = time_steps(step, state, 1, 1)  # compiles, then sizes blocks to ~budget_s
    return time_steps(step, state, repeats, max(1, int(budget_s / one)))


def train_and_score(name, X, Y, steps, draws):
    """Train ``steps`` Adam steps (lr 1e-2, then 1e-3 for the second half); return the
    full-data ELBO (mean, standard error) from ``draws`` single-draw estimates."""
    model, guide = GUIDES[name]()
    schedule = optax.piecewise_constant_schedule(1e-2, {steps // 2: 0.1})
    svi = SVI(model, guide, optax.adam(schedule), Trace_ELBO())
    params = svi.run(jax.random.key(1), steps, X, Y, progress_bar=False).params
    # lax.map, not vmap: under vmap the guides' divergence check calls back per draw
    loss = lambda key: Trace_ELBO().loss(key, params, logistic, guide, X, Y)
    elbo = -jax.jit(partial(jax.lax.map, loss))(jax.random.split(jax.random.key(2), draws))
    elbo = np.asarray(elbo)
    return float(elbo.mean()), float(elbo.std() / np.sqrt(elbo.size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, steps, draws")
    parser.add_argument("--steps", type=int, default=None, help="training steps for the ELBO")
    parser.add_argument("--elbo-draws", type=int, default=None)
    parser.add_argument("--rho", type=float, default=RHO, help="feature correlation")
    args = parser.parse_args()
    quick = args.quick
    sizes = [10**4, 10**5, 10**6]
    repeats = 3 if quick else 7
    elbo_nd = 10**4 if quick else 10**5
    steps = args.steps or (2000 if quick else 3000)
    draws = args.elbo_draws or (200 if quick else 300)

    timing = {}
    for nd in sizes:
        X, Y = make_data(nd, rho=args.rho)
        for name in TIMED:
            timing[name, nd] = step_time(name, X, Y, repeats)
            print(
                f"step time  Nd={nd:>8,}  {name:<22} {1e3 * timing[name, nd]:9.2f} ms", flush=True
            )

    X, Y = make_data(elbo_nd, rho=args.rho)
    scores = {}
    for name in GUIDES:
        start = time.perf_counter()
        scores[name] = train_and_score(name, X, Y, steps, draws)
        cost = timing.get((name, elbo_nd)) or step_time(name, X, Y, repeats)
        timing[name, elbo_nd] = cost
        print(
            f"ELBO  Nd={elbo_nd:,}  {name:<22} {scores[name][0]:12.2f} ± {scores[name][1]:.2f}"
            f"  ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )

    report = render(args, sizes, timing, scores, elbo_nd, steps, draws, repeats)
    print(report)
    out = Path(__file__).parent / "results" / f"sldais_scaling{'_quick' if quick else ''}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(report)
    print(f"written to {out}")


def render(args, sizes, timing, scores, elbo_nd, steps, draws, repeats):
    sl, ns, full, mf = TIMED
    lines = [
        "# SL-DAIS scaling (synthetic logistic regression, D = 28)",
        "",
        f"Command: `python {' '.join(sys.argv)}` (with the package importable: "
        "`pip install -e .` or `PYTHONPATH=.`)  ",
        f"Machine: {machine_line()}  ",
        f"Settings: feature correlation ρ = {args.rho}, B = N_s = {B}, K = 8; step time = "
        f"median of {repeats} repeats of warm "
        "jitted `svi.update`; generator and guides in the script's docstring.",
        "",
        "## Time per SVI step (ms)",
        "",
        "| guide | " + " | ".join(f"Nd = {nd:,}" for nd in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for name in TIMED:
        row = " | ".join(f"{1e3 * timing[name, nd]:.2f}" for nd in sizes)
        lines.append(f"| {name} | {row} |")
    lines += ["", "Ratios:", ""]
    for nd in sizes:
        lines.append(
            f"* Nd = {nd:,}: full-data DAIS / SL-DAIS = {timing[full, nd] / timing[sl, nd]:.1f}×, "
            f"NS-DAIS / SL-DAIS = {timing[ns, nd] / timing[sl, nd]:.2f}×, "
            f"SL-DAIS / AutoNormal = {timing[sl, nd] / timing[mf, nd]:.2f}×"
        )
    growth = timing[sl, sizes[-1]] / timing[sl, sizes[0]]
    speedup = timing[full, 10**5] / timing[sl, 10**5]
    lines += [
        "",
        f"## Full-data ELBO after {steps} training steps (Nd = {elbo_nd:,}, {draws} draws)",
        "",
        "| guide | ELBO ± s.e. | ms / step |",
        "|---|---:|---:|",
    ]
    for name, (mean, se) in scores.items():
        lines.append(f"| {name} | {mean:.2f} ± {se:.2f} | {1e3 * timing[name, elbo_nd]:.2f} |")
    k2 = "DAIS K=2 (full data)"
    better = scores[sl][0] - max(scores[mf][0], scores[ns][0])
    lines += [
        "",
        f"SL-DAIS K=8 vs full DAIS K=2: ELBO difference {scores[sl][0] - scores[k2][0]:+.2f} "
        f"nats at {100 * timing[sl, elbo_nd] / timing[k2, elbo_nd]:.0f}% of its cost per step "
        "(paper: SL-DAIS K=8 beats DAIS K=2 at about 2% of the cost).",
        "",
        "## Targets",
        "",
        f"* SL-DAIS step time Nd = 10⁶ / Nd = 10⁴: {growth:.2f}× (target ≤ 1.5×): "
        f"{'met' if growth <= 1.5 else 'MISSED'}",
        f"* full-data AutoDAIS / SL-DAIS per step at Nd = 10⁵: {speedup:.0f}× (target ≥ 20×): "
        f"{'met' if speedup >= 20 else 'MISSED'}",
        f"* SL-DAIS ELBO minus the better of AutoNormal and NS-DAIS: {better:+.2f} nats "
        f"(target > 0): {'met' if better > 0 else 'MISSED'}",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
