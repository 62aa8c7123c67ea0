"""Time to a right answer: our guides against NUTS, AutoNormal and AutoMultivariateNormal.

A method has the right answer when its draws are within 0.1 reference sds of the reference
mean and within 0.1 of its log sd on every latent coordinate (constrained space). The time
is what a user waits for it, compilation included, each method in a new Python process (its
imports and the data's construction left out): NUTS as users run it (``MCMC(NUTS(model),
num_warmup=1000, num_samples=1000, num_chains=4)``, and one chain); the SVI guides trained
by :func:`numpyro_dais.run_until_converged` (Adam 1e-2: stops when the loss does, so nobody
guesses ``num_steps``), then 4,000 draws. Cases:

* the models of ``real_models`` (their cached NUTS references) and ``model_families``
  (NUTS references cached in ``results/time_to_answer_reference.json``: ``--refs``);
* a logistic regression, ``D = 20``, 10³ to 10⁶ rows (reference: Laplace at the mode,
  importance-corrected up to 10⁵ rows), where SL-DAIS and AutoNormal train on mini-batches
  of 1,000 rows;
* a centred normal hierarchy with 10 to 10⁴ groups (exact reference), where Semi-DAIS trains
  on mini-batches of 256 groups;
* a pharmacokinetic ODE model, solved by RK4 in ``lax.scan`` and by ``odeint``
  (``benchmarks._ode_models``; NUTS references in the same file).

Run from the repository root: ``python -m benchmarks.time_to_answer [--quick | --smoke]
[--cases a,b] [--methods x,y]``; ``--refs`` computes the missing NUTS references.
"""

import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer import autoguide as npg
from numpyro.infer.initialization import init_to_median, init_to_uniform

import numpyro_dais
from benchmarks import _real_models, _scale_models
from benchmarks._common import RESULTS_DIR, Stopwatch, markdown_table, output_name, write_results
from benchmarks._model_families import MODELS as FAMILY_MODELS
from benchmarks._model_forms import FORMS
from benchmarks._scale_models import Case

NAME = "time_to_answer"
MODULE = f"benchmarks.{NAME}"
TITLE = "Time to a right answer: our guides against NUTS"
REFERENCE_PATH = RESULTS_DIR / f"{NAME}_reference.json"
#: a right answer: every coordinate's |mean − ref| / ref sd and |log(sd / ref sd)| within
TOL_MEAN = 0.1
TOL_LOG_SD = 0.1
LR = 1e-2
DRAWS = 4000
LOGISTIC_ROWS = (1_000, 10_000, 100_000, 1_000_000)
HIER_GROUPS = (10, 100, 1_000, 10_000)
SL_BATCH = 1000
SEMI_BATCH = 256

FULL = dict(
    cases=None,
    methods=None,
    nuts=(1000, 1000),
    max_steps=10_000,
    window=250,
    timeout=900,
    draws=DRAWS,
)
SETTINGS = {
    "full": FULL,
    "quick": dict(  # the full settings on a few cases
        FULL,
        cases=(
            "eight_schools_noncentred",
            "kid_score",
            "radon",
            "garch11",
            "breast_cancer_raw",
            "logistic_1000",
            "logistic_100000",
            "hierarchical_10",
            "hierarchical_1000",
        ),
        timeout=600,
    ),
    "smoke": dict(  # the test suite's: in-process, tiny settings
        cases=("logistic_1000",),
        methods=("NUTS 1×", "AutoNormal", "ours AutoDAIS"),
        nuts=(50, 50),
        max_steps=80,
        window=20,
        timeout=None,
        draws=200,
    ),
}

# -- cases ----------------------------------------------------------------------------------------


def _to(dtype):
    """Arrays to JAX arrays, their floating ones as ``dtype`` (indices stay integers)."""

    def conv(a):
        if not hasattr(a, "dtype"):
            return a
        return jnp.asarray(a, dtype if jnp.issubdtype(a.dtype, jnp.floating) else None)

    return conv


def _as_jax(args, kwargs):
    conv = _to(jnp.float32)
    return tuple(map(conv, args)), {k: conv(v) for k, v in kwargs.items()}


def _real_case(name):
    from benchmarks.real_models import REFERENCE_PATH as REAL_REFS

    entry = _real_models.load(name)
    ref = json.loads(REAL_REFS.read_text())["models"][name]
    args, kwargs = _as_jax(entry.args, entry.kwargs)
    return Case(
        name,
        "real_models",
        None,
        entry.model,
        args,
        kwargs,
        np.asarray(ref["mean"]),
        np.asarray(ref["sd"]),
        entry.description,
    )


