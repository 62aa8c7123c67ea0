"""Default AutoDAIS on model families outside ``real_models``, against NUTS.

Fourteen models on simulated data (``benchmarks/_model_families.py``): ordered, simplex and
LKJ Cholesky latents, mixtures and a hidden Markov model with their discrete latents summed
out, negative-binomial, ordinal, multinomial-logit and censored Weibull likelihoods, item
response, near-separation, improper flat priors, and a stochastic-volatility series.
AutoDAIS at its defaults (float32, as a user gets it) and AutoNormal as the baseline, both
trained with Adam 1e-2 for the same steps, each model against its own 4-chain NUTS
reference. Errors over every latent coordinate (constrained space), in NUTS sds. The
warnings columns list which of our guide's warnings fired while fitting and drawing q0 (what
a user of the defaults sees) and while drawing the importance draws; a q0 far off with none
of the first is counted as silent.

    python -m benchmarks.model_families [--quick | --smoke]
"""

import statistics
import time
import warnings

import jax
import numpy as np
import optax
from numpyro.diagnostics import split_gelman_rubin
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.initialization import init_to_median

import numpyro_dais
from benchmarks._common import Stopwatch, markdown_table, parse_args, write_results
from benchmarks._model_families import MODELS
from benchmarks.real_models import flatten

NAME = "model_families"
MODULE = f"benchmarks.{NAME}"
TITLE = "Default AutoDAIS on fourteen model families, against NUTS"
SETTINGS = {
    "full": dict(models=tuple(MODELS), steps=5000, draws=4000, nuts=(4, 1000, 2000)),
    "quick": dict(models=tuple(MODELS), steps=2000, draws=2000, nuts=(4, 500, 500)),
    "smoke": dict(models=("student_t",), steps=20, draws=100, nuts=(1, 50, 50)),
}
#: a result this far off (largest |mean error| in NUTS sds, or largest |log sd ratio|) with
#: no warning from the guide counts as silent
OFF = 0.5
#: our warnings, by a phrase of their message
WARNINGS = {
    "q0 disagrees": "q0 check",
    "q0 is narrower": "q0 chains",
    "q0 is wider": "q0 chains",
    "Pareto k̂": "k̂",
    "diverged": "divergences",
    "Laplace start": "set-up",
    "not finite": "non-finite draws",
}


def errors(flat, ref):
    """``(max |mean err| / NUTS sd, max |log sd ratio|)`` over the coordinates that vary
    under NUTS (an LKJ factor's fixed entries do not), over finite draws."""
    mean, sd = ref.mean(0), ref.std(0)
    varies = sd > 1e-6 * (1 + np.abs(mean))
    flat = flat[np.all(np.isfinite(flat), axis=1)]
    if len(flat) < 2:
        return np.nan, np.nan
    err = np.abs(flat.mean(0) - mean)[varies] / sd[varies]
    log_ratio = np.abs(np.log(flat.std(0)[varies] / sd[varies]))
    return float(err.max()), float(log_ratio.max())


def fit(guide, model, args, steps):
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(2), steps, *args, progress_bar=False)
    return result.params


def run(name, cfg):
    model, args, description = MODELS[name]()
    chains, warmup, samples = cfg["nuts"]
    start = time.perf_counter()
    # from the prior medians: from init_to_uniform one LKJ chain in four stuck at the
    # boundary (a correlation of -1, sigma ~ 700) and made the reference meaningless
    kernel = NUTS(model, target_accept_prob=0.9, init_strategy=init_to_median)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(0), *args)
    nuts_seconds = time.perf_counter() - start
    sites = [s for s in mcmc.get_samples() if not s.startswith("_")]
    names, ref = flatten(mcmc.get_samples(), sites)
    grouped = mcmc.get_samples(group_by_chain=True)
    by_chain = np.stack(
        [flatten({s: grouped[s][c] for s in sites}, sites)[1] for c in range(chains)]
    )
    varies = ref.std(0) > 1e-6 * (1 + np.abs(ref.mean(0)))
    r_hat = float(np.max(split_gelman_rubin(by_chain[..., varies]))) if chains > 1 else np.nan
    key, shape = jax.random.PRNGKey(1), (cfg["draws"],)

    baseline = AutoNormal(model)
    params = fit(baseline, model, args, cfg["steps"])
    _, flat = flatten(baseline.sample_posterior(key, params, sample_shape=shape), sites)
    normal = errors(flat, ref)

    with warnings.catch_warnings(record=True) as caught:  # what a default user sees
        warnings.simplefilter("always")
        start = time.perf_counter()
        guide = numpyro_dais.AutoDAIS(model)
        params = fit(guide, model, args, cfg["steps"])
        seconds = time.perf_counter() - start
        q0 = guide.sample_posterior(key, params, *args, sample_shape=shape)
    with warnings.catch_warnings(record=True) as caught_end:
        warnings.simplefilter("always")
        end = guide.sample_posterior(key, params, *args, sample_shape=shape, method="importance")
    fired, fired_end = (
        sorted(
            {label for w in ws for phrase, label in WARNINGS.items() if phrase in str(w.message)}
        )
        for ws in (caught, caught_end)
    )
    ours = {
        "q0": errors(flatten(q0, sites)[1], ref),
        "importance": errors(flatten(end, sites)[1], ref),
    }
    return dict(
        name=name, description=description, dim=ref.shape[1], nuts=nuts_seconds,
        seconds=seconds, normal=normal, warnings=fired, r_hat=r_hat, warnings_end=fired_end, **ours,
    )  # fmt: skip


