"""The annealed guides' posterior queries, each a function of a bound call
(:class:`~numpyro_dais.annealed.sampling.Call`):

* :mod:`~numpyro_dais.annealed.posterior.queries` — importance draws through one compiled
  program, the checks of draws and evidence, and ``q0`` as a NumPyro distribution;
* :mod:`~numpyro_dais.annealed.posterior.selfcheck` — the self-check of ``q0``: its MALA
  chains (``mala_draws``' ensemble) and the verdict on them and on the end points;
* :mod:`~numpyro_dais.annealed.posterior.mala_draws` — ``sample_posterior(method="mala")``:
  rounds of an adapted ensemble of MALA chains from ``q0`` draws.
"""
