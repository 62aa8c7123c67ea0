"""Resampling for SMC samplers: ancestor draws, decision rules, gradient modes.

Ancestor schemes map ``(rng_key, log_weights (N,)) -> ancestors (N,) int32``: each draws
ancestor ``j`` ``N · W_j`` times in expectation, ``W = softmax(log_weights)``. They work in
log space and are float32-safe: uniforms lie strictly inside ``(0, 1)``, the cumulative
weights are forced to 1 from the last positive-weight particle on, so no index past the end
and no zero-weight particle (``-inf`` log weight) is ever drawn. If no weight is positive
(all ``-inf``/NaN) the draw falls back to uniform weights. Ancestors are integers computed
from stopped weights: they carry no gradient.

Decision rules map ``(rng_key, log_weights (N,), threshold) -> bool`` (resample now?).

References: Douc & Cappé (2005), "Comparison of resampling schemes for particle filtering";
Zenn & Bamler (2023), "Resampling gradients vanish in differentiable sequential Monte Carlo
samplers" (decision rules); Fan et al. (2022), "Training discrete deep generative models via
gapped straight-through estimator" (GST).
"""

import jax
import jax.numpy as jnp

from numpyro_dais.engine.annealing import weights
from numpyro_dais.engine.validation import check_choice


def _cumulative_weights(log_weights: jax.Array) -> jax.Array:
    """Guarded CDF ``(N,)`` of the normalised weights (gradient stopped)."""
    log_w = jax.lax.stop_gradient(log_weights)
    positive = jnp.isfinite(log_w)  # +inf/NaN are diverged, -inf has zero weight
    log_w = jnp.where(positive, log_w, -jnp.inf)
    any_positive = jnp.any(positive)
    log_w = jnp.where(any_positive, log_w, 0.0)
    positive = jnp.where(any_positive, positive, True)
    w = jnp.exp(weights.log_normalize(log_w))
    positive = positive & (w > 0)  # underflow to 0 in float32 counts as zero weight
    positive = positive.at[jnp.argmax(w)].set(True)  # at least one
    idx = jnp.arange(w.shape[0])
    last = jnp.max(jnp.where(positive, idx, -1))
    return jnp.where(idx >= last, 1.0, jnp.cumsum(w))


def _open_unit(u: jax.Array) -> jax.Array:
    """Clip uniforms into the open interval ``(0, 1)`` of their dtype."""
    tiny = jnp.finfo(u.dtype).tiny
    return jnp.clip(u, tiny, jnp.nextafter(jnp.ones((), u.dtype), 0.0))


def _invert(cdf: jax.Array, u: jax.Array) -> jax.Array:
    """Index ``j`` with ``cdf[j-1] <= u < cdf[j]`` for sorted or unsorted ``u`` in (0, 1)."""
    idx = jnp.searchsorted(cdf, u, side="right")
    return jnp.minimum(idx, cdf.shape[0] - 1).astype(jnp.int32)


def multinomial(rng_key, log_weights: jax.Array) -> jax.Array:
    """``N`` iid draws from ``Categorical(W)``; returns ancestors ``(N,)``."""
    cdf = _cumulative_weights(log_weights)
    u = _open_unit(jax.random.uniform(rng_key, cdf.shape, cdf.dtype))
    return _invert(cdf, u)


def stratified(rng_key, log_weights: jax.Array) -> jax.Array:
    """One uniform in each stratum ``((i + U_i) / N)``; returns ancestors ``(N,)``."""
    cdf = _cumulative_weights(log_weights)
    n = cdf.shape[0]
    u = _open_unit(jax.random.uniform(rng_key, (n,), cdf.dtype))
    return _invert(cdf, _open_unit((jnp.arange(n, dtype=cdf.dtype) + u) / n))


def systematic(rng_key, log_weights: jax.Array) -> jax.Array:
    """One shared uniform, ``(i + U) / N``; returns ancestors ``(N,)``."""
    cdf = _cumulative_weights(log_weights)
    n = cdf.shape[0]
    u = _open_unit(jax.random.uniform(rng_key, (), cdf.dtype))
    return _invert(cdf, _open_unit((jnp.arange(n, dtype=cdf.dtype) + u) / n))


SCHEMES = {"multinomial": multinomial, "systematic": systematic, "stratified": stratified}


# -- decision rules ---------------------------------------------------------------------------


def bernoulli_probability(log_weights: jax.Array) -> jax.Array:
    """``1 − (ESS − 1) / (N − 1)`` in ``[0, 1]``: 0 at ``ESS = N``, 1 at ``ESS = 1``."""
    n = log_weights.shape[-1]
    if n == 1:
        return jnp.zeros(log_weights.shape[:-1])
    return jnp.clip(1.0 - (weights.ess(log_weights) - 1.0) / (n - 1), 0.0, 1.0)


