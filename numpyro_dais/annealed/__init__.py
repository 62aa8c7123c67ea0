"""The annealed guides: one NumPyro adapter over the annealing samplers, and its presets.

A preset picks a target and a sampler; everything else is the adapter's, so every option works
the same for every preset:

* presets — :mod:`~numpyro_dais.annealed.autodais` (``AutoDAIS``),
  :mod:`~numpyro_dais.annealed.autodsmcs` (``AutoDSMCS``) and
  :mod:`~numpyro_dais.annealed.autosldais` (the SL-DAIS and SL-DSMCS guides);
* :mod:`~numpyro_dais.annealed.options` — the option groups, one table of defaults;
* :mod:`~numpyro_dais.annealed.targets` — what the dynamics follow and the final weight uses,
  bound to one call (``Bound``);
* :mod:`~numpyro_dais.annealed.guide` — ``AnnealedGuide``: its options and public queries;
* :mod:`~numpyro_dais.annealed.binding` — its base: parameter sites, set-up, the training
  hooks, and the binding of each call into one ``Call``;
* :mod:`~numpyro_dais.annealed.sampling` — ``Fitted`` and ``Call``; the sampler run on a
  call's target, back in ``z``;

Each room below is a function of a bound ``Call`` (or of the set-up's ``Problem``), never of
the guide:

* :mod:`~numpyro_dais.annealed.setup` — once, at the first call: mode, whitening, step sizes;
* :mod:`~numpyro_dais.annealed.objective` — the bound, the DAIS₀ term, the divergence brake;
* :mod:`~numpyro_dais.annealed.posterior` — the posterior queries: importance draws through
  one compiled program, the draws' warnings, ``q0`` as a distribution (``queries``); the
  self-check's chains and verdict (``selfcheck``); MALA draws from ``q0`` (``mala_draws``).
"""

from numpyro_dais.annealed.autodais import AutoDAIS
from numpyro_dais.annealed.autodsmcs import AutoDSMCS
from numpyro_dais.annealed.autosldais import (
    AutoSurrogateLikelihoodDAIS,
    AutoSurrogateLikelihoodDSMCS,
)
from numpyro_dais.annealed.guide import AnnealedGuide
from numpyro_dais.annealed.options import Annealing, Resampling, SurrogateLikelihood
from numpyro_dais.annealed.targets import FullData, NaiveMiniBatch, Surrogate

__all__ = [
    "AnnealedGuide",
    "Annealing",
    "AutoDAIS",
    "AutoDSMCS",
    "AutoSurrogateLikelihoodDAIS",
    "AutoSurrogateLikelihoodDSMCS",
    "FullData",
    "NaiveMiniBatch",
    "Resampling",
    "Surrogate",
    "SurrogateLikelihood",
]
