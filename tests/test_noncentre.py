"""Non-centred hierarchies inside the guide (``noncentre``): a centred model's Normal sites
whose scale is a latent function run as ``value = loc + scale · u``, which must be exactly
the guide of the model written non-centred, and numpyro's own ``LocScaleReparam``."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.handlers import reparam
from numpyro.infer import SVI, Predictive, Trace_ELBO
from numpyro.infer.reparam import LocScaleReparam
from numpyro.infer.util import potential_energy

from numpyro_dais import AutoDAIS, AutoDSMCS, AutoSurrogateLikelihoodDAIS
from tests import models

Y, SIGMA = models.SCHOOLS_Y, models.SCHOOLS_SIGMA


def centred(sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def non_centred(sigma, y=None):
    """The same posterior written non-centred; ``theta`` here is the noise (same name and
    order of sites, so ``init_to_uniform`` gives both guides the same initial point)."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", sigma.shape[0]):
        u = numpyro.sample("theta", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * u, sigma), obs=y)


def _fit(model, guide, steps=30):
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = svi.run(jax.random.key(0), steps, SIGMA, y=Y, progress_bar=False)
    return result, caught


@pytest.fixture(scope="module")
def pair():
    """Default-option guides (K = 4, N = 4) of the centred model (non-centred by the guide
    at set-up, ``noncentre="auto"``) and of the model written non-centred."""
    fits = {}
    for name, model in (("centred", centred), ("non_centred", non_centred)):
        guide = AutoDAIS(model, K=4, num_particles=4, self_check=False)
        fits[name] = (guide, *_fit(model, guide))
    return fits


def test_auto_noncentres_the_funnel_silently(pair):
    guide, result, caught = pair["centred"]
    assert guide._view.noncentred == ("theta",)
    assert not [w for w in caught if "no mode" in str(w.message)]
    assert "auto_preconditioner_loc" in result.params  # a Laplace start, in (mu, tau, u)
    assert pair["non_centred"][0]._view.noncentred == ()  # nothing to non-centre there


def test_noncentred_guide_is_the_guide_of_the_noncentred_model(pair):
    """The same initial point, set-up, losses and parameters step for step (float32: the
    two log joints differ in the order of a few operations, rtol 1e-4)."""
    (g_c, r_c, _), (g_n, r_n, _) = pair["centred"], pair["non_centred"]
    np.testing.assert_allclose(r_c.losses, r_n.losses, rtol=1e-4)
    for k, v in r_n.params.items():
        np.testing.assert_allclose(r_c.params[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    # draws: the centred guide returns theta = mu + tau u, from the same q0 draws
    key = jax.random.key(1)
    d_c = g_c.sample_posterior(key, r_c.params, sample_shape=(500,))
    d_n = g_n.sample_posterior(key, r_n.params, sample_shape=(500,))
    theta = d_n["mu"][:, None] + d_n["tau"][:, None] * d_n["theta"]
    # values ~20 built from parameters equal to ~1e-5: float32 round-off up to ~1e-3
    np.testing.assert_allclose(d_c["theta"], theta, rtol=1e-3, atol=5e-3)
    np.testing.assert_allclose(d_c["tau"], d_n["tau"], rtol=1e-4)


def test_log_joint_is_numpyros_locscalereparam(pair):
    """The dynamics' log joint at a flat ``z`` equals minus numpyro's potential energy of
    ``reparam(model, {theta: LocScaleReparam(0)})`` at the same unconstrained values."""
    guide, result, _ = pair["centred"]
    target = guide.annealing_target(result.params, SIGMA, y=Y)
    z = jax.random.normal(jax.random.key(3), (guide.latent_dim,))
    site = guide._view.unpack(z)
    values = {"mu": site["mu"], "tau": site["tau"], "theta_decentered": site["theta"]}
    model = reparam(centred, config={"theta": LocScaleReparam(0)})
    expected = -potential_energy(model, (SIGMA,), {"y": Y}, values)
    np.testing.assert_allclose(target.log_dynamics(z), expected, rtol=1e-5)


def test_summaries_and_predictive_give_model_values(pair):
    """``median``/``quantiles`` summarise the draws' values of theta (not ``loc + scale ·
    median(u)``), ``Predictive`` replays theta into the model, and the flat coordinates of
    theta are labelled as the noise they hold."""
    guide, result, _ = pair["centred"]
    draws = guide.sample_posterior(jax.random.key(0), result.params, sample_shape=(2000,))
    median = guide.median(result.params)
    # two medians of 2000 draws each: Monte Carlo error ~0.04 sd apiece
    sd = np.std(draws["theta"], 0)
    assert np.all(np.abs(median["theta"] - np.median(draws["theta"], 0)) < 0.15 * sd)
    q = guide.quantiles(result.params, [0.25, 0.75])
    assert q["theta"].shape == (2, 8) and np.all(q["theta"][0] < q["theta"][1])
    out = Predictive(centred, guide=guide, params=result.params, num_samples=3)(
        jax.random.key(2), SIGMA
    )
    assert out["y"].shape == (3, 8) and np.all(np.isfinite(out["y"]))
    sites = Predictive(guide, params=result.params, num_samples=3)(jax.random.key(2), SIGMA)
    assert sites["theta"].shape == (3, 8)
    assert "theta_decentered[0]" in guide._coordinate_names()


def _strong_data():
    """8 groups of 50 rows each with noise sd 1: the centred posterior has a clear mode."""
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(8), 50)
    y = rng.normal(rng.normal(0.0, 1.0, 8)[group], 1.0)
    return jnp.asarray(group), jnp.asarray(y, jnp.float32)


def grouped(group, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("g", 8):
        a = numpyro.sample("a", dist.Normal(mu, tau))
    numpyro.sample("y", dist.Normal(a[group], 1.0), obs=y)


@pytest.mark.parametrize("noncentre, expected", [("auto", ()), (True, ("a",)), (False, ())])
def test_auto_keeps_a_hierarchy_with_a_mode_centred(noncentre, expected):
    """Where the data pin the groups down the centred posterior has a mode, and ``"auto"``
    keeps it (centred is the better geometry there); ``True`` non-centres anyway."""
    data = _strong_data()
    guide = AutoDAIS(grouped, noncentre=noncentre)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SVI(grouped, guide, optax.adam(1e-2), Trace_ELBO()).init(jax.random.key(0), *data)
    assert guide._view.noncentred == expected


def test_noncentre_option_is_checked():
    for bad in ("yes", 1):
        with pytest.raises(ValueError, match="`noncentre` must be 'auto'"):
            AutoDAIS(centred, noncentre=bad)
    AutoDSMCS(centred, noncentre=True)  # the SMC preset has it too
    with pytest.raises(ValueError, match="mini-batch guides take False only"):
        AutoSurrogateLikelihoodDAIS(centred, None, noncentre=True)
