"""Pareto smoothed importance sampling (PSIS): the tail index ``k̂`` of importance weights
and the PSIS-smoothed log weights.

Vehtari, Simpson, Gelman, Yao & Gabry (2024), "Pareto smoothed importance sampling", JMLR
25(72), Algorithm 1: of ``S`` draws, the ``M = ⌈min(S/5, 3 √(S/r_eff))⌉`` largest weights
above the ``(M+1)``-th largest are the tail; a generalised Pareto distribution (GPD) is fitted
to their exceedances with the empirical-Bayes method of Zhang & Stephens (2009,
"A new and efficient estimation method for the generalized Pareto distribution",
Technometrics 51(3)) and the weakly informative prior of the paper's Appendix G (``k̂`` shrunk
towards 0.5 with the weight of 10 observations). ``k̂`` is that fit's shape:

* ``k̂ < 0.5``: the weights have a finite variance; estimates converge at the usual rate.
* ``0.5 ≤ k̂ ≤ min(1 − 1/log10 S, 0.7)``: finite mean, slower convergence; PSIS estimates are
  reliable with ``S`` draws (:func:`k_threshold`).
* above: unreliable. Between ``k_threshold(S)`` and 0.7 more draws help
  (:func:`min_draws`); above 0.7 the number of draws needed is impractical, and the fix is a
  better proposal.

Same algorithm and constants as ArviZ's ``psislw`` (``arviz.stats.stats._psislw``,
``_gpdfit``, ``_gpinv``) and NumPyro's ``psis_diagnostic`` (``numpyro.infer.importance``), so
the numbers agree with theirs (to rounding; the test suite checks it). Written in JAX
rather than calling NumPyro's private, NumPy-only ``_fit_generalized_pareto``: these functions
run under ``jit`` and ``vmap`` (e.g. ``k̂`` per SMC transition inside a compiled program),
compute in the dtype of the weights (float32 unless x64 is on), and also smooth.

Shapes: the draw axis is the last one; leading axes are batch axes (one fit per row). The tail
size ``M`` is static (from the shape); the number of tail draws actually fitted is not (ties at
the cutoff leave fewer than ``M`` strictly above it), so every step is masked. Non-finite log
weights (NaN, ``+inf``: diverged trajectories, as in
:func:`~numpyro_dais.engine.annealing.weights.mask_nonfinite`) count as zero weights (``-inf``).

Fewer than 5 draws strictly above the cutoff leave nothing to fit (no smoothing then);
ArviZ and NumPyro report ``k̂ = inf`` in every such case. Here it depends on why:

* ``S ≤ 20`` (``M < 5``), all but a few weights ~0 next to the largest (below the dtype's
  ``tiny``), no finite log weight, or a failed fit: ``k̂ = inf``, unreliable.
* ties at the cutoff (the largest weights share one value: a flat top, e.g. exact sampling
  with all weights equal, or weights equal up to float32 rounding, which takes few distinct
  values): ``k̂ = -inf``. The weights are bounded, there is no tail to fear; ArviZ's ``inf``
  would be a false alarm.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: ``k̂`` below which the weights have a finite variance (Vehtari et al. 2024)
K_GOOD = 0.5
#: ``k̂`` above which PSIS estimates are unreliable whatever the number of draws
K_BAD = 0.7
#: Zhang & Stephens's scale of the grid of candidate ``b = -k/σ`` (ArviZ's ``prior_bs``)
_PRIOR_BS = 3.0
#: weight, in observations, of the prior ``k ~ 0.5`` (Vehtari et al. 2024, Appendix G)
_PRIOR_K = 10.0
#: grid candidates with a posterior weight below this are dropped (as ArviZ and NumPyro do)
_NEGLIGIBLE = 10 * 2.220446049250313e-16


class ParetoK(NamedTuple):
    """The generalised Pareto fit to the upper tail of importance weights (one per row)."""

    k: jax.Array
    """Shape ``k̂`` (with the weak prior of Vehtari et al. 2024); see the module's
    thresholds. ``inf``: no fit (unreliable); ``-inf``: the largest weights are tied."""
    sigma: jax.Array
    """Scale ``σ̂`` of the fit to the tail's exceedances over the cutoff, with the weights
    scaled so that the largest is 1 (NaN where there is no fit)."""
    num_tail: jax.Array
    """Tail draws fitted: ``M`` less the ties at the cutoff (fewer than 5: no fit)."""
    num_draws: jax.Array
    """Draws ``S`` (the length of the draw axis)."""


class PSIS(NamedTuple):
    """PSIS-smoothed log weights and the fit that smoothed them."""

    log_weights: jax.Array
    """Smoothed log weights, on the scale of the input (not normalised), same shape."""
    pareto_k: ParetoK
    """The tail fit (:func:`pareto_k`)."""


def tail_size(num_draws: int, r_eff: float = 1.0) -> int:
    """``M = ⌈min(S/5, 3 √(S/r_eff))⌉``, the number of largest weights fitted (static)."""
    return int(math.ceil(min(num_draws / 5.0, 3.0 * math.sqrt(num_draws / r_eff))))


def k_threshold(num_draws) -> jax.Array:
    """The sample-size-dependent threshold ``min(1 − 1/log10 S, 0.7)`` (Vehtari et al. 2024,
    section 3.2.4): below it, PSIS with ``S`` draws is reliable."""
    S = jnp.asarray(num_draws, jnp.float32)
    return jnp.minimum(1.0 - 1.0 / jnp.log10(S), K_BAD)


def min_draws(k) -> jax.Array:
    """Draws needed for a reliable PSIS estimate at tail index ``k``: ``10^(1/(1−k))``
    (inverse of :func:`k_threshold`; ``inf`` for ``k ≥ 1``, 10 for ``k ≤ 0``)."""
    k = jnp.maximum(jnp.asarray(k, jnp.float32), 0.0)
    return jnp.where(k < 1.0, 10.0 ** (1.0 / (1.0 - k)), jnp.inf)


def pareto_k(log_weights: jax.Array, r_eff: float = 1.0) -> ParetoK:
    """``k̂`` of the importance weights ``exp(log_weights)``; draws on the last axis.

    ``log_weights`` need not be normalised. ``r_eff`` (static): relative efficiency of
    correlated draws (MCMC), 1 for independent ones. Safe under ``jit`` and ``vmap``; no
    gradient is meant to flow through it.
    """
    return _batched(_pareto_k_1d, log_weights, r_eff)


def psis_smooth(log_weights: jax.Array, r_eff: float = 1.0) -> PSIS:
    """PSIS-smoothed log weights (draws on the last axis) and their ``k̂``.

    The ``num_tail`` largest weights are replaced, in their order, by the expected order
    statistics of the fitted GPD, ``F⁻¹((i − ½)/num_tail)`` above the cutoff, and truncated at
    the largest raw weight; the other weights are unchanged. Without a fit (``k̂`` not finite)
    the weights are returned unchanged. Same result as ``az.psislw(log_weights,
    normalize=False)``, except that ``az.psislw`` maps non-finite entries differently.
    """
    return _batched(_psis_1d, log_weights, r_eff)


def _batched(fn, log_weights, r_eff):
    log_weights = jnp.asarray(log_weights)
    if not jnp.issubdtype(log_weights.dtype, jnp.floating):
        log_weights = log_weights.astype(jnp.result_type(float))
    batch, S = log_weights.shape[:-1], log_weights.shape[-1]
    if S < 2:  # no tail and no cutoff: nothing to fit
        inf = jnp.full(batch, jnp.inf, log_weights.dtype)
        fit = ParetoK(inf, inf * jnp.nan, jnp.zeros(batch, jnp.int32), jnp.full(batch, S))
        return fit if fn is _pareto_k_1d else PSIS(log_weights, fit)
    flat = log_weights.reshape((-1, log_weights.shape[-1]))
    out = jax.vmap(lambda row: fn(row, r_eff))(flat)
    return jax.tree.map(lambda a: a.reshape(batch + a.shape[1:]), out)


class _Tail(NamedTuple):
    x: jax.Array  # log weights less their max, non-finite -> -inf (S,)
    order: jax.Array  # argsort of x (S,)
    tail: jax.Array  # exceedances exp(x) - exp(cutoff) of the M largest, ascending (M,)
    valid: jax.Array  # which of them lie strictly above the cutoff (M,)
    cutoff: jax.Array  # log cutoff
    fit: ParetoK


def _tail_fit(log_weights, r_eff) -> _Tail:
    S = log_weights.shape[0]
    M = min(tail_size(S, r_eff), S - 1)
    dtype = log_weights.dtype
    finite = jnp.isfinite(log_weights)
    any_finite = jnp.any(finite)
    x = jnp.where(finite, log_weights, -jnp.inf)
    x = x - jnp.where(any_finite, jnp.max(x), 0.0)
    order = jnp.argsort(x)
    x_sorted = x[order]
    log_tiny = jnp.log(jnp.finfo(dtype).tiny)
    clamped = x_sorted[S - M - 1] < log_tiny  # the tail holds every weight that is not ~0
    cutoff = jnp.maximum(x_sorted[S - M - 1], log_tiny)
    tail_x = x_sorted[S - M :]
    valid = tail_x > cutoff
    n = jnp.sum(valid)
    tail = jnp.where(valid, jnp.exp(tail_x) - jnp.exp(cutoff), 0.0)
    k, sigma = _gpd_fit(tail, valid, n)
    # fewer than 5 tail draws: because the largest weights are tied (a flat top, no tail:
    # -inf), or because S <= 20 or all but a few weights are ~0 relative to the largest (inf)
    all_equal = any_finite & jnp.all(~finite | (x == 0.0))
    flat_top = all_equal | (any_finite & ~clamped & (M >= 5))
    enough = n > 4
    k = jnp.where(enough & ~jnp.isnan(k), k, jnp.where(flat_top & ~enough, -jnp.inf, jnp.inf))
    sigma = jnp.where(enough, sigma, jnp.nan)
    fit = ParetoK(k, sigma, n, jnp.asarray(S))
    return _Tail(x, order, tail, valid, cutoff, fit)


def _gpd_fit(tail, valid, n):
    """Zhang & Stephens's empirical-Bayes GPD fit of the ``n`` valid exceedances in ``tail``
    (ascending, the invalid ones first and 0), with the weak prior on ``k``; ``(k, σ)``.
    ArviZ's ``_gpdfit`` with the dynamic ``n`` masked."""
    M = tail.shape[0]
    dtype = tail.dtype
    nf = jnp.maximum(n, 1).astype(dtype)
    # the ascending valid values are tail[M - n:]; ArviZ's ary[int(n/4 + 0.5) - 1]
    quartile = tail[jnp.clip(M - n + jnp.floor(nf / 4 + 0.5).astype(n.dtype) - 1, 0, M - 1)]
    largest = tail[M - 1]
    m = 30.0 + jnp.floor(jnp.sqrt(nf))  # grid size
    j = jnp.arange(1, 30 + math.isqrt(M) + 1, dtype=dtype)
    on_grid = j <= m
    b = 1.0 - jnp.sqrt(m / (j - 0.5))
    b = b / (_PRIOR_BS * quartile) + 1.0 / largest
    # invalid entries are 0 and add log1p(0) = 0
    k_grid = jnp.sum(jnp.log1p(-b[:, None] * tail[None, :]), axis=1) / nf
    profile = nf * (jnp.log(-(b / k_grid)) - k_grid - 1.0)
    profile = jnp.where(on_grid & jnp.isfinite(profile), profile, -jnp.inf)
    w = jax.nn.softmax(profile)
    w = jnp.where(w >= _NEGLIGIBLE, w, 0.0)
    b_post = jnp.sum(b * w) / jnp.sum(w)
    k = jnp.sum(jnp.log1p(-b_post * tail)) / nf
    sigma = -k / b_post
    k = (nf * k + _PRIOR_K * 0.5) / (nf + _PRIOR_K)
    return k, sigma


