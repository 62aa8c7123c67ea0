"""The set-up of an annealed guide: a mode and the curvature there, the whitened coordinates
of its Laplace approximation, and the Gaussian VI refinement of that start.

* :mod:`~numpyro_dais.engine.setup.curvature` — Hessian-vector products, ``λ_max``, damped Newton
  ascent to a mode;
* :mod:`~numpyro_dais.engine.setup.preconditioning` — the whitening ``z = m + L u`` and targets in
  ``u``;
* :mod:`~numpyro_dais.engine.setup.refinement` — Gaussian VI in the whitened coordinates, by L-BFGS.
"""

from numpyro_dais.engine.setup.curvature import Mode, find_mode, max_eigenvalue, neg_hessian
from numpyro_dais.engine.setup.preconditioning import (
    Affine,
    laplace,
    pull_back,
    push,
    whiten,
    whitened_curvature,
)
from numpyro_dais.engine.setup.refinement import Refinement, refine

__all__ = [
    "Affine",
    "Mode",
    "Refinement",
    "find_mode",
    "laplace",
    "max_eigenvalue",
    "neg_hessian",
    "pull_back",
    "push",
    "refine",
    "whiten",
    "whitened_curvature",
]