def _cell(e):
    return f"{e[0]:.2f} / {e[1]:.2f}"


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    sw = Stopwatch()
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in cfg["models"]:
            with sw.lap(name):
                results.append(run(name, cfg))
            r = results[-1]
            print(name, _cell(r["q0"]), _cell(r["importance"]), _cell(r["normal"]), flush=True)
    rows = [
        [r["name"], str(r["dim"]), _cell(r["q0"]), _cell(r["importance"]), _cell(r["normal"]),
         ", ".join(r["warnings"]) or "—", ", ".join(r["warnings_end"]) or "—",
         f"{r['seconds']:.0f}", f"{r['r_hat']:.3f}", f"{r['nuts']:.0f}"]
        for r in results
    ]  # fmt: skip
    headers = ["model", "D", "ours q0", "ours importance", "AutoNormal",
               "our warnings (fit, q0 draws)", "our warnings (importance draws)",
               "AutoDAIS fit (s)", "NUTS max split r̂", "NUTS (s)"]  # fmt: skip
    table = markdown_table(headers, rows)
    off = lambda e: not (e[0] <= OFF and e[1] <= OFF)  # noqa: E731 (NaN is off)
    silent = [r["name"] for r in results if off(r["q0"]) and not r["warnings"]]
    median = lambda key, i: statistics.median(r[key][i] for r in results)  # noqa: E731
    summary = "\n".join(
        [
            f"* median over the models, q0: {median('q0', 0):.2f} / {median('q0', 1):.2f}; "
            f"importance: {median('importance', 0):.2f} / {median('importance', 1):.2f}; "
            f"AutoNormal: {median('normal', 0):.2f} / {median('normal', 1):.2f}",
            f"* q0 beats AutoNormal on both errors: "
            f"{sum(r['q0'][0] <= r['normal'][0] and r['q0'][1] <= r['normal'][1] for r in results)}"
            f" of {len(results)}",
            f"* q0 more than {OFF} off (mean or log sd) with no warning from our guide while "
            "fitting and drawing q0: "
            f"{', '.join(silent) or 'none'}",
        ]
    )
    models = "\n".join(f"* `{r['name']}`: {r['description']}" for r in results)
    chains, warmup, samples = cfg["nuts"]
    body = "\n\n".join(
        [
            "## Models",
            models,
            "## Settings",
            f"NUTS: {chains} chains × ({warmup} warm-up + {samples} draws), target accept 0.9, "
            "from the prior medians, PRNGKey(0). AutoDAIS at its defaults (K = 4, N = 1, "
            "float32) and AutoNormal, "
            f"Adam 1e-2, {cfg['steps']} steps, training key PRNGKey(2); {cfg['draws']} draws "
            "with PRNGKey(1). Cells: largest |mean − NUTS mean| / NUTS sd / largest "
            "|log(sd / NUTS sd)| over every latent coordinate that varies under NUTS. "
            "`AutoDAIS fit` includes set-up and compilation.",
            f"## Results\n\n{table}",
            summary,
        ]
    )
    print(table)
    print(summary)
    path = write_results(args.out_dir, NAME, args.mode, TITLE, MODULE, body, sw)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
