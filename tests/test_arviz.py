"""``numpyro_dais.to_inference_data``: the ArviZ export (the ``[arviz]`` extra), with
ArviZ 0.x (an ``InferenceData``) or ArviZ 1.x (an xarray ``DataTree``), whichever is
installed: Python 3.11 gets 0.x; ArviZ 1.x needs Python >= 3.12.

To run these tests under the other ArviZ major too, point ``NUMPYRO_DAIS_OTHER_ARVIZ_PYTHON``
at a Python that has it with this package's dependencies, e.g. on Python 3.12::

    python3.12 -m venv /tmp/venv312
    /tmp/venv312/bin/pip install -e ".[test]" "arviz>=1"
    NUMPYRO_DAIS_OTHER_ARVIZ_PYTHON=/tmp/venv312/bin/python pytest tests/test_arviz.py
"""

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.handlers import seed
from numpyro.infer import SVI, Trace_ELBO
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.elbo import get_importance_log_probs

from numpyro_dais import AutoDAIS, run_chains, to_inference_data
from numpyro_dais.engine.annealing import weights
from numpyro_dais.engine.diagnostics import psis

az = pytest.importorskip("arviz", reason="needs ArviZ: `pip install numpyro-dais[arviz]`")
ARVIZ_1 = int(az.__version__.split(".")[0]) >= 1

S = 100  # posterior draws per chain
C = 4  # chains


def groups(data):
    """The group names of an ``InferenceData`` (0.x) or a ``DataTree`` (1.x)."""
    if ARVIZ_1:
        return {g.strip("/") for g in data.groups if g != "/"}
    return set(data.groups())


def elpd(loo):
    return loo.elpd if ARVIZ_1 else loo.elpd_loo


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
    """Four independent fits (one vmapped program), the first one exported alone."""
    k1, k2 = jax.random.split(jax.random.key(0))
    X = jax.random.normal(k1, (40, 2))
    y = jax.random.bernoulli(k2, jax.nn.sigmoid(X @ jnp.array([1.0, -1.0]))).astype(jnp.float32)
    guide = AutoDAIS(model, K=2, num_particles=4)
    svi = SVI(model, guide, optax.adam(2e-2), Trace_ELBO())
    result = run_chains(svi, jax.random.key(1), 200, X, y, num_chains=C)
    assert len(result.params) == C and result.losses.shape == (C, 200)
    idata = to_inference_data(
        guide,
        result.params[0],
        X,
        y,
        num_samples=S,
        posterior_predictive=True,
        evidence_particles=256,
    )
    return X, y, guide, result.params, idata


def test_groups_dims_and_evidence_attrs(fitted):
    X, y, guide, params, idata = fitted
    assert {"posterior", "log_likelihood", "observed_data", "posterior_predictive"} == groups(idata)
    post = idata.posterior
    assert post["b"].shape == (1, S) and post["w"].shape == (1, S, 2)
    # dims from the model's plate; unnamed event dims get ArviZ's default names
    assert post["logit"].dims == ("chain", "draw", "data")
    assert post["w"].dims == ("chain", "draw", "w_dim_0")
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "data")
    assert idata.posterior_predictive["y"].shape == (1, S, 40)
    assert set(np.unique(idata.posterior_predictive["y"])) <= {0.0, 1.0}
    np.testing.assert_array_equal(idata.observed_data["y"], y)
    for attrs in (idata.attrs, idata.posterior.attrs):
        assert attrs["guide"] == "AutoDAIS" and attrs["posterior_method"] == "q0"
        assert attrs["num_chains"] == 1 and attrs["inference_library"] == "numpyro"
        assert attrs["log_Z_particles"] == 256 and 1 <= attrs["log_Z_ess"] <= 256
        assert 0 < attrs["log_Z_se"] < 1 and np.isfinite(attrs["log_Z"])


