"""Diagnostics of trained annealing guides: the learnt transition parameters, their plot,
and the SMC ESS trace.

``matplotlib`` is imported by the plotting functions only, on demand: it is not a
dependency of numpyro-dais.
"""

from typing import NamedTuple

import numpy as np


class TransitionParams(NamedTuple):
    """Result of :func:`transition_params`: the learnt annealing of an annealing guide, as
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


def transition_params(guide, params) -> TransitionParams:
    """The learnt β schedule, step sizes, mass matrix and damping ``γ`` of ``guide``.

    :param guide: a set-up ``AutoDAIS``, ``AutoDSMCS``, ``AutoSurrogateLikelihoodDAIS`` or
        ``AutoSurrogateLikelihoodDSMCS`` (``SVI.init`` or ``SVI.run`` has run).
    :param dict params: trained parameters (``svi_result.params``).
    """
    from numpyro_dais._annealed import AnnealedGuide

    if not isinstance(guide, AnnealedGuide):
        raise TypeError(
            f"{type(guide).__name__} has no annealing transitions; transition_params needs "
            "an AutoDAIS, AutoDSMCS, AutoSurrogateLikelihoodDAIS or "
            "AutoSurrogateLikelihoodDSMCS guide."
        )
    anneal = guide._params_from(params).anneal
    return TransitionParams(
        betas=np.asarray(anneal.betas),
        step_sizes=np.asarray(anneal.step_sizes),
        mass=np.asarray(anneal.mass),
        gamma=float(anneal.gamma),
        eta_max=float(guide._step_bounds[1]),
        kernel=guide.kernel,
        coordinates=guide._coordinate_names(),
    )


def _pyplot(name):
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            f"{name} needs matplotlib, which numpyro-dais does not depend on; install it "
            "with `pip install matplotlib`."
        ) from err
    return plt


def plot_transitions(params: TransitionParams, axes=None):
    """Plot :func:`transition_params`: β schedule, step sizes and mass matrix, side by side.

    :param params: a :class:`TransitionParams`.
    :param axes: three matplotlib axes, or ``None`` for a new ``1 × 3`` figure.
    :return: the three axes.
    """
    plt = _pyplot("plot_transitions")
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(12, 3.2), layout="constrained")
    ax_beta, ax_eta, ax_mass = axes
    K = params.step_sizes.shape[0]
    k = np.arange(K + 1)
    ax_beta.plot(k, params.betas, marker="o", label="learnt")
    ax_beta.plot(k, k / K, color="grey", linestyle=":", label="linear")
    ax_beta.set_xlabel("transition k")
    ax_beta.set_ylabel("β_k")
    ax_beta.legend(loc="best")
    ax_eta.plot(k[1:], params.step_sizes, marker="o")
    ax_eta.axhline(params.eta_max, color="grey", linestyle=":", label="eta_max")
    ax_eta.legend(loc="best")
    ax_eta.set_xlabel("transition k")
    ax_eta.set_ylabel("step size η_k")
    ax_eta.set_yscale("log")
    D = params.mass.shape[0]
    ax_mass.bar(np.arange(D), params.mass)
    ax_mass.axhline(1.0, color="grey", linestyle=":")
    ax_mass.set_xticks(np.arange(D), params.coordinates, rotation=90 if D > 8 else 0)
    ax_mass.set_ylabel("mass m_d")
    title = f"damping γ = {params.gamma:.3f}" if params.kernel == "hmc" else "Langevin (no mass)"
    ax_mass.set_title(title)
    return axes


def plot_ess(diagnostics, num_particles=None, ax=None):
    """ESS per transition ``k = 1..K`` of a guide's ``diagnostics``, resampling steps marked;
    one line per particle system.

    :param diagnostics: an ``SMCDiagnostics`` (``ess`` and ``resampled`` of shape ``(K,)``
        or ``(S, K)``).
    :param int num_particles: draws the line ``ESS = N`` when given.
    :return: the matplotlib axes.
    """
    plt = _pyplot("plot_ess")
    ess = np.atleast_2d(np.asarray(diagnostics.ess))
    flags = np.atleast_2d(np.asarray(diagnostics.resampled))
    if ax is None:
        _, ax = plt.subplots()
    k = np.arange(1, ess.shape[-1] + 1)
    alpha = 1.0 if ess.shape[0] == 1 else max(0.1, 1.0 / ess.shape[0] ** 0.5)
    for s in range(ess.shape[0]):
        ax.plot(k, ess[s], color="C0", alpha=alpha)
        ax.scatter(k[flags[s]], ess[s][flags[s]], color="C3", marker="v", s=12, alpha=alpha)
    if num_particles is not None:
        ax.axhline(num_particles, color="grey", linestyle=":", label=f"N = {num_particles}")
    ax.scatter([], [], color="C3", marker="v", s=12, label="resampled before k")
    ax.set_xlabel("transition k")
    ax.set_ylabel("ESS")
    ax.legend(loc="best")
    return ax
