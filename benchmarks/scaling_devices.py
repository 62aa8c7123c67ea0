"""Device scaling: ``log_evidence`` with many particles, and a full-data training step with
many rows, split over 1, 2, 4, ... devices.

``AutoDAIS`` (``K = 8``, HMC) on a Bayesian logistic regression (``D = 10`` weights,
``Nd = 200`` rows, synthetic), parameters from ``svi.init`` (untrained: the cost of a call
does not depend on them). For each device count ``m`` a child process starts JAX with ``m``
devices (on CPU, ``--xla_force_host_platform_device_count=m`` host devices, which share the
machine's cores; on an accelerator, the first ``m`` devices) and times
``log_evidence(..., num_particles=N, batch_size=B, mesh=Mesh(devices[:m]))`` compiled and
warm (median of repeats), with ``m = 1`` (no mesh) as the baseline of the same run. Memory
per device is XLA's own account of the compiled program (``compiled.memory_analysis()``:
arguments + outputs + temporaries of one device's partition), plus the allocator's peak
(``device.memory_stats()``) where the backend reports one (GPUs do, CPUs do not). Every
row reports its ``log_Z`` and its difference from the baseline's (same key: it should be
float rounding).

Full-data training: one jitted ``svi.update`` of the same ``AutoDAIS`` (defaults, ``N = 1``)
on ``train_rows`` generated rows (10⁶ in full mode) whose arrays are split by rows over the
``m`` devices (``NamedSharding``; ``m = 1``: one device), timed warm from the set-up state
(median of repeats), with XLA's memory account per device and the first step's loss.

Run from the repository root: ``python -m benchmarks.scaling_devices [--quick|--smoke]``.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.infer import SVI, Trace_ELBO

from benchmarks._common import Stopwatch, markdown_table, parse_args, write_results
from numpyro_dais import AutoDAIS

NAME = "scaling_devices"
MODULE = f"benchmarks.{NAME}"
D, ND, K = 10, 200, 8
SETTINGS = {
    "full": dict(
        particles=1_000_000, batch_size=125_000, devices=(1, 2, 4, 8), repeats=5, rows=10**6
    ),
    "quick": dict(particles=65_536, batch_size=None, devices=(1, 2, 4), repeats=5, rows=10**5),
    "smoke": dict(particles=256, batch_size=None, devices=(1, 2), repeats=2, rows=1000),
}


def model(X, y=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("N", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def data(rows=ND):
    kx, kw, ky = jax.random.split(jax.random.key(0), 3)
    X = jax.random.normal(kx, (rows, D))
    w = jax.random.normal(kw, (D,))
    return X, jax.random.bernoulli(ky, jax.nn.sigmoid(X @ w)).astype(np.float32)


def xla_bytes(compiled):
    """Arguments + outputs + temporaries of one device's program, or ``None``."""
    mem = compiled.memory_analysis()
    if mem is None:
        return None
    return mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes


