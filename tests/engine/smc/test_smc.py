"""The DSMCS scan (engine/smc/smc.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.engine import ResamplingConfig
from numpyro_dais.engine.annealing import dais, gaussian, weights
from numpyro_dais.engine.annealing.path import betas_from_increments
from numpyro_dais.engine.annealing.transitions import KERNELS
from numpyro_dais.engine.smc import smc

HMC = KERNELS["hmc"]

D, K, N = 3, 6, 8
RULES = ["always", "ess", "bernoulli", "never"]

# Conjugate target: ℓ(z) = log_Z + log N(z; 1, 0.5² I), so log Z is known exactly.
LOG_Z = 1.7
TARGET_LOC, TARGET_SCALE = 1.0, 0.5
Q0 = gaussian.Gaussian(jnp.zeros(D), jnp.full(D, 1.5))


def log_target(z):
    return LOG_Z + gaussian.log_prob(
        gaussian.Gaussian(jnp.full(D, TARGET_LOC), jnp.full(D, TARGET_SCALE)), z
    )


TARGET = dais.Target(log_target)


def make(step_size=0.1):
    params = dais.AnnealParams(
        betas_from_increments(jnp.ones(K)), jnp.full(K, step_size), jnp.ones(D), 0.9
    )
    return TARGET, params


def run_smc(key, q0, target, params, n, kernel="hmc", **config):
    return smc.run(
        key, q0, target, params, n, kernel=kernel, resampling_config=ResamplingConfig(**config)
    )


@pytest.mark.parametrize("kernel", ["hmc", "langevin"])
def test_never_reproduces_dais(kernel):
    target, params = make()
    key = jax.random.PRNGKey(0)
    d = jax.jit(lambda k: dais.run(k, Q0, target, params, N, kernel=kernel))(key)
    s = jax.jit(lambda k: run_smc(k, Q0, target, params, N, kernel, when="never"))(key)
    # same random numbers: identical trajectories (up to XLA fusion, ~1 ulp)
    np.testing.assert_allclose(s.z, d.z, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(s.z0, d.z0, rtol=0, atol=0)
    # L = Σ_k log Σ_i W̄ w̃_k telescopes to log (1/N) Σ_i w_i; float32 rounding only
    np.testing.assert_allclose(s.log_Z, weights.log_mean_exp(d.log_weights), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s.log_weights, d.log_weights, rtol=1e-5, atol=1e-4)
    assert not np.any(s.trace.resampled)
    np.testing.assert_array_equal(s.trace.ancestors, np.tile(np.arange(N), (K, 1)))


@functools.cache
def _many(rule, kernel, num_systems=400):
    """``num_systems`` independent systems (cached: each compilation costs seconds)."""
    target, params = make()
    keys = jax.random.split(jax.random.PRNGKey(7), num_systems)
    f = lambda k: run_smc(k, Q0, target, params, N, kernel, when=rule)
    return jax.jit(jax.vmap(f))(keys)


CASES = [(rule, "hmc") for rule in RULES] + [("bernoulli", "langevin"), ("always", "langevin")]


@pytest.mark.parametrize("rule, kernel", CASES)
def test_outputs(rule, kernel):
    out = jax.tree.map(lambda x: x[0], _many(rule, kernel))
    tr = out.trace
    assert out.z.shape == (N, D) and out.log_weights.shape == (N,)
    assert tr.ess.shape == (K,) and tr.resampled.shape == (K,) and out.log_Z.shape == ()
    assert tr.ancestors.shape == (K, N) and tr.log_increments.shape == (K, N)
    assert not bool(tr.resampled[0])  # no resampling before the first transition
    assert np.all((tr.ess >= 1 - 1e-4) & (tr.ess <= N + 1e-4))
    np.testing.assert_allclose(out.ess, tr.ess[-1])
    if rule == "always":
        assert np.all(tr.resampled[1:])
    a = np.asarray(tr.ancestors)
    assert a.min() >= 0 and a.max() < N
    assert np.all(a[~np.asarray(tr.resampled)] == np.arange(N))
    # the final log weights average to the bound
    np.testing.assert_allclose(weights.log_mean_exp(out.log_weights), out.log_Z, atol=1e-5)


@pytest.mark.parametrize("rule, kernel", CASES)
def test_bound_and_unbiased_evidence(rule, kernel):
    L = np.asarray(_many(rule, kernel).log_Z, np.float64)
    M = L.shape[0]
    assert np.all(np.isfinite(L))
    # E[L] ≤ log Z: the mean over M systems may exceed log Z only by MC error (3 SE).
    se = L.std() / np.sqrt(M)
    assert L.mean() <= LOG_Z + 3 * se
    # Ẑ = exp(L) is unbiased for Z under every resampling rule (SMC's defining property,
    # which a bookkeeping error after resampling would break): mean within 4 SE of Z.
    ratio = np.exp(L - LOG_Z)
    assert abs(ratio.mean() - 1) < 4 * ratio.std() / np.sqrt(M) + 1e-3


@pytest.mark.parametrize("rule", ["always", "bernoulli", "never"])
def test_log_Z_se_matches_the_spread_of_independent_systems(rule):
    """The genealogy-based se of one system against the standard deviation of log Ẑ over 400
    systems (N = 32, q0 = N(0.5, I) against N(1, 0.5² I)): the root-mean-square se agrees
    within 25%. The i.i.d. formula on the final weights ignores the resampling and is far too
    small; without resampling the two are the same."""
    q0 = gaussian.Gaussian(jnp.full(D, 0.5), jnp.ones(D))
    target, params = make()
    run = lambda k: run_smc(k, q0, target, params, 32, when=rule)
    out = jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(7), 400))
    se = jax.vmap(smc.log_Z_se)(out)
    iid = jax.vmap(weights.log_mean_exp_se)(out.log_weights)
    rms = lambda x: float(jnp.sqrt(jnp.mean(x**2)))
    np.testing.assert_allclose(rms(se), float(jnp.std(out.log_Z)), rtol=0.25)
    if rule == "never":
        np.testing.assert_allclose(se, iid, rtol=1e-5, atol=1e-6)
    else:
        assert rms(iid) < rms(se) / 2


def test_founders_follow_the_genealogy():
    # N = 3, K = 3: before k=1 slot 0 copies 2; before k=2 slots 1, 2 copy 0
    ancestors = jnp.array([[0, 1, 2], [2, 1, 2], [0, 0, 0]], jnp.int32)
    np.testing.assert_array_equal(smc.founders(ancestors), [2, 2, 2])
    np.testing.assert_array_equal(smc.founders(jnp.tile(jnp.arange(3), (3, 1))), [0, 1, 2])


def test_bernoulli_decisions_are_independent_per_system():
    flags = np.asarray(_many("bernoulli", "langevin").trace.resampled)
    # some transitions resample in some systems and not in others
    frac = flags[:, 1:].mean(0)
    assert np.any((frac > 0) & (frac < 1))


GRAD_KEY = jax.random.PRNGKey(3)


@functools.cache
def _grad(rule, gradient):
    key = GRAD_KEY
    target, params = make()

    def bound(step_sizes, loc):
        q0 = gaussian.Gaussian(loc, Q0.scale)
        p = params._replace(step_sizes=step_sizes)
        return run_smc(key, q0, target, p, N, when=rule, gradient=gradient).log_Z

    return jax.jit(jax.value_and_grad(bound, argnums=(0, 1)))(params.step_sizes, Q0.loc)


def test_gradients_finite_and_gst_changes_only_the_gradient():
    v_stop, g_stop = _grad("always", "stop")
    v_gst, g_gst = _grad("always", "gst")
    assert np.all(np.isfinite(np.concatenate([np.ravel(g) for g in g_stop])))
    np.testing.assert_allclose(v_stop, v_gst, rtol=1e-6)  # same forward pass
    assert not np.allclose(g_stop[0], g_gst[0])  # GST adds resampling gradients


def test_stop_gradient_resampling_treats_ancestors_as_constants():
    # With gradients stopped, the bound's gradient equals that of the same computation with
    # the drawn ancestors fed back in as constants: resampling contributes no gradient.
    target, params = make()
    key = GRAD_KEY
    fixed = np.asarray(run_smc(key, Q0, target, params, N, when="always").trace.ancestors)
    potential = dais.potential(Q0, target)

    def with_fixed_ancestors(step_sizes):
        p = params._replace(step_sizes=step_sizes)
        noise = dais.draw_noise(dais.run_keys(key)[0], K, N, Q0.loc.shape[-1])
        state = dais.init(noise, Q0, potential, p, HMC, True)
        log_W, L = jnp.full(N, -jnp.log(N)), 0.0
        for k in range(K):
            if k > 0:
                state = jax.tree.map(lambda x, a=fixed[k]: x[a], state)
                log_W = jnp.full(N, -jnp.log(N))
            state, info = dais.move(
                noise.moves[k], state, dais.step_params(p, k), potential, HMC, True
            )
            s = jax.scipy.special.logsumexp(log_W + info.log_increment)
            L, log_W = L + s, log_W + info.log_increment - s
        return L

    v_ref, g_ref = jax.jit(jax.value_and_grad(with_fixed_ancestors))(params.step_sizes)
    v, (g, _) = _grad("always", "stop")
    np.testing.assert_allclose(v, v_ref, rtol=1e-5)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-4)


def test_bad_options_raise():
    target, params = make()
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="`resampling`"):
        run_smc(key, Q0, target, params, N, scheme="residual")
    with pytest.raises(ValueError, match="`ess_threshold`"):
        run_smc(key, Q0, target, params, N, when="ess", ess_threshold=0.0)
    with pytest.raises(ValueError, match="`kernel`"):
        run_smc(key, Q0, target, params, N, kernel="mala")


def test_a_rule_and_a_scheme_may_be_functions():
    """Names are resolved to functions once (resampling.resolve); a user's own rule or
    scheme runs the same recursion: the same functions given directly give the same run."""
    from numpyro_dais.engine.smc import resampling

    target, params = make()
    key = jax.random.PRNGKey(4)
    by_name = run_smc(key, Q0, target, params, N, when="ess", scheme="systematic")
    by_function = run_smc(
        key, Q0, target, params, N, when=resampling.ess_below, scheme=resampling.systematic
    )
    np.testing.assert_array_equal(by_name.z, by_function.z)
    always_first = run_smc(key, Q0, target, params, N, when=lambda k, lw, t: jnp.ones((), bool))
    assert np.asarray(always_first.trace.resampled)[1:].all()
