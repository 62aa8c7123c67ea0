"""A sampler says how particles move and are weighted: DAIS, or SMC (DAIS plus resampling).

:class:`Sampler` is a plain configuration; :func:`run` runs it on any
:class:`~numpyro_dais.engine.dais.Target`, so targets and samplers compose freely. Both
samplers return a :class:`~numpyro_dais.engine.dais.SamplerOutput`.
"""

from typing import NamedTuple

from numpyro_dais.engine import dais, smc
from numpyro_dais.engine.resampling import check_config
from numpyro_dais.engine.smc import ResamplingConfig
from numpyro_dais.engine.transitions import Kernel, check_kernel


class Sampler(NamedTuple):
    """``kernel``: a :class:`~numpyro_dais.engine.transitions.Kernel` or its name
    (``"hmc"``, ``"langevin"``); ``resampling``: ``None`` for DAIS (never resample), or a
    :class:`~numpyro_dais.engine.smc.ResamplingConfig` for SMC."""

    kernel: "str | Kernel" = "hmc"
    resampling: ResamplingConfig | None = None


def check(sampler: Sampler):
    """Raise ``ValueError`` naming the argument for an invalid configuration."""
    check_kernel(sampler.kernel)
    if sampler.resampling is not None:
        check_config(sampler.resampling)


def run(
    sampler: Sampler,
    rng_key,
    q0,
    target: dais.Target,
    params: dais.AnnealParams,
    N: int,
    *,
    trace: bool = False,
) -> dais.SamplerOutput:
    """Run ``sampler`` for one system of ``N`` particles; ``trace=True`` also records the
    per-transition ESS and increments (always recorded by SMC)."""
    if sampler.resampling is None:
        return dais.run(
            rng_key, q0, target, params, N, kernel=sampler.kernel, track_increments=trace
        )
    return smc.run(
        rng_key,
        q0,
        target,
        params,
        N,
        kernel=sampler.kernel,
        resampling_config=sampler.resampling,
    )
