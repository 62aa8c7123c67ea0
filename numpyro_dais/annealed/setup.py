"""The annealed guides' set-up: a mode, its Laplace whitening, and the step-size cap.

Runs once, on the first call, with that call's data: one compiled program finds a mode of
the posterior by damped Newton ascent from the initial point
(:func:`~numpyro_dais.engine.setup.curvature.find_mode`) and the potential's Hessian there; on
the host the Laplace covariance at that mode gives the affine map ``z = m + L u``
(:func:`~numpyro_dais.engine.setup.preconditioning.laplace`) in whose coordinates ``q0`` and the
transitions run, and the curvature in those coordinates gives the step-size cap. Every path
that does not reach a trustworthy start is loud: the warning names the reason and the fix.

For the mini-batch guides the search's Hessians are the surrogate's (cheap), while the
whitening takes the full data's Hessian at the search's end point (one Hessian-vector
product on all the rows per coordinate) and is centred one full-data Newton step further
(:func:`_newton_finish`); the full-data log joint's value and gradient at the end point
also serve the control variate of the final term
(:meth:`~numpyro_dais.annealed.targets.Surrogate.correction`).
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from numpyro_dais.annealed import options
from numpyro_dais.engine.setup import curvature, preconditioning, refinement
from numpyro_dais.runtime import compilation
from numpyro_dais.runtime.reporting import warn
from numpyro_dais.runtime.vectorise import jit_by_leaves

#: Loop bodies a set-up program runs, for its compilation level
#: (:func:`numpyro_dais.runtime.compilation.run_for`): the mode search's Newton iterations times its
#: Hessian's columns (its body ran about 340 times on a logistic GLMM, D = 71, 2,000 rows);
#: the model's gradients, so counted at
#: 1 / :data:`~numpyro_dais.runtime.compilation.GRADIENT_WORK_DISCOUNT`.
SET_UP_RUNS = 300 / compilation.GRADIENT_WORK_DISCOUNT

#: Largest latent dimension ``D`` for which the set-up forms the ``D × D`` Hessian (one
#: Hessian-vector product per column and Newton iteration) and whitens by its Laplace
#: covariance; above it ``q0`` starts at the initial point with ``init_scale``.
MAX_DENSE_DIM = 512

#: ``λ · init_scale²`` above which a guide without a Laplace start warns: the posterior's
#: narrowest direction is more than ~30 times narrower than ``q0`` at the start.
STIFFNESS_WARN = 1e3

#: Factor on the curvature measured at the mode in the whitened coordinates (1 there, by
#: construction) for the step-size cap: room for the posterior's curvature away from the mode
#: (a hierarchy's funnel, heavy tails), which the set-up does not measure. 4 halves the cap:
#: with the full cap the learnt steps of a hierarchy (non-centred eight schools, float32)
#: drifted into divergence of every particle; with half of it and less they did not.
BULK_MARGIN = 4.0

#: Newton decrement (nats) above which the mode search counts as failed: the start is more
#: than ~2 posterior standard deviations (in the Hessian's metric) from a mode.
DECREMENT_WARN = 2.0


class SetUp(NamedTuple):
    """What the set-up fixes for the rest of a guide's life."""

    affine: preconditioning.Affine | None
    """``z = loc + scale u``: the Laplace whitening (float64, host), or ``None``
    (``q0`` and the transitions run in ``z``)."""
    step_bounds: tuple
    """``(eta_init, eta_max)`` in use."""
    curvature: float | None
    """``λ`` behind the default ``eta_max`` (in ``u`` when whitened: :data:`BULK_MARGIN`
    times the curvature at the mode), ``None`` if given."""
    refined: refinement.Refinement | None = None
    """The Gaussian VI refinement of the Laplace start (host arrays; :func:`_moved` says
    whether it replaced the Laplace start), ``None`` when not run."""
    linear: tuple | None = None
    """``(ẑ, ℓ(ẑ), ∇ℓ(ẑ))``: the start density's value and gradient at the mode search's
    end point (host arrays), for a mini-batch target's control variate; ``None`` where not
    asked for (``Problem.linearise``) or there is no Laplace start."""


