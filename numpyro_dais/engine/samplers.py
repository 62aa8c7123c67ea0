"""A sampler says how particles move and are weighted: DAIS, or SMC (DAIS plus resampling).

:class:`Sampler` is a plain configuration; :func:`run` runs it on any
:class:`~numpyro_dais.engine.base.Target`, so targets and samplers compose freely. Both
samplers return a :class:`~numpyro_dais.engine.base.SamplerOutput`.
"""

from typing import NamedTuple

from numpyro_dais.engine.annealing import dais
from numpyro_dais.engine.annealing.transitions import Kernel, as_kernel
from numpyro_dais.engine.base import ResamplingConfig
from numpyro_dais.engine.smc import resampling, smc


class Sampler(NamedTuple):
    """``kernel``: a :class:`~numpyro_dais.engine.base.Kernel` or its name
    (``"hmc"``, ``"langevin"``); ``resampling``: ``None`` for DAIS (never resample), or a
    :class:`~numpyro_dais.engine.base.ResamplingConfig` for SMC."""

    kernel: "str | Kernel" = "hmc"
    resampling: ResamplingConfig | None = None


def resolve(sampler: Sampler) -> Sampler:
    """``sampler`` with its names resolved to functions (the kernel, the resampling scheme
    and rule), once, where a configuration is built; a ``ValueError`` names the argument of
    an invalid configuration."""
    config = None if sampler.resampling is None else resampling.resolve(sampler.resampling)
    return Sampler(as_kernel(sampler.kernel), config)


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
