"""``AutoGPVI``: generative particle VI as a NumPyro guide
(:mod:`~numpyro_dais.gpvi.autogpvi`), over the engine's :mod:`numpyro_dais.engine.vi`."""

from numpyro_dais.gpvi.autogpvi import AutoGPVI

__all__ = ["AutoGPVI"]