def _family_case(name, refs=None):
    model, args, description = FAMILY_MODELS[name]()
    refs = load_references() if refs is None else refs
    if name not in refs:
        raise KeyError(f"no reference for {name}: run `python -m {MODULE} --refs`")
    ref = refs[name]
    return Case(
        name,
        "model_families",
        None,
        model,
        tuple(args),
        {},
        np.asarray(ref["mean"]),
        np.asarray(ref["sd"]),
        description,
    )


def _ode_case(name):
    from benchmarks import _ode_models

    model, args, kwargs, description = _ode_models.BUILDERS[name.removeprefix("ode_")]()
    refs = load_references()
    if name not in refs:
        raise KeyError(f"no reference for {name}: run `python -m {MODULE} --refs`")
    return Case(
        name,
        "ode",
        None,
        model,
        args,
        kwargs,
        np.asarray(refs[name]["mean"]),
        np.asarray(refs[name]["sd"]),
        description,
    )


ODE_CASES = ("ode_rk4", "ode_odeint")


def case_names():
    """Every case, in the order of the tables."""
    return (
        list(_real_models.NAMES)
        + list(FAMILY_MODELS)
        + [f"logistic_{n}" for n in LOGISTIC_ROWS]
        + [f"hierarchical_{n}" for n in HIER_GROUPS]
        + list(ODE_CASES)
    )


def _form_case(name):
    """A model of ``_model_forms`` with its base model's data, reference and site order."""
    base_name, model = FORMS[name]
    base = load_case(base_name)
    sites = tuple(latent_sites(base.model, base.args, base.kwargs))
    description = f"{base.description}; written {name.split(':')[1].replace('_', ' ')}"
    return base._replace(name=name, model=model, description=description, sites=sites)


def load_case(name):
    if name in FORMS:
        return _form_case(name)
    if name in _real_models.NAMES:
        return _real_case(name)
    if name in FAMILY_MODELS:
        return _family_case(name)
    if name.startswith("logistic_"):
        return _scale_models.logistic(int(name.split("_")[1]), batch=SL_BATCH)
    if name.startswith("hierarchical_"):
        return _scale_models.hierarchical(int(name.split("_")[1]))
    if name in ODE_CASES:
        return _ode_case(name)
    raise KeyError(name)


def latent_sites(model, args, kwargs):
    """The model's latent sample sites, in the order it samples them."""
    seeded = numpyro.handlers.seed(model, 0)
    trace = numpyro.handlers.trace(
        numpyro.handlers.substitute(seeded, substitute_fn=init_to_uniform)
    ).get_trace(*args, **kwargs)
    return [n for n, s in trace.items() if s["type"] == "sample" and not s["is_observed"]]


def flatten(draws, sites):
    """``(S, D)`` of the ``sites`` of ``draws`` (leading axis: draws), in site order."""
    cols = [np.asarray(draws[s], np.float64).reshape(np.shape(draws[s])[0], -1) for s in sites]
    return np.concatenate(cols, axis=1)


def errors(case, flat):
    """``(max |mean err| / ref sd, max |log sd ratio|)`` over the coordinates that vary in
    the reference, over finite draws (NaN: fewer than two)."""
    varies = case.sd > 1e-6 * (1 + np.abs(case.mean))
    flat = flat[np.all(np.isfinite(flat), axis=1)]
    if len(flat) < 2:
        return float("nan"), float("nan")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        err = np.abs(flat.mean(0) - case.mean)[varies] / case.sd[varies]
        log_sd = np.abs(np.log(flat.std(0, ddof=1)[varies] / case.sd[varies]))
    return float(err.max()), float(log_sd.max())


def is_right(err):
    return err[0] <= TOL_MEAN and err[1] <= TOL_LOG_SD


# -- methods --------------------------------------------------------------------------------------


def _nuts(case, cfg, seed, chains):
    warmup, samples = cfg["nuts"]
    start = time.perf_counter()
    mcmc = MCMC(
        NUTS(case.model),
        num_warmup=warmup,
        num_samples=samples,
        num_chains=chains,
        progress_bar=False,
    )
    mcmc.run(jax.random.key(seed), *case.args, **case.kwargs)
    draws = jax.block_until_ready(mcmc.get_samples())
    return [("draws", time.perf_counter() - start, draws, None)]


