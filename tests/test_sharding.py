"""Particles over a device mesh (``mesh=``), and observations split by rows over one: the
same numbers as on one device, with no gather of the data.

JAX fixes the number of host devices when it starts, so the checks run in a child pytest on
4 CPU host devices (``--xla_force_host_platform_device_count=4``); in the parent run, on one
device, only :func:`test_on_four_host_devices` runs, and the rest of the suite keeps one
device.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.infer import SVI, Trace_ELBO

from numpyro_dais import AutoDAIS, AutoDSMCS, AutoGPVI, AutoSurrogateLikelihoodDAIS
from tests import models

ROOT = Path(__file__).resolve().parent.parent
CHILD = "NUMPYRO_DAIS_SHARDING_CHILD"
DEVICES = 4

child_only = pytest.mark.skipif(
    os.environ.get(CHILD) != "1", reason="runs in the child of test_on_four_host_devices"
)


@pytest.mark.skipif(os.environ.get(CHILD) == "1", reason="the parent test")
def test_on_four_host_devices():
    env = dict(os.environ, **{CHILD: "1"})
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" in proc.stdout, proc.stdout[-2000:]


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == DEVICES, jax.devices()
    return Mesh(np.array(jax.devices()), ("particles",))


@pytest.fixture(scope="module")
def dais_setup():
    return _setup(AutoDAIS)


def _setup(guide_cls, **options):
    y = models.linear_gaussian_data()
    guide = guide_cls(models.linear_gaussian, K=3, num_particles=4, **options)
    svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), y))
    # q0 off the (whitened, exact) Laplace fit, so that the weights vary
    return guide, {**params, "auto_z_0_loc": params["auto_z_0_loc"] + 0.5}, y


def _assert_close(a, b):
    for x, z in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(z), rtol=1e-5, atol=1e-5)


@child_only
@pytest.mark.parametrize("guide_cls", [AutoDAIS, AutoDSMCS])
@pytest.mark.parametrize("batch_size", [None, 8])
def test_log_evidence_sharded_equals_unsharded(mesh, guide_cls, batch_size):
    guide, params, y = _setup(guide_cls)
    key = jax.random.key(1)
    # batch_size=None without a mesh pools importance systems (another random stream)
    plain = guide.log_evidence(key, params, y, num_particles=24, batch_size=batch_size or 24)
    sharded = guide.log_evidence(key, params, y, num_particles=24, batch_size=batch_size, mesh=mesh)
    _assert_close(sharded, plain)
    assert np.isfinite(float(plain.log_Z))


@child_only
@pytest.mark.parametrize("guide_cls", [AutoDAIS, AutoDSMCS])
def test_training_bound_sharded_equals_unsharded(mesh, guide_cls):
    """``mesh=`` on the guide: the training loss and its gradients equal the one-device
    run's for the same key, and the compiled loss anneals 8 / 4 = 2 particles per device.
    DAIS's annealing loop gathers nothing across devices (only the one particle handed to
    the model is picked from all 8); DSMCS's, trained through resampling, gathers at its
    resampling steps, as a system spans the devices."""
    y = models.linear_gaussian_data()
    key = jax.random.key(3)
    # AutoDSMCS trains without resampling by default; train through it here.
    extra = {"train_resample_when": None} if guide_cls is AutoDSMCS else {}
    results = []
    for options in ({}, {"mesh": mesh}):
        guide = guide_cls(models.linear_gaussian, K=3, num_particles=8, **extra, **options)
        svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.key(0), y))
        loss = jax.jit(
            jax.value_and_grad(
                lambda p, g=guide: Trace_ELBO().loss(key, p, models.linear_gaussian, g, y)
            )
        )
        results.append((params, loss(params)))
        if options:
            hlo = loss.lower(params).compile().as_text()
            assert "f32[2,2]" in hlo
            gathers = [line for line in hlo.splitlines() if "all-gather(" in line]
            in_loop = [line for line in gathers if "/while/body/" in line]
            assert bool(in_loop) == (guide_cls is AutoDSMCS), in_loop
    (params, plain), (sharded_params, sharded) = results
    _assert_close(sharded_params, params)  # the set-up is deterministic
    _assert_close(sharded, plain)
    assert np.isfinite(float(plain[0]))


@child_only
def test_gpvi_particles_sharded_equal_unsharded(mesh):
    """``mesh=`` on AutoGPVI: the training loss and gradients, and ``sample_posterior``'s
    draws, equal the one-device run's; only the sharded step is partitioned (it holds
    cross-device collectives: the kernel couples every pair of particles)."""
    y = models.linear_gaussian_data()
    key = jax.random.key(3)
    results, programs = [], []
    for options in ({}, {"mesh": mesh}):
        guide = AutoGPVI(models.linear_gaussian, num_particles=16, **options)
        svi = SVI(models.linear_gaussian, guide, optax.adam(0.01), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.key(0), y))
        loss = jax.jit(
            jax.value_and_grad(
                lambda p, g=guide: Trace_ELBO().loss(key, p, models.linear_gaussian, g, y)
            )
        )
        draws = guide.sample_posterior(key, params, y, sample_shape=(12,), **options)
        results.append((params, loss(params), draws))
        programs.append(loss.lower(params).compile().as_text())
    _assert_close(results[1], results[0])
    collectives = [sum(f"{op}(" in hlo for op in ("all-gather", "all-reduce")) for hlo in programs]
    assert collectives[0] == 0 < collectives[1], collectives
    with pytest.raises(ValueError, match=r"4 devices does not divide num_particles=6.*=8"):
        AutoGPVI(models.linear_gaussian, num_particles=6, mesh=mesh)


@child_only
def test_particles_are_split_over_the_devices(mesh, dais_setup):
    """The annealing itself is partitioned: the compiled program holds 32 / 4 = 8 particles
    per device, never all 32 on one."""
    guide, params, y = dais_setup
    key = jax.random.key(1)
    evidence = lambda p: guide.log_evidence(key, p, y, num_particles=32, mesh=mesh).log_Z
    hlo = jax.jit(evidence).lower(params).compile().as_text()
    assert "f32[8,2]" in hlo
    assert "f32[32,2]" not in hlo and "f32[32]" not in hlo


@child_only
@pytest.mark.parametrize(
    "method, batch_size", [("q0", None), ("dais", None), ("dais", 4), ("importance", 8)]
)
def test_draws_sharded_equal_unsharded(mesh, dais_setup, method, batch_size):
    """``batch_size=8`` of 12 draws: a chunk of 8 and a remainder of 4, both split."""
    guide, params, y = dais_setup
    key = jax.random.key(2)
    kw = dict(sample_shape=(12,), method=method, batch_size=batch_size)
    plain = guide.sample_posterior(key, params, y, **kw)
    sharded = guide.sample_posterior(key, params, y, mesh=mesh, **kw)
    _assert_close(sharded, plain)
    z = sharded["z"]
    assert z.shape == (12, 2)
    if batch_size is None:
        assert isinstance(z.sharding, NamedSharding) and len(z.sharding.device_set) == DEVICES


@child_only
def test_mesh_must_divide_the_particles(mesh, dais_setup):
    guide, params, y = dais_setup
    with pytest.raises(ValueError, match=r"4 devices does not divide num_particles=30.*=32"):
        guide.log_evidence(jax.random.key(0), params, y, num_particles=30, mesh=mesh)
    with pytest.raises(ValueError, match=r"num_particles=32, batch_size=12"):
        guide.log_evidence(jax.random.key(0), params, y, num_particles=32, batch_size=10, mesh=mesh)
    with pytest.raises(ValueError, match=r"does not divide draws=6"):
        guide.sample_posterior(jax.random.key(0), params, y, sample_shape=(6,), mesh=mesh)
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        guide.log_evidence(jax.random.key(0), params, y, mesh=jax.devices())
    with pytest.raises(ValueError, match=r"4 devices does not divide num_particles=6.*=8"):
        AutoDAIS(models.linear_gaussian, num_particles=6, mesh=mesh)


# -- data over the mesh -------------------------------------------------------------------------

ROWS, FEATURES = 4096, 3


def _logistic(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([FEATURES]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)


def _logistic_subsampled(X, y):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([FEATURES]).to_event(1))
    with numpyro.plate("data", X.shape[0], subsample_size=64) as idx:
        numpyro.sample("y", dist.Bernoulli(logits=X[idx] @ w), obs=y[idx])


def _row_sharded_data(mesh):
    X = jax.random.normal(jax.random.key(0), (ROWS, FEATURES))
    y = (X @ jnp.array([1.0, -1.0, 0.5]) > 0).astype(jnp.float32)
    rows = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    return (X, y), (jax.device_put(X, rows), jax.device_put(y, rows))


@child_only
@pytest.mark.parametrize(
    "guide_cls, model",
    [(AutoDAIS, _logistic), (AutoSurrogateLikelihoodDAIS, _logistic_subsampled)],
)
def test_row_sharded_data_is_never_gathered(mesh, guide_cls, model):
    """Observations split by rows over 4 devices: the compiled training loss holds only
    row shards (1024 rows), no array of all 4096 rows and no all-gather, so the log
    likelihood's sum is a cross-device reduction inside XLA; value and gradients equal the
    one-device run's (float32 sums over 4096 rows in another order: rtol 1e-4, and an
    absolute 1e-4 of the largest gradient, for a parameter whose gradient is a sum that
    cancels to a small value)."""
    (X, y), (Xs, ys) = _row_sharded_data(mesh)
    extra = dict(num_surrogate=32) if guide_cls is AutoSurrogateLikelihoodDAIS else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # SL-DAIS: N > 1 bias note
        guide = guide_cls(model, K=3, num_particles=4, **extra)
    svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
    state = svi.init(jax.random.key(1), Xs, ys)
    params = svi.get_params(state)
    loss = jax.jit(
        jax.value_and_grad(
            lambda p, X, y: Trace_ELBO().loss(jax.random.key(3), p, model, guide, X, y)
        )
    )
    hlo = loss.lower(params, Xs, ys).compile().as_text()
    assert f"f32[{ROWS // DEVICES}" in hlo
    assert f"f32[{ROWS}" not in hlo and "all-gather" not in hlo
    (v1, g1), (v2, g2) = loss(params, X, y), loss(params, Xs, ys)
    np.testing.assert_allclose(v2, v1, rtol=1e-4)
    scale = max(float(jnp.max(abs(g))) for g in g1.values())
    for name in g1:
        np.testing.assert_allclose(g2[name], g1[name], rtol=1e-4, atol=1e-4 * scale)
    state, value = jax.jit(svi.update)(state, Xs, ys)
    assert np.isfinite(value)


@child_only
def test_a_host_call_in_a_partitioned_program_runs_once(mesh):
    """Divergence warnings in a program split over the mesh come once per step, not once
    per device: the CPU fast path (an FFI custom call, which every device would run) is for
    one-device programs; a partitioned one gets ``pure_callback``, which JAX runs once."""
    from numpyro_dais.runtime.reporting import warn_from_jit

    calls = []

    @jax.jit
    def step(x):
        bad = jnp.sum(~jnp.isfinite(x))
        return jnp.nansum(x) + warn_from_jit(lambda *v: calls.append(v), (bad,), x.shape[0])

    x = jnp.arange(8.0).at[3].set(jnp.nan)
    jax.block_until_ready(step(jax.device_put(x, NamedSharding(mesh, PartitionSpec("particles")))))
    assert calls == [(1.0, 8.0)]
