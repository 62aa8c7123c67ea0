"""Every seed, and a self-check calibrated on a labelled set of fits.

Fits ``AutoDAIS`` on the small models of ``time_to_answer`` (``real_models`` and
``model_families``, against their NUTS references) with several training seeds and two
settings (the defaults, and ``K=8, num_particles=8``), each trained by
:func:`numpyro_dais.run_until_converged` (Adam 1e-2), then draws 4,000 ``q0`` draws (the
default ``sample_posterior``) and 4,000 importance draws. Each fit is labelled **wrong**
when its ``q0`` draws are more than 0.3 reference sds off in a mean or 0.25 off in a log sd
(any latent coordinate, constrained space), and keeps the raw statistics of the ``q0``
self-check (:meth:`~numpyro_dais.AutoDAIS.transport_check`, run by ``run_until_converged``):
the end points' largest mean shift and std ratio, and the Metropolis-adjusted Langevin
chains' largest std ratio. The report gives, per model, the median and the worst seed, and
for the self-check's tolerances the misses (wrong, and no warning) and the false alarms (a
self-check warning on a right fit) they would give on this set.

Run from the repository root: ``python -m benchmarks.self_check [--quick | --smoke]
[--cases a,b] [--shard i/n]``; shards write ``.self_check.<i>.jsonl`` beside the results
and ``--report`` writes the tables from every shard's rows.
"""

import itertools
import time
import warnings

import jax
import numpy as np

import numpyro_dais
from benchmarks import time_to_answer as tta
from benchmarks._common import (
    add_shard_arguments,
    markdown_table,
    output_name,
    parse_args,
    run_shard,
    shard_rows,
    write_results,
)
from numpyro_dais.annealed.posterior import selfcheck

NAME = "self_check"
MODULE = f"benchmarks.{NAME}"
TITLE = "Every seed, and the q0 self-check calibrated on a labelled set of fits"

#: a ``q0`` more than this far off is wrong (reference sds; absolute log sd ratio)
WRONG_MEAN = 0.3
WRONG_LOG_SD = 0.25
DRAWS = 4000
SETTINGS_OF_GUIDE = {"defaults": {}, "K=8 N=8": {"K": 8, "num_particles": 8}}

MODES = {
    "full": dict(seeds={"defaults": 5, "K=8 N=8": 2}, cases=None, max_steps=10_000, window=250),
    "quick": dict(
        seeds={"defaults": 2, "K=8 N=8": 1},
        cases=("eight_schools_noncentred", "radon", "kid_score", "student_t", "funnel"),
        max_steps=10_000,
        window=250,
    ),
    "smoke": dict(seeds={"defaults": 1}, cases=("kid_score",), max_steps=200, window=50),
}


def small_cases():
    """The cases of ``time_to_answer`` with a NUTS reference and a few dozen latents."""
    return [c for c in tta.case_names() if not c.startswith(("logistic_", "hierarchical_", "ode_"))]


def _largest(report_dict, log=False):
    """The largest ``|value|`` (``|log value|`` with ``log``) over a report's ``{site:
    array}``, keeping its sign (direction); NaN where there is none."""
    values = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in report_dict.values()])
    values = np.log(values) if log else values
    values = values[np.isfinite(values)]
    if values.size == 0:
        return float("nan")
    return float(values[np.argmax(np.abs(values))])


