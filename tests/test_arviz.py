"""``numpyro_dais.to_inference_data``: the ArviZ export (the ``[arviz]`` extra)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal

from numpyro_dais import AutoDAIS, to_inference_data

az = pytest.importorskip("arviz", reason="needs ArviZ: `pip install numpyro-dais[arviz]`")

S = 100  # posterior draws


def model(X, y=None, subsample_size=None):
    b = numpyro.sample("b", dist.Normal(0.0, 2.0))
    w = numpyro.sample("w", dist.Normal(jnp.zeros(X.shape[1]), 1.0).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=subsample_size):
        X_batch = numpyro.subsample(X, event_dim=1)
        y_batch = numpyro.subsample(y, event_dim=0) if y is not None else None
        logit = numpyro.deterministic("logit", X_batch @ w + b)
        numpyro.sample("y", dist.Bernoulli(logits=logit), obs=y_batch)


@pytest.fixture(scope="module")
def fitted():
    k1, k2 = jax.random.split(jax.random.key(0))
    X = jax.random.normal(k1, (40, 2))
    y = jax.random.bernoulli(k2, jax.nn.sigmoid(X @ jnp.array([1.0, -1.0]))).astype(jnp.float32)
    guide = AutoDAIS(model, K=2, num_particles=4)
    svi = SVI(model, guide, optax.adam(2e-2), Trace_ELBO())
    result = svi.run(jax.random.key(1), 200, X, y, progress_bar=False)
    idata = to_inference_data(
        guide, result.params, X, y, num_samples=S, posterior_predictive=True, evidence_particles=256
    )
    return X, y, guide, result.params, idata


def test_groups_dims_and_evidence_attrs(fitted):
    X, y, guide, params, idata = fitted
    assert {"posterior", "log_likelihood", "observed_data", "posterior_predictive"} <= set(
        idata.groups()
    )
    post = idata.posterior
    assert post["b"].shape == (1, S) and post["w"].shape == (1, S, 2)
    # dims from the model's plate; unnamed event dims get ArviZ's default names
    assert post["logit"].dims == ("chain", "draw", "data")
    assert post["w"].dims == ("chain", "draw", "w_dim_0")
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert idata.posterior_predictive["y"].shape == (1, S, 40)
    assert set(np.unique(idata.posterior_predictive["y"])) <= {0.0, 1.0}
    np.testing.assert_array_equal(idata.observed_data["y"], y)
    attrs = idata.posterior.attrs
    assert attrs["guide"] == "AutoDAIS" and attrs["posterior_method"] == "q0"
    assert attrs["log_Z_particles"] == 256 and 1 <= attrs["log_Z_ess"] <= 256
    assert 0 < attrs["log_Z_se"] < 1 and np.isfinite(attrs["log_Z"])


def test_log_likelihood_is_pointwise_and_exact(fitted):
    X, y, _, _, idata = fitted
    b = idata.posterior["b"].values[0, :, None]
    w = idata.posterior["w"].values[0]
    expected = dist.Bernoulli(logits=jnp.asarray(w @ np.asarray(X).T + b)).log_prob(y)
    np.testing.assert_allclose(idata.log_likelihood["y"].values[0], expected, rtol=1e-5, atol=1e-5)


# 100 draws of a 4-particle guide: some Pareto k above 0.5 is expected, and pandas 3 warns
# about ArviZ's own call
@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
@pytest.mark.filterwarnings("ignore:The inplace keyword")
def test_summary_loo_and_compare_work(fitted):
    X, y, guide, params, idata = fitted
    summary = az.summary(idata, var_names=["b", "w"], kind="stats")
    assert list(summary.index) == ["b", "w[0]", "w[1]"]
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and loo.n_data_points == 40
    other = to_inference_data(
        guide, params, X, y, num_samples=S, method="importance", evidence_particles=0
    )
    assert "log_Z" not in other.posterior.attrs
    table = az.compare({"q0": idata, "importance": other})
    assert set(table.index) == {"q0", "importance"}


def test_numpyro_autoguide_and_subsampled_model(fitted):
    """A NumPyro autoguide (no ``method``, no ``log_evidence``) on a mini-batch model: the
    export asks for the full-data model, and works with it."""
    X, y, _, _, _ = fitted
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), X, y, subsample_size=10))
    with pytest.raises(ValueError, match="full-data model"):
        to_inference_data(guide, params, X, y, num_samples=S, subsample_size=10)
    idata = to_inference_data(guide, params, X, y, num_samples=S, model=model)
    assert idata.log_likelihood["y"].shape == (1, S, 40)
    assert "log_Z" not in idata.posterior.attrs
    with pytest.raises(TypeError, match="no `method`"):
        to_inference_data(guide, params, X, y, method="q0", model=model)


def test_without_arviz_a_clear_error(monkeypatch):
    """Said before anything else is done: an untrained guide and no params will do."""
    X, y = jnp.zeros((4, 2)), jnp.zeros(4)
    monkeypatch.setitem(sys.modules, "arviz", None)
    with pytest.raises(ImportError, match=r"numpyro-dais\[arviz\]"):
        to_inference_data(AutoDAIS(model), {}, X, y)