def converged(case, guide, seed, max_steps, window, model=None, args=None):
    """The benchmarks' fit: ``guide`` trained on ``case`` (its ``model`` and ``args``
    unless given) by ``run_until_converged`` with Adam at :data:`LR` from key ``seed``."""
    model = case.model if model is None else model
    svi = SVI(model, guide, optax.adam(LR), Trace_ELBO())
    return numpyro_dais.run_until_converged(
        svi,
        jax.random.key(seed),
        *(case.args if args is None else args),
        max_steps=max_steps,
        window=window,
        progress_bar=False,
        **case.kwargs,
    )


def _svi_answers(
    case, cfg, guide, model, seed, extra_draws=(), args=None, draw_args=None, members=None
):
    """Train ``guide`` by ``run_until_converged`` and draw: ``[(label, seconds, draws,
    steps)]`` for ``q0``/the guide's draws and each ``extra_draws`` method. ``members``:
    ``(plate, indices)`` the draws are for (AutoSemiDAIS: every group)."""
    args = case.args if args is None else args
    draw_args = args if draw_args is None else draw_args
    start = time.perf_counter()
    run = converged(case, guide, seed, cfg["max_steps"], cfg["window"], model, args)
    jax.block_until_ready(run.params)
    fit_s = time.perf_counter() - start
    steps = run.num_steps if run.converged else -run.num_steps
    out = []
    for method in ("default",) + tuple(extra_draws):
        t = time.perf_counter()
        kw = {} if method == "default" else {"method": method}
        fixed = {} if members is None else {members[0]: members[1]}
        with numpyro.handlers.substitute(data=fixed):
            draws = guide.sample_posterior(
                jax.random.key(seed + 1),
                run.params,
                *draw_args,
                sample_shape=(cfg["draws"],),
                **kw,
                **case.kwargs,
            )
        draws = jax.block_until_ready(draws)
        label = "draws" if method == "default" else method
        out.append((label, fit_s + time.perf_counter() - t, draws, steps))
    return out


def _autodais(case, cfg, seed, **options):
    guide = numpyro_dais.AutoDAIS(case.model, **options)
    return _svi_answers(case, cfg, guide, case.model, seed, extra_draws=("importance", "mala"))


def _sldais(case, cfg, seed):
    model = case.subsampled(SL_BATCH)
    guide = numpyro_dais.AutoSurrogateLikelihoodDAIS(model)
    return _svi_answers(case, cfg, guide, model, seed)


def _normal_minibatch(case, cfg, seed):
    model = case.subsampled(SL_BATCH)
    return _svi_answers(case, cfg, npg.AutoNormal(model), model, seed)


def _semidais(case, cfg, seed):
    model, local_model, global_model = case.semi(SEMI_BATCH)
    guide = numpyro_dais.AutoSemiDAIS(model, local_model, npg.AutoNormal(global_model))
    members = ("groups", jnp.arange(case.size))
    return _svi_answers(case, cfg, guide, model, seed, args=(), draw_args=(), members=members)


#: ``{method: (run(case, cfg, seed), applies(case))}``
METHODS = {
    "NUTS 4×": (functools.partial(_nuts, chains=4), lambda c: True),
    "NUTS 1×": (functools.partial(_nuts, chains=1), lambda c: True),
    "AutoNormal": (
        lambda c, cfg, s: _svi_answers(c, cfg, npg.AutoNormal(c.model), c.model, s),
        lambda c: True,
    ),
    "AutoMultivariateNormal": (
        lambda c, cfg, s: _svi_answers(c, cfg, npg.AutoMultivariateNormal(c.model), c.model, s),
        lambda c: c.family != "hierarchical" or c.size <= 1000,
    ),
    "ours AutoDAIS": (_autodais, lambda c: True),
    "ours AutoDAIS K=8 N=8": (
        functools.partial(_autodais, K=8, num_particles=8),
        lambda c: c.family not in ("logistic", "hierarchical") or c.size <= 10_000,
    ),
    "ours AutoDSMCS": (
        lambda c, cfg, s: _svi_answers(c, cfg, numpyro_dais.AutoDSMCS(c.model), c.model, s),
        lambda c: c.family in ("real_models", "model_families"),
    ),
    "ours SL-DAIS": (_sldais, lambda c: c.subsampled is not None),
    "AutoNormal (mini-batches)": (_normal_minibatch, lambda c: c.subsampled is not None),
    "ours Semi-DAIS": (_semidais, lambda c: c.semi is not None),
}