def fit(case_name, setting, seed, max_steps, window):
    """One labelled fit: a row of errors, warnings and the self-check's statistics."""
    case = tta.load_case(case_name)
    guide = numpyro_dais.AutoDAIS(case.model, **SETTINGS_OF_GUIDE[setting])
    sites = case.sites or tta.latent_sites(case.model, case.args, case.kwargs)
    row = dict(case=case_name, setting=setting, seed=seed, error="")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run = tta.converged(case, guide, seed, max_steps, window)
            answers = {}
            for label, kw in (("q0", {}), ("importance", {"method": "importance"})):
                draws = guide.sample_posterior(
                    jax.random.key(1000 + seed),
                    run.params,
                    *case.args,
                    sample_shape=(DRAWS,),
                    **kw,
                    **case.kwargs,
                )
                answers[label] = tta.errors(case, tta.flatten(draws, sites))
        except Exception as e:  # a crash is a wrong fit, and it says so
            row["error"] = f"{type(e).__name__}: {e}"[:200]
            run, answers = None, {}
    row["seconds"] = time.perf_counter() - start
    row["steps"] = None if run is None else int(run.num_steps)
    for label in ("q0", "importance"):
        mean, log_sd = answers.get(label, (float("nan"), float("nan")))
        row[f"{label}_mean"], row[f"{label}_log_sd"] = mean, log_sd
    check = None if run is None else run.check
    row["check_ok"] = None if check is None else bool(check.ok)
    row["shift"] = float("nan") if check is None else _largest(check.mean_shift)
    row["end_ratio"] = float("nan") if check is None else _largest(check.std_ratio, log=True)
    chains = None if check is None else check.chain_std_ratio
    row["chain_ratio"] = float("nan") if chains is None else _largest(chains, log=True)
    chains = None if check is None else check.chain_mean_shift
    row["chain_shift"] = float("nan") if chains is None else _largest(chains)
    messages = [f"{w.category.__name__}: {w.message}" for w in caught]
    row["self_check_warned"] = any("q0 " in m and "UserWarning" in m for m in messages)
    row["warnings"] = sorted({m[:160] for m in messages})
    return row


def wrong(row):
    """The fit's ``q0`` draws are wrong (or it crashed)."""
    m, s = row["q0_mean"], row["q0_log_sd"]
    return bool(row["error"]) or not (m <= WRONG_MEAN and s <= WRONG_LOG_SD)


def _about_importance(message):
    return "'importance' draws" in message


def warned(row):
    """A warning reached the user of ``q0`` (training, the self-check, the ``q0`` draws;
    not the importance draws', which judge those)."""
    return any(not _about_importance(w) for w in row["warnings"]) or bool(row["error"])


def importance_wrong(row):
    m, s = row["importance_mean"], row["importance_log_sd"]
    return bool(row["error"]) or not (m <= WRONG_MEAN and s <= WRONG_LOG_SD)


def importance_warned(row):
    return any(_about_importance(w) for w in row["warnings"])


def verdict(row, chain_shift_tol, chain_tol, shift_tol, end_tol):
    """Whether the self-check fails the fit at these tolerances (q0's mean shift from the
    chains' draws and their std ratio, the end points' mean shift and std ratio), from its
    raw statistics."""
    cs, c, s, e = row.get("chain_shift", np.nan), row["chain_ratio"], row["shift"], row["end_ratio"]
    fails = False
    if np.isfinite(cs):
        fails |= abs(cs) > chain_shift_tol
    if np.isfinite(c):
        fails |= abs(c) > np.log(chain_tol)
    if np.isfinite(s):
        fails |= abs(s) > shift_tol
    if np.isfinite(e):
        fails |= abs(e) > np.log(end_tol)
    return bool(fails)


def _fmt(x, digits=2):
    return "nan" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def fits_table(rows):
    headers = [
        "model",
        "setting",
        "seed",
        "steps",
        "q0 mean / log sd",
        "importance",
        "wrong",
        "warned",
        "chain shift",
        "chain ratio",
        "end shift",
        "end ratio",
    ]
    body = []
    for r in rows:
        body.append(
            [
                r["case"],
                r["setting"],
                r["seed"],
                r["steps"],
                f"{_fmt(r['q0_mean'])} / {_fmt(r['q0_log_sd'])}",
                f"{_fmt(r['importance_mean'])} / {_fmt(r['importance_log_sd'])}",
                "✗" if wrong(r) else "",
                "⚠" if warned(r) else "",
                _fmt(r.get("chain_shift", float("nan"))),
                _fmt(np.exp(r["chain_ratio"]) if np.isfinite(r["chain_ratio"]) else float("nan")),
                _fmt(r["shift"]),
                _fmt(np.exp(r["end_ratio"]) if np.isfinite(r["end_ratio"]) else float("nan")),
            ]
        )
    return markdown_table(headers, body)