def _pareto_k_1d(log_weights, r_eff):
    return _tail_fit(log_weights, r_eff).fit


def _psis_1d(log_weights, r_eff):
    t = _tail_fit(log_weights, r_eff)
    k, sigma, n = t.fit.k, t.fit.sigma, t.fit.num_tail
    M = t.tail.shape[0]
    dtype = t.tail.dtype
    nf = jnp.maximum(n, 1).astype(dtype)
    rank = jnp.arange(M, dtype=dtype) - (M - nf)  # 0 .. n-1 on the valid entries
    p = (rank + 0.5) / nf
    tiny_k = jnp.abs(k) < jnp.finfo(dtype).eps
    safe_k = jnp.where(tiny_k, 1.0, k)
    quantile = jnp.where(tiny_k, -jnp.log1p(-p), jnp.expm1(-safe_k * jnp.log1p(-p)) / safe_k)
    smoothed = jnp.minimum(jnp.log(sigma * quantile + jnp.exp(t.cutoff)), 0.0)
    smooth = t.valid & jnp.isfinite(k) & (sigma > 0)
    S = t.x.shape[0]
    tail_idx = t.order[S - M :]
    # the body keeps its input values bit for bit (no round trip through the shifted scale)
    lw = jnp.where(jnp.isfinite(log_weights), log_weights, -jnp.inf)
    shift = jnp.where(jnp.any(jnp.isfinite(lw)), jnp.max(lw), 0.0)
    lw = lw.at[tail_idx].set(jnp.where(smooth, smoothed + shift, lw[tail_idx]))
    return PSIS(lw, t.fit)


