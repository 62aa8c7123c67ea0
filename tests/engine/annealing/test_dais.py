"""Exact identities of the DAIS engine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.engine.annealing import dais, gaussian, path, transitions, weights
from numpyro_dais.engine.annealing.transitions import KERNELS

HMC = KERNELS["hmc"]

D = 3
Q0 = gaussian.Gaussian(jnp.array([0.1, -0.2, 0.3]), jnp.array([0.5, 0.8, 1.2]))


def _target(z):
    return -0.5 * jnp.sum((z - 1.0) ** 2 / jnp.array([0.3, 1.0, 2.0])) + jnp.sin(z[0])


TARGET = dais.Target(_target)


def _params(K, step=0.2):
    increments = jnp.linspace(0.5, 1.5, K)
    return dais.AnnealParams(
        betas=path.betas_from_increments(increments),
        step_sizes=jnp.full(K, step),
        mass=jnp.array([1.0, 2.0, 0.5]),
        gamma=jnp.array(0.8),
    )


@pytest.mark.parametrize("kernel", ["hmc", "langevin"])
def test_incremental_weights_telescope(kernel):
    out = dais.run(
        jax.random.key(0), Q0, TARGET, _params(6), 32, kernel=kernel, track_increments=True
    )
    incs = out.trace.log_increments
    assert incs.shape == (6, 32)
    # Σ_k log w̃_k = ℓ(z_K) − log q0(z_0) + Σ_k Δ_k: equal up to float32 round-off
    np.testing.assert_allclose(incs.sum(0), out.log_weights, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.trace.ess[-1], out.ess, rtol=1e-4)
    np.testing.assert_allclose(weights.log_mean_exp(out.log_weights), out.log_Z, rtol=1e-6)


@pytest.mark.parametrize("kernel", ["hmc", "langevin"])
def test_tracking_does_not_change_weights(kernel):
    a = dais.run(jax.random.key(1), Q0, TARGET, _params(4), 8, kernel=kernel)
    b = dais.run(jax.random.key(1), Q0, TARGET, _params(4), 8, kernel=kernel, track_increments=True)
    np.testing.assert_allclose(a.log_weights, b.log_weights, rtol=1e-6)
    np.testing.assert_allclose(a.z, b.z, rtol=1e-6)


def test_leapfrog_is_volume_preserving():
    mass = jnp.array([1.0, 2.0, 0.5])

    def grad_log_gamma(z):
        return jax.grad(lambda x: 0.3 * gaussian.log_prob(Q0, x) + 0.7 * _target(x))(z)

    def flow(x):
        z, v = transitions.leapfrog(x[:D], x[D:], grad_log_gamma, 0.3, mass)
        return jnp.concatenate([z, v])

    x = jax.random.normal(jax.random.key(2), (2 * D,))
    jac = jax.jacfwd(flow)(x)
    np.testing.assert_allclose(jnp.linalg.det(jac), 1.0, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["hmc", "langevin"])
def test_zero_step_size_reduces_to_iwvi(kernel):
    """With η = 0 no particle moves (HMC) and log w = ℓ(z_0) − log q0(z_0): IWVI."""
    params = _params(5, step=0.0)
    if kernel == "langevin":  # δ = 0 is a degenerate Gaussian; use a vanishing step instead
        params = params._replace(step_sizes=jnp.full(5, 1e-12))
    out = dais.run(jax.random.key(3), Q0, TARGET, params, 64, kernel=kernel)
    np.testing.assert_allclose(out.z, out.z0, atol=1e-4)
    iw = jax.vmap(_target)(out.z0) - gaussian.log_prob(Q0, out.z0)
    np.testing.assert_allclose(out.log_weights, iw, rtol=1e-4, atol=1e-4)


def test_hmc_momentum_refresh_keeps_gaussian():
    """The refresh v ← γv + sqrt(1−γ²)ξ leaves N(0, M) invariant: with a flat potential and
    tiny steps the final momenta keep variance ``mass`` (4σ tolerance for 20,000 draws)."""
    flat = transitions.Potential(lambda z: 0.0 * jnp.sum(z), lambda z: 0.0 * jnp.sum(z))
    mass = jnp.array([1.0, 2.0, 0.5])
    params = _params(5, step=1e-6)._replace(mass=mass)
    noise = dais.draw_noise(jax.random.key(4), 5, 20000, 3)
    state = dais.init(noise, Q0, flat, params, HMC, False)
    for k in range(5):
        state, _ = dais.step(
            jax.random.key(10 + k), state, dais.step_params(params, k), flat, HMC, False
        )
    var = jnp.var(state.v, axis=0)
    np.testing.assert_allclose(var, mass, rtol=4 * np.sqrt(2 / 20000))


def test_weights_helpers():
    log_w = jnp.array([0.0, jnp.log(3.0), -jnp.inf])
    np.testing.assert_allclose(weights.log_mean_exp(log_w), jnp.log(4.0 / 3.0), rtol=1e-6)
    np.testing.assert_allclose(weights.ess(log_w), 1.0 / (0.25**2 + 0.75**2), rtol=1e-6)
    assert weights.ess(jnp.zeros(7)) == pytest.approx(7.0)
    masked, n = weights.mask_nonfinite(jnp.array([1.0, jnp.nan, jnp.inf]))
    assert int(n) == 2 and bool(jnp.isneginf(masked[1:]).all())


def test_zero_nonfinite_grads():
    def f(x):
        x = weights.zero_nonfinite_grads(x)
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))

    g = jax.grad(f)(jnp.array([4.0, 0.0, -1.0]))
    assert bool(jnp.isfinite(g).all())
    np.testing.assert_allclose(g[0], 0.25)


def test_betas_from_increments():
    betas = path.betas_from_increments(jnp.array([1.0, 3.0]))
    np.testing.assert_allclose(betas, [0.0, 0.25, 1.0])
    np.testing.assert_allclose(path.betas_from_increments(jnp.ones(4)), [0, 0.25, 0.5, 0.75, 1.0])


def test_unknown_kernel():
    with pytest.raises(ValueError, match="kernel"):
        dais.run(jax.random.key(0), Q0, TARGET, _params(2), 2, kernel="nuts")


def test_cholesky_gaussian_matches_scipy():
    from jax.scipy.stats import multivariate_normal

    L = jnp.array([[1.0, 0.0], [0.5, 0.7]])
    q0 = gaussian.Gaussian(jnp.array([0.3, -0.1]), L)
    z = jax.random.normal(jax.random.key(0), (5, 2))
    np.testing.assert_allclose(
        gaussian.log_prob(q0, z), multivariate_normal.logpdf(z, q0.loc, L @ L.T), rtol=1e-5
    )


def _batched_whiles(jaxpr) -> int:
    """``while`` loops over a batch (a predicate per member: how ``vmap`` runs a loop whose
    trip count can differ between the members of a batch), at any depth."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "while":
            count += eqn.params["cond_jaxpr"].out_avals[0].ndim > 0
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _batched_whiles(inner)
    return count


