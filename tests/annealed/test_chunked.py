"""Importance draws in fixed chunks (numpyro_dais/annealed/posterior/queries.py): one
program, same draws."""

import jax
import numpy as np
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_dais import AutoDAIS
from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.posterior import queries
from numpyro_dais.runtime import compilation
from tests import models


def _guide_and_params(num_particles=4):
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, num_particles=num_particles, self_check=False)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    return guide, svi.get_params(svi.init(jax.random.key(0), y)), y


def test_chunked_draws_equal_one_program_over_all_draws():
    """Each draw keeps its key of ``split(rng_key, S)``: the chunked path (S = 300: a full
    chunk and a padded one) gives the draws of one program over all 300 (``batch_size=S``
    takes that path). Float32 rounding only: XLA may fuse a batch of 256 and of 300 apart."""
    guide, params, y = _guide_and_params()
    key = jax.random.key(5)
    kw = dict(sample_shape=(300,), method="importance", return_pareto_k=True)
    chunked, k_chunked = guide.sample_posterior(key, params, y, **kw)
    whole, k_whole = guide.sample_posterior(key, params, y, batch_size=300, **kw)
    np.testing.assert_allclose(chunked["z"], whole["z"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(k_chunked, k_whole, rtol=1e-4, atol=1e-5)


def test_every_draw_count_reuses_one_program():
    guide, params, y = _guide_and_params()
    for n in (3, 256, 300, 700):
        draws = guide.sample_posterior(
            jax.random.key(n), params, y, sample_shape=(n,), method="importance"
        )
        assert draws["z"].shape == (n, 2)
    guide.transport_check(jax.random.key(1), params, y, num_samples=100, warn=False)
    assert len(guide.__dict__["_jit_importance_chunk"].cache) == 1


def test_applies_only_where_the_caller_chose_no_batch_or_mesh():
    key = jax.random.key(0)
    assert queries.applies(None, None, key, ())
    assert not queries.applies(8, None, key, ())
    assert not queries.applies(None, object(), key, ())


def test_importance_draws_under_an_outer_jit_take_one_program():
    """A user's ``jit`` around ``sample_posterior``, over the parameters or over the data: no
    host loop (it would fetch tracers), the same draws."""
    guide, params, y = _guide_and_params()
    key = jax.random.key(5)
    draw = lambda p, y: guide.sample_posterior(key, p, y, sample_shape=(40,), method="importance")
    eager = draw(params, y)["z"]
    over_params = jax.jit(lambda p: draw(p, y))(params)["z"]
    over_data = jax.jit(lambda y: draw(params, y))(y)["z"]
    for z in (over_params, over_data):
        np.testing.assert_allclose(z, eager, rtol=1e-5, atol=1e-6)


def test_log_evidence_pools_the_importance_program():
    """DAIS's ``log_evidence`` (no ``batch_size``, no ``mesh``) compiles no annealing of its
    own: its weights are the importance systems' (``split(rng_key, S)``, ``S = ⌈P / N⌉``),
    pooled and cut to ``P``; the estimate is exactly ``evidence_of`` those weights."""
    guide, params, y = _guide_and_params(num_particles=4)
    key = jax.random.key(7)
    _, k = guide.sample_posterior(
        key, params, y, sample_shape=(3,), method="importance", return_pareto_k=True
    )
    ev = guide.log_evidence(key, params, y, num_particles=10)  # 3 systems of 4, cut to 10
    assert "_jit__log_evidence" not in guide.__dict__
    assert len(guide.__dict__["_jit_importance_chunk"].cache) == 1
    fitted = guide._params_from(params)
    systems = guide._importance(key, fitted, params, (y,), {}, 3)
    expected = sampling.evidence_of(systems.log_weights.reshape(-1)[:10])
    for got, want in zip(ev, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(k, sampling.pooled_pareto_k(systems.log_weights), rtol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's options")
def test_a_short_query_compiles_cheaply_and_a_long_one_optimised(monkeypatch):
    """The self-check's one chunk compiles at a cheap level (numpyro_dais/runtime/compilation.py); a
    query that runs more chunks than that level's budget recompiles the program once,
    optimised (in the background), and draws the same end points for the same keys."""
    monkeypatch.setenv("XLA_FLAGS", "")  # the suite's flags would choose the options
    guide, params, y = _guide_and_params()
    key = jax.random.key(3)
    short = guide.sample_posterior(key, params, y, sample_shape=(20,), method="importance")
    (program,) = guide.__dict__["_jit_importance_chunk"].programs.values()
    assert program.level == 0
    one_chunk = program.flops * guide.K
    monkeypatch.setattr(compilation, "WORK_BUDGETS", (one_chunk, 2 * one_chunk))
    monkeypatch.setattr(compilation, "UPGRADE_MARGIN", 1.0)
    long = guide.sample_posterior(key, params, y, sample_shape=(3 * 256,), method="importance")
    compilation.settle(guide.__dict__["_jit_importance_chunk"].programs)  # compiled aside
    (program,) = guide.__dict__["_jit_importance_chunk"].programs.values()
    assert program.level is None
    assert program.runs == 4 * guide.K  # each chunk's K transitions, asked once per query
    np.testing.assert_allclose(long["z"][:20], short["z"], rtol=1e-5, atol=1e-6)
