"""Where an AutoDAIS step's time goes, option by option, against numpyro's AutoDAIS.

One jitted ``svi.update`` (``K = 8``, ``N = 1``) of a Bayesian logistic regression on
breast cancer (569 × 30, standardised), for numpyro's ``AutoDAIS`` and for ours with the
options that add work to a step switched on or off: ``report_divergences`` (an in-jit
``lax.cond`` whose branch calls the host when a particle diverged) and ``laplace_init``
(the transitions run in Laplace-whitened coordinates: a triangular matrix product per
gradient). The configurations take turns block by block (``time_interleaved``); the table
gives the median seconds per step and the ratio to numpyro's, plus the compiled program's
size (XLA fusions, custom calls, conditionals), read from ``compiled.as_text()``.

On CPU the divergence check is an XLA FFI custom call; on an accelerator it is a
``jax.pure_callback`` behind the ``lax.cond``, whose predicate must reach the host each
step. Run from the repository root: ``python -m benchmarks.step_overheads [--quick|--smoke]``.
"""

import re

import jax
import optax
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoDAIS as NumpyroAutoDAIS

from benchmarks._common import (
    Stopwatch,
    markdown_table,
    parse_args,
    time_interleaved,
    write_results,
)
from benchmarks.autodais_vs_numpyro import load_data, model
from numpyro_dais import AutoDAIS

NAME = "step_overheads"
MODULE = f"benchmarks.{NAME}"
K = 8
SETTINGS = {"full": (9, 50), "quick": (5, 30), "smoke": (2, 3)}
BASE = "numpyro's AutoDAIS"
GUIDES = {
    BASE: lambda: NumpyroAutoDAIS(model, K=K),
    "ours, defaults": lambda: AutoDAIS(model, K=K),
    "ours, report_divergences=False": lambda: AutoDAIS(model, K=K, report_divergences=False),
    "ours, laplace_init=False": lambda: AutoDAIS(model, K=K, laplace_init=False),
    "ours, both off": lambda: AutoDAIS(model, K=K, laplace_init=False, report_divergences=False),
    "ours, sym_kl_weight=0": lambda: AutoDAIS(model, K=K, sym_kl_weight=0.0),
    "ours, all three off": lambda: AutoDAIS(
        model, K=K, laplace_init=False, report_divergences=False, sym_kl_weight=0.0
    ),
}


def program_size(text):
    """(fusions, custom calls, conditionals) in an optimised HLO module's text."""
    return (
        len(re.findall(r"^\s*\S+ = \S+ fusion\(", text, re.M)),
        text.count("custom-call("),
        text.count(" conditional("),
    )


def stepper(make, X, y):
    """A zero-argument call taking one compiled step from its own state, and the program's
    size."""
    svi = SVI(model, make(), optax.adam(1e-2), Trace_ELBO())
    box = [svi.init(jax.random.key(0), X, y)]
    compiled = jax.jit(svi.update).lower(box[0], X, y).compile()

    def call():
        box[0], loss = compiled(box[0], X, y)
        return loss

    return call, program_size(compiled.as_text())


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    repeats, steps = SETTINGS[args.mode]
    stopwatch = Stopwatch()
    X, y, data_name = load_data()
    calls, sizes = {}, {}
    for name, make in GUIDES.items():
        calls[name], sizes[name] = stepper(make, X, y)
    seconds = time_interleaved(calls, repeats, steps)
    rows = [
        [name, f"{seconds[name] * 1e3:.3f}", f"{seconds[name] / seconds[BASE]:.2f}", *sizes[name]]
        for name in GUIDES
    ]
    for row in rows:
        print(*row, sep="  |  ")
    table = markdown_table(
        ["guide", "ms / step", f"/ {BASE}", "fusions", "custom calls", "conditionals"], rows
    )
    body = "\n".join(
        [
            f"data: {data_name}; K = {K}, N = 1; median of {repeats} blocks of {steps} warm "
            f"jitted steps on {jax.devices()[0].platform}, the configurations taking turns.",
            "",
            table,
        ]
    )
    title = "Step overheads: AutoDAIS options against numpyro's AutoDAIS"
    path = write_results(args.out_dir, NAME, args.mode, title, MODULE, body, stopwatch)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
