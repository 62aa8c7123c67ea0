"""``sample_posterior(method="mala")`` against ``q0`` on the small models, every seed.

Fits ``AutoDAIS`` with its defaults by :func:`numpyro_dais.run_until_converged` (Adam 1e-2)
on the small models of ``time_to_answer`` (``real_models``, ``model_families`` and the
other forms of the hierarchies, against their NUTS references), then draws 4,000 ``q0``
draws and 4,000 ``method="mala"`` draws (Metropolis-adjusted Langevin chains from ``q0``
draws, preconditioned by ``q0``). Cells: the larger of the max mean error (reference sds)
and the max |log sd ratio|; a draw set is **wrong** above 0.3 in a mean or 0.25 in a log
sd, as in ``self_check``. ``warned``: the self-check warned about ``q0``, or the chains
warned that they had not settled. Seconds: the ``mala`` call in the fit's process, first
(compilation included) and again.

Run from the repository root: ``python -m benchmarks.mala_draws [--quick | --smoke]
[--cases a,b] [--seeds n] [--shard i/n]``; shards write ``.mala_draws.<i>.jsonl`` beside
the results, ``--report`` writes the tables from every shard's rows.
"""

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
from benchmarks.self_check import WRONG_LOG_SD, WRONG_MEAN, small_cases

NAME = "mala_draws"
MODULE = f"benchmarks.{NAME}"
TITLE = "Metropolis-adjusted chains from q0 draws (method='mala') against q0, every seed"
DRAWS = 4000
FORMS = (
    "eight_schools_noncentred:locals_first",
    "eight_schools_noncentred:to_event",
    "hier_logistic:locals_first",
    "radon:to_event",
    "gp_poisson:locals_first",
)
MODES = {
    "full": dict(seeds=2, cases=None),
    "quick": dict(seeds=1, cases=("eight_schools_noncentred", "radon", "hier_logistic")),
    "smoke": dict(seeds=1, cases=("kid_score",)),
}


def _errors(case, draws, sites):
    """``[max mean error, max |log sd ratio|]``, ``inf`` where not finite."""
    return [
        x if np.isfinite(x) else float("inf") for x in tta.errors(case, tta.flatten(draws, sites))
    ]


def _cell(errors):
    return max(errors) if errors is not None else float("inf")


def is_wrong(errors):
    return errors is None or not (errors[0] <= WRONG_MEAN and errors[1] <= WRONG_LOG_SD)


