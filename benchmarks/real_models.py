"""Posterior accuracy on realistic models: how far off are the means and sds, with defaults?

Each model of :mod:`benchmarks._real_models` has a cached multi-chain NUTS reference
(``--refs`` recomputes it into ``results/real_models_reference.json``; every other run
reads that file). Every method is fitted under one budget (Adam lr 1e-2, the mode's SVI
steps, ``K = 8``, 8 particles, float64, the method's other defaults) and drawn from; the
errors are over the flattened constrained latent coordinates: ``|mean − ref mean| / ref sd``
and ``|log(sd / ref sd)|``.

Run from the repository root: ``python -m benchmarks.real_models [--quick|--smoke]
[--models a,b] [--methods x,y]``; ``python -m benchmarks.real_models --refs [--models a,b]``.
From Python: :func:`evaluate`.
"""

import json
import statistics
import time
import warnings
from contextlib import contextmanager
from typing import NamedTuple

import jax
import numpy as np
import numpyro
import optax
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer import autoguide as npg
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.reparam import LocScaleReparam
from scipy import stats

import numpyro_dais
from benchmarks import _real_models, _sldais_case
from benchmarks._common import (
    RESULTS_DIR,
    Stopwatch,
    markdown_table,
    output_name,
    parse_args,
    write_results,
)

NAME = "real_models"
MODULE = f"benchmarks.{NAME}"
REFERENCE_PATH = RESULTS_DIR / f"{NAME}_reference.json"
K = 8
NUM_PARTICLES = 8
LR = 1e-2

SETTINGS = {
    "full": dict(
        models=_real_models.NAMES, methods=None, steps=5000, draws=4000, sldais_steps=40_000
    ),
    "quick": dict(
        models=_real_models.NAMES, methods=None, steps=1500, draws=1000, sldais_steps=40_000
    ),
    "smoke": dict(  # the test suite's: seconds; numpyro's SL-DAIS case is left out
        models=("regression_uncentred",),
        methods=("AutoNormal", "ours q0", "ours importance"),
        steps=50,
        draws=200,
        sldais_steps=None,
    ),
}

# -- methods ------------------------------------------------------------------------------------


def _fits():
    """``{fit name: model -> (guide, elbo)}``. numpyro's guides average ``num_particles``
    ELBO draws; ours put the particles inside their bound (``Trace_ELBO()``)."""
    elbo = lambda: Trace_ELBO(num_particles=NUM_PARTICLES)
    return {
        "AutoNormal": lambda m: (npg.AutoNormal(m), elbo()),
        "AutoMultivariateNormal": lambda m: (npg.AutoMultivariateNormal(m), elbo()),
        "AutoLaplaceApproximation": lambda m: (npg.AutoLaplaceApproximation(m), Trace_ELBO()),
        "numpyro AutoDAIS": lambda m: (npg.AutoDAIS(m, K=K), elbo()),
        "ours AutoDAIS": lambda m: (
            numpyro_dais.AutoDAIS(m, K=K, num_particles=NUM_PARTICLES),
            Trace_ELBO(),
        ),
        "ours AutoDSMCS": lambda m: (
            numpyro_dais.AutoDSMCS(m, K=K, num_particles=NUM_PARTICLES),
            Trace_ELBO(),
        ),
    }


FITS = _fits()


class Method(NamedTuple):
    fit: str
    draw_kwargs: dict
    ours: bool


#: ``{method: Method}``: methods that share a ``fit`` share one trained guide
METHODS = {
    "AutoNormal": Method("AutoNormal", {}, False),
    "AutoMultivariateNormal": Method("AutoMultivariateNormal", {}, False),
    "AutoLaplaceApproximation": Method("AutoLaplaceApproximation", {}, False),
    "numpyro AutoDAIS": Method("numpyro AutoDAIS", {}, False),
    "ours q0": Method("ours AutoDAIS", {}, True),
    "ours importance": Method("ours AutoDAIS", {"method": "importance"}, True),
    "ours psis": Method("ours AutoDAIS", {"method": "psis"}, True),
    "ours DSMCS": Method("ours AutoDSMCS", {}, True),
}


