"""Programs compiled for how long they run: XLA:CPU's cheaper code generation where a
program's run is short next to its compilation.

A guide's queries compile programs that, on a small model, compile for seconds and then run
for milliseconds: the first ``q0`` draws' self-check (a few hundred particle systems),
the Pareto ``k̂`` and the evidence of a set of weights. On CPU, most of that compilation is
LLVM's optimisation of the generated code, which such a run cannot pay back; without it the
code runs a few times slower. :func:`run_for` decides per program from XLA's cost analysis
and the runs asked of it (``0`` for a program whose run is always short), so that the same
query on a large data set keeps the optimised code. Elsewhere than on CPU, and under an
outer ``jit``, nothing changes.
"""

import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import jax

#: XLA:CPU options for a program whose run is short, by how short: no LLVM optimisation
#: passes, or LLVM's first level; both with the older loop emitters and one code-generation
#: module. Both compile several times sooner than XLA's default, and run slower by a factor
#: that matters only for long runs (measurements: ``docs/topics/compilation.md``).
LEVELS = tuple(
    {
        "xla_backend_optimization_level": level,
        "xla_cpu_use_fusion_emitters": False,
        "xla_cpu_parallel_codegen_split_count": 1,
    }
    for level in (0, 1)
)

#: XLA:CPU options for every program compiled here, at every level: no YNNPACK library
#: fusions. The queries' programs are many small elementwise passes and reductions over the
#: particles' or the members' axis, which XLA's own loops ran faster
#: (``docs/topics/compilation.md``).
CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}

#: Options this process's jaxlib refused (see :func:`compile_at`).
_REFUSED: set = set()

#: Floating-point operations (XLA's count) that a program may run in all, over the runs the
#: caller expects, and still compile at each of :data:`LEVELS`: as long as the slower code
#: costs less time than the optimised compilation would (``docs/topics/compilation.md``).
WORK_BUDGETS = (1e8, 3e10)

#: The factor by which a program whose work is the model's gradients and Hessian-vector
#: products (the set-up's mode search and refinement trigger, the self-check's MALA chains)
#: divides the runs it asks for: that work is mostly matrix products, library calls at
#: every LLVM level, so level 0 runs it nearly as fast as optimised code and compiles
#: sooner; the factor keeps such programs at level 0 up to about 3e9 flops, past which level
#: 1 ran them sooner (``docs/topics/compilation.md``).
GRADIENT_WORK_DISCOUNT = 30


def level_for(work: float) -> int | None:
    """The index in :data:`LEVELS` for a program of ``work`` flops in all, ``None``: XLA's
    own optimisation."""
    return next((i for i, budget in enumerate(WORK_BUDGETS) if work <= budget), None)


def on_cpu(leaves) -> bool:
    """Whether a program on ``leaves`` compiles here for CPU, outside any outer trace, in a
    single process. Several processes (``jax.distributed``) must run the same executable at
    each call, since their collectives pair up across them; a choice of executable made by
    each process's own clock (the background upgrade, the window's) would break that."""
    traced = any(isinstance(x, jax.core.Tracer) for x in leaves)
    return not traced and jax.default_backend() == "cpu" and jax.process_count() == 1


def options_at(level: int | None) -> dict:
    """The options of ``LEVELS[level]`` less those that ``XLA_FLAGS`` sets (the user's
    choice stands); none for ``None``."""
    return _unset({} if level is None else LEVELS[level])


def _unset(options: dict) -> dict:
    flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in options.items() if f"--{k}=" not in flags}


def compile_at(lowered, level: int | None):
    """``lowered.compile()`` with :data:`CPU_OPTIONS` and :func:`options_at` ``level``, less
    each option this jaxlib refuses (an option XLA has since removed), which is remembered
    and not passed again."""
    options = {**_unset(CPU_OPTIONS), **options_at(level)}
    options = {k: v for k, v in options.items() if k not in _REFUSED}
    while options:
        try:
            return lowered.compile(compiler_options=options)
        except Exception as exc:
            refused = [k for k in options if k in str(exc)]
            if not refused:
                break
            _REFUSED.update(refused)
            options = {k: v for k, v in options.items() if k not in _REFUSED}
    return lowered.compile()


def input_types(leaves) -> tuple:
    """What a compiled program is specific to: each input's type and placement."""
    return tuple((jax.typeof(x), getattr(x, "sharding", None)) for x in leaves)


def flops(lowered) -> float:
    """XLA's count of the floating-point operations of ``lowered``, each loop body counted
    once (``inf`` where XLA gives none)."""
    try:
        cost = lowered.cost_analysis()
    except Exception:
        return float("inf")
    return float((cost or {}).get("flops", float("inf")))


def annealing_runs(K: int, num_systems: int = 1, batch_size: int | None = None) -> int:
    """How often a program that anneals ``num_systems`` in batches of ``batch_size``
    (``None``: all at once) runs its transitions' loop body: ``K`` times per batch."""
    batches = 1 if batch_size is None else math.ceil(num_systems / batch_size)
    return K * batches


