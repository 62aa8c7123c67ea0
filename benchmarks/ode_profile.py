"""Where an ODE model's fit time goes: AutoDAIS against numpyro's AutoDAIS and AutoNormal.

The pharmacokinetic model of ``benchmarks._ode_models`` (one compartment, oral absorption, one
patient, 4 latents), its ODE solved by fixed-step RK4 in ``lax.scan`` and by
``jax.experimental.ode.odeint``, fitted as the README fits a model:
``SVI(model, guide, optax.adam(1e-2), Trace_ELBO())``, the steps of ``svi.run`` with its
progress bar (one jitted ``svi.update`` per Python iteration), then
``guide.sample_posterior(key, params, *args, sample_shape=(1000,))``.

Each guide runs in a fresh Python process, as a user's script would, with JAX's default
compilation options. Each phase is timed in wall-clock and CPU seconds (all threads of the
process), with the XLA compilations it ran (``jax.monitoring``'s compile events): ``svi.init``
(for ours, the set-up's share: mode, Hessian, whitening), the first step (compiling the
training step), the steady steps, the first ``sample_posterior`` (for ours, the self-check's
importance draws and MALA chains) and the host calls of divergence reports. The fit's time
is ``svi.init`` + the steps + the first ``sample_posterior``; with ``--quick`` the steps are
timed on 500 and the fit extrapolated to 5,000 steps. The posterior's four means and sds are
compared with NUTS's (in NUTS sds and sd ratios).

Run from the repository root: ``python -m benchmarks.ode_profile [--quick|--smoke]``.
"""

import contextlib
import json
import os
import resource
import subprocess
import sys
import time

import jax
import numpy as np
import optax
from numpyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS as NumpyroAutoDAIS
from numpyro.infer.autoguide import AutoNormal

from benchmarks import _ode_models
from benchmarks._common import (
    Stopwatch,
    markdown_table,
    parse_args,
    time_interleaved,
    write_results,
)
from numpyro_dais import AutoDAIS
from numpyro_dais.annealed.guide import AnnealedGuide
from numpyro_dais.annealed.posterior import queries
from numpyro_dais.engine.annealing import dais, dais0
from numpyro_dais.runtime import reporting

NAME = "ode_profile"
MODULE = f"benchmarks.{NAME}"
K = 8
GUIDES = {
    "ours N=8": lambda model: AutoDAIS(model, K=K, num_particles=8),
    "ours N=1": lambda model: AutoDAIS(model, K=K, num_particles=1),
    "numpyro AutoDAIS": lambda model: NumpyroAutoDAIS(model, K=K),
    "AutoNormal": lambda model: AutoNormal(model),
}
#: timed steps, the fit's steps, draws, whether each guide runs in its own process; the
#: guides and the variants of the one-particle comparison, where not all
SETTINGS = {
    "full": {"steps": 5000, "fit_steps": 5000, "draws": 1000, "children": True},
    "quick": {"steps": 500, "fit_steps": 5000, "draws": 1000, "children": True},
    "smoke": {
        "steps": 3,
        "fit_steps": 3,
        "draws": 10,
        "children": False,
        "guides": ("ours N=8",),
        "one_particle": ("rk4",),
    },
}
LATENTS = ("log_ka", "log_cl", "log_v", "sigma")
#: (blocks, steps per block, training steps before) of the one-particle comparison
ONE_PARTICLE = {"full": (20, 30, 300), "quick": (10, 20, 300), "smoke": (1, 1, 1)}
#: JAX's compile events, by the name this table gives them
EVENTS = {
    "compile": "/jax/core/compile/backend_compile_duration",
    "trace": "/jax/core/compile/jaxpr_trace_duration",
    "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
}


class Recorder:
    """Compile events (count and seconds of each kind), and named wall and CPU laps."""

    def __init__(self):
        self.events = {key: [0, 0.0] for key in EVENTS}
        self.phases = {}
        names = {v: k for k, v in EVENTS.items()}

        def listen(event, seconds, **_):
            if event in names:
                self.events[names[event]][0] += 1
                self.events[names[event]][1] += seconds

        jax.monitoring.register_event_duration_secs_listener(listen)
        self._listener = listen

    def close(self):
        jax.monitoring.unregister_event_duration_listener(self._listener)

    @contextlib.contextmanager
    def phase(self, name):
        before = {k: list(v) for k, v in self.events.items()}
        usage = resource.getrusage(resource.RUSAGE_SELF)
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        after = resource.getrusage(resource.RUSAGE_SELF)
        self.phases[name] = {
            "wall": time.perf_counter() - wall,
            "cpu": time.process_time() - cpu,
            "waits": after.ru_nvcsw - usage.ru_nvcsw,
            "preempted": after.ru_nivcsw - usage.ru_nivcsw,
            "compiles": self.events["compile"][0] - before["compile"][0],
            **{f"{k}_s": self.events[k][1] - before[k][1] for k in EVENTS},
        }