@contextmanager
def x64():
    """Float64 inside, the previous setting restored after (the smoke test runs in-process)."""
    previous = jax.config.jax_enable_x64
    numpyro.enable_x64()
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def as_jax(entry):
    """The entry's data as JAX arrays (float64 inside :func:`x64`)."""
    conv = lambda a: jax.numpy.asarray(a) if isinstance(a, np.ndarray) else a
    return tuple(map(conv, entry.args)), {k: conv(v) for k, v in entry.kwargs.items()}


def flatten(draws, sites):
    """``(names, (S, D) array)`` of the ``sites`` of ``draws`` (leading axis: draws)."""
    names, cols = [], []
    for site in sites:
        a = np.asarray(draws[site], dtype=float)
        a = a.reshape(a.shape[0], -1)
        shape = np.shape(draws[site])[1:]
        names += (
            [site]
            if not shape
            else [f"{site}[{','.join(map(str, i))}]" for i in np.ndindex(*shape)]
        )
        cols.append(a)
    return names, np.concatenate(cols, axis=1)


# -- NUTS references ----------------------------------------------------------------------------


class NutsSettings(NamedTuple):
    warmup: int
    samples: int
    target_accept_prob: float = 0.9
    dense_mass: bool = False
    #: sites that NUTS samples non-centred (``LocScaleReparam(0)``): the same posterior, the
    #: site itself recorded as a deterministic
    noncentre: tuple = ()


#: per model, 4 chains each
NUTS_SETTINGS = {
    "eight_schools_centred": NutsSettings(1000, 2500, 0.95, noncentre=("theta",)),
    "eight_schools_noncentred": NutsSettings(1000, 2500, 0.95),
    "regression_uncentred": NutsSettings(1000, 2500, dense_mass=True),
    "kid_score": NutsSettings(1000, 2500, dense_mass=True),
    "collinear": NutsSettings(1000, 2500, dense_mass=True),
    "badly_scaled": NutsSettings(1000, 2500, dense_mass=True),
    "hier_logistic": NutsSettings(1000, 2500, 0.95),
    "hier_logistic_centred": NutsSettings(1000, 2500, 0.95, noncentre=("a",)),
    "radon": NutsSettings(1000, 2500, 0.95, noncentre=("a",)),
    "gp_poisson": NutsSettings(1000, 2500, 0.99),
    "ar2": NutsSettings(1000, 2500),
    "garch11": NutsSettings(1000, 2500, 0.95),
    "funnel": NutsSettings(1000, 2500, 0.95, noncentre=("x",)),
    "breast_cancer_raw": NutsSettings(1000, 2500, dense_mass=True),
}
NUM_CHAINS = 4


def _funnel_exact(names):
    """Exact moments of the funnel: ``v``: 0 and 3; each ``x_i``: 0 and ``sqrt(E e^v)``."""
    return [0.0] * len(names), [3.0 if n == "v" else float(np.exp(9 / 4)) for n in names]


#: models whose means and sds are known exactly: the reference uses those (NUTS's are kept
#: as ``nuts_mean`` / ``nuts_sd`` with its diagnostics)
EXACT = {"funnel": _funnel_exact}


def latent_sites(entry, args, kwargs):
    """The model's latent sample sites, in the order the model samples them."""
    seeded = numpyro.handlers.seed(entry.model, 0)
    trace = numpyro.handlers.trace(
        numpyro.handlers.substitute(seeded, substitute_fn=init_to_uniform)
    ).get_trace(*args, **kwargs)
    return [n for n, s in trace.items() if s["type"] == "sample" and not s["is_observed"]]


def bulk_ess(x):
    """Rank-normalised (bulk) ESS of ``x`` with shape ``(chains, draws)``."""
    z = stats.norm.ppf((stats.rankdata(x, axis=None) - 0.375) / (x.size + 0.25))
    return float(effective_sample_size(z.reshape(x.shape)))


