"""Markov chains that leave the posterior exactly invariant, run from ``q0`` draws.

* :mod:`~numpyro_dais.engine.mcmc.mala` — the Metropolis-adjusted Langevin kernel and an
  ensemble of short chains adapted together (step size and per-coordinate scale), whose
  draws correct a Gaussian ``q0`` that is too narrow or misplaced.
"""

from numpyro_dais.engine.mcmc.mala import ChainState, EnsembleInfo, mala_step, run_chain, sample

__all__ = ["ChainState", "EnsembleInfo", "mala_step", "run_chain", "sample"]