def seeds_table(rows):
    """Per model and setting: the median and the worst seed's ``q0`` and importance errors
    (the larger of mean error and log sd error)."""
    headers = [
        "model",
        "setting",
        "seeds",
        "q0 median",
        "q0 worst",
        "importance median",
        "importance worst",
        "wrong seeds",
        "unwarned wrong",
    ]
    body = []
    keys = sorted({(r["case"], r["setting"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for case, setting in keys:
        rs = [r for r in rows if r["case"] == case and r["setting"] == setting]
        q0 = [max(r["q0_mean"], r["q0_log_sd"]) for r in rs]
        imp = [max(r["importance_mean"], r["importance_log_sd"]) for r in rs]
        q0 = [x if np.isfinite(x) else np.inf for x in q0]
        imp = [x if np.isfinite(x) else np.inf for x in imp]
        body.append(
            [
                case,
                setting,
                len(rs),
                _fmt(np.median(q0)),
                _fmt(max(q0)),
                _fmt(np.median(imp)),
                _fmt(max(imp)),
                sum(wrong(r) for r in rs),
                sum(wrong(r) and not warned(r) for r in rs),
            ]
        )
    return markdown_table(headers, body)


def _counts(rows, tolerances):
    """``(missed, false alarms)`` of the self-check at ``tolerances`` (:func:`verdict`'s) on
    ``rows``: a miss is a wrong fit that no warning reaches (the warnings other than the
    self-check's as they came); a false alarm is a right fit the self-check fails."""
    missed = alarms = 0
    for r in rows:
        other = bool(r["error"]) or any(
            "q0 " not in w and not _about_importance(w) for w in r["warnings"]
        )
        fails = verdict(r, *tolerances)
        missed += wrong(r) and not (fails or other)
        alarms += (not wrong(r)) and fails
    return missed, alarms


#: the grid of the self-check's tolerances the report scores: q0's mean shift from the
#: chains' draws (their sds) and their std ratio, the end points' mean shift (their sds)
#: and their std ratio
GRID = dict(
    chain_shift=(0.2, 0.3, 0.4),
    chain=(1.2, 1.28, 1.35, 1.5),
    shift=(0.3, 0.4, 0.5),
    end=(1.35, 1.5, 2.0),
)
#: the rows of the tolerance table shown (the best first)
TOLERANCE_ROWS = 20


def tolerance_table(rows):
    """Misses and false alarms on this set over :data:`GRID`, fewest misses first among the
    tolerances with the fewest false alarms (the best :data:`TOLERANCE_ROWS`)."""
    n_wrong = sum(wrong(r) for r in rows)
    scored = []
    for tolerances in itertools.product(*GRID.values()):
        missed, alarms = _counts(rows, tolerances)
        scored.append((alarms, missed, tolerances))
    scored.sort(key=lambda t: (t[0], t[1], tuple(-x for x in t[2])))
    body = [
        [
            *(f"{x:g}" for x in tolerances),
            f"{missed} of {n_wrong}",
            f"{alarms} of {len(rows) - n_wrong}",
        ]
        for alarms, missed, tolerances in scored[:TOLERANCE_ROWS]
    ]
    headers = [
        "chains' mean shift",
        "chains' std ratio",
        "end points' mean shift",
        "end points' std ratio",
        "missed (wrong fits)",
        "false alarms (right fits)",
    ]
    return markdown_table(headers, body)


def _pareto_warned(row):
    return any("Pareto k̂" in w and _about_importance(w) for w in row["warnings"])


def importance_verdict(row):
    """Whether the library now warns of the fit's importance draws, from its statistics:
    with one particle (the defaults) where the chains judged them, the self-check fails
    ``q0`` and the end points share its error (they stay near it, or the spread is off:
    ``numpyro_dais.annealed.posterior.selfcheck``); elsewhere the Pareto ``k̂`` warning as
    the fit gave it."""
    c = row["chain_ratio"]
    if row["setting"] != "defaults" or not np.isfinite(c):
        return _pareto_warned(row)
    chains_ok = not verdict(row, *DEFAULTS[:2], np.inf, np.inf)
    end_points_ok = not verdict(row, np.inf, np.inf, *DEFAULTS[2:])
    spread_ok = abs(c) <= np.log(selfcheck.CHAIN_STD_RATIO_TOL)
    return not chains_ok and (end_points_ok or not spread_ok)


def importance_table(rows):
    """The importance draws against their warnings: as the fits ran (the Pareto ``k̂`` of
    the pooled weights behind them, draws that are not finite, and whatever else named
    them), and at the library's rule now (:func:`importance_verdict`), per setting."""
    body = []
    for setting in SETTINGS_OF_GUIDE:
        rs = [r for r in rows if r["setting"] == setting]
        for judge, warned_of in (("as run", importance_warned), ("now", importance_verdict)):
            cells = {(w, k): 0 for w in (True, False) for k in (True, False)}
            for r in rs:
                cells[importance_wrong(r), bool(warned_of(r))] += 1
            body.append(
                [
                    setting,
                    judge,
                    f"{cells[True, True]} of {cells[True, True] + cells[True, False]}",
                    f"{cells[False, True]} of {cells[False, True] + cells[False, False]}",
                ]
            )
    return markdown_table(["setting", "warnings", "wrong and warned", "right but warned"], body)


#: the library's tolerances, in :func:`verdict`'s order
DEFAULTS = (
    selfcheck.CHAIN_MEAN_TOL,
    selfcheck.CHAIN_STD_RATIO_TOL,
    selfcheck.MEAN_SHIFT_TOL,
    selfcheck.STD_RATIO_TOL,
)


def _names(rows):
    return ", ".join(sorted({r["case"] + " (" + r["setting"] + ")" for r in rows})) or "none"


def report(rows):
    n = len(rows)
    n_wrong = sum(wrong(r) for r in rows)
    missed = [r for r in rows if wrong(r) and not warned(r)]
    alarms = [r for r in rows if not wrong(r) and r["self_check_warned"]]
    other = lambda r: (
        bool(r["error"]) or any("q0 " not in w and not _about_importance(w) for w in r["warnings"])
    )
    missed_now = [r for r in rows if wrong(r) and not (verdict(r, *DEFAULTS) or other(r))]
    alarms_now = [r for r in rows if not wrong(r) and verdict(r, *DEFAULTS)]
    lines = [
        "A fit is wrong when its q0 draws are more than "
        f"{WRONG_MEAN} reference sds off in a mean or {WRONG_LOG_SD} off in a log sd.",
        "",
        f"* fits: {n}; wrong: {n_wrong}",
        f"* at the library's tolerances now ({', '.join(f'{t:g}' for t in DEFAULTS)}: the "
        "chains' mean shift and std ratio, the end points'), from each fit's statistics: "
        f"wrong with no warning (missed) {len(missed_now)}, right but failed by the "
        f"self-check (false alarms) {len(alarms_now)} of {n - n_wrong}",
        f"* missed: {_names(missed_now)}; false alarms: {_names(alarms_now)}",
        f"* as the fits ran (the warnings they gave): missed {len(missed)}, false alarms "
        f"{len(alarms)}",
        "",
        "## Per model: median and worst seed",
        "",
        "Errors are the larger of the max mean error (reference sds) and the max |log sd ratio|.",
        "",
        seeds_table(rows),
        "",
        "## The self-check's tolerances on this set",
        "",
        tolerance_table(rows),
        "",
        "## The importance draws' own warning",
        "",
        importance_table(rows),
        "",
        "## Every fit",
        "",
        fits_table(rows),
    ]
    return "\n".join(lines)


def extra_args(parser):
    add_shard_arguments(parser)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="training seeds from this one (a hold-out set)"
    )


def _line(row):
    return (
        f"{row['case']:26s} {row['setting']:8s} {row['seed']} "
        f"q0 {_fmt(row['q0_mean'])}/{_fmt(row['q0_log_sd'])} "
        f"{'✗' if wrong(row) else '✓'}{'⚠' if warned(row) else ''} "
        f"chains {_fmt(row.get('chain_shift'))}/{_fmt(row['chain_ratio'])} {row['seconds']:.0f}s"
    )


def main(argv=None):
    args = parse_args(TITLE, argv, extra_args)
    mode = args.mode
    cfg = MODES[mode]
    name = output_name(NAME, mode)
    out_dir = args.out_dir
    if not args.report:
        cases = args.cases.split(",") if args.cases else list(cfg["cases"] or small_cases())
        jobs = [
            (c, setting, seed)
            for setting, num_seeds in cfg["seeds"].items()
            for seed in range(args.first_seed, args.first_seed + num_seeds)
            for c in cases
        ]
        run = lambda *job: fit(*job, cfg["max_steps"], cfg["window"])
        run_shard(out_dir, name, jobs, args.shard, ("case", "setting", "seed"), run, _line)
    rows = shard_rows(out_dir, name, lambda r: (r["setting"], r["case"], r["seed"]))
    path = write_results(out_dir, NAME, mode, TITLE, MODULE, report(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
