import functools
import warnings

import jax
import jax.numpy as jnp
import pytest

from numpyro_dais.runtime import hostcall


def _program(fn):
    """A jitted ``x -> sum(x) + host call when x has a NaN`` (the guides' pattern)."""

    @jax.jit
    def step(x):
        count = jnp.sum(jnp.isnan(x))
        report = jax.lax.cond(
            count > 0,
            lambda a: hostcall.host_call(fn, a),
            lambda a: jnp.zeros((), jnp.float32),
            (count, jnp.nanmax(x)),
        )
        return jnp.nansum(x) + report

    return step


def test_the_call_runs_only_in_the_taken_branch_and_leaves_no_host_callback():
    calls = []
    step = _program(lambda *v: calls.append(v))
    x = jnp.array([1.0, 2.0, 3.0])
    assert float(step(x)) == 6.0 and not calls
    assert float(step(x.at[0].set(jnp.nan))) == 5.0
    assert calls == [(1.0, 3.0)]
    if jax.default_backend() == "cpu":  # the FFI path: no JAX host callback in the program
        hlo = step.lower(x).compile().as_text()
        assert hostcall.TARGET in hlo and "python_cpu_callback" not in hlo


def test_an_exception_in_the_function_fails_the_step_with_its_message():
    def warn(count, largest):
        warnings.warn(f"{int(count)} NaN, largest {float(largest)}", RuntimeWarning, stacklevel=2)

    step = _program(warn)
    x = jnp.array([jnp.nan, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Exception, match="RuntimeWarning: 1 NaN, largest 2.0"):
            jax.block_until_ready(step(x))


def test_pure_callback_fallback(monkeypatch):
    """Where the FFI handler cannot be used (another platform, an unknown FFI ABI), the same
    call goes through ``jax.pure_callback``."""
    monkeypatch.setattr(hostcall, "_ffi_ok", [False])
    calls = []
    step = _program(lambda *v: calls.append(v))
    assert float(step(jnp.array([jnp.nan, 4.0]))) == 4.0
    assert calls == [(1.0, 4.0)]
    assert "python_cpu_callback" in step.lower(jnp.zeros(2)).compile().as_text()


def _warn(name, state, count):
    state.append(name)


def test_ids_are_stable_for_plain_partials_and_distinct_for_stateful_ones():
    same = [functools.partial(_warn, "a", "info"), functools.partial(_warn, "a", "info")]
    assert hostcall._register(same[0]) == hostcall._register(same[1])
    assert hostcall._register(same[0]) != hostcall._register(functools.partial(_warn, "b", "x"))
    # a partial over mutable state (e.g. a guide's step counter) is its own function
    a, b = functools.partial(_warn, "g", []), functools.partial(_warn, "g", [])
    assert hostcall._register(a) != hostcall._register(b)
