"""A run over several processes is refused unless they hash strings alike: numpyro's ELBOs
sum the sites in set order, so their compiled programs (and collectives) would differ."""

import sys
import types

import jax
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO

from numpyro_dais import AutoDAIS
from numpyro_dais.bridge.checks import check_processes


def _processes(monkeypatch, count, seed, randomised=1):
    monkeypatch.setattr(jax, "process_count", lambda: count)
    monkeypatch.setattr(sys, "flags", types.SimpleNamespace(hash_randomization=randomised))
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)


@pytest.mark.parametrize("seed", [None, "", "random"])
def test_several_processes_without_a_hash_seed_are_refused(monkeypatch, seed):
    _processes(monkeypatch, 2, seed)
    with pytest.raises(RuntimeError, match="same PYTHONHASHSEED, e.g. `PYTHONHASHSEED=0"):
        check_processes("AutoDAIS")


@pytest.mark.parametrize("count, seed", [(1, None), (2, "0"), (2, "7")])
def test_one_process_or_a_fixed_hash_seed_passes(monkeypatch, count, seed):
    _processes(monkeypatch, count, seed)
    check_processes("AutoDAIS")


def test_a_guide_refuses_at_its_first_call(monkeypatch):
    def model():
        numpyro.sample("x", dist.Normal(0.0, 1.0))

    _processes(monkeypatch, 2, None)
    svi = SVI(model, AutoDAIS(model), optax.adam(1e-2), Trace_ELBO())
    with pytest.raises(RuntimeError, match="AutoDAIS: this run spans 2 processes"):
        svi.init(jax.random.key(0))