def run_one(case_name, method, cfg, seed=0):
    """One method on one case, in this process: ``{answers: [...], warnings, error}``; each
    answer ``{label, seconds, mean_err, log_sd_err, right, steps}``."""
    case = load_case(case_name)
    jnp.zeros(()).block_until_ready()  # the backend's start, outside the timings
    sites = case.sites or latent_sites(case.model, case.args, case.kwargs)
    if method == "ours Semi-DAIS":
        sites = ["mu", "tau", "theta"]
    row = {"case": case_name, "method": method, "answers": [], "error": ""}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for label, seconds, draws, steps in METHODS[method][0](case, cfg, seed):
                err = errors(case, flatten(draws, sites))
                row["answers"].append(
                    dict(
                        label=label,
                        seconds=seconds,
                        mean_err=err[0],
                        log_sd_err=err[1],
                        right=is_right(err),
                        steps=steps,
                    )
                )
        except Exception as exc:  # a crash is a result
            row["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:200]
    row["warnings"] = sorted({str(w.message).split(":")[0][:60] for w in caught})
    return row


def run_in_child(case_name, method, mode, seed, timeout):
    """:func:`run_one` in a new Python process (what a user's script pays: JAX's start and
    every compilation); ``{error: "timeout"}`` past ``timeout`` seconds."""
    cmd = [sys.executable, "-m", MODULE, "--child", case_name, method, mode, str(seed)]
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # JAX's defaults, as a user gets them
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"case": case_name, "method": method, "answers": [], "error": "timeout"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"case": case_name, "method": method, "answers": [], "error": tail[0][:200]}
    return json.loads(lines[-1])


# -- references -----------------------------------------------------------------------------------


def load_references(path=REFERENCE_PATH):
    if not path.exists():
        return {}
    return json.loads(path.read_text())["models"]


def compute_references(names, path=REFERENCE_PATH):
    """4-chain NUTS references (1,000 warm-up + 2,500 draws each, from the prior medians,
    float64) of the model-family cases and the ODE model, merged into ``path``."""
    cache = {"models": load_references(path)}
    numpyro.enable_x64()
    for name in names:
        if name in ODE_CASES:
            from benchmarks import _ode_models

            model, args, kwargs, _ = _ode_models.BUILDERS[name.removeprefix("ode_")]()
        else:
            model, args, _ = FAMILY_MODELS[name]()
            kwargs = {}
        args = tuple(map(_to(jnp.float64), args))
        start = time.perf_counter()
        kernel = NUTS(model, target_accept_prob=0.9, init_strategy=init_to_median)
        mcmc = MCMC(kernel, num_warmup=1000, num_samples=2500, num_chains=4,
                    chain_method="sequential", progress_bar=False)  # fmt: skip
        mcmc.run(jax.random.key(100), *args, **kwargs)
        sites = latent_sites(model, args, kwargs)
        flat = flatten(mcmc.get_samples(), sites)
        cache["models"][name] = {
            "mean": flat.mean(0).tolist(),
            "sd": flat.std(0, ddof=1).tolist(),
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"{name}: {cache['models'][name]['seconds']} s", flush=True)
        path.write_text(json.dumps(cache, indent=1) + "\n")


# -- tables ---------------------------------------------------------------------------------------


def _best(row):
    """The fastest right answer of a row: ``(seconds, label)``, or ``(inf, None)``."""
    right = [(a["seconds"], a["label"]) for a in row["answers"] if a["right"]]
    return min(right) if right else (math.inf, None)


def _cell(row):
    if row is None:
        return ""
    if row["error"]:
        return "timeout" if row["error"] == "timeout" else "crash"
    parts = []
    for a in row["answers"]:
        label = "" if a["label"] == "draws" else f"{a['label']}: "
        steps = f", {abs(a['steps'])} steps" if a.get("steps") else ""
        if a["right"]:
            parts.append(f"{label}**{a['seconds']:.1f} s**{steps}")
        else:
            parts.append(
                f"{label}✗ {a['mean_err']:.2f}/{a['log_sd_err']:.2f} ({a['seconds']:.1f} s{steps})"
            )
    return "; ".join(parts)


def results_table(rows, cases, methods):
    by = {(r["case"], r["method"]): r for r in rows}
    return markdown_table(
        ["case"] + list(methods), [[c] + [_cell(by.get((c, m))) for m in methods] for c in cases]
    )