def _concrete(x):
    """``x`` as a NumPy array, ``None`` when the set-up is being traced (under ``jit``)."""
    try:
        return np.asarray(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


class Problem(NamedTuple):
    """What the set-up measures, from the guide: its ``name``, the initial point ``init``,
    ``bind`` (``(args, kwargs, params) -> targets.Bound``), the first call's data and model
    parameters, ``site_sizes`` (``(D,)``: the whitening's blocks) and the options (``linearise``:
    keep the start's linearisation for a control variate; ``own_start``: the search runs on
    another density than the start's; ``refine``: by Gaussian VI; the kernel's ``momentum``)."""

    name: str
    init: object
    bind: Callable
    args: tuple
    kwargs: dict
    params: dict
    site_sizes: np.ndarray
    laplace_init: bool
    init_scale: float
    linearise: bool
    own_start: bool
    refine: bool
    eta_init: float | None
    eta_max: float | None
    momentum: bool


class Measured(NamedTuple):
    """:func:`measure`'s result (host arrays; ``None`` where not measured). ``funnel``:
    ``(rise, predicted)`` at a degenerate mode (:func:`_funnel_rise`): non-centre, measure again."""

    lam: object
    mode: object
    linear: tuple | None
    affine: preconditioning.Affine | None
    funnel: tuple | None


def on_dynamics(problem: Problem, fn, key, *operands, runs=SET_UP_RUNS):
    """``fn(dynamics, start, *operands)`` on the problem's data (``start``: the full-data log
    joint whose mode ``q0`` starts at, for the mini-batch guides too), as one program (the
    set-up runs eagerly, where each operation of the model would be compiled on its own)
    compiled for ``runs`` loop bodies (:func:`numpyro_dais.runtime.compilation.run_for`)."""

    def call(args, kwargs, params, operands):
        bound = problem.bind(args, kwargs, params)
        return fn(bound.dynamics(key), bound.start(key), *operands)

    return jit_by_leaves(call).run_for(runs, *problem[3:6], operands)


def measure(problem: Problem) -> Measured:
    """Measure the posterior at the initial point: the curvature, and with a Laplace start
    the mode search, its Hessian and the whitening there."""
    init = problem.init
    laplace = problem.laplace_init and init.shape[0] <= MAX_DENSE_DIM
    own = laplace and problem.own_start  # the Hessian of the start density
    key = jax.random.key(0)  # a fixed start: the set-up is deterministic

    def measure(dynamics, start, init, forward):
        # λ_max at the initial point (the step-size cap when q0 is not whitened): read off the
        # Hessian that the mode search forms there, else by power iteration
        if laplace:
            mode = curvature.find_mode(start, init, curvature_density=dynamics, forward=forward)
            # the whitening: the start density's Hessian at its mode where the search ran on
            # another's (a mini-batch target's surrogate, whose N_s rows misplace it), with
            # its value and gradient there (the last Newton step; the control variate)
            linear = jax.value_and_grad(start)(mode.z) if own else None
            whitening = curvature.neg_hessian(start, mode.z, forward=forward) if own else None
            return mode.start_curvature, mode, linear, whitening
        return curvature.max_eigenvalue(key, dynamics, init, forward=forward), None, None, None

    measured = curvature.forward_or_reverse(lambda f: on_dynamics(problem, measure, key, init, f))
    lam, mode, linear, whitening = jax.tree.map(_concrete, measured)
    affine = funnel = None
    if mode is not None and mode.z is not None:  # None: set up under jit, nothing to read
        centre = mode.z
        if whitening is None:
            whitening = mode.neg_hessian
        else:
            centre = _newton_finish(mode.z, whitening, linear[1])
        affine = preconditioning.laplace(centre, whitening, problem.site_sizes)
        funnel = _funnel_rise(affine, mode, np.asarray(init))
    return Measured(lam, mode, linear, affine, funnel)


def finish(problem: Problem, measured: Measured) -> SetUp:
    """Fix the start from a :func:`measure`-ment: the Laplace whitening (refined, or none,
    each with its warning) and the step-size bounds."""
    name, init = problem.name, problem.init
    dim, (lam, mode, linear, affine, funnel) = init.shape[0], measured
    laplace = problem.laplace_init and dim <= MAX_DENSE_DIM
    if mode is not None and mode.z is not None:
        affine = _laplace_affine(name, mode, affine, funnel)
    refined = None
    if affine is not None and problem.refine:
        affine, refined = _refine(problem, affine, init.dtype)
    if affine is not None:
        # refined: the curvature is 1 in u by construction (the Gaussian VI fit's own), where
        # the mode's (far from the bulk) would cap the step sizes tens of times too low
        at_mode = preconditioning.whitened_curvature(affine, mode.neg_hessian)
        lam = BULK_MARGIN * (1.0 if _moved(refined) else at_mode)
        floor = BULK_MARGIN  # q0's own curvature in u, N(0, I) at the start, with the margin
    else:
        floor = 1.0 / problem.init_scale**2
        _warn_if_stiff(name, lam, problem.init_scale, dim, problem.laplace_init and laplace)
    linearise = laplace and problem.linearise
    if affine is None or not linearise or linear is None or linear[0] is None:
        linear = None
    else:
        linear = (mode.z, *linear)
    bounds = options.step_bounds(problem.eta_init, problem.eta_max, lam, floor, problem.momentum)
    return SetUp(affine, *bounds, refined, linear)


#: Fixed draws of the refinement's sample-average ELBO (antithetic pairs): enough for a
#: mean-field Gaussian's ELBO (Giordano et al. 2024 use 30) at a set-up cost of that many
#: gradients per evaluation of the fit.
REFINE_DRAWS = 32
#: Loop bodies the refinement's fit runs, for its program's compilation level
#: (:func:`numpyro_dais.runtime.compilation.run_for`): about 100 evaluations of the ELBO's
#: gradient by L-BFGS, over the 3 bodies of the program that evaluate it (XLA counts each
#: once: the starts' and the line search's two); the model's gradients, so counted at
#: 1 / :data:`~numpyro_dais.runtime.compilation.GRADIENT_WORK_DISCOUNT`. A short run: a
#: cheaper compilation pays for itself where the set-up's count, made for the mode search's
#: hundreds of Hessian columns, would optimise the code.
REFINE_RUNS = 100 / 3 / compilation.GRADIENT_WORK_DISCOUNT


def _moved(refined) -> bool:
    """Whether a :class:`~numpyro_dais.engine.setup.refinement.Refinement` replaced the Laplace
    start: the fit took steps, or started from a shrunken copy of it."""
    return refined is not None and (int(refined.num_iters) > 0 or float(refined.start_scale) != 1)


def _refine(problem: Problem, affine, dtype):
    """``(affine, Refinement)``: the Laplace whitening ``affine`` refined by Gaussian VI in its
    coordinates (:func:`~numpyro_dais.engine.setup.refinement.refine`) when its residual says the
    posterior's bulk is not the mode's Gaussian: ``z = m + L (μ + e^ρ u)``; ``affine``
    unchanged otherwise.

    Only the centre and the scales move: a second Laplace whitening at the refined centre
    (the bulk's correlations) gave the GLMM's sds exactly but let q0 drift into eight
    schools' funnel neck in training."""
    key = jax.random.key(0)
    loc, scale = (np.asarray(x, dtype) for x in affine[:2])
    eps = refinement.antithetic_draws(REFINE_DRAWS, loc.shape[0], dtype)

    def run(dynamics, start, loc, scale, eps, fit):
        with jax.default_matmul_precision("highest"):
            log_density = lambda u: start(loc + scale @ u)  # noqa: E731
            if fit:
                return refinement.refine(log_density, eps)
            return refinement.residual(log_density, eps)

    def on_start(fit):
        operands = loc, scale, eps, fit
        runs = {"runs": REFINE_RUNS} if fit else {}
        return on_dynamics(problem, run, key, *operands, **runs)

    # the trigger alone first: the fit's program is compiled only for the posteriors it fits
    residual = float(on_start(False))
    if not residual > refinement.THRESHOLD:
        zeros = np.zeros_like(loc)
        kept = refinement.Refinement(zeros, zeros, np.asarray(residual), 0, 0.0, 1.0, 0, False)
        return affine, kept
    refined = jax.tree.map(np.asarray, on_start(True))
    if not _moved(refined):
        return affine, refined
    scale = np.exp(refined.log_scale.astype(np.float64))
    return preconditioning.rescale(affine, refined.loc, scale), refined


#: ``rise / (½ d²)`` below which the end point of the mode search is taken for a degenerate
#: mode: ``rise`` the log density gained from the start, ``d`` the start's distance from the
#: end point in the end point's Laplace metric. A Gaussian gains ``½ d²``, a logistic
#: likelihood (linear tails) ~0.1 of it; a funnel whose density grows without bound into its
#: neck (a centred hierarchy) gains 10⁻¹⁰ of it, its curvature there exploding.
DEGENERATE_RATIO = 1e-4


#: The longest last Newton step (:func:`_newton_finish`) that the set-up takes, in the
#: posterior sds of the Laplace approximation at the mode search's end point.
NEWTON_FINISH_LIMIT = 3.0


def _newton_finish(z, neg_hess, grad):
    """The mode search's end point ``z`` moved by one Newton step of the start density, on
    its Hessian ``neg_hess`` and gradient ``grad`` at ``z`` (host arrays): where the search's
    Hessians are a surrogate's, its steps converge only linearly and it stops a fraction of
    a posterior sd short of the full data's mode. ``z`` itself where the Hessian is not
    positive definite, the step not finite or longer than :data:`NEWTON_FINISH_LIMIT`."""
    h, g = np.asarray(neg_hess, np.float64), np.asarray(grad, np.float64)
    try:
        chol = np.linalg.cholesky((h + h.T) / 2)
    except np.linalg.LinAlgError:
        return z
    half = np.linalg.solve(chol, g)  # the step's length in sds: |L⁻¹ g|, H = L Lᵀ
    step = np.linalg.solve(chol.T, half)
    if not np.all(np.isfinite(step)) or float(half @ half) > NEWTON_FINISH_LIMIT**2:
        return z
    return (np.asarray(z, np.float64) + step).astype(np.asarray(z).dtype)


def _funnel_rise(affine, mode, init):
    """``(rise, predicted)`` when the mode search's end point is a degenerate mode (the
    density grows without bound there: a centred hierarchy's funnel), else ``None``."""
    if affine is None:
        return None
    d = np.linalg.solve(np.asarray(affine.scale), init - np.asarray(affine.loc))
    predicted = 0.5 * float(d @ d)
    if predicted > 50.0 and float(mode.rise) < DEGENERATE_RATIO * predicted:
        return float(mode.rise), predicted
    return None


def _laplace_affine(name, mode, affine, funnel):
    """``affine``, the whitening at the mode search's end point, with a warning when that
    point is not a mode; ``None`` (warned too) when its Hessian is not finite (``affine`` is
    ``None``), or when the end point is a degenerate mode (``funnel``: ``(rise,
    predicted)``, :func:`_funnel_rise`)."""
    if affine is None:
        warn(
            f"{name}: the Laplace start was skipped: the log density's Hessian is not "
            f"finite (or is zero) at the point the mode search reached ({int(mode.num_iters)} "
            "Newton iterations from the initial point), so q0 starts at the initial point "
            "with `init_scale` in the model's raw coordinates, where a badly scaled or "
            "correlated posterior can end many standard deviations off. Fix: give a start "
            "inside the support where the density is smooth (e.g. "
            "`init_loc_fn=init_to_median`), or check the model for NaNs at its initial point.",
            UserWarning,
        )
        return None
    if funnel is not None:
        rise, predicted = funnel
        warn(
            f"{name}: the posterior seems to have no mode: from the initial point its log "
            f"density rose by {rise:.3g} nats while its curvature grew as if by "
            f"{predicted:.3g} (a Gaussian's rise): the search ran into a funnel's neck, where "
            "the density of a centred hierarchy grows without bound as a scale goes to 0. "
            "A Laplace start there would trap q0, so q0 starts at the initial point with "
            "`init_scale` in the model's raw coordinates. Fix: non-centre the hierarchy "
            "(`noncentre='auto'` does it for Normal sites whose scale is a latent site; "
            "otherwise `numpyro.infer.reparam.LocScaleReparam(0)` on the group-level "
            "sites, or write theta = mu + tau * theta_raw), and check the fit with "
            "`transport_check`.",
            UserWarning,
        )
        return None
    decrement = float(mode.decrement)
    if decrement > DECREMENT_WARN:
        warn(
            f"{name}: the mode search stopped {decrement:.3g} nats below the mode its "
            f"quadratic model predicts (after {int(mode.num_iters)} Newton iterations; "
            f"converged means below {DECREMENT_WARN:g}). q0 starts at the Laplace "
            "approximation there, which may be far from the posterior, e.g. deep in the neck "
            "of a hierarchical funnel whose density has no maximum. Fix: reparameterise "
            "(non-centred hierarchies: `numpyro.infer.reparam.LocScaleReparam`), give a "
            "better start (`init_loc_fn=init_to_median`), or use `laplace_init=False`; "
            "check the fit with `transport_check` or against `method='importance'` draws.",
            UserWarning,
        )
    return affine


def _warn_if_stiff(name, lam, init_scale, dim, laplace_init):
    """Warn when ``q0`` has no Laplace start and the curvature says it starts far wider than
    the posterior (or the curvature could not be measured).

    Adam moves a parameter by about the learning rate per step whatever the curvature, so in
    raw coordinates it cannot resolve a direction of scale ``1 / sqrt(λ)`` far below it; the
    fit then ends many posterior standard deviations off with no other sign."""
    reason = (
        f"D = {dim} > {MAX_DENSE_DIM}, too large to form the Hessian"
        if dim > MAX_DENSE_DIM
        else "laplace_init=False"
        if not laplace_init
        else "the Laplace start was skipped, see the warning above"
    )
    if lam is None:
        return  # set up under jit, or the step sizes were given: nothing was measured
    if not np.isfinite(lam):
        warn(
            f"{name}: the curvature of the log density is not finite at the initial point "
            f"({reason}), so neither q0's start nor the step sizes could be checked against "
            "the posterior's scale. Fix: start inside the support where the density is "
            "smooth (e.g. `init_loc_fn=init_to_median`), or pass `eta_max`.",
            UserWarning,
        )
        return
    if lam * init_scale**2 <= STIFFNESS_WARN:
        return
    width = 1.0 / math.sqrt(lam)
    warn(
        f"{name}: the posterior is stiff: the curvature at the initial point is "
        f"λ ≈ {lam:.3g}, so its narrowest direction has scale ≈ 1/sqrt(λ) = {width:.2g}, "
        f"{init_scale / width:.0f} times narrower than q0 at the start (init_scale = "
        f"{init_scale:g}); q0 is not set up in the posterior's own units ({reason}), and "
        "an optimiser that moves parameters by ~its learning rate per step cannot place "
        "q0 to that precision. Fix: standardise the covariates (the usual cause: an unscaled "
        f"predictor), leave `laplace_init=True` where D <= {MAX_DENSE_DIM}, or pass "
        f"`init_scale={width:.2g}` and a learning rate that decays below {width / 10:.1g} "
        "(e.g. optax.exponential_decay); check the fit with `transport_check`.",
        UserWarning,
    )
