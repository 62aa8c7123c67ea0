"""MCMC-augmented variational inference for NumPyro: DAIS, SL-DAIS, DSMCS and GPVI guides."""

from numpyro_dais._annealed import LogEvidence, SMCDiagnostics, TransportReport
from numpyro_dais.autodais import AutoDAIS
from numpyro_dais.autodsmcs import AutoDSMCS
from numpyro_dais.autogpvi import AutoGPVI
from numpyro_dais.autosldais import AutoSurrogateLikelihoodDAIS, AutoSurrogateLikelihoodDSMCS

__version__ = "0.1.0"

__all__ = [
    "AutoDAIS",
    "AutoDSMCS",
    "AutoGPVI",
    "AutoSurrogateLikelihoodDAIS",
    "AutoSurrogateLikelihoodDSMCS",
    "LogEvidence",
    "SMCDiagnostics",
    "TransportReport",
    "__version__",
]
