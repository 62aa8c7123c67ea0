"""Helpers shared by the benchmark scripts: modes, machine info, timing, SVI runs, results.

Every script is run from the repository root as ``python -m benchmarks.<name>`` with
``--quick`` (minutes), ``--smoke`` (seconds, for the test suite) or neither (full mode),
and writes ``<out-dir>/<name>{_quick,_smoke}.md`` plus its figures.
"""

import argparse
import importlib.util
import json
import os
import platform
import shlex
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.flatten_util import ravel_pytree
from numpyro.infer import util as infer_util

RESULTS_DIR = Path(__file__).resolve().parent / "results"
MODES = ("full", "quick", "smoke")


def quickstart_module():
    """The quick-start module (``examples/`` is not a package): its model, data and ``fit``."""
    path = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"
    spec = importlib.util.spec_from_file_location("quickstart", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(description, argv=None, extra=None):
    """Command line ``--quick`` / ``--smoke`` / ``--out-dir``; ``extra(parser)`` adds more."""
    parser = argparse.ArgumentParser(description=description)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="small settings (minutes)")
    group.add_argument("--smoke", action="store_true", help="tiny settings (test suite)")
    parser.add_argument(
        "--out-dir", type=Path, default=RESULTS_DIR, help="where the results file and figures go"
    )
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return args


def output_name(name, mode):
    """``name`` for full mode, ``name_quick`` / ``name_smoke`` otherwise."""
    return name if mode == "full" else f"{name}_{mode}"


def machine_info():
    """Platform, CPU count, load and library versions, as a dict of strings."""
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu count": str(os.cpu_count()),
        "load average when written (1, 5, 15 min)": load,
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "devices": ", ".join(str(d) for d in jax.devices()),
    }


def machine_line():
    """:func:`machine_info` on one line, for scripts that write their own header."""
    return "; ".join(f"{k}: {v}" for k, v in machine_info().items())


def time_steps(step, state, repeats, steps, reduce=statistics.median):
    """Seconds per call of ``step(state) -> (state, loss)`` once warm (compiled first):
    ``reduce`` (median by default) over ``repeats`` timed blocks of ``steps`` calls."""
    state, loss = step(state)
    jax.block_until_ready(loss)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            state, loss = step(state)
        jax.block_until_ready(loss)
        times.append((time.perf_counter() - start) / steps)
    return float(reduce(times))


def time_interleaved(calls, repeats, steps, reduce=statistics.median):
    """Seconds per call of each ``calls[name]()`` (returns something to block on), once warm:
    blocks of ``steps`` calls, the configurations taking turns block by block so that a
    change of machine load hits all of them alike, then ``reduce`` over the ``repeats``
    blocks of each. Returns ``{name: seconds}``."""
    for call in calls.values():
        jax.block_until_ready(call())
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(steps):
                out = call()
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / steps)
    return {name: float(reduce(t)) for name, t in times.items()}


def svi_stepper(svi, *model_args, seed=0):
    """A zero-argument call that takes one jitted ``svi.update`` step from its own state
    and returns the loss: for :func:`time_interleaved`."""
    update = jax.jit(svi.update)
    box = [svi.init(jax.random.key(seed), *model_args)]

    def call():
        box[0], loss = update(box[0], *model_args)
        return loss

    return call


def command_line(module):
    """The command that reproduces this run."""
    return " ".join(["python", "-m", module, *map(shlex.quote, sys.argv[1:])])


