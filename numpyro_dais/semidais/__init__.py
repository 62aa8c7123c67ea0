"""``AutoSemiDAIS``: a global guide, and one DAIS chain per member of a local plate.

* :mod:`~numpyro_dais.semidais.autosemidais` — the guide: its training call;
* :mod:`~numpyro_dais.semidais.sites` — the local sites, the members' terms and curvature;
* :mod:`~numpyro_dais.semidais.laplace` — the members' Laplace bases and the nested Laplace
  fit of the globals;
* :mod:`~numpyro_dais.semidais.cv` — the control variate of the mini-batch sum;
* :mod:`~numpyro_dais.semidais.setup` — the set-up: checks, layout, initial step sizes;
* :mod:`~numpyro_dais.semidais.queries` — draws for a set of members, and ``log p(x)``.
"""

from numpyro_dais.semidais.autosemidais import AutoSemiDAIS

__all__ = ["AutoSemiDAIS"]
