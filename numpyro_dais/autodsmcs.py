"""``AutoDSMCS``: a differentiable SMC sampler guide (DAIS transitions plus resampling).

Reference: Zenn & Bamler (2023), "Resampling gradients vanish in differentiable sequential
Monte Carlo samplers" (ICLR Tiny Papers); algorithms.md §4.
"""

from typing import NamedTuple

import jax
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais._autoguide import check_positive_int
from numpyro_dais.autodais import AutoDAIS
from numpyro_dais.engine import smc
from numpyro_dais.engine.resampling import check_options


class SMCDiagnostics(NamedTuple):
    """Result of :meth:`AutoDSMCS.diagnostics`, per particle system."""

    ess: jax.Array
    """``(..., K)`` ESS of the weights after transition ``k``, in ``[1, N]``."""
    resampled: jax.Array
    """``(..., K)`` bool: resampled just before transition ``k``."""
    log_Z: jax.Array
    """``(...,)`` the bound's value ``L = log Ẑ`` of each particle system."""


class AutoDSMCS(AutoDAIS):
    """Differentiable SMC sampler guide: ``AutoDAIS`` with resampling between transitions.

    Each call runs one system of ``N = num_particles`` particles from ``q0`` through ``K``
    annealed HMC or Langevin transitions and, before transitions ``k ≥ 2``, resamples them
    when ``resample_when`` says so. Under ``SVI(..., Trace_ELBO())`` the loss is minus the
    SMC bound ``L = Σ_k log Σ_i W̄_i w̃_k,i`` (``E[L] ≤ log Z``), value and gradient; with
    ``resample_when="never"`` it is AutoDAIS's ``L_{N,K}``: same random numbers for the same
    key, equal up to float32 rounding.
    Resampling gradients are stopped by default: they vanish when the ESS is maximal
    (Zenn & Bamler 2023) and do not help in practice.

    Posterior draws (``sample_posterior`` and ``Predictive`` alike) default to
    ``posterior_method="importance"``: each draw runs one particle system and picks a final
    particle by its final weight (SIR from the final weighted set). ``"dais"`` returns the
    final particles of one system of ``num_draws`` particles unweighted, and ``"q0"`` the
    trained base distribution (cheap, needs no data, but not the recommended posterior here).

    All AutoDAIS arguments apply (``K``, ``kernel``, ``base_dist``, ``eta_init``,
    ``eta_max``, ``gamma_init``, ``init_scale``, ...), plus:

    :param str resampling: ancestor scheme, ``"multinomial"`` (default, the paper's
        categorical resampling), ``"systematic"`` or ``"stratified"``.
    :param str resample_when: ``"bernoulli"`` (default; resample with probability
        ``1 − (ESS − 1)/(N − 1)``, the paper's Bern-Cat), ``"ess"`` (ESS below
        ``ess_threshold · N``), ``"always"`` or ``"never"`` (plain DAIS).
    :param float ess_threshold: ``τ ∈ (0, 1]`` of the ``"ess"`` rule.
    :param str resampling_gradient: ``"stop"`` (default) or ``"gst"``, the gapped
        straight-through estimator of Fan et al. (2022), an ablation.
    :param float gst_temperature: softmax temperature of ``"gst"`` (paper: 0.1 or 1).
    :param float gst_gap: the gap ``κ`` by which the drawn logit is lifted in ``"gst"``.
    """

    def __init__(
        self,
        model,
        *,
        K=8,
        num_particles=16,
        kernel="hmc",
        resampling="multinomial",
        resample_when="bernoulli",
        ess_threshold=0.5,
        resampling_gradient="stop",
        gst_temperature=0.1,
        gst_gap=1.0,
        base_dist="diagonal",
        eta_init=None,
        eta_max=None,
        gamma_init=0.9,
        prefix="auto",
        init_loc_fn=init_to_uniform,
        init_scale=0.1,
        posterior_method="importance",
        sym_kl_weight=None,
        report_divergences=True,
        forward_mode_differentiation=False,
    ):
        check_positive_int("num_particles", num_particles)
        check_options(
            resampling, resample_when, ess_threshold, resampling_gradient, gst_temperature, gst_gap
        )
        self.resampling = resampling
        self.resample_when = resample_when
        self.ess_threshold = ess_threshold
        self.resampling_gradient = resampling_gradient
        self.gst_temperature = gst_temperature
        self.gst_gap = gst_gap
        super().__init__(
            model,
            K=K,
            num_particles=num_particles,
            kernel=kernel,
            base_dist=base_dist,
            eta_init=eta_init,
            eta_max=eta_max,
            gamma_init=gamma_init,
            prefix=prefix,
            init_loc_fn=init_loc_fn,
            init_scale=init_scale,
            posterior_method=posterior_method,
            sym_kl_weight=sym_kl_weight,
            report_divergences=report_divergences,
            forward_mode_differentiation=forward_mode_differentiation,
        )

    # -- the engine (AutoDAIS hooks) ----------------------------------------------------------

    def _run(
        self,
        rng_key,
        q0,
        anneal,
        model_params,
        args,
        kwargs,
        num_particles,
        model_supplies_final=False,
    ):
        """One SMC system. The last increment needs ``ℓ(z_K)``, so ``model_supplies_final``
        is ignored: ``ℓ(z_K)`` is always part of ``L``."""
        potential = self._potential(q0, args, kwargs, model_params)
        return smc.run(
            rng_key,
            q0,
            potential,
            anneal,
            num_particles,
            kernel=self.kernel,
            resampling_scheme=self.resampling,
            resample_when=self.resample_when,
            ess_threshold=self.ess_threshold,
            resampling_gradient=self.resampling_gradient,
            gst_temperature=self.gst_temperature,
            gst_gap=self.gst_gap,
        )

    def _log_marginal(self, out):
        """The SMC bound ``L`` accumulated over the transitions."""
        return out.log_Z

    # -- diagnostics ----------------------------------------------------------------------------

    def diagnostics(self, rng_key, params, *args, num_systems=None, **kwargs) -> SMCDiagnostics:
        """ESS per transition, resampling flags and ``log Ẑ`` of fresh particle systems.

        :param params: trained parameters (``svi_result.params``).
        :param num_systems: ``None`` for one system (shapes ``(K,)``, ``(K,)``, ``()``), or
            an int ``S`` for ``S`` independent systems (a leading ``(S,)`` axis).
        """
        q0, anneal = self._guide_params_from(params)
        model_params = self._model_params_from(params)

        def one(key):
            out = self._run(key, q0, anneal, model_params, args, kwargs, self.num_particles)
            return SMCDiagnostics(out.ess, out.resampled, out.log_Z)

        if num_systems is None:
            return one(rng_key)
        check_positive_int("num_systems", num_systems)
        return jax.vmap(one)(jax.random.split(rng_key, num_systems))

    def plot_ess(self, diagnostics: SMCDiagnostics, ax=None):
        """Plot the ESS trace of :meth:`diagnostics` (needs matplotlib); returns the axes."""
        return plot_ess(diagnostics, self.num_particles, ax=ax)


def plot_ess(diagnostics: SMCDiagnostics, num_particles=None, ax=None):
    """ESS per transition ``k = 1..K``, resampling steps marked; one line per system.

    ``matplotlib`` is imported here, on demand: it is not a dependency of numpyro-dais.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "plot_ess needs matplotlib, which numpyro-dais does not depend on; "
            "install it with `pip install matplotlib`."
        ) from err
    import numpy as np

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
