"""The set-up's cost as the data grow: `svi.init` of AutoDAIS on a large logistic GLMM.

`benchmarks._large_models.logistic_glmm` (67 groups, D = 71; its joint mode overfits the
groups, so the set-up also refines the Laplace start by Gaussian VI) at several numbers of
rows. Each size runs in a new process, as a user's first fit would, after a discarded
`svi.init` of AutoNormal on 500 rows (JAX's own start-up): the first `svi.init` of AutoDAIS
(defaults, and K = 8, N = 8) at that size, compilation included, against the first
`svi.init` of numpyro's AutoNormal at that size and against one full-data gradient of the
log joint (compiled, then timed), all in that process. Of the set-up, the refinement
(its trigger and fit) is timed around its call; its evaluations are `guide.refinement`'s.
"""

import json
import subprocess
import sys
import time
import warnings

from benchmarks._common import Stopwatch, markdown_table, parse_args, write_results

SETTINGS = {
    "full": {"rows": (2_000, 20_000, 200_000, 1_000_000)},
    "quick": {"rows": (2_000, 200_000)},
    "smoke": {"rows": (500,)},
}
#: rows of the discarded first `svi.init` in each process
WARM_ROWS = 500
#: the guides' options, by column
GUIDES = {"AutoDAIS defaults": {}, "AutoDAIS K=8 N=8": {"K": 8, "num_particles": 8}}


def one_size(rows):
    """Time the `svi.init`s of one size in this (new) process; a dict of seconds."""
    import jax
    import jax.numpy as jnp
    import optax
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal

    from benchmarks._common import flat_log_joint
    from benchmarks._large_models import logistic_glmm, logistic_glmm_data
    from numpyro_dais import AutoDAIS
    from numpyro_dais.annealed import setup

    def data(rows):
        (X, group), kw = logistic_glmm_data(rows)
        args = (jnp.asarray(X), jnp.asarray(group))
        return args, {"y": jnp.asarray(kw["y"]), "num_groups": kw["num_groups"]}

    def init(guide, args, kwargs):
        svi = SVI(logistic_glmm, guide, optax.adam(1e-2), Trace_ELBO())
        t0 = time.perf_counter()
        jax.block_until_ready(svi.init(jax.random.key(0), *args, **kwargs))
        return time.perf_counter() - t0

    init(AutoNormal(logistic_glmm), *data(WARM_ROWS))
    args, kwargs = data(rows)
    out = {}

    refine_seconds = []
    original = setup._refine

    def timed_refine(*a, **k):
        t0 = time.perf_counter()
        result = original(*a, **k)
        refine_seconds.append(time.perf_counter() - t0)
        return result

    setup._refine = timed_refine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["AutoNormal"] = init(AutoNormal(logistic_glmm), args, kwargs)
        for name, options in GUIDES.items():
            refine_seconds.clear()
            guide = AutoDAIS(logistic_glmm, **options)
            out[name] = init(guide, args, kwargs)
            out[name + ": refinement"] = sum(refine_seconds)
            out[name + ": refinement evaluations"] = int(guide.refinement.num_evals)
    log_joint, z = flat_log_joint(lambda: logistic_glmm(*args, **kwargs), ())
    grad = jax.jit(jax.grad(log_joint))
    jax.block_until_ready(grad(z))
    t0 = time.perf_counter()
    for _ in range(10):
        jax.block_until_ready(grad(z))
    out["gradient"] = (time.perf_counter() - t0) / 10
    return out


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    sw = Stopwatch()
    results = {}
    for rows in SETTINGS[args.mode]["rows"]:
        with sw.lap(f"{rows:,} rows"):
            cmd = [sys.executable, "-m", "benchmarks.setup_scaling", "--one-size", str(rows)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[rows] = json.loads(done.stdout.strip().splitlines()[-1])
        print(rows, results[rows], flush=True)
    headers = ["rows", "AutoNormal svi.init (s)", "one full-data gradient (ms)"]
    for name in GUIDES:
        headers += [
            f"{name}: svi.init (s)",
            "of it, the refinement (s; evaluations of 32 gradients)",
            "/ AutoNormal's",
        ]
    table = []
    for rows, r in results.items():
        row = [f"{rows:,}", f"{r['AutoNormal']:.2f}", f"{1e3 * r['gradient']:.2f}"]
        for name in GUIDES:
            row += [
                f"{r[name]:.2f}",
                f"{r[name + ': refinement']:.2f} ({r[name + ': refinement evaluations']})",
                f"{r[name] / r['AutoNormal']:.1f}",
            ]
        table.append(row)
    body = "\n\n".join(
        [
            "## Settings",
            __doc__.split("\n", 2)[2].strip(),
            "## `svi.init` by size",
            markdown_table(headers, table),
        ]
    )
    title = "The set-up's cost as the data grow"
    path = write_results(
        args.out_dir, "setup_scaling", args.mode, title, "benchmarks.setup_scaling", body, sw
    )
    print(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one-size"]:
        print(json.dumps(one_size(int(sys.argv[2]))))
    else:
        main()