def unreliable(k, num_draws: int) -> bool:
    """Whether ``k̂`` (host value; the largest of a batch) of ``num_draws`` weights is past
    :func:`k_threshold`, or unfitted (``inf``); ``False`` where no ``k̂`` is finite or
    infinite (all NaN)."""
    ks = np.asarray(k, dtype=float)
    if ks.size == 0 or np.all(np.isnan(ks)):
        return False
    return bool(np.nanmax(ks) > float(k_threshold(num_draws)))


def pareto_k_warning(
    fit: ParetoK, what: str = "the importance weights", fix: str | None = None
) -> str | None:
    """The warning for an unreliable ``k̂`` (host side: call on concrete values), or ``None``.

    ``what`` names the quantity judged (e.g. ``"log_evidence's weights (num_particles=1000)"``);
    ``fix`` replaces the default advice (more particles, a larger ``K``, a better-trained
    guide). A batched ``fit`` is judged by its largest ``k̂``. Thresholds: above 0.7, or above
    ``min(1 − 1/log10 S, 0.7)`` (:func:`k_threshold`), or no fit (``k̂ = inf``: too few tail
    draws).
    """
    S = int(np.max(np.asarray(fit.num_draws)))
    if not unreliable(fit.k, S):
        return None
    k = float(np.nanmax(np.asarray(fit.k, dtype=float)))
    threshold = float(k_threshold(S))
    fix = fix or "more particles, a larger K, or a better-trained guide"
    if np.isinf(k):
        return (
            f"Pareto k̂ of {what} could not be fitted: too few of the {S} draws in the tail "
            f"(ties or S ≤ 20). Estimates from these weights are not checked; use more draws "
            f"({fix})."
        )
    if k > K_BAD:
        meaning = (
            "the weights have a tail so heavy that their mean is unreliable and no practical "
            "number of draws fixes it"
        )
    else:
        need = float(min_draws(k))
        meaning = (
            f"the weights have a finite mean but infinite variance; with k̂ = {k:.2f} about "
            f"{need:,.0f} draws are needed for a reliable estimate"
        )
    return (
        f"Pareto k̂ = {k:.2f} of {what} exceeds {threshold:.2f} (min(1 - 1/log10 S, 0.7) for "
        f"S = {S} draws): {meaning}. Estimates weighted by them (log Z, weighted draws) can be "
        f"far off while their standard error and ESS look fine. Fix: {fix}."
    )