def test_over_particles_is_vmap_and_one_particle_runs_unbatched():
    """Values equal ``vmap``'s for one particle and for three; one particle reaches the
    function as an unbatched ``(D,)``, three as a batch."""
    seen = []

    def fn(z, scale):
        seen.append(isinstance(z, jax.core.Tracer) and "Batch" in type(z).__name__)
        return {"value": _target(z) * scale, "z": z}

    for n in (1, 3):
        z = jax.random.normal(jax.random.key(n), (n, D))
        scale = jnp.arange(1.0, n + 1.0)
        out = dais.over_particles(fn)(z, scale)
        expected = jax.vmap(fn)(z, scale)
        np.testing.assert_allclose(out["value"], expected["value"], rtol=1e-6)
        np.testing.assert_array_equal(out["z"], z)
    assert seen == [False, True, True, True]  # (over_particles, vmap) for 1, then for 3


def test_one_particle_keeps_an_ode_solvers_loop_unbatched():
    """The training program of one particle on a log density solved by ``odeint`` (an
    adaptive solver: ``while`` loops, with a ``custom_vjp`` adjoint) holds no loop over a
    batch of one, in the run or its gradient; two particles do (the marker is right)."""
    from jax.experimental.ode import odeint

    t = jnp.array([0.0, 0.5, 1.0])

    def log_density(z):
        y = odeint(lambda y, _, k: -k * y, jnp.ones(1), t, jnp.exp(z[0]))
        return -jnp.sum((y[1:, 0] - jnp.array([0.6, 0.4])) ** 2) / 0.02 - 0.5 * jnp.sum(z**2)

    q0 = gaussian.Gaussian(jnp.zeros(1), jnp.ones(1))
    params = dais.AnnealParams(
        path.betas_from_increments(jnp.ones(2)), jnp.full(2, 0.1), jnp.ones(1), 0.8
    )

    def loss(loc, n):
        q = q0._replace(loc=loc)
        return dais.run(jax.random.key(0), q, dais.Target(log_density), params, n).log_Z

    for n, expected in ((1, False), (2, True)):
        jaxpr = jax.make_jaxpr(jax.value_and_grad(loss), static_argnums=1)(q0.loc, n)
        assert (_batched_whiles(jaxpr.jaxpr) > 0) is expected, n