def test_the_container_of_the_installed_arviz(fitted):
    """``InferenceData`` with ArviZ 0.x, an xarray ``DataTree`` with ArviZ 1.x."""
    idata = fitted[-1]
    if ARVIZ_1:
        import xarray as xr

        assert isinstance(idata, xr.DataTree)
    else:
        assert isinstance(idata, az.InferenceData)


def test_log_likelihood_is_pointwise_and_exact(fitted):
    X, y, _, _, idata = fitted
    b = idata.posterior["b"].values[0, :, None]
    w = idata.posterior["w"].values[0]
    expected = dist.Bernoulli(logits=jnp.asarray(w @ np.asarray(X).T + b)).log_prob(y)
    np.testing.assert_allclose(idata.log_likelihood["y"].values[0], expected, rtol=1e-5, atol=1e-5)


# 100 draws of a 4-particle guide: some Pareto k above 0.5 is expected, and pandas 3 warns
# about ArviZ's own call
@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
@pytest.mark.filterwarnings("ignore:.*Pareto k.*:UserWarning")
@pytest.mark.filterwarnings("ignore:The inplace keyword")
def test_summary_loo_and_compare_work(fitted):
    X, y, guide, params, idata = fitted
    summary = az.summary(idata, var_names=["b", "w"], kind="stats")
    assert list(summary.index) == ["b", "w[0]", "w[1]"]
    loo = az.loo(idata)
    assert np.isfinite(elpd(loo)) and loo.n_data_points == 40
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


def test_several_fits_are_chains(fitted, caplog, capfd):
    """Four fits as four chains: shapes ``(C, S, ...)``, attributes per chain, and
    ``az.summary`` gives a finite ``r_hat`` without ArviZ's "Shape validation failed" (which
    one chain does log)."""
    X, y, guide, params, one = fitted
    idata = to_inference_data(guide, params, X, y, num_samples=S, evidence_particles=64)
    post = idata.posterior
    assert post["b"].shape == (C, S) and post["w"].shape == (C, S, 2)
    assert post["logit"].dims == ("chain", "draw", "data")
    assert idata.log_likelihood["y"].shape == (C, S, 40)
    assert idata.observed_data["y"].shape == (40,)
    # the chains are different fits, not copies
    assert not np.allclose(post["b"].values[0], post["b"].values[1])
    attrs = idata.attrs
    assert attrs["num_chains"] == C and attrs["guide"] == "AutoDAIS"
    assert len(attrs["log_Z"]) == C and len(attrs["log_Z_se"]) == C
    assert np.ptp(attrs["log_Z"]) < 0.5  # the fits agree on the evidence

    # ArviZ 0.x logs to its own stderr handler, 1.x at INFO through logging
    caplog.set_level(logging.DEBUG)
    logged = lambda: caplog.text + capfd.readouterr().err
    logged()
    summary = az.summary(idata, var_names=["b", "w"])
    assert np.all(np.isfinite(summary["r_hat"])) and np.all(summary["r_hat"] < 1.05)
    assert "Shape validation failed" not in logged()
    az.summary(one, var_names=["b"])
    assert "Shape validation failed" in logged()


def test_r_hat_flags_fits_that_did_not_converge():
    """Four AutoNormal fits from dispersed starts (``run_chains``' ``init_params``): after 5
    steps they disagree and ``r_hat`` says so (measured 2.85); after 2000 they agree (1.004)."""
    X = jax.random.normal(jax.random.key(3), (40, 2))
    y = (X[:, 0] > 0).astype(jnp.float32)
    guide = AutoNormal(lambda X, y: model(X, y))
    svi = SVI(guide.model, guide, optax.adam(5e-2), Trace_ELBO())
    starts = [
        {"b_auto_loc": jnp.asarray(b), "w_auto_loc": jnp.full(2, b)} for b in (-4.0, -1.0, 1.0, 4.0)
    ]
    rhat = {}
    for steps in (5, 2000):
        result = run_chains(svi, jax.random.key(4), steps, X, y, num_chains=C, init_params=starts)
        idata = to_inference_data(guide, result.params, X, y, num_samples=S, log_likelihood=False)
        rhat[steps] = float(az.rhat(idata)["b"])
    assert rhat[5] > 1.5 and rhat[2000] < 1.05