def warm_seconds(call, repeats):
    """Median seconds of ``repeats`` warm calls of ``call()`` (it returns what to block on)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_step(devices, rows, repeats):
    """Full-data AutoDAIS: one jitted ``svi.update`` with the data split by rows."""
    X, y = data(rows)
    if len(devices) > 1:
        split = NamedSharding(Mesh(np.array(devices), ("rows",)), PartitionSpec("rows"))
        X, y = jax.device_put(X, split), jax.device_put(y, split)
    svi = SVI(model, AutoDAIS(model, K=K), optax.adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.key(1), X, y)
    compiled = jax.jit(svi.update).lower(state, X, y).compile()
    loss = float(compiled(state, X, y)[1])
    return dict(
        train_seconds=warm_seconds(lambda: compiled(state, X, y)[1], repeats),
        train_xla_bytes=xla_bytes(compiled),
        train_loss=loss,
    )


def worker(m, particles, batch_size, repeats, rows):
    """One device count, in this process: a dict of measurements."""
    devices = jax.devices()[:m]
    if len(devices) < m:
        raise SystemExit(f"asked for {m} devices, JAX has {len(jax.devices())}")
    X, y = data()
    guide = AutoDAIS(model, K=K, num_particles=8)
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(1), X, y))
    mesh = None if m == 1 else Mesh(np.array(devices), ("particles",))
    key = jax.random.key(2)

    def evidence(p):
        out = guide.log_evidence(
            key, p, X, y, num_particles=particles, batch_size=batch_size, mesh=mesh
        )
        return out.log_Z

    t0 = time.perf_counter()
    compiled = jax.jit(evidence).lower(params).compile()
    compile_s = time.perf_counter() - t0
    log_Z = float(compiled(params))
    seconds = warm_seconds(lambda: compiled(params), repeats)
    stats = devices[0].memory_stats() or {}
    return dict(
        devices=m,
        platform=devices[0].platform,
        seconds=seconds,
        compile_s=compile_s,
        xla_bytes=xla_bytes(compiled),
        peak_bytes=stats.get("peak_bytes_in_use"),
        log_Z=log_Z,
        **train_step(devices, rows, repeats),
    )


def run_child(m, cfg, platform=None):
    """:func:`worker` in a fresh process with ``m`` devices; its dict.

    ``platform="cpu"`` forces the host CPU (on an accelerator machine: the same-machine
    baseline); the child does not preallocate accelerator memory, so the allocator's peak
    is the program's.
    """
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if platform is not None:
        env["JAX_PLATFORMS"] = platform
    if platform == "cpu" or jax.default_backend() == "cpu":
        flags = env.get("XLA_FLAGS", "")
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={m}".strip()
    args = [str(m), str(cfg["particles"]), str(cfg["batch_size"]), str(cfg["repeats"])]
    args.append(str(cfg["rows"]))
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, "--worker", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"{m} devices: child failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def label(row, accelerator):
    """The device count, with the platform on an accelerator machine (GPU rows vs host CPU)."""
    return f"{row['devices']} ({row['platform']})" if accelerator else row["devices"]


def mib(x):
    return "n/a" if x is None else f"{x / 2**20:.1f}"


def vs_base(row, base, key):
    """``row[key] / base[key]`` to 2 decimals, ``n/a`` where either is missing."""
    return "n/a" if row[key] is None or not base[key] else f"{row[key] / base[key]:.2f}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        m, particles, batch_size, repeats, rows = argv[1:]
        batch = None if batch_size == "None" else int(batch_size)
        print(json.dumps(worker(int(m), int(particles), batch, int(repeats), int(rows))))
        return
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    accelerator = jax.default_backend() != "cpu"
    counts = [m for m in cfg["devices"] if not accelerator or m <= jax.device_count()]
    stopwatch = Stopwatch()
    rows = []
    for m in counts:
        with stopwatch.lap(f"{m} devices"):
            rows.append(run_child(m, cfg))
        print(rows[-1], flush=True)
    base = rows[0]
    if accelerator:
        with stopwatch.lap("host cpu, 1 device"):
            rows.append(run_child(1, cfg, platform="cpu"))
        print(rows[-1], flush=True)
    table = markdown_table(
        [
            "devices",
            "time per call (s)",
            "time / 1 device",
            "XLA memory per device (MiB)",
            "memory / 1 device",
            "allocator peak (MiB)",
            "log_Z",
            "log_Z − 1 device",
            "compile (s)",
        ],
        [
            [
                label(r, accelerator),
                f"{r['seconds']:.3f}",
                vs_base(r, base, "seconds"),
                mib(r["xla_bytes"]),
                vs_base(r, base, "xla_bytes"),
                mib(r["peak_bytes"]),
                f"{r['log_Z']:.5f}",
                f"{r['log_Z'] - base['log_Z']:.1e}",
                f"{r['compile_s']:.1f}",
            ]
            for r in rows
        ],
    )
    train_table = markdown_table(
        [
            "devices",
            "time per step (s)",
            "time / 1 device",
            "XLA memory per device (MiB)",
            "memory / 1 device",
            "first loss",
            "loss − 1 device",
        ],
        [
            [
                label(r, accelerator),
                f"{r['train_seconds']:.3f}",
                vs_base(r, base, "train_seconds"),
                mib(r["train_xla_bytes"]),
                vs_base(r, base, "train_xla_bytes"),
                f"{r['train_loss']:.3f}",
                f"{r['train_loss'] - base['train_loss']:.1e}",
            ]
            for r in rows
        ],
    )
    batch = cfg["batch_size"]
    body = "\n".join(
        [
            f"AutoDAIS (K = {K}, HMC), logistic regression D = {D}, Nd = {ND}; "
            f"`log_evidence` with {cfg['particles']:,} particles, batch_size = {batch}, "
            f"split over a mesh of the first m devices ({base['platform']}); "
            f"median of {cfg['repeats']} warm calls. Ratios against 1 device (no mesh) "
            "in this run."
            + (
                f" Device counts above the {jax.device_count()} this machine has are skipped; "
                "the last row runs the same program on this machine's host CPU (one device, "
                f"{os.cpu_count()} cores): accelerator against CPU in one run."
                if accelerator
                else ""
            ),
            "",
            table,
            "",
            "XLA memory: arguments + outputs + temporaries of one device's program "
            "(`compiled.memory_analysis()`); allocator peak: `device.memory_stats()`, "
            "n/a where the backend reports none (CPU). On CPU the host devices share the "
            f"machine's {os.cpu_count()} cores, and the machine may be shared with other "
            "work (load average above).",
            "",
            f"## Full-data AutoDAIS: one SVI step on {cfg['rows']:,} rows split over the devices",
            "",
            f"AutoDAIS (defaults, K = {K}, N = 1), the same model on {cfg['rows']:,} generated "
            "rows whose arrays are split by rows over the first m devices (`NamedSharding`; "
            "1 device: unsplit); a jitted `svi.update` from the set-up state, median of "
            f"{cfg['repeats']} warm steps. The log likelihood's sum over rows becomes a "
            "cross-device reduction inside XLA (no gather of the data: "
            "`tests/test_sharding.py` checks the compiled program).",
            "",
            train_table,
        ]
    )
    title = "Device scaling: log_evidence and a full-data step over a mesh"
    path = write_results(args.out_dir, NAME, args.mode, title, MODULE, body, stopwatch)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