def nuts_reference(entry, seed=0):
    """A dict: flattened means and sds, names, split r̂ range, min bulk ESS, divergences."""
    cfg = NUTS_SETTINGS[entry.name]
    args, kwargs = as_jax(entry)
    model = numpyro.handlers.reparam(
        entry.model, config={site: LocScaleReparam(0) for site in cfg.noncentre}
    )
    mcmc = MCMC(
        NUTS(model, target_accept_prob=cfg.target_accept_prob, dense_mass=cfg.dense_mass),
        num_warmup=cfg.warmup,
        num_samples=cfg.samples,
        num_chains=NUM_CHAINS,
        chain_method="sequential",
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=("diverging",), **kwargs)
    draws = mcmc.get_samples(group_by_chain=True)
    seconds = time.perf_counter() - start
    sites = latent_sites(entry, args, kwargs)
    chains = {
        s: np.asarray(draws[s]).reshape(NUM_CHAINS * cfg.samples, *draws[s].shape[2:])
        for s in sites
    }
    names, flat = flatten(chains, sites)
    by_chain = flat.reshape(NUM_CHAINS, cfg.samples, -1)
    rhat = [float(split_gelman_rubin(by_chain[:, :, j])) for j in range(flat.shape[1])]
    ess = [bulk_ess(by_chain[:, :, j]) for j in range(flat.shape[1])]
    ref = {
        "names": names,
        "mean": flat.mean(0).tolist(),
        "sd": flat.std(0, ddof=1).tolist(),
        "rhat_min": min(rhat),
        "rhat_max": max(rhat),
        "ess_bulk_min": min(ess),
        "ess_bulk_min_coord": names[int(np.argmin(ess))],
        "divergences": int(np.asarray(mcmc.get_extra_fields()["diverging"]).sum()),
        "num_chains": NUM_CHAINS,
        "num_warmup": cfg.warmup,
        "num_samples": cfg.samples,
        "target_accept_prob": cfg.target_accept_prob,
        "dense_mass": cfg.dense_mass,
        "noncentred_for_nuts": list(cfg.noncentre),
        "seconds": round(seconds, 1),
        "exact": entry.name in EXACT,
    }
    if entry.name in EXACT:
        ref["nuts_mean"], ref["nuts_sd"] = ref["mean"], ref["sd"]
        ref["mean"], ref["sd"] = EXACT[entry.name](names)
    return ref


def compute_references(model_names, path=REFERENCE_PATH):
    """Run NUTS for ``model_names`` and merge the results into the cache file at ``path``."""
    cache = json.loads(path.read_text()) if path.exists() else {"models": {}}
    start = time.perf_counter()
    with x64():
        for name in model_names:
            ref = nuts_reference(_real_models.load(name))
            cache["models"][name] = ref
            print(
                f"{name}: {ref['seconds']:.0f} s, r̂ {ref['rhat_min']:.4f}-{ref['rhat_max']:.4f}, "
                f"min bulk ESS {ref['ess_bulk_min']:.0f} ({ref['ess_bulk_min_coord']}), "
                f"{ref['divergences']} divergences",
                flush=True,
            )
            cache["models"] = {
                n: cache["models"][n] for n in _real_models.NAMES if n in cache["models"]
            }
            path.write_text(json.dumps(cache, indent=1) + "\n")
    print(f"references: {time.perf_counter() - start:.0f} s in all; wrote {path}")
    return cache