def fit(case_name, seed, max_steps):
    case = tta.load_case(case_name)
    guide = numpyro_dais.AutoDAIS(case.model)
    sites = case.sites or tta.latent_sites(case.model, case.args, case.kwargs)
    row = dict(case=case_name, seed=seed, error="")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            start = time.perf_counter()
            run = tta.converged(case, guide, seed, max_steps, min(250, max_steps // 4))
            key, params = jax.random.key(1000 + seed), run.params
            q0 = guide.sample_posterior(key, params, sample_shape=(DRAWS,))
            jax.block_until_ready(q0)
            row["fit_seconds"] = time.perf_counter() - start
            row["q0"] = _errors(case, q0, sites)
            row["q0_warned"] = any("q0 " in str(w.message) for w in caught)
            seconds = []
            for k in range(2):
                start, n_before = time.perf_counter(), len(caught)
                draws = guide.sample_posterior(
                    jax.random.fold_in(key, k), params, *case.args, sample_shape=(DRAWS,),
                    method="mala", **case.kwargs,
                )  # fmt: skip
                jax.block_until_ready(draws)
                seconds.append(time.perf_counter() - start)
            row["mala"] = _errors(case, draws, sites)
            # q0 judged by the chains' draws instead of NUTS: what a self-check built on
            # them would see (no reference needed)
            mala_ref = tta.flatten(draws, sites)
            mala_ref = mala_ref[np.all(np.isfinite(mala_ref), axis=1)]
            as_ref = case._replace(mean=mala_ref.mean(0), sd=mala_ref.std(0, ddof=1))
            row["q0_vs_mala"] = _errors(as_ref, q0, sites)
            row["mala_warned"] = any("'mala'" in str(w.message) for w in caught[n_before:])
            row["mala_seconds"] = seconds
        except Exception as e:  # a crash is a wrong answer, and it says so
            row["error"] = f"{type(e).__name__}: {e}"[:200]
    return row


def _fmt(x):
    return "—" if x is None else "∞" if not np.isfinite(x) else f"{x:.2f}"


def _outcome(rows, key, warned_key):
    """``(wrong, wrong and not warned, right but warned)`` counts of ``rows``' ``key``."""
    bad = [r for r in rows if is_wrong(r.get(key))]
    silent = [r for r in bad if not r.get(warned_key) and not r.get("q0_warned")]
    alarms = [r for r in rows if not is_wrong(r.get(key)) and r.get(warned_key)]
    return len(bad), len(silent), len(alarms)


def judged_by_chains(rows):
    """``q0`` judged against the ``mala`` draws instead of NUTS (max mean error in the
    chains' sds, max |log sd ratio|), over the fits whose chains are right: for each pair
    of tolerances, the wrong ``q0`` it would pass and the right ``q0`` it would fail."""
    usable = [r for r in rows if r.get("q0_vs_mala") and not is_wrong(r.get("mala"))]
    body = []
    for mean_tol in (0.2, 0.3):
        for log_tol in (0.15, 0.2, 0.25):
            fails = [not (r["q0_vs_mala"][0] <= mean_tol and r["q0_vs_mala"][1] <= log_tol)
                     for r in usable]  # fmt: skip
            missed = sum(is_wrong(r["q0"]) and not f for r, f in zip(usable, fails, strict=True))
            alarms = sum(not is_wrong(r["q0"]) and f for r, f in zip(usable, fails, strict=True))
            body.append([mean_tol, log_tol, missed, alarms])
    wrong = sum(is_wrong(r["q0"]) for r in usable)
    right = len(usable) - wrong
    headers = [
        "mean tolerance",
        "log sd tolerance",
        f"wrong q0 passed (of {wrong})",
        f"right q0 failed (of {right})",
    ]
    return markdown_table(headers, body)


def report(rows):
    body = []
    for case in sorted({r["case"] for r in rows}):
        rs = [r for r in rows if r["case"] == case]
        q0 = [_cell(r.get("q0")) for r in rs]
        ml = [_cell(r.get("mala")) for r in rs]
        secs = [r["mala_seconds"] for r in rs if "mala_seconds" in r]
        body.append(
            [
                case,
                len(rs),
                _fmt(np.median(q0)),
                _fmt(max(q0)),
                "⚠" * sum(bool(r.get("q0_warned")) for r in rs),
                _fmt(np.median(ml)),
                _fmt(max(ml)),
                "⚠" * sum(bool(r.get("mala_warned")) for r in rs),
                f"{np.median([s[0] for s in secs]):.1f} / {np.median([s[1] for s in secs]):.2f}"
                if secs
                else "—",
                "; ".join(r["error"] for r in rs if r["error"])[:80],
            ]
        )
    headers = [
        "model", "seeds", "q0 median", "q0 worst", "q0 warned", "mala median", "mala worst",
        "mala warned", "mala s (first / again)", "error",
    ]  # fmt: skip
    n = len(rows)
    qw, qs, _ = _outcome(rows, "q0", "q0_warned")
    mw, ms, ma = _outcome(rows, "mala", "mala_warned")
    lines = [
        f"A draw set is wrong above {WRONG_MEAN} reference sds in a mean or {WRONG_LOG_SD} in "
        "a log sd; cells are the larger of the two.",
        "",
        f"* fits: {n}",
        f"* q0 draws wrong: {qw} (with no warning: {qs})",
        f"* mala draws wrong: {mw} (with no warning from the chains or the self-check: {ms}); "
        f"right but the chains warned: {ma}",
        "",
        markdown_table(headers, body),
        "",
        "## q0 judged by the chains instead of NUTS",
        "",
        "What a check of `q0` against its own `mala` draws would say, on the fits whose "
        "`mala` draws are right:",
        "",
        judged_by_chains(rows),
    ]
    return "\n".join(lines)


def extra_args(parser):
    add_shard_arguments(parser)
    parser.add_argument("--seeds", type=int, default=None)


def _line(row):
    return (
        f"{row['case']:40s} {row['seed']} q0 {_fmt(_cell(row.get('q0')))} "
        f"mala {_fmt(_cell(row.get('mala')))}{'⚠' if row.get('mala_warned') else ''} "
        f"{row.get('mala_seconds')} {row['error'][:60]}"
    )


def main(argv=None):
    args = parse_args(TITLE, argv, extra_args)
    cfg = MODES[args.mode]
    name = output_name(NAME, args.mode)
    out_dir = args.out_dir
    if not args.report:
        default = cfg["cases"] or (*small_cases(), *FORMS)
        cases = args.cases.split(",") if args.cases else list(default)
        seeds = args.seeds or cfg["seeds"]
        jobs = [(c, s) for s in range(seeds) for c in cases]
        max_steps = 200 if args.mode == "smoke" else 10_000
        run = lambda *job: fit(*job, max_steps)
        run_shard(out_dir, name, jobs, args.shard, ("case", "seed"), run, _line)
    rows = shard_rows(out_dir, name, lambda r: (r["case"], r["seed"]))
    path = write_results(out_dir, NAME, args.mode, TITLE, MODULE, report(rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
