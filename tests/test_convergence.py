"""``run_until_converged``: SVI until the loss stops improving, the tail average of the
iterates, the self-check as the last word, and loud failures."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_dais import AutoDAIS, ConvergedRun, TransportReport, run_until_converged
from numpyro_dais.runtime import compilation
from tests import models


def normal_mean(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
    with numpyro.plate("n", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


Y = jnp.asarray(np.random.default_rng(0).normal(2.0, 1.0, 50), jnp.float32)


def test_params_are_the_average_of_the_last_patience_windows_iterates():
    """Exact: the same steps taken one by one, their unconstrained iterates averaged over
    the last ``patience`` windows and constrained, are the returned params (float32
    round-off of the sums)."""
    svi = SVI(normal_mean, AutoNormal(normal_mean), optax.adam(1e-4), Trace_ELBO())
    out = run_until_converged(
        svi, jax.random.key(0), Y, max_steps=400, window=20, patience=2, progress_bar=False
    )
    assert isinstance(out, ConvergedRun) and out.converged
    assert out.num_steps % 20 == 0 and out.losses.shape == (out.num_steps,)
    state = svi.init(jax.random.key(0), Y)
    update = jax.jit(svi.update)
    iterates, losses = [], []
    for _ in range(out.num_steps):
        state, loss = update(state, Y)
        iterates.append(svi.optim.get_params(state.optim_state))
        losses.append(loss)
    np.testing.assert_allclose(out.losses, jnp.stack(losses), rtol=1e-5)
    tail = iterates[-40:]
    average = jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs), 0), *tail)
    expected = svi.constrain_fn(average)
    for name in expected:
        np.testing.assert_allclose(out.params[name], expected[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        svi.get_params(out.state)["mu_auto_loc"], svi.get_params(state)["mu_auto_loc"], rtol=1e-5
    )


def test_stops_long_before_max_steps_where_the_loss_is_flat_and_gets_the_answer():
    """A conjugate normal mean: AutoNormal at Adam 1e-2 reaches the exact posterior mean
    (tolerance 0.15 posterior sd: the tail average's Adam noise) and stops."""
    svi = SVI(normal_mean, AutoNormal(normal_mean), optax.adam(1e-2), Trace_ELBO())
    out = run_until_converged(svi, jax.random.key(1), Y, max_steps=20_000, progress_bar=False)
    assert out.converged and out.num_steps < 5000
    post_var = 1.0 / (1 / 100 + Y.shape[0])
    post_mean = post_var * float(Y.sum())
    assert abs(float(out.params["mu_auto_loc"]) - post_mean) < 0.15 * post_var**0.5
    assert out.check is None  # not an annealed guide


@pytest.mark.parametrize("levels", ["suite", "library"])
def test_an_annealed_guide_is_judged_by_its_self_check_once(levels, monkeypatch):
    """The check runs once, at the end; where the library chooses the compilers' options
    (``XLA_FLAGS`` unset, as a user's), its programs were compiled in the background during
    the training (one each: the run found them)."""
    if levels == "library":
        if jax.default_backend() != "cpu":
            pytest.skip("XLA:CPU's options")
        monkeypatch.setenv("XLA_FLAGS", "")  # the suite's flags would choose the options
    prepared = []
    prepare = compilation.prepare
    monkeypatch.setattr(
        compilation,
        "prepare",
        lambda programs, *a: prepared.append(programs) or prepare(programs, *a),
    )
    y = models.linear_gaussian_data()
    guide = AutoDAIS(models.linear_gaussian, K=2)
    svi = SVI(models.linear_gaussian, guide, optax.adam(1e-2), Trace_ELBO())
    out = run_until_converged(svi, jax.random.key(0), y, window=50, progress_bar=False)
    assert isinstance(out.check, TransportReport) and out.check.ok
    checked = set(guide._self_checked)
    guide.sample_posterior(jax.random.key(1), out.params, sample_shape=(10,))
    assert guide._self_checked == checked  # the draws did not check again
    for name in ("_jit_chains_round", "_jit_importance_chunk"):
        programs = getattr(guide, name).programs
        if levels == "library":
            (program,) = programs.values()  # the prepared one ran
            assert program.compiled is not None and program.runs > 0
            assert any(p is programs for p in prepared)
        else:
            assert not programs  # plain jit


def test_still_improving_at_max_steps_warns_and_returns_the_last_iterate():
    svi = SVI(normal_mean, AutoNormal(normal_mean), optax.adam(1e-3), Trace_ELBO())
    with pytest.warns(RuntimeWarning, match="still improving.*max_steps") as got:
        out = run_until_converged(
            svi, jax.random.key(0), Y + 100.0, max_steps=80, window=20, progress_bar=False
        )
    assert {w.filename for w in got if "still improving" in str(w.message)} == {__file__}
    assert not out.converged and out.num_steps == 80
    np.testing.assert_allclose(out.params["mu_auto_loc"], svi.get_params(out.state)["mu_auto_loc"])


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(max_steps=0), "`max_steps`"),
        (dict(window=5), "`window`"),
        (dict(max_steps=100, window=50, patience=3), r"`max_steps` \(100\).*\(patience \+ 1\)"),
    ],
)
def test_bad_options_name_the_argument(options, match):
    svi = SVI(normal_mean, AutoNormal(normal_mean), optax.adam(1e-2), Trace_ELBO())
    with pytest.raises(ValueError, match=match):
        run_until_converged(svi, jax.random.key(0), Y, progress_bar=False, **options)


def overflowing(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.factor("blow_up", -jnp.exp(50.0 * mu**2))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def test_non_finite_parameters_stop_the_run_with_the_fix():
    svi = SVI(overflowing, AutoNormal(overflowing), optax.sgd(10.0), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FloatingPointError, match="stable_update=True"):
            run_until_converged(svi, jax.random.key(0), 1.0, window=20, progress_bar=False)
