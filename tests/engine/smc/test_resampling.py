"""Resampling schemes and decision rules (engine/smc/resampling.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.engine import ResamplingConfig
from numpyro_dais.engine.smc import resampling

SCHEMES = sorted(resampling.SCHEMES)
NUM_DRAWS = 4000  # resampling rounds per statistical check

WEIGHT_VECTORS = {
    "random": np.log(np.random.default_rng(0).dirichlet(np.ones(8))),
    "one_survivor": np.array([-np.inf, 0.0, -np.inf, -np.inf]),
    "first_only": np.array([0.0] + [-np.inf] * 7),
    "last_only": np.array([-np.inf] * 7 + [0.0]),
    # tiny (subnormal after normalisation) and huge-but-finite log weights in float32
    "tiny_entries": np.array([0.0, -200.0, -1e30, -np.inf, 0.5, -90.0, -3.0, -np.inf]),
    "shifted": np.array([1e4, 1e4 - 1.0, 1e4 - 2.0, -np.inf, 1e4 - 0.5]),
}


def _counts(scheme, log_w, num_draws=NUM_DRAWS, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), num_draws)
    log_w = jnp.asarray(log_w, jnp.float32)
    ancestors = jax.jit(jax.vmap(lambda k: resampling.SCHEMES[scheme](k, log_w)))(keys)
    a = np.asarray(ancestors)
    n = log_w.shape[0]
    assert a.shape == (num_draws, n) and a.dtype == np.int32
    assert a.min() >= 0 and a.max() < n
    rows = np.repeat(np.arange(num_draws), n)
    counts = np.zeros((num_draws, n), np.int64)
    np.add.at(counts, (rows, a.ravel()), 1)
    return counts


def _normalised(log_w):
    log_w = np.asarray(log_w, np.float64)
    w = np.exp(log_w - np.max(log_w[np.isfinite(log_w)]))
    w[~np.isfinite(log_w)] = 0.0
    return w / w.sum()


@pytest.mark.parametrize("name", sorted(WEIGHT_VECTORS))
@pytest.mark.parametrize("scheme", SCHEMES)
def test_expected_offspring_counts(scheme, name):
    log_w = WEIGHT_VECTORS[name]
    counts = _counts(scheme, log_w)
    W = _normalised(log_w)
    n = len(W)
    # Each ancestor j is drawn N·W_j times in expectation. Tolerance: 5 standard errors of
    # the mean count over NUM_DRAWS rounds, with the multinomial per-round variance
    # N·W(1−W) (an upper bound for stratified; systematic's floor/ceil variance is at most
    # 1/4, hence the max), plus 1e-3 for float32 normalisation.
    sd = np.sqrt(np.maximum(n * W * (1 - W), 0.25) / NUM_DRAWS)
    np.testing.assert_array_less(np.abs(counts.mean(0) - n * W), 5 * sd + 1e-3)
    # zero-weight particles are never drawn
    assert counts[:, W == 0].sum() == 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_never_draws_zero_weight_last_particle(scheme):
    # many equal float32 weights: their cumulative sum misses 1, and the last particle has
    # zero weight, so an unguarded inversion could land on it or past the end.
    n = 1000
    log_w = jnp.concatenate([jnp.zeros(n - 1), jnp.array([-jnp.inf])])
    counts = _counts(scheme, log_w, num_draws=200)
    assert counts[:, -1].sum() == 0


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_no_finite_weight_falls_back_to_uniform(scheme, bad):
    counts = _counts(scheme, np.full(6, bad), num_draws=500)
    assert counts.sum() == 500 * 6  # valid indices only (checked in _counts)


def test_cumulative_weights_end_at_one_from_last_positive_particle():
    log_w = jnp.array([0.0, -1.0, -jnp.inf, 0.0, -jnp.inf, -jnp.inf], jnp.float32)
    cdf = resampling._cumulative_weights(log_w)
    np.testing.assert_array_equal(np.asarray(cdf[3:]), 1.0)
    # the largest float32 uniform below 1 maps onto the last positive particle
    u = jnp.nextafter(jnp.float32(1.0), jnp.float32(0.0))
    assert int(resampling._invert(cdf, u[None])[0]) == 3


@pytest.mark.parametrize("scheme", SCHEMES)
def test_ancestors_carry_no_gradient(scheme):
    x = jnp.arange(5.0) ** 2
    key = jax.random.PRNGKey(1)
    f = lambda lw: jnp.sum(x[resampling.SCHEMES[scheme](key, lw)])
    g = jax.jit(jax.grad(f))(jnp.log(jnp.array([0.1, 0.2, 0.3, 0.25, 0.15])))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def test_gst_take_is_exact_forward_and_differentiable():
    x = {"z": jnp.arange(10.0).reshape(5, 2), "s": jnp.arange(5.0)}
    log_w = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.25, 0.15]))
    a = resampling.multinomial(jax.random.PRNGKey(2), log_w)
    taken = resampling.straight_through_take(x, a, log_w, 0.1, 1.0)
    np.testing.assert_array_equal(np.asarray(taken["z"]), np.asarray(x["z"][a]))
    np.testing.assert_array_equal(np.asarray(taken["s"]), np.asarray(x["s"][a]))
    g = jax.jit(
        jax.grad(lambda lw: jnp.sum(resampling.straight_through_take(x, a, lw, 1.0, 1.0)["s"]))
    )(log_w)
    assert np.all(np.isfinite(g)) and np.any(np.asarray(g) != 0)


def test_gst_one_hot_forward_value_and_gap():
    logits = jnp.array([2.0, 0.0, -1.0, -jnp.inf])
    hard = resampling.gst_one_hot(jnp.array(2), logits, 0.5, 1.0)
    np.testing.assert_array_equal(np.asarray(hard), [0.0, 0.0, 1.0, 0.0])


# -- decision rules ---------------------------------------------------------------------------


def _log_w_with_ess(n, ess):
    """Weights with one heavy particle and n−1 equal light ones, tuned to a given ESS."""
    # W = (a, b, …, b) with a + (n−1) b = 1 and a² + (n−1) b² = 1/ess
    b = (1 - np.sqrt((n / ess - 1) / (n - 1))) / n
    a = 1 - (n - 1) * b
    return jnp.log(jnp.array([a] + [b] * (n - 1), jnp.float32))


def test_ess_helper_hits_target():
    from numpyro_dais.engine.annealing.weights import ess

    np.testing.assert_allclose(float(ess(_log_w_with_ess(10, 3.0))), 3.0, rtol=1e-4)


def test_rules_always_never_ess():
    key = jax.random.PRNGKey(0)
    lw = _log_w_with_ess(10, 4.0)
    assert bool(resampling.RULES["always"](key, lw, 0.5))
    assert not bool(resampling.RULES["never"](key, lw, 0.5))
    assert bool(resampling.RULES["ess"](key, lw, 0.5))  # 4 < 5
    assert not bool(resampling.RULES["ess"](key, lw, 0.3))  # 4 > 3
    assert bool(resampling.RULES["ess"](key, jnp.zeros(10), 1.0)) is False  # ESS = N


@pytest.mark.parametrize("ess", [1.0, 3.0, 7.0, 10.0])
def test_bernoulli_rule_frequency(ess):
    n, m = 10, 4000
    lw = _log_w_with_ess(n, ess) if ess < n else jnp.zeros(n)
    p = 1 - (ess - 1) / (n - 1)
    keys = jax.random.split(jax.random.PRNGKey(3), m)
    flags = np.asarray(jax.vmap(lambda k: resampling.RULES["bernoulli"](k, lw, 0.5))(keys))
    # Frequency of a Bernoulli(p) over m draws: 5 standard errors, plus 1e-3 for the
    # float32 ESS (p = 0 and p = 1 are exact: never/always).
    np.testing.assert_allclose(flags.mean(), p, atol=5 * np.sqrt(p * (1 - p) / m) + 1e-3)


def test_bernoulli_single_particle_never_resamples():
    assert float(resampling.bernoulli_probability(jnp.zeros(1))) == 0.0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(scheme="residual", when="always"), "resampling"),
        (dict(scheme="systematic", when="sometimes"), "resample_when"),
        (dict(scheme="systematic", when="ess", ess_threshold=0.0), "ess_threshold"),
        (dict(scheme="systematic", when="ess", ess_threshold=1.5), "ess_threshold"),
        (dict(scheme="systematic", when="ess", gradient="reinforce"), "resampling_gradient"),
        (dict(scheme="systematic", when="ess", gst_temperature=0.0), "gst_temperature"),
    ],
)
def test_resolve_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        resampling.resolve(ResamplingConfig(**kwargs))


def test_resolve_accepts_threshold_one_and_gives_functions():
    resolved = resampling.resolve(ResamplingConfig("stratified", "ess", 1.0))
    assert (resolved.scheme, resolved.when) == (resampling.stratified, resampling.ess_below)
    assert resampling.resolve(resolved) == resolved  # functions pass through
