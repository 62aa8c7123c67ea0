"""The answer does not depend on how the model is written: the order of its ``sample``
statements, or a ``plate`` against ``.to_event``.

The set-up's whitening takes the sites by size and whitens within a size by the symmetric
root of the Laplace covariance, which permuting the coordinates permutes the same way (a
Cholesky factor does not: every diagonal quantity in its coordinates, ``q0``'s scales and
the mass matrix, then depends on the order), so the same posterior written in another order
starts from the same whitened frame."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_dais import AutoDAIS
from numpyro_dais.convergence import run_until_converged

SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def _schools_globals_first(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", 8):
        eta = numpyro.sample("eta", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * eta, sigma), obs=y)


def _schools_to_event(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([8]).to_event(1))
    numpyro.sample("y", dist.Normal(mu + tau * eta, sigma).to_event(1), obs=y)


def _schools_locals_first(sigma, y=None):
    eta = numpyro.sample("eta", dist.Normal(0.0, 1.0).expand([8]).to_event(1))
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    numpyro.sample("y", dist.Normal(mu + tau * eta, sigma).to_event(1), obs=y)


def _regression(order):
    def model(x, y=None):
        sites = {}
        for name in order:
            prior = dist.Exponential(1.0) if name == "sigma" else dist.Normal(0.0, 10.0)
            sites[name] = numpyro.sample(name, prior)
        mean = sites["a"] + sites["b"] * x
        numpyro.sample("y", dist.Normal(mean, sites["sigma"]), obs=y)

    return model


def _regression_data():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 1.0, 30)  # uncentred: intercept and slope correlated
    return x, 1.0 + 0.5 * x + rng.normal(0, 0.5, 30)


def _hier_logistic(order):
    def model(group, x, y=None):
        sites = {}
        for name in order:
            if name == "alpha":
                with numpyro.plate("g", 6):
                    sites[name] = numpyro.sample("alpha", dist.Normal(0.0, 1.0))
            elif name == "tau":
                sites[name] = numpyro.sample("tau", dist.HalfNormal(1.0))
            else:
                sites[name] = numpyro.sample(name, dist.Normal(0.0, 2.0))
        logits = sites["mu"] + sites["tau"] * sites["alpha"][group] + sites["beta"] * x
        with numpyro.plate("n", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)

    return model


def _hier_logistic_data():
    rng = np.random.default_rng(1)
    group = np.repeat(np.arange(6), 8)
    x = rng.normal(size=48)
    logits = 0.3 + 0.8 * rng.normal(size=6)[group] + 0.7 * x
    return group, x, (rng.random(48) < 1 / (1 + np.exp(-logits))).astype(float)


def _gp(order):
    def model(x, k=None):
        sites = {}
        for name in order:
            if name == "f":
                sites[name] = numpyro.sample("f", dist.Normal(0.0, 1.0).expand([6]).to_event(1))
            elif name == "rho":
                sites[name] = numpyro.sample("rho", dist.InverseGamma(5.0, 5.0))
            else:
                sites[name] = numpyro.sample("alpha", dist.LogNormal(0.0, 1.0))
        d2 = (x[:, None] - x[None, :]) ** 2
        cov = sites["alpha"] ** 2 * jnp.exp(-0.5 * d2 / sites["rho"] ** 2) + 1e-6 * jnp.eye(6)
        f = jnp.linalg.cholesky(cov) @ sites["f"]
        numpyro.sample("k", dist.Poisson(jnp.exp(f)).to_event(1), obs=k)

    return model


def _ar2(order):
    def model(y):
        sites = {}
        for name in order:
            if name == "sigma":
                sites[name] = numpyro.sample("sigma", dist.HalfNormal(1.0))
            else:
                sites[name] = numpyro.sample("phi", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        phi, sigma = sites["phi"], sites["sigma"]
        mean = phi[0] * y[1:-1] + phi[1] * y[:-2]
        numpyro.sample("y", dist.Normal(mean, sigma).to_event(1), obs=y[2:])

    return model


def _ar2_data():
    rng = np.random.default_rng(2)
    y = np.zeros(60)
    for t in range(2, 60):
        y[t] = 0.6 * y[t - 1] - 0.3 * y[t - 2] + 0.5 * rng.normal()
    return (y,)


SCHOOLS = (SCHOOLS_SIGMA, SCHOOLS_Y)
#: ``name: ((the model written one way, and another), its arguments)``
FORMS = {
    "eight schools": ((_schools_globals_first, _schools_locals_first), SCHOOLS),
    "regression": (
        (_regression(("a", "b", "sigma")), _regression(("sigma", "b", "a"))),
        _regression_data(),
    ),
    "hierarchical logistic": (
        (
            _hier_logistic(("mu", "tau", "alpha", "beta")),
            _hier_logistic(("beta", "alpha", "tau", "mu")),
        ),
        _hier_logistic_data(),
    ),
    "latent GP": (
        (_gp(("rho", "alpha", "f")), _gp(("f", "alpha", "rho"))),
        (np.linspace(0, 5, 6), np.array([1.0, 3, 4, 2, 0, 1])),
    ),
    "AR(2)": ((_ar2(("phi", "sigma")), _ar2(("sigma", "phi"))), _ar2_data()),
}


def _set_up(model, args):
    guide = AutoDAIS(model)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), *args))
    names = guide._coordinate_names()
    loc = np.asarray(params["auto_preconditioner_loc"], np.float64)
    scale = np.asarray(params["auto_preconditioner_scale"], np.float64)
    return names, loc, scale


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMS))
def test_the_whitened_frame_does_not_depend_on_the_order_of_the_sites(name):
    """The set-up of one posterior written in two orders gives the same whitened frame,
    permuted: ``F = L₂⁻¹ P L₁ Pᵀ`` (``P`` the permutation of the flat coordinates) is
    diagonal, so the diagonal ``q0`` and mass matrix of either order span the same
    Gaussians of ``z``. Diagonal, not the identity: where the Gaussian VI refinement of
    the start runs (the hierarchies), its 32 fixed draws fall on other coordinates in the
    other order, and its centre and scales differ by its Monte Carlo error (which training
    then removes). Tolerance: off-diagonal entries below 0.02 of the diagonal's (float32
    round-off, and the mode search's tolerance); a Cholesky factor in place of the
    symmetric root gives 0.3-1 here (the posteriors' correlations)."""
    (first, second), args = FORMS[name]
    names1, loc1, scale1 = _set_up(first, args)
    names2, loc2, scale2 = _set_up(second, args)
    assert sorted(names1) == sorted(names2)
    perm = np.array([names1.index(n) for n in names2])
    frame = np.linalg.solve(scale2, scale1[perm][:, perm])
    diagonal = np.diagonal(frame)
    off = frame - np.diag(diagonal)
    assert np.all(diagonal > 0)
    assert np.abs(off / diagonal[:, None]).max() < 0.02


def _q0_moments(model, seed):
    guide = AutoDAIS(model)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_until_converged(svi, jax.random.key(seed), *SCHOOLS, progress_bar=False)
    draws = guide.sample_posterior(jax.random.key(1), run.params, sample_shape=(4000,))
    return {k: (float(np.mean(draws[k])), float(np.std(draws[k]))) for k in ("mu", "tau")}


@pytest.mark.slow
def test_eight_schools_trained_locals_first_as_globals_first():
    """Defaults trained until converged, ``q0`` draws: eight schools written with the local
    vector first (``.to_event``) gives the answer of the globals-first form with a plate,
    to within the two runs' Monte Carlo error (training keys, and draws falling on other
    coordinates): μ's and τ's means within 0.15 of NUTS's sds, sds within 15%. With a
    Cholesky whitening the locals-first form gave τ's sd 1.8-3 times the other's."""
    first = _q0_moments(_schools_globals_first, 0)
    second = _q0_moments(_schools_locals_first, 0)
    for site, sd in (("mu", 3.34), ("tau", 3.28)):
        (m1, s1), (m2, s2) = first[site], second[site]
        assert abs(m1 - m2) / sd < 0.15, (site, first, second)
        assert abs(np.log(s1 / s2)) < np.log(1.15), (site, first, second)
