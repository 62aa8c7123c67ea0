"""SL-DAIS and NS-DAIS guides: annealing trained on mini-batches, with or without resampling.

The ``K`` transitions follow a cheap surrogate log likelihood ``ψ̂(z)`` instead of the full
one; only the final term of the weight touches the data, through the model's own
mini-batch estimate. The cost of a step is ``O(K · N_s + B)`` likelihood terms instead of
``O(K · Nd)``. ``AutoSurrogateLikelihoodDSMCS`` adds DSMCS's resampling between the
transitions (a combination the papers do not study: same targets, SMC sampler).

References: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling" (SL-DAIS; NS-DAIS is their naive-subsampling baseline); Zenn & Bamler
(2023), "Resampling gradients vanish in differentiable sequential Monte Carlo samplers".
"""

from numpyro_dais.annealed.guide import AnnealedGuide
from numpyro_dais.annealed.options import Annealing, Resampling, SurrogateLikelihood
from numpyro_dais.annealed.targets import NaiveMiniBatch, Surrogate
from numpyro_dais.bridge.checks import check_choice, check_positive_int
from numpyro_dais.bridge.options import parse
from numpyro_dais.runtime.reporting import warn

__all__ = ["AutoSurrogateLikelihoodDAIS", "AutoSurrogateLikelihoodDSMCS"]

DYNAMICS = ("surrogate", "naive")


def surrogate_target(name, annealing, surrogate, smc=False):
    """The target of a preset's :class:`~numpyro_dais.annealed.options.SurrogateLikelihood`
    options (guide ``name``'s, which keeps them as attributes); for DAIS, warns about the
    bias of ``num_particles > 1`` with mini-batches (an SMC system has ``N > 1`` by design:
    its docstring states the bias instead)."""
    surrogate_model, num_surrogate, dynamics = surrogate
    check_choice("dynamics", dynamics, DYNAMICS)
    if num_surrogate is not None:
        num_surrogate = check_positive_int("num_surrogate", num_surrogate)
    if surrogate_model is not None and dynamics == "naive":
        raise ValueError(
            "`surrogate_model` is not used with dynamics='naive' (NS-DAIS); "
            "drop it or use dynamics='surrogate'."
        )
    if surrogate_model is not None and num_surrogate is not None:
        raise ValueError(
            "`num_surrogate` sizes the automatic (RAND) surrogate; with a "
            "`surrogate_model` drop `num_surrogate`."
        )
    num_particles = annealing.num_particles
    if num_particles > 1 and not smc:
        warn(
            f"{name} with num_particles={num_particles}: the mini-batch "
            "estimate of the log likelihood enters the log-mean-exp of the weights, so the "
            "bound is biased upwards when the plate subsamples (B < Nd) and may exceed "
            "log Z. Use num_particles=1 for an unbiased bound.",
            UserWarning,
        )
    if dynamics == "naive":
        return NaiveMiniBatch()
    return Surrogate(surrogate_model, num_surrogate)


