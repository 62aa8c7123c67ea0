"""Particle variational inference: the GPVI functional gradient and amortized SVGD.

* :mod:`~numpyro_dais.engine.vi.gpvi` — the descent directions and the training objective;
* :mod:`~numpyro_dais.engine.vi.kernels` — RBF kernels with the median bandwidth, and the KSD;
* :mod:`~numpyro_dais.engine.vi.networks` — the generator and helper MLPs as plain pytrees.
"""

from numpyro_dais.engine.vi.gpvi import (
    ALGORITHMS,
    JACOBIANS,
    Direction,
    Objective,
    amortized_svgd_direction,
    gpvi_direction,
)
from numpyro_dais.engine.vi.kernels import RBF, ksd_u_statistic, median_bandwidth
from numpyro_dais.engine.vi.networks import generator_apply, generator_init

__all__ = [
    "ALGORITHMS",
    "Direction",
    "JACOBIANS",
    "Objective",
    "RBF",
    "amortized_svgd_direction",
    "generator_apply",
    "generator_init",
    "gpvi_direction",
    "ksd_u_statistic",
    "median_bandwidth",
]
