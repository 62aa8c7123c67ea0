"""MCMC-augmented variational inference for NumPyro: DAIS, SL-DAIS, DSMCS and GPVI guides."""

from numpyro_dais.annealed import (
    AutoDAIS,
    AutoDSMCS,
    AutoSurrogateLikelihoodDAIS,
    AutoSurrogateLikelihoodDSMCS,
)
from numpyro_dais.arviz import to_inference_data
from numpyro_dais.chains import run_chains
from numpyro_dais.convergence import run_until_converged
from numpyro_dais.diagnostics import plot_ess, plot_transitions, transition_params
from numpyro_dais.gpvi import AutoGPVI
from numpyro_dais.results import (
    ConvergedRun,
    LogEvidence,
    SMCDiagnostics,
    TransitionParams,
    TransportReport,
)
from numpyro_dais.semidais import AutoSemiDAIS

__version__ = "0.1.0"

__all__ = [
    "AutoDAIS",
    "AutoDSMCS",
    "AutoGPVI",
    "AutoSemiDAIS",
    "AutoSurrogateLikelihoodDAIS",
    "AutoSurrogateLikelihoodDSMCS",
    "ConvergedRun",
    "LogEvidence",
    "SMCDiagnostics",
    "TransitionParams",
    "TransportReport",
    "__version__",
    "plot_ess",
    "plot_transitions",
    "run_chains",
    "run_until_converged",
    "to_inference_data",
    "transition_params",
]
