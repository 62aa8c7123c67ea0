"""The public result types of the guides' queries, as NamedTuples of arrays."""

from typing import NamedTuple

import jax
import numpy as np


class LogEvidence(NamedTuple):
    """Result of ``log_evidence``: an AIS (or SMC) estimate of ``log Z``, its ESS and its
    standard error."""

    log_Z: jax.Array
    """``()`` estimate of ``log Z = log p(x)`` (log-mean-exp of the weights)."""
    ess: jax.Array
    """``()`` effective sample size of those weights, in ``[1, num_particles]``."""
    se: jax.Array
    """``()`` standard error of ``log_Z`` (delta method on the weights, through the
    genealogy for SMC: :func:`numpyro_dais.engine.annealing.weights.log_mean_exp_se`); too small
    when ``ess`` is small."""
    pareto_k: jax.Array
    """``()`` Pareto ``k̂`` of the weights (:func:`numpyro_dais.engine.diagnostics.psis.pareto_k`;
    for SMC the largest over the independent systems): below 0.5 the estimate converges at
    the usual rate; above ``min(1 − 1/log10 S, 0.7)`` it is unreliable, however small ``se``
    looks, and ``log_evidence`` warns. ``inf`` with 20 particles or fewer (no tail to fit)."""


class TransportReport(NamedTuple):
    """Result of ``transport_check``: ``q0`` against the annealed end points."""

    ok: bool
    """``True`` when every coordinate is within both tolerances."""
    mean_shift: dict
    """``{site: array}`` ``(mean_q0 − mean_end) / std_end``, in the unconstrained space."""
    std_ratio: dict
    """``{site: array}`` ``std_q0 / std_end``, in the unconstrained space."""
    worst: str
    """The coordinate (e.g. ``"w[0]"``) with the largest standardised mean shift."""
    message: str
    """A one-paragraph verdict, with the fix when ``ok`` is ``False``."""
    chain_std_ratio: dict | None = None
    """``{site: array}`` the std of the draws of Metropolis-adjusted Langevin chains started
    at ``q0`` draws over ``q0``'s, per latent value (above 1: the posterior is
    wider than ``q0``); ``None`` where the guide's dynamics do not run on the full-data
    posterior."""
    chain_mean_shift: dict | None = None
    """``{site: array}`` ``(mean_q0 − mean_chains) / std_chains`` of those chains' draws,
    per latent value; ``None`` where they did not run."""
    importance_ok: bool | None = None
    """Whether those chains also pass the ``"importance"`` draws of one particle per system
    (the end points): ``False`` when ``q0`` fails them and the end points stay near it or
    share its spread; ``None`` where the chains did not judge (not run, or they hardly
    moved). :meth:`sample_posterior` judges those draws by it rather than by ``k̂``."""


class SMCDiagnostics(NamedTuple):
    """Result of ``diagnostics``, per particle system."""

    ess: jax.Array
    """``(..., K)`` ESS of the weights after transition ``k``, in ``[1, N]``."""
    resampled: jax.Array
    """``(..., K)`` bool: resampled just before transition ``k`` (never for DAIS)."""
    log_Z: jax.Array
    """``(...,)`` the bound's value ``L = log Ẑ`` of each particle system."""
    pareto_k: jax.Array
    """``(..., K)`` Pareto ``k̂`` of the incremental weights ``w̃_k`` of transition ``k``
    over the system's ``N`` particles (:func:`numpyro_dais.engine.diagnostics.psis.pareto_k`): where
    it exceeds 0.7 the transition's target is poorly covered by the particles it starts from (a
    larger ``K`` spreads the annealing). ``inf`` for ``N ≤ 20``: too few to fit a tail."""


class TransitionParams(NamedTuple):
    """Result of ``transition_params``: the learnt annealing of an annealing guide, as
    NumPy arrays (``K`` transitions, ``D`` unconstrained coordinates)."""

    betas: np.ndarray
    """``(K + 1,)`` the schedule ``0 = β_0 < … < β_K = 1`` of
    ``log γ_k = (1 − β_k) log q0 + β_k ℓ``."""
    step_sizes: np.ndarray
    """``(K,)`` the leapfrog (or Langevin) step size ``η_k`` of each transition, in
    ``(0, eta_max)``."""
    mass: np.ndarray
    """``(D,)`` the diagonal mass matrix as the sampler uses it (geometric mean 1; ones for
    Langevin)."""
    gamma: float
    """The momentum damping ``γ`` of the partial refresh ``v ← γ v + sqrt(1 − γ²) ξ`` (0 for
    Langevin, which has no momentum)."""
    eta_max: float
    """The cap of the step sizes, fixed at set-up."""
    kernel: str
    """``"hmc"`` or ``"langevin"``."""
    coordinates: list
    """``D`` labels of the unconstrained coordinates, e.g. ``["b", "w[0]", "w[1]"]``."""


class ConvergedRun(NamedTuple):
    """Result of :func:`~numpyro_dais.run_until_converged`; its first three fields are those
    of ``svi.run``'s ``SVIRunResult``."""

    params: dict
    """The constrained parameters: the average of the iterates of the last ``patience``
    windows where the run converged, else the last iterate's."""
    state: object
    """The optimiser's last ``SVIState``, to continue from (``init_state``)."""
    losses: jax.Array
    """``(num_steps,)`` the loss of every step taken."""
    num_steps: int
    """Steps taken: a whole number of windows."""
    converged: bool
    """Whether the loss stopped improving before ``max_steps``."""
    check: TransportReport | None
    """The ``q0`` self-check of an annealed guide on ``params`` (``None`` for other
    guides, or where it is off)."""
