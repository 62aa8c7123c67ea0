"""``AutoDAIS``: differentiable annealed importance sampling with an N-particle bound.

References:
  Geffner & Domke (2021), "MCMC variational inference via uncorrected Hamiltonian annealing".
  Zhang et al. (2021), "Differentiable annealed importance sampling and the perils of
  gradient noise".
  Zenn & Bamler (ICML 2024), "Differentiable annealed importance sampling minimizes the
  symmetrized KL divergence between initial and target distribution" (DAIS₀).
"""

from numpyro_dais.annealed.guide import AnnealedGuide
from numpyro_dais.annealed.options import Annealing
from numpyro_dais.annealed.targets import FullData
from numpyro_dais.bridge.options import parse
from numpyro_dais.results import LogEvidence, SMCDiagnostics, TransportReport

__all__ = ["AutoDAIS", "LogEvidence", "SMCDiagnostics", "TransportReport"]


class AutoDAIS(AnnealedGuide):
    """Differentiable AIS guide over all latent sites (uncorrected Hamiltonian annealing).

    Each call draws ``N = num_particles`` particles ``z_0 ~ q0``, moves them through ``K``
    annealed transitions towards the posterior, and, under ``SVI(..., Trace_ELBO())``,
    makes the reported loss equal to minus the importance-weighted bound
    ``L_{N,K} = log (1/N) Σ_i w_i`` (value and gradient). Learnable: ``q0`` (loc and
    diagonal scale or Cholesky factor), the β schedule, ``K`` step sizes, the diagonal mass
    matrix and the damping ``γ`` of the partial momentum refresh.

    After training, ``q0`` itself is the recommended posterior (**DAIS₀**): it fits a
    symmetrised KL, and it has a density, mean, median and quantiles. ``sample_posterior``
    and ``Predictive`` both return ``q0`` draws unless ``posterior_method`` says otherwise.

    :param model: a NumPyro model with continuous global latent sites.
    :param int K: number of annealing transitions, ``K >= 1``.
    :param int num_particles: particles ``N >= 1`` inside the bound (``N = 1``: the
        DAIS ELBO, as numpyro's ``AutoDAIS``).
    :param str kernel: ``"hmc"`` (leapfrog + partial momentum refresh) or ``"langevin"``
        (overdamped, unadjusted).
    :param str base_dist: ``"diagonal"`` or ``"cholesky"`` covariance of ``q0`` in the
        whitened coordinates ``u`` (below); either is a full-rank Gaussian of ``z``.
    :param float eta_init: initial step size, in ``(0, eta_max)``; default ``eta_max / 10``.
    :param float eta_max: upper bound of the learnt step sizes (in ``u`` when whitened).
        Default: ``1 / sqrt(λ)`` for HMC and ``1 / λ`` for Langevin (half the stability
        limit of the integrator), with ``λ`` the largest eigenvalue of the potential's
        Hessian measured at set-up: in ``u``, 4 times its value at the mode (which is 1),
        room for the curvature away from the mode; without whitening, at the initial point,
        floored by ``q0``'s own curvature ``1 / init_scale²``. :attr:`curvature` holds ``λ``.
    :param float gamma_init: initial damping of the momentum refresh, in ``(0, 1)``.
    :param float init_scale: standard deviation of ``q0`` at the start when it is not
        whitened (``laplace_init=False``, ``D > 512``, or no usable mode at set-up).
    :param bool laplace_init: ``True`` (default): at set-up (``D ≤ 512``) find a mode ``m``
        by damped Newton ascent from ``init_loc_fn``'s point and run ``q0`` and the
        transitions in ``u = L⁻¹(z − m)``, ``L Lᵀ = Σ`` the Laplace covariance there
        (``L``: the sites' coordinates whitened by the symmetric root, smaller sites first,
        so that the result does not depend on the order of the model's sites), with ``q0``
        starting at ``N(0, I)`` in ``u`` (where the mode's Gaussian is far from the
        posterior's bulk, as in a hierarchy whose mode overfits its groups, refined first
        by Gaussian VI: :attr:`refinement`); the whitening is stored in ``params``
        (``{prefix}_preconditioner_loc``, ``_scale`` and ``_log_det``, never trained). A
        set-up that cannot be trusted (no finite Hessian, no mode) warns with the fix.
        ``False``: ``q0`` starts exactly at ``init_loc_fn`` with ``init_scale`` in ``z``
        and its location is a plain parameter (e.g. to hold a fixed ``q0``, as in the DSMCS
        paper's benchmarks).
    :param noncentre: ``"auto"`` (default): when the mode search at set-up runs into a
        funnel (a centred hierarchy, whose density grows without bound as a group scale
        goes to 0), run the hierarchy's ``Normal`` sites whose scale is a function of other
        latent sites non-centred, ``value = loc + scale · u`` (the model's
        ``LocScaleReparam(0)``, Gorinova et al. 2020, done inside the guide: the model,
        its site names and ``sample_posterior``'s draws stay as written), and set up
        again there. Their flat coordinates (``get_posterior``, ``transport_check``) then
        hold ``u``, labelled ``{site}_decentered``. ``True``: always; ``False``: never.
    :param str posterior_method: what ``sample_posterior`` and ``Predictive`` return by
        default: ``"q0"`` (DAIS₀), ``"dais"`` (end points ``z_K``) or ``"importance"``
        (end points resampled by weight within N-particle sets).
    :param bool report_divergences: warn (``RuntimeWarning``) from inside the jitted step
        when trajectories diverge. Diverged particles are always dropped from the bound and
        their non-finite gradients zeroed. The host is called only on a step where something
        diverged (once per step, also under ``Trace_ELBO(num_particles=B)``, whose draws
        are summed into one warning); a healthy step pays nothing for it (on CPU the call is
        an XLA FFI custom call, not a JAX host callback). The warning comes when the step
        runs (asynchronous dispatch): block on the result to capture it.
    :param bool self_check: the first time given ``params`` are used for ``q0`` draws
        (``sample_posterior`` with ``method="q0"``, ``median``, ``quantiles``), compare
        ``q0`` with 256 importance-resampled end points on the set-up data
        (``transport_check``) and with the draws of 256 Metropolis-adjusted Langevin chains
        started at ``q0`` draws on the posterior (``method="mala"``'s ensemble), and warn,
        with the fix, when either disagrees with ``q0`` (a ``q0`` too narrow for the
        posterior, which the end points, a few steps from ``q0``, can miss); the tolerances
        are ``transport_check``'s defaults. With ``num_particles=1`` it also judges the
        ``"importance"`` and ``"dais"`` draws (the end points) the first time given
        ``params`` are used for them, in place of their weights' ``k̂``.
    :param jax.sharding.Mesh mesh: split the training bound's ``N`` particles evenly over
        the mesh's devices (its size must divide ``num_particles``); XLA partitions the
        annealing, and loss and gradients equal the one-device run's for the same key. With
        resampling (AutoDSMCS) a system spans the devices, so each resampling step gathers
        its weights across them. ``sample_posterior`` and ``log_evidence`` take their own
        ``mesh``. Default ``None``: one device.
    :param float sym_kl_weight: weight ``w`` of the explicit symmetrised-KL term that only
        ``q0``'s location sees: it follows the gradient of ``L_{N,K} − (w/K)·[KL(q0‖p) +
        KL(p‖q0)]``, while ``q0``'s scale, the transitions and the reported loss see only
        the bound (the DAIS₀ regime). Default: 1 when ``posterior_method="q0"``, else 0
        (``q0`` on the bound alone: best bound, end points and evidence).
    """

    defaults = (Annealing(),)

    def __init__(self, model, **options):
        (annealing,) = parse(type(self), options)
        super().__init__(model, FullData(), annealing)
