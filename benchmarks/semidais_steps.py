"""Semi-DAIS step time: flat in the number of groups? Ours against numpyro's AutoSemiDAIS.

Student-t regression written with one local Gamma scale per data point (the model of
``benchmarks.semidais_robust_regression``, d = 26, simulated), mini-batches of B = 256
members, K = 8; the data set grows from 10³ to 10⁵ points. Each row times one jitted
``svi.update`` (Adam) of: our ``AutoSemiDAIS`` with its defaults (the Laplace base, the
control variate, one set of annealing parameters), ours with numpyro's base and without the
control variate (``base='gaussian', control_variate=False``), ours with per-member annealing
parameters (``use_global_dais_params=False``, numpyro's default), ours without the
divergence report (its flag goes to the host every step), and numpyro's ``AutoSemiDAIS``
with the same K (its defaults otherwise). Median of blocks of steps, the configurations
taking turns block by block; ratios within one run.

Run from the repository root: ``python -m benchmarks.semidais_steps [--quick|--smoke]``.
"""

from functools import partial

import numpyro.infer.autoguide as numpyro_autoguide
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from benchmarks import semidais_robust_regression as rr
from benchmarks._common import (
    Stopwatch,
    markdown_table,
    parse_args,
    svi_stepper,
    time_interleaved,
    write_results,
)
from numpyro_dais import AutoSemiDAIS

NAME = "semidais_steps"
MODULE = f"benchmarks.{NAME}"
D, K, B = 26, 8, 256
SETTINGS = {
    "full": dict(sizes=(1_000, 10_000, 100_000), repeats=9, steps=50),
    "quick": dict(sizes=(1_000, 100_000), repeats=5, steps=30),
    "smoke": dict(sizes=(300, 600), repeats=1, steps=2),
}
GUIDES = {
    "ours, defaults": lambda m, loc, g: AutoSemiDAIS(m, loc, g, K=K),
    "ours, base='gaussian', control_variate=False": lambda m, loc, g: AutoSemiDAIS(
        m, loc, g, K=K, base="gaussian", control_variate=False
    ),
    "ours, use_global_dais_params=False": lambda m, loc, g: AutoSemiDAIS(
        m, loc, g, K=K, use_global_dais_params=False
    ),
    "ours, report_divergences=False": lambda m, loc, g: AutoSemiDAIS(
        m, loc, g, K=K, report_divergences=False
    ),
    "numpyro's AutoSemiDAIS": lambda m, loc, g: numpyro_autoguide.AutoSemiDAIS(m, loc, g, K=K),
}


def stepper(name, X, y, batch):
    local = partial(rr.local_model, X=X, y=y, batch=batch)

    def model():
        return local(rr.global_model(X.shape[1]))

    guide = GUIDES[name](model, local, AutoNormal(partial(rr.global_model, X.shape[1])))
    return svi_stepper(SVI(model, guide, optax.adam(1e-3), Trace_ELBO()))


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    stopwatch = Stopwatch()
    times = {}
    for n in cfg["sizes"]:
        X, y = rr.simulate(n, D, 0)
        batch = min(B, n)
        with stopwatch.lap(f"N = {n:,}"):
            calls = {name: stepper(name, X, y, batch) for name in GUIDES}
            for name, seconds in time_interleaved(calls, cfg["repeats"], cfg["steps"]).items():
                times[name, n] = seconds
            print(n, {k: f"{1e3 * v:.2f} ms" for (k, m), v in times.items() if m == n}, flush=True)
    body = render(cfg, times)
    print(body)
    title = "Semi-DAIS step time: flat in the number of groups? Ours against numpyro's"
    print(
        f"written to {write_results(args.out_dir, NAME, args.mode, title, MODULE, body, stopwatch)}"
    )


def render(cfg, times):
    sizes, small = cfg["sizes"], cfg["sizes"][0]
    numpyro_name = "numpyro's AutoSemiDAIS"
    rows = []
    for name in GUIDES:
        for n in sizes:
            t = times[name, n]
            mine = "" if name == numpyro_name else f"{t / times[numpyro_name, n]:.2f}"
            rows.append([name, f"{n:,}", f"{1e3 * t:.2f}", f"{t / times[name, small]:.2f}", mine])
    lines = [
        f"Student-t regression, d = {D}, local Gamma scales; B = {B}, K = {K}; one jitted "
        f"`svi.update` (Adam); median of {cfg['repeats']} blocks of {cfg['steps']} steps, "
        "the guides taking turns.",
        "",
        markdown_table(
            ["guide", "N", "step (ms)", f"step / step at N = {small:,}", "ours / numpyro's"],
            rows,
        ),
        "",
        "Targets (issue 37): step at N = 10⁵ / step at N = 10³ ≤ 1.5; ours / numpyro's ≤ 1.0.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