def test_chain_arguments_are_checked(fitted):
    X, y, guide, params, _ = fitted
    with pytest.raises(ValueError, match="2 guides for 4 sets of parameters"):
        to_inference_data([guide, guide], params, X, y)
    with pytest.raises(TypeError, match="non-empty list"):
        to_inference_data(guide, [], X, y)
    with pytest.raises(ValueError, match="num_chains"):
        run_chains(None, jax.random.key(0), 1, num_chains=0)


class _Evidence(NamedTuple):
    log_Z: jax.Array
    ess: jax.Array
    se: jax.Array
    pareto_k: psis.ParetoK


class _AutoNormalWithEvidence(AutoNormal):
    """An AutoNormal with a ``log_evidence`` that also returns the Pareto k̂ of its weights
    (``log p(x, z) − log q(z)``), as the guides of this package are to."""

    def log_evidence(self, rng_key, params, *args, num_particles=1000, batch_size=None, **kw):
        def log_weight(key):
            k1, k2 = jax.random.split(key)
            lp, lq = get_importance_log_probs(
                seed(self.model, k1), seed(self, k2), args, kw, params
            )
            return sum(v.sum() for v in lp.values()) - sum(v.sum() for v in lq.values())

        lw = jax.vmap(log_weight)(jax.random.split(rng_key, num_particles))
        return _Evidence(
            weights.log_mean_exp(lw),
            weights.ess(lw),
            weights.log_mean_exp_se(lw),
            psis.pareto_k(lw),
        )


def test_pareto_k_of_the_evidence_weights_in_the_attributes(fitted):
    """Where ``log_evidence`` returns ``pareto_k``, the export has ``log_Z_pareto_k`` (per
    chain; measured 0.50 and 0.22 for these two trained AutoNormal fits)."""
    X, y, _, _, idata = fitted
    k = idata.attrs["log_Z_pareto_k"]  # AutoDAIS's LogEvidence carries it
    assert isinstance(k, float) and k < psis.K_BAD
    guide = _AutoNormalWithEvidence(lambda X, y: model(X, y))
    svi = SVI(guide.model, guide, optax.adam(5e-2), Trace_ELBO())
    result = run_chains(svi, jax.random.key(5), 1000, X, y, num_chains=2)
    out = to_inference_data(guide, result.params, X, y, num_samples=S, evidence_particles=1000)
    ks = out.attrs["log_Z_pareto_k"]
    assert len(ks) == 2 and all(k < psis.K_BAD for k in ks)
    single = to_inference_data(guide, result.params[0], X, y, num_samples=S)
    assert isinstance(single.posterior.attrs["log_Z_pareto_k"], float)


OTHER_PYTHON = os.environ.get("NUMPYRO_DAIS_OTHER_ARVIZ_PYTHON")


@pytest.mark.skipif(
    not OTHER_PYTHON,
    reason="set NUMPYRO_DAIS_OTHER_ARVIZ_PYTHON to a Python with the other ArviZ major "
    "(this module's docstring says how)",
)
def test_under_the_other_arviz_major():
    """This module and the PSIS tests, run by a Python whose ArviZ has the other major
    version, on this working tree."""
    root = Path(__file__).resolve().parent.parent
    # its own conftest sets XLA's flags and JAX's cache for its jaxlib (which may reject
    # this one's flags)
    drop = ("NUMPYRO_DAIS_OTHER_ARVIZ_PYTHON", "XLA_FLAGS", "JAX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = str(root)
    probe = subprocess.run(
        [OTHER_PYTHON, "-c", "import arviz; print(arviz.__version__)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    other = int(probe.stdout.strip().split(".")[0])
    assert other != int(az.__version__.split(".")[0]), f"both have ArviZ {other}.x"
    tests = ["tests/test_arviz.py", "tests/engine/diagnostics/test_psis.py"]
    run = subprocess.run(
        [OTHER_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