class _Program(NamedTuple):
    compiled: object  # jax.stages.Compiled
    level: int | None  # its index in LEVELS, None: optimised
    flops: float
    runs: float  # the runs asked of it so far (the scales of its calls, summed)
    lowered: object  # jax.stages.Lowered, for a more optimised compilation
    upgrade: Future | None = None  # (compiled, level) being compiled in the background


def _rank(level):
    return len(LEVELS) if level is None else level


#: The factor by which the work asked of a compiled program must pass its level's budget
#: before it is compiled again, more optimised: the cheaper levels' code runs within tens of
#: percent of optimised code's, so only a long use pays for a second compilation.
UPGRADE_MARGIN = 10.0

_UPGRADES = None


def _compile_in_background(lowered, level) -> Future:
    """``(compile_at(lowered, level), level)`` on the one background thread of this module:
    XLA releases the GIL while it compiles, so the caller goes on with the program it has."""
    global _UPGRADES
    if _UPGRADES is None:
        _UPGRADES = ThreadPoolExecutor(1, thread_name_prefix="numpyro_dais_compile")
    return _UPGRADES.submit(lambda: (compile_at(lowered, level), level))


def _installed(program: _Program, wait: bool = False) -> _Program:
    """``program`` with its background compilation in use where it has finished (``wait``:
    once it has); a compilation that failed leaves the program as it was."""
    if program.upgrade is None or not (wait or program.upgrade.done()):
        return program
    try:
        compiled, level = program.upgrade.result()
    except Exception:
        return program._replace(upgrade=None)
    return program._replace(compiled=compiled, level=level, upgrade=None)


def settle(programs: dict) -> None:
    """Wait for the background compilations of ``programs`` (a :func:`run_for` cache) and
    put them in use: for tests and benchmarks that read the levels."""
    for key, program in programs.items():
        programs[key] = _installed(program, wait=True)


def prepare(programs: dict, key, jitted, dynamic, scale: float) -> None:
    """Lower ``jitted(dynamic)`` now and compile it in the background for ``scale`` runs, as
    :func:`run_for` would, so that a later :func:`run_for` on inputs of the same types finds
    it compiled (or waits for the rest of its compilation) while the caller goes on: a
    guide's self-check, prepared before training, compiles during it. Nothing where
    :func:`run_for` would not compile (off CPU, ``XLA_FLAGS`` choosing the options) or where
    the program is there already."""
    leaves = jax.tree.leaves(dynamic)
    if not on_cpu(leaves) or not options_at(0):
        return
    key = (key, input_types(leaves))
    if key in programs:
        return
    lowered, work, level = _lowered(jitted, dynamic, scale)
    upgrade = _compile_in_background(lowered, level)
    programs[key] = _Program(None, level, work, 0.0, lowered, upgrade)


def _lowered(jitted, dynamic, runs):
    """``jitted`` lowered on ``dynamic``, its flops and the level of :data:`LEVELS` for
    ``runs`` of them."""
    lowered = jitted.lower(dynamic)
    work = flops(lowered)
    return lowered, work, level_for(work * runs)


def run_for(programs: dict, key, jitted, dynamic, scale: float):
    """``jitted(dynamic)`` by a program compiled for the work asked of it: ``scale`` times
    the flops of :func:`flops` (the caller's number of runs times its loops' trip counts),
    summed over its calls so far, at the cheapest of :data:`LEVELS` whose budget that stays
    within, on CPU.

    ``scale=0``: a program whose every run is short (sums, sorts and tail fits over a set of
    weights), kept at the cheapest level. ``programs`` caches them per ``key`` and input
    types; when a call takes that sum past :data:`UPGRADE_MARGIN` times its level's budget
    (a much longer query, or the same one called again and again), the program is compiled
    again, more optimised, in the background: the calls go on with the program they have
    until the new one is ready, so that no call stalls on a compilation it did not ask for.
    Where ``XLA_FLAGS`` sets the options of :data:`LEVELS` (the test suite does), the plain
    ``jitted(dynamic)``."""
    leaves = jax.tree.leaves(dynamic)
    if not on_cpu(leaves) or not options_at(0):  # XLA_FLAGS already chose the options
        return jitted(dynamic)
    key = (key, input_types(leaves))
    program = programs.get(key)
    runs = scale + (0.0 if program is None else program.runs)
    if program is None:
        lowered, work, level = _lowered(jitted, dynamic, runs)
        program = _Program(compile_at(lowered, level), level, work, runs, lowered)
    else:
        program = _installed(program, wait=program.compiled is None)  # prepared
        if program.compiled is None:  # its background compilation failed
            program = program._replace(compiled=compile_at(program.lowered, program.level))
        wanted = level_for(program.flops * runs / UPGRADE_MARGIN)
        if program.upgrade is None and _rank(wanted) > _rank(program.level):
            program = program._replace(upgrade=_compile_in_background(program.lowered, wanted))
    programs[key] = program = program._replace(runs=runs)
    return program.compiled(dynamic)