def load_references(path=REFERENCE_PATH):
    """The cached references; a clear error if the file (or a model in it) is missing."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: compute the NUTS references first with `python -m {MODULE} --refs`"
        )
    return json.loads(path.read_text())["models"]


# -- evaluation ---------------------------------------------------------------------------------


def _first_warning(caught):
    return str(caught[0].message).replace("\n", " ")[:80] if caught else ""


def _fit(fit_name, entry, args, kwargs, steps, seed):
    guide, elbo = FITS[fit_name](entry.model)
    svi = SVI(entry.model, guide, optax.adam(LR), elbo)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        result = svi.run(jax.random.PRNGKey(seed), steps, *args, progress_bar=False, **kwargs)
        jax.block_until_ready(result.params)
        seconds = time.perf_counter() - start
    return guide, result.params, seconds, list(caught)


def _draw(guide, params, method, args, kwargs, num_draws, seed):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        draws = guide.sample_posterior(
            jax.random.PRNGKey(seed + 1),
            params,
            *args,
            sample_shape=(num_draws,),
            **method.draw_kwargs,
            **kwargs,
        )
        draws = jax.block_until_ready(draws)
        seconds = time.perf_counter() - start
    return draws, seconds, list(caught)


def metrics(ref, names, flat):
    """Errors of ``flat`` draws ``(S, D)`` against ``ref``, over finite draws only."""
    if names != ref["names"]:
        raise ValueError(f"coordinates {names} differ from the reference's {ref['names']}")
    finite = np.all(np.isfinite(flat), axis=1)
    out = {"nan_draws": int((~finite).sum())}
    ok = flat[finite]
    if len(ok) < 2:
        return dict(
            out,
            max_mean_err=np.nan,
            mean_mean_err=np.nan,
            max_log_sd=np.nan,
            mean_log_sd=np.nan,
            worst_mean_coord="",
            worst_sd_coord="",
        )
    ref_mean, ref_sd = np.asarray(ref["mean"]), np.asarray(ref["sd"])
    with np.errstate(over="ignore", invalid="ignore"):  # finite but huge draws
        mean, sd = ok.mean(0), ok.std(0, ddof=1)
    mean_err = np.abs(mean - ref_mean) / ref_sd
    with np.errstate(divide="ignore"):
        log_sd = np.abs(np.log(sd / ref_sd))
    return dict(
        out,
        max_mean_err=float(mean_err.max()),
        mean_mean_err=float(mean_err.mean()),
        max_log_sd=float(log_sd.max()),
        mean_log_sd=float(log_sd.mean()),
        worst_mean_coord=names[int(np.argmax(mean_err))],
        worst_sd_coord=names[int(np.argmax(log_sd))],
    )


def evaluate(
    model_names, methods=None, steps=5000, num_draws=4000, refs=None, seed=0, verbose=True
):
    """Fit and draw every method on every model; one row (a dict) per model and method.

    ``methods``: names of :data:`METHODS` (default all). ``refs``: the references (default:
    :func:`load_references`). Rows have the errors of :func:`metrics`, the wall times (fit
    and draws, compilation included), the first warning and an ``error`` when it crashed.
    """
    methods = list(METHODS) if methods is None else list(methods)
    refs = load_references() if refs is None else refs
    missing = [n for n in model_names if n not in refs]
    if missing:
        raise KeyError(
            f"no reference for {missing}: run `python -m {MODULE} --refs --models "
            f"{','.join(missing)}`"
        )
    rows = []
    with x64():
        for name in model_names:
            entry = _real_models.load(name)
            args, kwargs = as_jax(entry)
            sites = latent_sites(entry, args, kwargs)
            fitted = {}
            for method_name in methods:
                method = METHODS[method_name]
                row = {"model": name, "method": method_name, "ours": method.ours, "error": ""}
                caught = []
                try:
                    if method.fit not in fitted:
                        fitted[method.fit] = _fit(method.fit, entry, args, kwargs, steps, seed)
                    guide, params, fit_s, caught = fitted[method.fit]
                    draws, draw_s, draw_caught = _draw(
                        guide, params, method, args, kwargs, num_draws, seed
                    )
                    caught = caught + draw_caught
                    row.update(metrics(refs[name], *flatten(draws, sites)))
                    row.update(fit_s=fit_s, draw_s=draw_s, time_s=fit_s + draw_s)
                except Exception as exc:  # a crash is a result
                    fitted.setdefault(method.fit, (None, None, 0.0, caught))
                    row.update(
                        error=f"{type(exc).__name__}: {exc}".replace("\n", " ")[:120],
                        max_mean_err=np.nan,
                        max_log_sd=np.nan,
                        nan_draws=0,
                        time_s=np.nan,
                    )
                row.update(num_warnings=len(caught), warning=_first_warning(caught))
                rows.append(row)
                if verbose:
                    print(
                        f"{name:26s} {method_name:26s} {_cell(row):>14s} "
                        f"{row['time_s']:6.1f} s {row['warning'][:40]}",
                        flush=True,
                    )
    return rows


# -- tables -------------------------------------------------------------------------------------


def _bad(x):
    """An error for ranking: NaN (crash, no finite draws) counts as infinitely off."""
    return np.inf if not np.isfinite(x) else x


def _cell(row):
    if row["error"]:
        return "crash"
    text = f"{_fmt(row['max_mean_err'])} / {_fmt(row['max_log_sd'])}"
    if row["nan_draws"]:
        text += f" ({row['nan_draws']} non-finite draws)"
    return text + (" ⚠" if row["warning"] else "")


def per_model_table(rows, models, methods):
    by = {(r["model"], r["method"]): r for r in rows}
    return markdown_table(
        ["model"] + list(methods),
        [[m] + [_cell(by[m, k]) for k in methods] for m in models],
    )


def _fmt(x):
    """Two decimals; ``1.2e+05`` from 10⁴ on; ``inf``, ``nan``."""
    if not np.isfinite(x):
        return "inf" if np.isinf(x) else "nan"
    return f"{x:.1e}" if abs(x) >= 1e4 else f"{x:.2f}"


def summary(rows, methods):
    """``{method: dict}`` of the summary statistics over models."""
    out = {}
    for k in methods:
        rs = [r for r in rows if r["method"] == k]
        errs = [_bad(r["max_mean_err"]) for r in rs]
        worst = max(rs, key=lambda r: _bad(r["max_mean_err"]))
        times = [r["time_s"] for r in rs if np.isfinite(r["time_s"])]
        out[k] = dict(
            median_mean=statistics.median(errs),
            median_sd=statistics.median(_bad(r["max_log_sd"]) for r in rs),
            worst_model=worst["model"],
            worst_mean=_bad(worst["max_mean_err"]),
            off=sum(e > 1 for e in errs),
            n=len(rs),
            crashes=sum(bool(r["error"]) for r in rs),
            warned=sum(bool(r["warning"]) for r in rs),
            median_time=statistics.median(times) if times else np.nan,
        )
    return out


def summary_table(summ):
    return markdown_table(
        [
            "method",
            "median max mean err",
            "median max log sd ratio",
            "worst model: max mean err",
            "models > 1 sd off",
            "crashes",
            "models with a warning",
            "median wall time (s)",
        ],
        [
            [
                k,
                _fmt(s["median_mean"]),
                _fmt(s["median_sd"]),
                f"{s['worst_model']}: {_fmt(s['worst_mean'])}",
                f"{s['off']} of {s['n']}",
                s["crashes"],
                s["warned"],
                _fmt(s["median_time"]),
            ]
            for k, s in summ.items()
        ],
    )


def targets(rows, summ, sldais=None):
    """Rows ``(target, value, goal, met)`` for our guide, from the results; ``sldais``:
    ``(steps, our ELBO, AutoNormal's)`` on numpyro's SL-DAIS case, or ``None``."""
    out = []

    def add(label, value, goal, met):
        out.append([label, value, goal, "met" if met else "**missed**"])

    if sldais is not None:
        steps, ours, normal = sldais
        add(
            f"numpyro's test_autosldais case ({steps} steps): our SL-DAIS ELBO − AutoNormal's",
            f"{ours - normal:+.2f} ({ours:.2f} vs {normal:.2f})",
            "> +0.1",
            ours - normal > 0.1,
        )

    for k, stat, goal in (
        ("ours q0", "median_mean", 0.3),
        ("ours q0", "median_sd", 0.3),
        ("ours importance", "median_mean", 0.15),
    ):
        if k in summ:
            what = "max mean err" if stat == "median_mean" else "max log sd ratio"
            add(
                f"{k}: median over models of {what}",
                _fmt(summ[k][stat]),
                f"≤ {goal}",
                summ[k][stat] <= goal,
            )
    for k in ("ours q0", "ours importance"):
        if k in summ:
            add(
                f"{k}: worst model's max mean err ({summ[k]['worst_model']})",
                _fmt(summ[k]["worst_mean"]),
                "≤ 1",
                summ[k]["worst_mean"] <= 1,
            )
    ours = [k for k in ("ours q0", "ours importance") if k in summ]
    if ours:
        off = sorted(
            {r["model"] for r in rows if r["method"] in ours and _bad(r["max_mean_err"]) > 1}
        )
        add(
            f"models where {' or '.join(ours)} is > 1 sd off",
            f"{len(off)}" + (f" ({', '.join(off)})" if off else ""),
            "0",
            not off,
        )
        silent = [
            f"{r['model']} ({r['method']})"
            for r in rows
            if r["method"] in ours
            and _bad(r["max_mean_err"]) > 1
            and not r["warning"]
            and not r["error"]
        ]
        add(
            "results > 1 sd off with no warning from our guide",
            f"{len(silent)}" + (f" ({', '.join(silent)})" if silent else ""),
            "0",
            not silent,
        )
    if {"ours q0", "AutoNormal", "numpyro AutoDAIS"} <= set(summ):
        by = {(r["model"], r["method"]): _bad(r["max_mean_err"]) for r in rows}
        models = [r["model"] for r in rows if r["method"] == "ours q0"]
        wins = [
            m
            for m in models
            if by[m, "ours q0"] < min(by[m, "AutoNormal"], by[m, "numpyro AutoDAIS"])
        ]
        add(
            "models where ours q0 beats AutoNormal and numpyro's AutoDAIS on max mean err",
            f"{len(wins)} of {len(models)}",
            "all",
            len(wins) == len(models),
        )
    return markdown_table(["target", "value", "goal", ""], out)


REFERENCE_NOTE = """\
Computed by `python -m benchmarks.real_models --refs` (4 chains, `chain_method="sequential"`,
PRNGKey(0)); the file keeps each model's flattened means and sds, not the draws. Split r̂ is
numpyro's `split_gelman_rubin`; bulk ESS is numpyro's `effective_sample_size` of the
rank-normalised draws. Where a site is marked non-centred, NUTS sampled the same posterior
with that site reparameterised (`LocScaleReparam(0)`) and the site recorded as a
deterministic: the guides still see the model as written (centred). The funnel's reference is
its exact moments (v: 0 and 3; each x: 0 and exp(9/4) ≈ 9.49); its NUTS run is kept in the
file with the distance from the exact values. The x's have heavy tails (E x⁴ = 3 e¹⁸), so
any finite sample's sd of x is noisy, NUTS's and every method's alike."""


def _reference_kind(r):
    """``NUTS``, ``NUTS, theta non-centred``, or ``exact`` with how far NUTS was from it."""
    if r.get("exact"):
        nuts = np.asarray(r["nuts_mean"]), np.asarray(r["nuts_sd"])
        mean_err = np.max(np.abs(nuts[0] - np.asarray(r["mean"])) / np.asarray(r["sd"]))
        log_sd = np.max(np.abs(np.log(nuts[1] / np.asarray(r["sd"]))))
        return f"exact (NUTS: {mean_err:.2f} / {log_sd:.2f} off)"
    sites = r.get("noncentred_for_nuts")
    return "NUTS" + (f", {', '.join(sites)} non-centred" if sites else "")


def reference_table(refs, models):
    rows = []
    for m in models:
        r = refs[m]
        rows.append(
            [
                m,
                len(r["names"]),
                _reference_kind(r),
                f"{r['num_chains']} × ({r['num_warmup']} + {r['num_samples']})",
                r["target_accept_prob"],
                "dense" if r["dense_mass"] else "diag",
                f"{r['rhat_min']:.4f}-{r['rhat_max']:.4f}",
                f"{r['ess_bulk_min']:.0f} ({r['ess_bulk_min_coord']})",
                r["divergences"],
                f"{r['seconds']:.0f}",
            ]
        )
    return markdown_table(
        [
            "model",
            "D",
            "reference",
            "chains × (warm-up + draws)",
            "target accept",
            "mass",
            "split r̂",
            "min bulk ESS",
            "divergences",
            "NUTS time (s)",
        ],
        rows,
    )


def _jsonable(rows):
    clean = lambda v: None if isinstance(v, float) and not np.isfinite(v) else v
    return [{k: clean(v) for k, v in r.items()} for r in rows]


def extra_args(parser):
    parser.add_argument("--refs", action="store_true", help="(re)compute the NUTS references")
    parser.add_argument("--models", help="comma-separated model names (default: the mode's)")
    parser.add_argument("--methods", help="comma-separated method names (default: the mode's)")


def _names(text, choices, what):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; choose from {list(choices)}")
    return names


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv, extra_args)
    cfg = dict(SETTINGS[args.mode])
    models = list(cfg["models"])
    if args.models:
        models = _names(args.models, _real_models.NAMES, "models")
    if args.refs:
        compute_references(models)
        return
    methods = list(METHODS) if cfg["methods"] is None else list(cfg["methods"])
    if args.methods:
        methods = _names(args.methods, METHODS, "methods")
    refs = load_references()
    sw = Stopwatch()
    with sw.lap("fits and draws"):
        rows = evaluate(models, methods, cfg["steps"], cfg["draws"], refs)
    sldais = None
    if cfg["sldais_steps"] and not (args.models or args.methods):  # float32, as numpyro's
        with sw.lap("numpyro's SL-DAIS case"):
            sldais = (cfg["sldais_steps"], *_sldais_case.run(cfg["sldais_steps"]))
    summ = summary(rows, methods)
    tables = {
        "per model": per_model_table(rows, models, methods),
        "summary": summary_table(summ),
        "targets": targets(rows, summ, sldais),
    }
    for title, table in tables.items():
        print(f"\n{title}\n{table}")
    descriptions = "\n".join(f"* `{m}`: {_real_models.load(m).description}" for m in models)
    settings = (
        f"{cfg['steps']} SVI steps of Adam lr {LR}, float64, {cfg['draws']} draws per method, "
        f"training key PRNGKey(0), draw key PRNGKey(1). numpyro's AutoNormal, "
        f"AutoMultivariateNormal and AutoDAIS(K={K}): Trace_ELBO(num_particles="
        f"{NUM_PARTICLES}); AutoLaplaceApproximation: Trace_ELBO(). Ours: "
        f"numpyro_dais.AutoDAIS(K={K}, num_particles={NUM_PARTICLES}) (one fit, drawn by "
        f"`sample_posterior` default = q0 and by method='importance') and "
        f"numpyro_dais.AutoDSMCS(K={K}, num_particles={NUM_PARTICLES}) (its default draws), "
        "Trace_ELBO(). Everything else at the library defaults. Wall time: fit + draws, "
        "compilation included. Errors over the flattened constrained latent coordinates: "
        "*max mean err* = max over coordinates of abs(mean − ref mean) / ref sd (in reference "
        "sds), *max log sd ratio* = max of abs(log(sd / ref sd)); over the finite draws (NaN "
        "draws counted). A crash or no finite draws counts as infinitely off."
    )
    body = "\n\n".join(
        [
            "## Models",
            descriptions,
            "## Settings",
            settings,
            "## NUTS references (`results/real_models_reference.json`)",
            REFERENCE_NOTE,
            reference_table(refs, models),
            "## Per model: max mean err / max log sd ratio (⚠: a warning was raised)",
            tables["per model"],
            "## Summary over models",
            tables["summary"],
            "## Targets for our guide",
            tables["targets"],
            "## First warning per method and model",
            "\n".join(
                f"* {r['model']}, {r['method']}: {r['warning']}" for r in rows if r["warning"]
            )
            or "none",
            "## Crashes",
            "\n".join(f"* {r['model']}, {r['method']}: {r['error']}" for r in rows if r["error"])
            or "none",
        ]
    )
    path = write_results(
        args.out_dir,
        NAME,
        args.mode,
        "Posterior accuracy on realistic models against NUTS",
        MODULE,
        body,
        sw,
    )
    stem = output_name(NAME, args.mode)
    (args.out_dir / f"{stem}.json").write_text(
        json.dumps(
            {"settings": cfg | {"models": models, "methods": methods}, "rows": _jsonable(rows)},
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
