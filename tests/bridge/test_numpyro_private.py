"""The set-up hooks around numpyro's ``_setup_prototype`` (fast tier)."""

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

import numpyro_dais


def valid_near_zero(y=None):
    """Valid only where ``|x| < 1``: half of numpyro's initial draws (uniform on (−2, 2))
    are invalid, the posterior (``y = 0``: N(0, 0.29²)) almost never."""
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(x, jnp.where(jnp.abs(x) < 1.0, 0.3, -1.0)), obs=y)


def never_valid(y=None):
    x = numpyro.sample("x", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(x, -1.0), obs=y)


def test_an_invalid_draw_of_the_prior_does_not_stop_the_set_up():
    key = jax.random.PRNGKey(1)
    with pytest.raises(ValueError, match="distribution got invalid"):  # numpyro's own guide
        SVI(valid_near_zero, AutoNormal(valid_near_zero), optax.adam(0.01), Trace_ELBO()).init(
            key, y=0.5
        )
    guide = numpyro_dais.AutoDAIS(valid_near_zero)
    svi = SVI(valid_near_zero, guide, optax.adam(0.01), Trace_ELBO())
    state = svi.init(key, y=0.0)
    assert jnp.isfinite(svi.evaluate(state, y=0.0))


def test_a_model_invalid_everywhere_keeps_the_validation_error():
    guide = numpyro_dais.AutoDAIS(never_valid)
    svi = SVI(never_valid, guide, optax.adam(0.01), Trace_ELBO())
    with pytest.raises(ValueError, match="Normal distribution got invalid scale parameter"):
        svi.init(jax.random.PRNGKey(0), y=0.0)