class AutoSurrogateLikelihoodDAIS(AnnealedGuide):
    """DAIS for models whose likelihood sits in a subsampled ``numpyro.plate`` (SL-DAIS).

    The dynamics anneal from ``q0`` to ``log p(z) + ψ̂(z)``, a surrogate that never reads
    the data set; the final term of ``log w`` is the model's mini-batch estimate
    ``log p(z_K) + (Nd / B) Σ_{n∈I} log p(y_n | z_K)``. Under ``SVI(..., Trace_ELBO())``
    the loss is minus this bound (for ``num_particles = 1`` the model's own term of the
    ELBO supplies the final term, on the mini-batch the model draws).

    The surrogate ``ψ̂`` is either

    * ``surrogate_model``: a user model with the same latent sites as ``model``, called
      with no arguments (bind its data with ``functools.partial``); its ``numpyro.param``
      sites become parameters of the guide (numpyro's signature); or
    * built automatically (``surrogate_model=None``, RAND): ``num_surrogate`` points drawn
      once at set-up from the plate that the model subsamples, with learnable positive
      weights ``ω`` (``{prefix}_surrogate_weights``, init ``Nd / N_s`` each, summing to
      ``Nd``): ``ψ̂(z) = Σ_m ω_m log p(ỹ_m | z)``. The chosen rows are stored at set-up
      (for data the model picks with ``numpyro.subsample``), so after training
      ``sample_posterior`` needs no data: ``method="q0"`` (DAIS₀, the default) and
      ``method="dais"`` run on the stored rows. Arguments of the call that the model does
      not subsample (e.g. a prior scale) are read fresh on every call.

    ``dynamics="naive"`` gives **NS-DAIS**, the paper's baseline: the dynamics use the
    rescaled estimate ``(Nd / B) Σ_{n∈J} log p(y_n | z)`` on a mini-batch ``J`` drawn
    fresh from the current data on every run (so sampling it needs the data).

    The guide draws the model's mini-batch (it opens the subsample plates that the loss's
    model subsamples, with an ``O(B)`` sampler, and the ELBO replays their indices into
    the model), so a step's cost does not grow with ``Nd``. With ``num_particles = N > 1``
    it evaluates the mini-batch estimate at every particle inside ``log (1/N) Σ_i w_i``, on
    that mini-batch. A
    noisy term inside the concave logarithm of a mean makes that estimate biased *upwards*
    for ``B < Nd`` (it can exceed ``log Z``); ``N = 1`` is unbiased.

    ``log_evidence`` and ``method="importance"`` weight the particles by the exact
    full-data log joint, so they need the data.

    The other arguments are those of :class:`~numpyro_dais.AutoDAIS`.

    :param model: a NumPyro model with continuous global latent sites.
    :param surrogate_model: optional surrogate model (see above); ``None``: RAND.
    :param int num_surrogate: RAND surrogate size ``N_s`` (default ``min(256, Nd)``).
    :param str dynamics: ``"surrogate"`` (SL-DAIS) or ``"naive"`` (NS-DAIS).
    :param int num_particles: particles ``N`` in the bound; defaults to 1 (see above).
    """

    _refine_laplace = False  # its start density is the full data's

    defaults = (Annealing(noncentre=False), SurrogateLikelihood())

    def __init__(self, model, surrogate_model=None, **options):
        options["surrogate_model"] = surrogate_model
        annealing, surrogate = parse(type(self), options)
        self.surrogate_model, self.num_surrogate, self.dynamics = surrogate
        target = surrogate_target(type(self).__name__, annealing, surrogate)
        super().__init__(model, target, annealing)


class AutoSurrogateLikelihoodDSMCS(AnnealedGuide):
    """SL-DAIS with resampling: the surrogate (or naive mini-batch) dynamics of
    :class:`AutoSurrogateLikelihoodDAIS` inside the particle system of
    :class:`~numpyro_dais.AutoDSMCS`.

    The transitions, their weights and the resampling decisions all use the cheap
    surrogate ``log p(z) + ψ̂(z)``; the last increment ends on the model's mini-batch
    estimate, as SL-DAIS's final weight does. With ``resample_when="never"`` it is exactly
    :class:`AutoSurrogateLikelihoodDAIS` (same random numbers for the same key), and with
    the full data in the final term it is an SMC sampler whose dynamics follow a surrogate.
    Arguments as :class:`AutoSurrogateLikelihoodDAIS` plus the resampling options of
    :class:`~numpyro_dais.AutoDSMCS`, except that ``train_resample_when`` defaults to
    ``None`` (train through resampling with ``resample_when``'s rule: on a mini-batched
    logistic regression it gave a higher ``log_evidence`` than training without).
    ``posterior_method`` defaults to ``"importance"``, which (like ``log_evidence``) weights
    by the full-data log joint, so it needs the data.

    With ``B < Nd`` the mini-batch estimate of the final term sits inside the log-sum-exp of
    the last SMC increment, so the bound is biased upwards (it may exceed ``log Z``), as
    for :class:`AutoSurrogateLikelihoodDAIS` with ``num_particles > 1``; the bias shrinks
    as ``B`` grows.
    """

    _refine_laplace = False  # its start density is the full data's

    defaults = (
        Annealing(K=8, num_particles=16, noncentre=False, posterior_method="importance"),
        SurrogateLikelihood(),
        Resampling(train_resample_when=None),
    )

    def __init__(self, model, surrogate_model=None, **options):
        options["surrogate_model"] = surrogate_model
        annealing, surrogate, resampling = parse(type(self), options)
        self.surrogate_model, self.num_surrogate, self.dynamics = surrogate
        target = surrogate_target(type(self).__name__, annealing, surrogate, smc=True)
        super().__init__(model, target, annealing, resampling)
