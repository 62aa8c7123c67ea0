"""Diagnostics of trained annealing guides: the learnt transition parameters, their plot,
and the SMC ESS trace.

``matplotlib`` is imported by the plotting functions only, on demand: it is not a
dependency of numpyro-dais.
"""

import numpy as np

from numpyro_dais.results import TransitionParams


def transition_params(guide, params) -> TransitionParams:
    """The learnt β schedule, step sizes, mass matrix and damping ``γ`` of ``guide``.

    :param guide: a set-up ``AutoDAIS``, ``AutoDSMCS``, ``AutoSurrogateLikelihoodDAIS`` or
        ``AutoSurrogateLikelihoodDSMCS`` (``SVI.init`` or ``SVI.run`` has run).
    :param dict params: trained parameters (``svi_result.params``).
    """
    if not callable(getattr(guide, "transition_params", None)):
        raise TypeError(
            f"{type(guide).__name__} has no annealing transitions; transition_params needs "
            "an AutoDAIS, AutoDSMCS, AutoSurrogateLikelihoodDAIS or "
            "AutoSurrogateLikelihoodDSMCS guide."
        )
    return guide.transition_params(params)


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