def ratios(rows, cases, ours="ours AutoDAIS", nuts="NUTS 4×"):
    """``{case: ours' time to its fastest right answer / NUTS's}`` (``inf`` where ours has
    none; cases where NUTS has none are left out)."""
    by = {(r["case"], r["method"]): r for r in rows}
    out = {}
    for c in cases:
        if (c, ours) not in by or (c, nuts) not in by:
            continue
        t_nuts = _best(by[c, nuts])[0]
        if math.isfinite(t_nuts):
            out[c] = _best(by[c, ours])[0] / t_nuts
    return out


def scale_figure(rows, out_path, methods):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["case"], r["method"]): r for r in rows}
    colours = {m: f"C{i}" for i, m in enumerate(METHODS)}  # one colour per method, both panels
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, family, sizes, xlabel in (
        (axes[0], "logistic", LOGISTIC_ROWS, "rows"),
        (axes[1], "hierarchical", HIER_GROUPS, "groups"),
    ):
        for m in methods:
            pts = [
                (n, _best(by[f"{family}_{n}", m])[0]) for n in sizes if (f"{family}_{n}", m) in by
            ]
            xs = [n for n, t in pts if math.isfinite(t)]
            if xs:
                ts = [t for _, t in pts if math.isfinite(t)]
                ax.plot(xs, ts, "o-", color=colours.get(m), label=m)
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="seconds to a right answer")
        ax.set_title(f"{family} (no point: not right, or not run)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def crossover(rows, family, sizes, ours, nuts="NUTS 4×"):
    """The smallest size from which ours is sooner than NUTS at every larger size."""
    by = {(r["case"], r["method"]): r for r in rows}
    first = None
    for n in sizes:
        a, b = by.get((f"{family}_{n}", ours)), by.get((f"{family}_{n}", nuts))
        if a is None or b is None:
            continue
        if _best(a)[0] < _best(b)[0]:
            first = n if first is None else first
        else:
            first = None
    return first


# -- main -----------------------------------------------------------------------------------------


def parse(argv):
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true")
    group.add_argument("--smoke", action="store_true")
    parser.add_argument("--out-dir", type=__import__("pathlib").Path, default=RESULTS_DIR)
    parser.add_argument("--cases", default=None)
    parser.add_argument("--methods", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--refs", action="store_true")
    parser.add_argument("--report", action="store_true", help="rewrite the tables from the json")
    parser.add_argument(
        "--merge", action="store_true", help="keep the other (case, method) rows of the results"
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per method and case")
    parser.add_argument("--child", nargs=4, default=None)
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return args


def main(argv=None):
    args = parse(argv)
    if args.child:
        case_name, method, mode, seed = args.child
        print(json.dumps(run_one(case_name, method, SETTINGS[mode], int(seed))), flush=True)
        return
    if args.refs:
        missing = [n for n in list(FAMILY_MODELS) + list(ODE_CASES) if n not in load_references()]
        compute_references(missing)
        return
    cfg = SETTINGS[args.mode]
    if args.report:
        name = output_name(NAME, args.mode)
        rows, cases, methods = merged(
            json.loads((args.out_dir / f"{name}.json").read_text()), [], []
        )
        body = report(rows, cases, methods, args, name)
        print(f"wrote {write_results(args.out_dir, NAME, args.mode, TITLE, MODULE, body)}")
        return
    cases = args.cases.split(",") if args.cases else list(cfg["cases"] or case_names())
    methods = args.methods.split(",") if args.methods else list(cfg["methods"] or METHODS)
    sw = Stopwatch()
    name = output_name(NAME, args.mode)
    # the rows so far, one JSON line each: an interrupted run resumes with --merge
    partial = args.out_dir / f".{name}.partial.jsonl"
    rows = []
    if args.merge and partial.exists():
        rows = [json.loads(line) for line in partial.read_text().splitlines() if line]
    done = {(r["case"], r["method"]) for r in rows}
    for c in cases:
        case = load_case(c)
        for m in methods:
            if not METHODS[m][1](case) or (c, m) in done:
                continue
            with sw.lap(c):
                if args.mode == "smoke":
                    row = run_one(c, m, cfg, args.seed)
                else:
                    row = run_in_child(c, m, args.mode, args.seed, args.timeout or cfg["timeout"])
            rows.append(row)
            with partial.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{c:28s} {m:26s} {_cell(row)}", flush=True)
    json_path = args.out_dir / f"{name}.json"
    if args.merge and json_path.exists():
        rows, cases, methods = merged(json.loads(json_path.read_text()), rows, methods)
    json_path.write_text(json.dumps(rows, indent=1) + "\n")
    body = report(rows, cases, methods, args, name)
    path = write_results(args.out_dir, NAME, args.mode, TITLE, MODULE, body, sw)
    partial.unlink(missing_ok=True)
    print(f"wrote {path}")


def merged(old, new, methods):
    """``old`` rows updated by ``new`` (by case and method): ``(rows, cases, methods)`` in the
    tables' order, for a benchmark run in several parts."""
    by = {(r["case"], r["method"]): r for r in old}
    by.update({(r["case"], r["method"]): r for r in new})
    order = {c: i for i, c in enumerate(case_names())}
    known = list(METHODS) + [m for m in methods if m not in METHODS]
    rows = sorted(by.values(), key=lambda r: (order.get(r["case"], 1e9), known.index(r["method"])))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    methods = [m for m in known if any(r["method"] == m for r in rows)]
    return rows, cases, methods


def report(rows, cases, methods, args, name):
    families = {}
    for c in cases:
        families.setdefault(load_case(c).family, []).append(c)
    sections = [
        "## Settings",
        f"A right answer: every latent coordinate's |mean − reference| ≤ {TOL_MEAN} reference "
        f"sds and |log(sd / reference sd)| ≤ {TOL_LOG_SD}. Cells: **seconds to the right "
        "answer** (wall clock in a new process, compilation included, imports and data "
        "excluded) or ✗ max mean error / max log sd error (seconds); for the SVI guides the "
        "steps `run_until_converged` took (Adam 1e-2), and for ours the `q0` draws, the "
        "`importance` draws and (AutoDAIS) the `mala` draws after the same fit, each timed "
        "from the fit's start. NUTS: `MCMC(NUTS(model), num_warmup="
        f"{SETTINGS[args.mode]['nuts'][0]}, num_samples={SETTINGS[args.mode]['nuts'][1]}, "
        "num_chains=4 or 1)` at numpyro's defaults (on one CPU device the 4 chains run one "
        "after the other). Rows of several runs are merged (`--merge`); the command above "
        "is the last one's.",
    ]
    for family, names in families.items():
        sections.append(f"## {family}\n\n{results_table(rows, names, methods)}")
    small = [c for f in ("real_models", "model_families") for c in families.get(f, [])]
    lines = []
    for ours in ("ours AutoDAIS", "ours AutoDAIS K=8 N=8"):
        for nuts in ("NUTS 4×", "NUTS 1×"):
            r = ratios(rows, small, ours, nuts)
            if not r:
                continue
            both = sorted(v for v in r.values() if math.isfinite(v))
            worst = max(r, key=r.get)
            lines.append(
                f"* {ours} / {nuts}, time to a right answer, over the {len(r)} small models "
                f"where {nuts} got it: median {statistics.median(r.values()):.2f}, worst "
                f"{r[worst]:.2f} ({worst}); ours right on {len(both)} of {len(r)}"
                + (
                    f", and there {both[0]:.2f}–{both[-1]:.2f} (median "
                    f"{statistics.median(both):.2f})"
                    if both
                    else ""
                )
            )
    for family, sizes, ours in (
        ("logistic", LOGISTIC_ROWS, "ours SL-DAIS"),
        ("hierarchical", HIER_GROUPS, "ours Semi-DAIS"),
    ):
        if family in families:
            x = crossover(rows, family, sizes, ours)
            by = {(r["case"], r["method"]): r for r in rows}
            per_size = []
            for n in sizes:
                a, b = by.get((f"{family}_{n}", ours)), by.get((f"{family}_{n}", "NUTS 4×"))
                if a is not None and b is not None:
                    t_ours, t_nuts = _best(a)[0], _best(b)[0]
                    ratio = f"{t_nuts / t_ours:.2f}" if math.isfinite(t_ours) else "ours ✗"
                    per_size.append(f"{n:,}: {ratio}")
            lines.append(
                f"* {ours} sooner than NUTS 4× from: {x if x else 'never'}; NUTS 4× time / "
                f"ours by size: {', '.join(per_size) or 'not run'}"
            )
    if any(c.startswith(("logistic", "hierarchical")) for c in cases):
        fig = args.out_dir / f"{name}_scale.png"
        scale_figure(rows, fig, methods)
        sections.append(f"![time against size]({fig.name})")
    sections.append("## Summary\n\n" + "\n".join(lines))
    return "\n\n".join(sections)


if __name__ == "__main__":
    main()