class Stopwatch:
    """Wall-clock time since creation, and named laps."""

    def __init__(self):
        self.start = time.perf_counter()
        self.laps = {}

    def elapsed(self):
        return time.perf_counter() - self.start

    @contextmanager
    def lap(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.laps[name] = self.laps.get(name, 0.0) + time.perf_counter() - t0


def markdown_table(headers, rows):
    """A GitHub markdown table from a header list and rows of cells (converted with ``str``)."""
    lines = [
        "| " + " | ".join(map(str, headers)) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def sci(x, digits=2):
    """``1.23e-04`` style; ``nan`` stays ``nan``."""
    x = float(x)
    return "nan" if not np.isfinite(x) else f"{x:.{digits}e}"


def write_results(out_dir, name, mode, title, module, body, stopwatch=None):
    """Write ``<out_dir>/<name>{_mode}.md``: title, command, machine, wall time, ``body``."""
    info = machine_info()
    lines = [
        f"# {title}",
        "",
        f"Mode: **{mode}**",
        "",
        "Command (from the repository root):",
        "",
        "```",
        command_line(module),
        "```",
        "",
        "Machine:",
        "",
    ]
    lines += [f"* {k}: {v}" for k, v in info.items()]
    if stopwatch is not None:
        lines += [f"* wall time: {stopwatch.elapsed():.0f} s"]
        lines += [f"  * {k}: {v:.0f} s" for k, v in stopwatch.laps.items()]
    lines += ["", body.rstrip(), ""]
    path = Path(out_dir) / f"{output_name(name, mode)}.md"
    path.write_text("\n".join(lines))
    return path


def fit_svi(svi, model_args, rng_keys, num_steps, num_checkpoints=1, init_key=None):
    """Train one SVI problem from several seeds at once.

    ``vmap`` over the seeds of a jitted ``lax.scan`` over ``svi.update``; every seed starts
    from the same initial parameters (``svi.init`` with ``init_key``) and differs only in
    its random stream. Returns ``(params, losses)``: ``params`` has leading shape
    ``(num_seeds, num_checkpoints)`` (parameters after each equal chunk of steps, the last
    one after ``num_steps``), ``losses`` has shape ``(num_seeds, num_steps)``.
    """
    if num_steps % num_checkpoints:
        raise ValueError("num_steps must be a multiple of num_checkpoints")
    init_key = jax.random.PRNGKey(0) if init_key is None else init_key
    state0 = svi.init(init_key, *model_args)
    chunk = num_steps // num_checkpoints

    def one_chunk(state, _):
        state, losses = jax.lax.scan(
            lambda s, _: svi.update(s, *model_args), state, None, length=chunk
        )
        return state, (svi.get_params(state), losses)

    def run(key):
        _, (params, losses) = jax.lax.scan(
            one_chunk, state0._replace(rng_key=key), None, length=num_checkpoints
        )
        return params, losses.reshape(-1)

    params, losses = jax.jit(jax.vmap(run))(rng_keys)
    return params, np.asarray(losses)


def gaussian_moments(q):
    """``(mean, marginal sds)`` of a Gaussian ``get_posterior`` as NumPy arrays: a diagonal
    ``Normal`` (possibly ``Independent``) or a full-rank ``MultivariateNormal`` (AutoDAIS's
    ``q0``, whitened)."""
    if hasattr(q, "covariance_matrix"):
        return np.asarray(q.mean), np.sqrt(np.diagonal(np.asarray(q.covariance_matrix), 0, -2, -1))
    q = getattr(q, "base_dist", q)
    return np.asarray(q.loc), np.asarray(q.scale)


def log_joint_fn(model, model_args, site):
    """``z -> log p(x, z)`` for a model whose only latent is the real-valued site ``site``."""

    def log_joint(z):
        return infer_util.log_density(model, model_args, {}, {site: z})[0]

    return log_joint


# -- the gradient floor of an annealing step ------------------------------------------------


def flat_log_joint(model, model_args, seed=0):
    """``(ℓ, z_init)``: ``ℓ(z)`` the model's log joint on a flat unconstrained ``z`` (numpyro's
    own potential, Jacobians included) and an initial point, for floor measurements that do
    not go through this package."""
    info = infer_util.initialize_model(jax.random.key(seed), model, model_args=model_args)
    z_init, unravel = ravel_pytree(info.param_info.z)
    return (lambda z: -info.potential_fn(unravel(z))), z_init


def gradient_floor(log_joint, z_init, num):
    """A call of ``num`` vmapped, jitted gradients of ``log_joint`` (at points around
    ``z_init``): the work of ``num`` particle-transitions, and nothing else."""
    z = z_init + 0.1 * jax.random.normal(jax.random.key(0), (num, z_init.shape[0]))
    grads = jax.jit(jax.vmap(jax.grad(log_joint)))
    return lambda: grads(z)


def chain_floor(log_joint, z_init, K, N):
    """A call of the value and gradient, in the start points and a step size, of ``N``
    vmapped chains of ``K`` gradient steps ``z ← z + η ∇ℓ(z)`` (then ``ℓ(z_K)``): the least
    that differentiating through ``K`` transitions costs (reverse mode through each
    gradient is a Hessian-vector product)."""

    def chain(z0, eta):
        def body(z, _):
            value, grad = jax.value_and_grad(log_joint)(z)
            return z + eta * grad, value

        z_K, values = jax.lax.scan(body, z0, None, length=K)
        return jnp.sum(values) + log_joint(z_K)

    z0 = z_init + 0.1 * jax.random.normal(jax.random.key(0), (N, z_init.shape[0]))
    loss = lambda z0, eta: jnp.sum(jax.vmap(chain, (0, None))(z0, eta))
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    return lambda: step(z0, 1e-3)


def run_shard(out_dir, name, jobs, shard, fields, run, describe):
    """Run shard ``shard`` (``"i/n"``: every n-th of ``jobs`` from the i-th) of a benchmark
    whose fits are independent, appending each row (``run(*job)``, a dict) as one JSON line
    to ``<out_dir>/.<name>.<i>.jsonl`` and printing ``describe(row)``; a job whose row is
    there already (its ``fields`` equal to the job) is skipped, so an interrupted shard
    resumes."""
    i, n = (int(x) for x in shard.split("/"))
    path = Path(out_dir) / f".{name}.{i}.jsonl"
    done = set()
    if path.exists():
        rows = map(json.loads, path.read_text().splitlines())
        done = {tuple(r[f] for f in fields) for r in rows}
    for job in jobs[i::n]:
        if tuple(job) in done:
            continue
        row = run(*job)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(describe(row), flush=True)


def shard_rows(out_dir, name, sort_key):
    """Every shard's rows (:func:`run_shard`), sorted by ``sort_key`` and also written to
    ``<out_dir>/<name>.json``."""
    rows = [
        json.loads(line)
        for p in sorted(Path(out_dir).glob(f".{name}.*.jsonl"))
        for line in p.read_text().splitlines()
        if line
    ]
    rows.sort(key=sort_key)
    (Path(out_dir) / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def add_shard_arguments(parser):
    """``--cases a,b``, ``--shard i/n`` and ``--report``: the options of a benchmark run in
    shards (:func:`run_shard`, :func:`shard_rows`)."""
    parser.add_argument("--cases", default=None)
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th fit from the i-th")
    parser.add_argument("--report", action="store_true", help="write the tables from the rows")