def always(rng_key, log_weights, threshold):
    """Resample before every transition ``k ≥ 2``."""
    return jnp.ones((), bool)


def never(rng_key, log_weights, threshold):
    """Never resample: DAIS (the SMC recursion then skips the resampling step)."""
    return jnp.zeros((), bool)


def ess_below(rng_key, log_weights, threshold):
    """Resample when ``ESS < threshold · N``."""
    return weights.ess(log_weights) < threshold * log_weights.shape[-1]


def bernoulli(rng_key, log_weights, threshold):
    """Resample with probability :func:`bernoulli_probability` (Bern-Cat, Zenn & Bamler
    2023)."""
    p = jax.lax.stop_gradient(bernoulli_probability(log_weights))
    return _open_unit(jax.random.uniform(rng_key, (), p.dtype)) < p


RULES = {"always": always, "ess": ess_below, "bernoulli": bernoulli, "never": never}
GRADIENTS = ("stop", "gst")


def _resolve(name, value, table):
    """``table[value]`` for a name, ``value`` itself for a callable."""
    if callable(value):
        return value
    check_choice(name, value, table)
    return table[value]


def resolve(config):
    """``config`` (a :class:`~numpyro_dais.engine.base.ResamplingConfig`) with its ``scheme``
    and ``when`` resolved from names to the functions of :data:`SCHEMES` and :data:`RULES`
    (callables pass through); a ``ValueError`` names the argument, as the guides name it,
    for an unknown name or an out-of-range option."""
    check_choice("resampling_gradient", config.gradient, GRADIENTS)
    threshold = config.ess_threshold
    if isinstance(threshold, bool) or not 0 < threshold <= 1:
        raise ValueError(f"`ess_threshold` must lie in (0, 1], got {threshold!r}.")
    if not config.gst_temperature > 0:
        raise ValueError(f"`gst_temperature` must be positive, got {config.gst_temperature!r}.")
    if not config.gst_gap >= 0:
        raise ValueError(f"`gst_gap` must be non-negative, got {config.gst_gap!r}.")
    return config._replace(
        scheme=_resolve("resampling", config.scheme, SCHEMES),
        when=_resolve("resample_when", config.when, RULES),
    )


# -- gapped straight-through gradients ----------------------------------------------------------


def gst_one_hot(choice: jax.Array, logits: jax.Array, temperature, gap) -> jax.Array:
    """Gapped straight-through relaxation of ``one_hot(choice)``, shape ``choice.shape + (C,)``.

    Forward value: exactly ``one_hot(choice, C)``. Backward: the Jacobian of
    ``softmax((logits + m) / temperature)``, where ``m`` (gradient stopped) raises the chosen
    logit until it exceeds every other logit by at least ``gap``: a consistent, gapped,
    zero-gradient perturbation in the sense of Fan et al. (2022).
    """
    C = logits.shape[-1]
    hard = jax.nn.one_hot(choice, C, dtype=logits.dtype)
    lg = jax.lax.stop_gradient(jnp.where(jnp.isfinite(logits), logits, -jnp.inf))
    chosen = jnp.sum(jnp.where(hard > 0, lg, 0.0), axis=-1)
    others = jnp.max(jnp.where(hard > 0, -jnp.inf, lg), axis=-1)
    lift = jnp.maximum(others + gap - chosen, 0.0)
    lift = jnp.where(jnp.isfinite(lift), lift, 0.0)
    safe = jnp.where(jnp.isfinite(logits), logits, -1e30)
    soft = jax.nn.softmax((safe + hard * lift[..., None]) / temperature, axis=-1)
    return hard + soft - jax.lax.stop_gradient(soft)


def straight_through_take(tree, ancestors: jax.Array, log_weights: jax.Array, temperature, gap):
    """``x[ancestors]`` for every leaf ``x (N, ...)``, with GST gradients w.r.t. the weights.

    Forward values equal the plain gather exactly; the backward pass adds
    ``(P − stop_gradient(P)) @ x`` with ``P`` the ``(N, N)`` relaxed one-hot ancestor matrix.
    """
    P = gst_one_hot(ancestors, log_weights, temperature, gap)
    zero = P - jax.lax.stop_gradient(P)

    def take(x):
        safe = jnp.where(jnp.isfinite(x), x, 0.0)
        return x[ancestors] + jnp.tensordot(zero, safe, axes=1)

    return jax.tree.map(take, tree)