@contextlib.contextmanager
def timed_calls(recorder):
    """Our guide's set-up, self-check parts and divergence reports timed as phases (their
    module functions wrapped, and restored after)."""
    targets = [
        (AnnealedGuide, "_set_up_from_curvature", "set-up (mode, Hessian, whitening)"),
        (queries, "importance", "self-check: importance draws"),
        (AnnealedGuide, "_chains", "self-check: MALA chains"),
    ]
    originals = [(module, name, getattr(module, name)) for module, name, _ in targets]
    host = {"calls": 0, "seconds": 0.0}

    def wrap(fn, label):
        def wrapped(*args, **kwargs):
            with recorder.phase(label):
                return jax.block_until_ready(fn(*args, **kwargs))

        return wrapped

    warn = reporting._warn_diverged

    def counted(*args, **kwargs):
        start = time.perf_counter()
        try:
            return warn(*args, **kwargs)
        finally:
            host["calls"] += 1
            host["seconds"] += time.perf_counter() - start

    for (module, name, label), (_, _, fn) in zip(targets, originals, strict=True):
        setattr(module, name, wrap(fn, label))
    reporting._warn_diverged = counted
    try:
        yield host
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)
        reporting._warn_diverged = warn


def profile(variant, guide_name, steps, fit_steps, draws):
    """One guide's fit of one variant, phase by phase: a dict (JSON-able)."""
    model, args, kwargs, _ = _ode_models.BUILDERS[variant]()
    guide = GUIDES[guide_name](model)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    recorder = Recorder()
    try:
        with timed_calls(recorder) as host:
            with recorder.phase("svi.init"):
                state = jax.block_until_ready(svi.init(jax.random.key(0), *args, **kwargs))
            # svi.run's loop with its progress bar: a jitted step per iteration
            step = jax.jit(lambda state, _: svi.update(state, *args, **kwargs))
            with recorder.phase("first step"):
                state, loss = jax.block_until_ready(step(state, None))
            with recorder.phase("steps"):
                losses = [loss]
                for i in range(1, steps):
                    state, loss = step(state, None)
                    losses.append(loss)
                    if i % max(steps // 20, 1) == 0:  # the progress bar's fetch
                        jax.device_get(losses[-1])
                jax.block_until_ready(state)
            params = svi.get_params(state)
            for name in ("first sample_posterior", "second sample_posterior"):
                with recorder.phase(name):
                    out = guide.sample_posterior(
                        jax.random.key(1), params, *args, sample_shape=(draws,), **kwargs
                    )
                    out = jax.block_until_ready(out)
    finally:
        recorder.close()
    phases = recorder.phases
    per_step = phases["steps"]["wall"] / max(steps - 1, 1)
    fit = phases["svi.init"]["wall"] + phases["first step"]["wall"]
    fit += per_step * (fit_steps - 1) + phases["first sample_posterior"]["wall"]
    cpu = phases["svi.init"]["cpu"] + phases["first step"]["cpu"]
    cpu += phases["steps"]["cpu"] / max(steps - 1, 1) * (fit_steps - 1)
    cpu += phases["first sample_posterior"]["cpu"]
    return {
        "variant": variant,
        "guide": guide_name,
        "steps": steps,
        "phases": phases,
        "step_ms": 1e3 * per_step,
        "step_cpu_ms": 1e3 * phases["steps"]["cpu"] / max(steps - 1, 1),
        "fit_s": fit,
        "fit_cpu_s": cpu,
        "host_calls": host["calls"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "host_s": host["seconds"],
        "final_loss": float(np.mean(np.asarray(jax.device_get(losses[-50:])))),
        "moments": {k: [float(np.mean(out[k])), float(np.std(out[k]))] for k in LATENTS},
    }


@contextlib.contextmanager
def particles_batched(batched):
    """With ``batched``, one particle runs under a ``vmap`` of one, as before
    ``engine.annealing.dais.over_particles``; else as the package runs it."""
    original = dais.over_particles
    if batched:
        dais.over_particles = dais0.over_particles = jax.vmap
    try:
        yield
    finally:
        dais.over_particles = dais0.over_particles = original


def one_particle(variant, mode):
    """``{label: (compile CPU s, step ms)}`` of our ``num_particles=1`` training step with the
    particle batched (a ``vmap`` of one) and unbatched: each compiled in this process, then
    both timed in turns on the same state, that of :data:`ONE_PARTICLE`'s training steps
    (an adaptive solver's cost depends on where the particles are), fastest block of each."""
    model, args, kwargs, _ = _ode_models.BUILDERS[variant]()
    steps, compile_s = {}, {}
    for label, batched in (("batched (a vmap of one)", True), ("unbatched", False)):
        with particles_batched(batched):
            svi = SVI(model, AutoDAIS(model, K=K), optax.adam(1e-2), Trace_ELBO())
            state = svi.init(jax.random.key(0), *args, **kwargs)
            start = time.process_time()
            steps[label] = jax.jit(svi.update).lower(state, *args, **kwargs).compile()
            compile_s[label] = time.process_time() - start
    blocks, per_block, trained = ONE_PARTICLE[mode]
    for _ in range(trained):
        state, _ = steps["unbatched"](state, *args, **kwargs)
    calls = {
        label: lambda step=step: step(state, *args, **kwargs)[1] for label, step in steps.items()
    }
    seconds = time_interleaved(calls, blocks, per_block, reduce=min)
    return {label: (compile_s[label], 1e3 * seconds[label]) for label in calls}


def run_child(variant, guide_name, cfg):
    """:func:`profile` in a fresh process (JAX's defaults: the parent's ``XLA_FLAGS`` are not
    passed on)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cmd = [sys.executable, "-m", MODULE, "--child", variant, guide_name]
    cmd += [str(cfg[k]) for k in ("steps", "fit_steps", "draws")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"{variant}, {guide_name}: child failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def nuts_reference(variant, mode):
    """NUTS's posterior means and sds of the four latents."""
    model, args, kwargs, _ = _ode_models.BUILDERS[variant]()
    warmup, samples = (1000, 4000) if mode != "smoke" else (20, 20)
    mcmc = MCMC(NUTS(model), num_warmup=warmup, num_samples=samples, progress_bar=False)
    mcmc.run(jax.random.key(2), *args, **kwargs)
    draws = mcmc.get_samples()
    return {k: [float(np.mean(draws[k])), float(np.std(draws[k]))] for k in LATENTS}


def accuracy(moments, reference):
    """``(largest |mean error| in NUTS sds, largest sd ratio off 1, as a factor)``."""
    err = max(abs(moments[k][0] - reference[k][0]) / reference[k][1] for k in LATENTS)
    ratio = max(np.exp(abs(np.log(moments[k][1] / reference[k][1]))) for k in LATENTS)
    return err, ratio


def seconds(phase, key="wall"):
    return "" if phase is None else f"{phase[key]:.2f}"


def variant_table(rows, reference, fit_steps):
    """The phases of one variant, a column per guide."""
    cols = [r["guide"] for r in rows]
    get = lambda r, name: r["phases"].get(name)  # noqa: E731
    lines = []

    def add(label, fn):
        lines.append([label, *[fn(r) for r in rows]])

    def wall_cpu(name):
        return lambda r: (
            ""
            if get(r, name) is None
            else (f"{get(r, name)['wall']:.2f} / {get(r, name)['cpu']:.2f}")
        )

    def compiles(name):
        def cell(r):
            p = get(r, name)
            return "" if p is None else f"{p['compiles']} ({p['compile_s']:.2f} s)"

        return cell

    add("`svi.init` (wall / CPU s)", wall_cpu("svi.init"))
    add("  compilations (backend s)", compiles("svi.init"))
    add(
        "  of it, the set-up: mode, Hessian, whitening",
        wall_cpu("set-up (mode, Hessian, whitening)"),
    )
    add("first step (wall / CPU s)", wall_cpu("first step"))
    add("  compilations (backend s)", compiles("first step"))
    add("steady step (wall / CPU ms)", lambda r: f"{r['step_ms']:.2f} / {r['step_cpu_ms']:.2f}")
    add("  compilations during the steps", lambda r: str(get(r, "steps")["compiles"]))
    add(
        "  context switches per step (waits / preempted)",
        lambda r: "{:.0f} / {:.0f}".format(
            *(get(r, "steps")[k] / max(r["steps"] - 1, 1) for k in ("waits", "preempted"))
        ),
    )
    add("host calls (divergence reports)", lambda r: f"{r['host_calls']} ({r['host_s']:.3f} s)")
    add("first `sample_posterior` (wall / CPU s)", wall_cpu("first sample_posterior"))
    add("  compilations (backend s)", compiles("first sample_posterior"))
    add("  of it, self-check: importance draws", wall_cpu("self-check: importance draws"))
    add("  of it, self-check: MALA chains", wall_cpu("self-check: MALA chains"))
    add("peak memory (MiB, resident)", lambda r: f"{r['peak_rss_mib']:.0f}")
    add("second `sample_posterior` (wall s)", lambda r: seconds(get(r, "second sample_posterior")))
    add(
        f"**fit, {fit_steps} steps (wall / CPU s)**",
        lambda r: f"**{r['fit_s']:.1f}** / {r['fit_cpu_s']:.1f}",
    )
    base = next((r for r in rows if r["guide"] == "numpyro AutoDAIS"), None)
    if base is not None:
        add("fit / numpyro AutoDAIS's", lambda r: f"{r['fit_s'] / base['fit_s']:.2f}")
    add("final loss (mean of the last 50)", lambda r: f"{r['final_loss']:.3f}")
    acc = {r["guide"]: accuracy(r["moments"], reference) for r in rows}
    add("largest mean error (NUTS sds)", lambda r: f"{acc[r['guide']][0]:.2f}")
    add("largest sd ratio (×, either way)", lambda r: f"{acc[r['guide']][1]:.2f}")
    return markdown_table(["phase", *cols], lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        variant, guide_name, steps, fit_steps, draws = argv[1:]
        print(json.dumps(profile(variant, guide_name, int(steps), int(fit_steps), int(draws))))
        return
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    stopwatch = Stopwatch()
    sections = []
    for variant, build in _ode_models.BUILDERS.items():
        with stopwatch.lap(f"{variant}: NUTS reference"):
            reference = nuts_reference(variant, args.mode)
        rows = []
        for guide_name in cfg.get("guides", GUIDES):
            with stopwatch.lap(f"{variant}: {guide_name}"):
                if cfg["children"]:
                    rows.append(run_child(variant, guide_name, cfg))
                else:
                    rows.append(
                        profile(variant, guide_name, cfg["steps"], cfg["fit_steps"], cfg["draws"])
                    )
            print(variant, guide_name, f"fit {rows[-1]['fit_s']:.1f} s", flush=True)
        sections += [f"## {build()[3]}", "", variant_table(rows, reference, cfg["fit_steps"]), ""]
        if variant not in cfg.get("one_particle", _ode_models.BUILDERS):
            continue
        with stopwatch.lap(f"{variant}: one particle, batched or not"):
            ab = one_particle(variant, args.mode)
        blocks, steps, trained = ONE_PARTICLE[args.mode]
        sections += [
            f"Our `num_particles=1` training step (`K = {K}`) with its particle under a `vmap` "
            "of one, as before `engine.annealing.dais.over_particles`, and unbatched: compiled "
            "in one process, CPU seconds; both steps timed in turns on the state after "
            f"{trained} training steps, the fastest of {blocks} blocks of {steps}.",
            "",
            markdown_table(
                ["particle", "compile (CPU s)", "step (ms)"],
                [[label, f"{c:.2f}", f"{ms:.2f}"] for label, (c, ms) in ab.items()],
            ),
            "",
        ]
    steps_note = (
        f"the steps timed on {cfg['steps']} and extrapolated to {cfg['fit_steps']}"
        if cfg["steps"] != cfg["fit_steps"]
        else f"{cfg['fit_steps']} steps run"
    )
    body = "\n".join(
        [
            f"`K = {K}` for every annealing guide; ours with `num_particles=8` (the README's "
            "setting: 8 particles, 8 times the gradient work of numpyro's single-particle "
            "AutoDAIS) and `num_particles=1` (numpyro's setting). Each guide in a fresh "
            f"process, JAX's default compilation options; {steps_note}. Wall and CPU "
            "seconds (CPU: all threads of the process; on a shared machine wall time also "
            "holds the waits for a core); context switches from `getrusage`: voluntary (a "
            "thread of the process waited: for another thread, a lock, the host) and "
            "involuntary (preempted). NUTS reference: 1 chain, 1,000 warm-up and 4,000 draws.",
            "",
            *sections,
        ]
    )
    title = "An ODE model's fit, phase by phase"
    path = write_results(args.out_dir, NAME, args.mode, title, MODULE, body, stopwatch)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
