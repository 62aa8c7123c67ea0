"""``numpyro_dais._vectorise``: the programs cache of ``jit_by_leaves`` and programs compiled
to run once (the set-up's) with cheaper XLA options."""

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais._vectorise import jit_by_leaves


def _newton_like(x, options):
    """A small set-up-like program: a loop of gradient steps, static options as leaves."""
    step = lambda z, _: (z - options["rate"] * jax.grad(lambda y: jnp.sum(jnp.cosh(y)))(z), None)
    return jax.lax.scan(step, x, None, length=options["steps"])[0]


def test_a_program_run_once_gives_the_cached_programs_values():
    """The same values as the cached program's, to float32 round-off (the options change
    XLA's code generation, not the computation), and nothing is cached; inside an outer
    ``jit`` (traced arguments) the program is an ordinary nested ``jit``."""
    x = jnp.linspace(-1.0, 1.0, 7)
    options = {"rate": 0.1, "steps": 5}
    cached = jit_by_leaves(_newton_like)
    once = jit_by_leaves(_newton_like, run_once=True)
    np.testing.assert_allclose(once(x, options), cached(x, options), rtol=1e-6)
    assert len(cached.cache) == 1 and not once.cache
    traced = jax.jit(lambda x: once(x, options))(x)
    np.testing.assert_allclose(traced, cached(x, options), rtol=1e-6)
