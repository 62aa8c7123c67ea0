"""Does re-estimating the whitening (m, L) half-way through training help AutoDAIS?

The set-up whitens by the Laplace fit at a mode, ``z = m + L u``, fixed for the guide's
life. The alternative measured here: after half the steps, draw importance-resampled end
points, set ``m`` to their mean and ``L`` to the Cholesky factor of their covariance, restart
``q0`` at ``N(0, I)`` in the new ``u`` (a fresh Adam state), and train the other half.
Against the same number of steps with the set-up's whitening, on the real models of
:mod:`benchmarks.real_models` (their NUTS references), with errors as there.

    python -m benchmarks.reestimate_preconditioner [--quick | --smoke]
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO

import numpyro_dais
from benchmarks import _real_models
from benchmarks import real_models as rm
from benchmarks._common import Stopwatch, markdown_table, parse_args, write_results
from numpyro_dais.annealed import sampling

NAME = "reestimate_preconditioner"
MODULE = f"benchmarks.{NAME}"
MODELS = ("gp_poisson", "hier_logistic", "eight_schools_noncentred", "radon")
SETTINGS = {
    "full": dict(models=MODELS, steps=5000, draws=4000),
    "quick": dict(models=MODELS, steps=1500, draws=4000),
    "smoke": dict(models=("eight_schools_noncentred",), steps=20, draws=100),
}


def fit(entry, steps, draws, reestimate):
    """``{method: metrics}`` of one AutoDAIS fit (K = 8, N = 8, Adam 1e-2)."""
    args, kwargs = rm.as_jax(entry)
    guide = numpyro_dais.AutoDAIS(entry.model, K=rm.K, num_particles=rm.NUM_PARTICLES)
    svi = SVI(entry.model, guide, optax.adam(rm.LR), Trace_ELBO())
    state = svi.init(jax.random.PRNGKey(0), *args, **kwargs)
    update = jax.jit(lambda s: svi.update(s, *args, **kwargs)[0])
    for _ in range(steps // 2):
        state = update(state)
    if reestimate:
        params = svi.get_params(state)
        fitted = guide._params_from(params)
        call = guide._bind(fitted, args, kwargs)
        z = sampling.draw(call, jax.random.PRNGKey(5), "importance", draws)
        z = np.asarray(z, np.float64)
        cov = np.cov(z.T) + 1e-9 * np.eye(z.shape[1])
        chol = np.linalg.cholesky(cov)
        params = dict(
            params,
            auto_preconditioner_loc=jnp.asarray(z.mean(0)),
            auto_preconditioner_scale=jnp.asarray(chol),
            auto_preconditioner_log_det=jnp.asarray(np.sum(np.log(np.diag(chol)))),
            auto_z_0_loc=jnp.zeros_like(params["auto_z_0_loc"]),
            auto_z_0_scale=jnp.ones_like(params["auto_z_0_scale"]),
        )
        state = svi.init(jax.random.PRNGKey(0), *args, init_params=params, **kwargs)
    for _ in range(steps - steps // 2):
        state = update(state)
    params = svi.get_params(state)
    sites = rm.latent_sites(entry, args, kwargs)
    out = {}
    for method in ("q0", "importance"):
        draws_ = guide.sample_posterior(
            jax.random.PRNGKey(1), params, *args, sample_shape=(draws,), method=method, **kwargs
        )
        out[method] = rm.metrics(rm.load_references()[entry.name], *rm.flatten(draws_, sites))
    return out


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    sw = Stopwatch()
    rows = []
    with rm.x64(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in cfg["models"]:
            entry = _real_models.load(name)
            with sw.lap(name):
                res = {r: fit(entry, cfg["steps"], cfg["draws"], r) for r in (False, True)}
            cell = lambda m: f"{m['max_mean_err']:.2f} / {m['max_log_sd']:.2f}"
            row = [name] + [cell(res[r][meth]) for meth in ("q0", "importance") for r in (0, 1)]
            rows.append(row)
            print(" | ".join(row), flush=True)
    headers = [
        "model",
        "q0, set-up whitening",
        "q0, re-estimated",
        "importance, set-up whitening",
        "importance, re-estimated",
    ]
    table = markdown_table(headers, rows)
    body = "\n\n".join(
        [
            "## Settings",
            f"AutoDAIS(K={rm.K}, num_particles={rm.NUM_PARTICLES}), Adam {rm.LR}, "
            f"{cfg['steps']} steps, float64; re-estimated after {cfg['steps'] // 2} steps from "
            f"{cfg['draws']} importance-resampled end points (fresh Adam state, q0 = N(0, I) "
            f"in the new coordinates); {cfg['draws']} draws each; training key PRNGKey(0), "
            "draw key PRNGKey(1). Cells: max |mean error| (reference sds) / max |log sd "
            "ratio|, as in `real_models`.",
            "## Results",
            table,
        ]
    )
    print(table)
    path = write_results(
        args.out_dir,
        NAME,
        args.mode,
        "Re-estimating the whitening half-way through training",
        MODULE,
        body,
        sw,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
