"""MCMC-augmented variational inference for NumPyro: DAIS, SL-DAIS, DSMCS and GPVI guides."""

from numpyro_dais.autodais import AutoDAIS, LogEvidence, TransportReport
from numpyro_dais.autodsmcs import AutoDSMCS, SMCDiagnostics
from numpyro_dais.autogpvi import AutoGPVI
from numpyro_dais.autosldais import AutoSurrogateLikelihoodDAIS

__version__ = "0.1.0"

__all__ = [
    "AutoDAIS",
    "AutoDSMCS",
    "AutoGPVI",
    "AutoSurrogateLikelihoodDAIS",
    "LogEvidence",
    "SMCDiagnostics",
    "TransportReport",
    "__version__",
]
