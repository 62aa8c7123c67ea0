"""``numpyro_dais.runtime.compilation``: programs compiled at XLA:CPU's cheaper levels where their
run is short, with the values of XLA's optimised code."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.runtime import compilation
from numpyro_dais.runtime.vectorise import jit_by_leaves, jit_short_run

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's options")


def _descent(x, options):
    """A small sampler-like program: a loop of gradient steps, static options as leaves."""
    step = lambda z, _: (z - options["rate"] * jax.grad(lambda y: jnp.sum(jnp.cosh(y)))(z), None)
    return jax.lax.scan(step, x, None, length=options["steps"])[0]


def test_levels_follow_the_work_budgets():
    small, large = compilation.WORK_BUDGETS
    assert compilation.level_for(0.0) == 0 and compilation.level_for(small) == 0
    assert compilation.level_for(small * 2) == 1 and compilation.level_for(large) == 1
    assert compilation.level_for(large * 2) is None
    assert compilation.options_at(None) == {}


def test_a_flag_the_user_set_stands(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
    options = compilation.options_at(0)
    assert "xla_backend_optimization_level" not in options
    assert options["xla_cpu_use_fusion_emitters"] is False


@cpu_only
def test_run_for_picks_the_level_by_the_work_asked_so_far(monkeypatch):
    """Same values as the optimised program to float32 round-off (the options change XLA's
    code generation, not the computation). The level follows the runs asked of the program
    so far: once they pass ``UPGRADE_MARGIN`` times its level's budget it is compiled again,
    more optimised, in the background (the call that asks for it runs the program it has:
    no stall); a first call compiles for its own runs."""
    monkeypatch.setenv("XLA_FLAGS", "")  # the suite's flags would choose the options
    x = jnp.linspace(-1.0, 1.0, 7)
    options = {"rate": 0.1, "steps": 5}
    program = jit_by_leaves(_descent)
    expected = jax.jit(lambda x: _descent(x, options))(x)
    work = compilation.flops(jax.jit(lambda x: _descent(x, options)).lower(x))
    assert 0 < work < np.inf
    monkeypatch.setattr(compilation, "WORK_BUDGETS", (10 * work, 100 * work))
    monkeypatch.setattr(compilation, "UPGRADE_MARGIN", 2.0)
    levels = lambda: [p.level for p in program.programs.values()]
    # the runs asked so far: 1, 6, 11, ..., 21 (past 2 x 10), 121, 201 (past 2 x 100), 2201;
    # a first call compiles for its own runs: level 1 for 11
    calls = [(1, 0), (5, 0), (5, 0), (5, 0), (5, 1), (100, 1), (80, None), (2000, None)]
    before = 0
    for scale, level in calls:
        np.testing.assert_allclose(program.run_for(scale, x, options), expected, rtol=1e-6)
        assert levels() == [before]  # the call itself ran the program it had
        compilation.settle(program.programs)
        assert levels() == [level]
        before = level
    fresh = jit_by_leaves(_descent)
    fresh.run_for(11, x, options)
    assert [p.level for p in fresh.programs.values()] == [1]
    assert len(program.cache) == 1  # one trace, whatever the level


@cpu_only
def test_a_prepared_program_compiles_in_the_background_and_is_the_one_run(monkeypatch):
    """``prepare`` lowers now and compiles in the background at the level of the runs it
    names; the later ``run_for`` on inputs of the same types runs that program (it traced
    once, compiled once), with the values of plain ``jit``. Inputs of other types compile
    their own; a failed background compilation is redone by the call."""
    monkeypatch.setenv("XLA_FLAGS", "")  # the suite's flags would choose the options
    x = jnp.linspace(-1.0, 1.0, 7)
    options = {"rate": 0.1, "steps": 5}
    program = jit_by_leaves(_descent)
    compiles = []
    compile_at = compilation.compile_at
    monkeypatch.setattr(
        compilation, "compile_at", lambda *a: compiles.append(a[1]) or compile_at(*a)
    )
    program.prepare(1, x, options)
    (prepared,) = program.programs.values()
    assert prepared.compiled is None and prepared.upgrade is not None and prepared.runs == 0
    expected = jax.jit(lambda x: _descent(x, options))(x)
    np.testing.assert_allclose(program.run_for(1, x, options), expected, rtol=1e-6)
    (ran,) = program.programs.values()
    assert ran.compiled is not None and ran.runs == 1 and compiles == [0]
    program.prepare(1, x, options)  # there already: nothing
    assert len(program.programs) == 1 and compiles == [0]
    program.prepare(1, x.astype(jnp.float16), options)
    assert len(program.programs) == 2
    failed = program.programs[list(program.programs)[1]]
    broken = compilation._compile_in_background(None, 0)  # compiling None fails
    program.programs[list(program.programs)[1]] = failed._replace(upgrade=broken)
    program.run_for(1, x.astype(jnp.float16), options)
    assert all(p.compiled is not None for p in program.programs.values())
    assert len(program.cache) == 1


def test_under_an_outer_jit_the_program_is_inlined():
    x = jnp.linspace(-1.0, 1.0, 7)
    options = {"rate": 0.1, "steps": 3}
    program = jit_by_leaves(_descent)
    traced = jax.jit(lambda x: program.run_for(1, x, options))(x)
    np.testing.assert_allclose(traced, _descent(x, options), rtol=1e-6)
    assert not program.programs


@cpu_only
def test_a_short_run_program_stays_cheap_and_compiles_once_per_static_argument(monkeypatch):
    """``jit_short_run`` (the weights' Pareto k̂ and evidence): however often it is called,
    compiled once per static argument at the cheapest level; inlined under an outer ``jit``."""
    monkeypatch.setenv("XLA_FLAGS", "")  # the suite's flags would choose the options
    calls = []

    def head_sum(x, n):
        calls.append(n)
        return jnp.sum(x[:n])

    program = jit_short_run(head_sum)
    x = jnp.arange(6.0)
    for _ in range(20):
        assert float(program(x, 3)) == 3.0
    assert float(program(x + 1, 3)) == 6.0 and float(program(x, 4)) == 6.0
    assert calls == [3, 4]  # traced once per static argument, not per call
    assert [p.level for p in program.programs.values()] == [0, 0]
    assert float(jax.jit(lambda x: program(x, 2))(x)) == 1.0


def test_where_xla_flags_choose_the_options_the_program_is_plain_jit(monkeypatch):
    monkeypatch.setenv(
        "XLA_FLAGS", " ".join(f"--{k}={v}" for k, v in compilation.LEVELS[0].items())
    )
    program = jit_by_leaves(_descent)
    x = jnp.linspace(-1.0, 1.0, 7)
    np.testing.assert_allclose(
        program.run_for(1, x, {"rate": 0.1, "steps": 2}), _descent(x, {"rate": 0.1, "steps": 2})
    )
    assert not program.programs and len(program.cache) == 1


def test_several_processes_compile_every_program_the_same_way(monkeypatch):
    # each process choosing its level (or a background upgrade) by its own clock could run
    # a different executable than the others at the same call, and their collectives pair up
    assert compilation.on_cpu([jnp.zeros(2)]) == (jax.default_backend() == "cpu")
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert not compilation.on_cpu([jnp.zeros(2)])


_YNN_CHILD = """
import jax, jax.numpy as jnp, numpy as np
from numpyro_dais.runtime import compilation
f = lambda x, y: jnp.sum(jnp.sin(x)[:, :, None] * y[None], axis=-1)
x, y = jnp.ones((4, 10_000)), jnp.ones((10_000, 5))  # a size XLA gives YNNPACK
lowered = jax.jit(f).lower(x, y)
assert "__ynn_fusion" in lowered.compile().as_text()  # XLA's default here
for level in (0, 1, None):
    assert "__ynn_fusion" not in compilation.compile_at(lowered, level).as_text(), level
# an option this jaxlib refuses is dropped alone: the others still apply
compilation.CPU_OPTIONS = {"xla_not_an_option": "", **compilation.CPU_OPTIONS}
compiled = compilation.compile_at(lowered, 0)
assert "__ynn_fusion" not in compiled.as_text()
assert "xla_not_an_option" in compilation._REFUSED
np.testing.assert_allclose(compiled(x, y), f(x, y), rtol=1e-6)
"""


@cpu_only
def test_programs_compile_without_ynnpack_fusions_at_every_level():
    """:data:`~numpyro_dais.runtime.compilation.CPU_OPTIONS` at every level; an option this
    jaxlib refuses is dropped, and the other options stay. In a child with XLA's default
    flags (the suite's own turn the fusions off for the whole process)."""
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _YNN_CHILD], env=env, capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
