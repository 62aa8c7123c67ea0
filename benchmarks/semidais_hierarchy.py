"""Where AutoSemiDAIS's answer on the centred normal hierarchy is off, coordinate by coordinate.

Trains ``AutoSemiDAIS(model, local_model, AutoNormal(global_model))`` on
:func:`benchmarks._scale_models.hierarchical` by :func:`numpyro_dais.run_until_converged`
(Adam 1e-2, as ``time_to_answer`` does), draws for every group, and compares with the exact
reference: μ and τ (mean error in reference sds, log sd error), and the θ_j split into the
part that the globals' error explains (the exact conditionals ``θ_j | μ, τ, y`` mixed over the
guide's own draws of μ, τ) and the chains' own part (the draws against that mixture).

Run from the repository root: ``python -m benchmarks.semidais_hierarchy --groups 1000
[--seeds 0,1] [--option K=8 ...]``; prints one line per fit.
"""

import argparse
import ast
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro import handlers
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

import numpyro_dais
from benchmarks import _scale_models

LR = 1e-2
DRAWS = 4000


def conditional_mixture(y, mu, tau):
    """Mean and sd of each θ_j under the exact ``θ_j | μ, τ, y`` mixed over draws ``(μ, τ)``."""
    ybar = y.mean(axis=1)
    s2 = _scale_models.SIGMA_Y**2 / y.shape[1]
    v = 1.0 / (1.0 / tau[:, None] ** 2 + 1.0 / s2)  # (S, J)
    m = v * (mu[:, None] / tau[:, None] ** 2 + ybar / s2)
    mean = m.mean(0)
    sd = np.sqrt(np.maximum((v + m**2).mean(0) - mean**2, 0.0))
    return mean, sd


def judge(case, y, draws):
    """Errors by coordinate: ``{name: value}``."""
    mu, tau = np.asarray(draws["mu"], np.float64), np.asarray(draws["tau"], np.float64)
    theta = np.asarray(draws["theta"], np.float64)
    ref_m, ref_s = case.mean, case.sd
    out = {}
    for i, name in enumerate(("mu", "tau")):
        x = (mu, tau)[i]
        out[f"{name}_mean"] = (x.mean() - ref_m[i]) / ref_s[i]
        out[f"{name}_logsd"] = np.log(x.std(ddof=1) / ref_s[i])
    t_err = (theta.mean(0) - ref_m[2:]) / ref_s[2:]
    t_log = np.log(theta.std(0, ddof=1) / ref_s[2:])
    out["theta_mean_max"] = np.max(np.abs(t_err))
    out["theta_logsd_max"] = np.max(np.abs(t_log))
    out["theta_logsd_median"] = np.median(t_log)
    mix_m, mix_s = conditional_mixture(y, mu, tau)
    g_err = (mix_m - ref_m[2:]) / ref_s[2:]
    out["theta_from_globals_mean_max"] = np.max(np.abs(g_err))
    out["theta_from_globals_logsd_median"] = np.median(np.log(mix_s / ref_s[2:]))
    c_err = (theta.mean(0) - mix_m) / ref_s[2:]
    c_log = np.log(theta.std(0, ddof=1) / mix_s)
    out["theta_chain_mean_max"] = np.max(np.abs(c_err))
    out["theta_chain_logsd_max"] = np.max(np.abs(c_log))
    out["theta_chain_logsd_median"] = np.median(c_log)
    # the chains' mean error against the group's distance from the pooled mean
    z = (y.mean(1) - ref_m[0]) / ref_m[1]
    out["corr(theta_chain_err, ybar)"] = np.corrcoef(c_err, z)[0, 1]
    out["mean_err"] = max(abs(out["mu_mean"]), abs(out["tau_mean"]), out["theta_mean_max"])
    out["logsd_err"] = max(abs(out["mu_logsd"]), abs(out["tau_logsd"]), out["theta_logsd_max"])
    return out


def fit(
    groups, seed=0, batch=256, max_steps=10_000, window=250, patience=3, draws=DRAWS, **options
):
    case = _scale_models.hierarchical(groups)
    y = np.asarray(case.args[0], np.float64)
    model, local_model, global_model = case.semi(batch)
    guide = numpyro_dais.AutoSemiDAIS(model, local_model, AutoNormal(global_model), **options)
    start = time.perf_counter()
    svi = SVI(model, guide, optax.adam(LR), Trace_ELBO())
    run = numpyro_dais.run_until_converged(
        svi,
        jax.random.key(seed),
        max_steps=max_steps,
        window=window,
        patience=patience,
        progress_bar=False,
    )
    jax.block_until_ready(run.params)
    fit_s = time.perf_counter() - start
    with handlers.substitute(data={"groups": jnp.arange(groups)}):
        out = guide.sample_posterior(jax.random.key(seed + 1), run.params, sample_shape=(draws,))
    out = jax.block_until_ready(out)
    total_s = time.perf_counter() - start
    result = judge(case, y, out)
    result.update(steps=run.num_steps, converged=run.converged, fit_s=fit_s, total_s=total_s)
    return result, run, guide, out


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--max-steps", type=int, default=10_000)
    parser.add_argument("--option", action="append", default=[], help="name=value")
    args = parser.parse_args(argv)
    options = {k: _value(v) for k, v in (o.split("=", 1) for o in args.option)}
    for seed in map(int, args.seeds.split(",")):
        result, *_ = fit(args.groups, seed, args.batch, args.max_steps, **options)
        text = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()
        )
        print(f"groups {args.groups} seed {seed} {options}: {text}", flush=True)


if __name__ == "__main__":
    main()
