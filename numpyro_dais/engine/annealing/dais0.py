"""The DAIS₀ objective of ``q0``: the symmetrised KL made explicit.

With many perfect transitions and a linear schedule, the gap of the DAIS bound is
``Δ = (1 / 2K) [KL(q0 ‖ p) + KL(p ‖ q0)] + O(1/K³)`` (Zenn & Bamler 2024, Theorem 4.1), so
``q0`` trained on the bound fits the symmetrised KL. With few, learned transitions the
dynamics can instead *transport* a misplaced ``q0`` to the posterior, and the bound becomes
nearly flat in ``q0``'s location. :func:`symmetrized_kl` estimates the theorem's limit
directly, from quantities a DAIS run already has:

* ``KL(q0 ‖ p) = log Z − E_q0[ℓ(z) − log q0(z)]``: the reparameterised ELBO of ``q0`` at
  the initial particles ``z_0``;
* ``KL(p ‖ q0) = −H(p) − E_p[log q0(z)]``: ``E_p`` estimated by the self-normalised AIS
  weights of the final particles ``z_K`` (consistent as ``N → ∞``), with the particles and
  weights held fixed, so only ``q0`` sees this term.

Reference: Zenn & Bamler (ICML 2024), "Differentiable annealed importance sampling minimizes the
symmetrized Kullback-Leibler divergence between initial and target distribution".
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from numpyro_dais.engine.annealing import gaussian, weights
from numpyro_dais.engine.annealing.dais import over_particles


def symmetrized_kl(
    log_q0: Callable,
    log_target: Callable,
    z0: jax.Array,
    z: jax.Array,
    log_weights: jax.Array,
) -> jax.Array:
    """Estimate of ``J = KL(q0 ‖ p) + KL(p ‖ q0)`` up to terms that do not depend on ``q0``.

    :param log_q0: ``z (D,) -> log q0(z)``, differentiable in ``q0``'s parameters.
    :param log_target: ``z (D,) -> ℓ(z)``, the unnormalised log posterior; hold its own
        parameters fixed (``stop_gradient``) if only ``q0`` should see this term.
    :param z0: ``(N, D)`` reparameterised draws of ``q0``.
    :param z: ``(N, D)`` final particles ``z_K`` (gradient stopped here).
    :param log_weights: ``(N,)`` their AIS log weights (gradient stopped here; non-finite
        entries count as zero weight, as do draws ``z0`` where ``ℓ`` is not finite).
    :return: ``()`` the value ``−E_q0[ℓ − log q0] − E_p[log q0] = J − log Z + H(p)``, whose
        gradient in ``q0``'s parameters is that of ``J``.
    """
    z, log_weights = jax.lax.stop_gradient((z, log_weights))
    # a draw where ℓ is not finite (outside the model's domain) drops out, NaN gradient too
    finite_z0 = weights.zero_nonfinite_grads(z0)
    r = over_particles(log_q0)(z0) - over_particles(log_target)(finite_z0)
    ok = jnp.isfinite(r)
    reverse = jnp.sum(jnp.where(ok, r, 0.0)) / jnp.maximum(jnp.sum(ok), 1)
    log_weights, _ = weights.mask_nonfinite(log_weights)
    finite = jnp.isfinite(log_weights)
    W = jnp.where(finite, jnp.exp(weights.log_normalize(log_weights)), 0.0)
    log_q0_z = over_particles(log_q0)(jnp.where(finite[:, None], z, 0.0))
    forward = -jnp.sum(jnp.where(W > 0, W * log_q0_z, 0.0))
    return reverse + forward


class TransportCheck(NamedTuple):
    """How far ``q0`` sits from the annealed end points, coordinate by coordinate."""

    mean_shift: jax.Array
    """``(D,)`` ``(mean_q0 − mean_end) / std_end``: the shift in end-point standard deviations."""
    log_std_ratio: jax.Array
    """``(D,)`` ``log(std_q0 / std_end)``."""
    finite_fraction: jax.Array
    """``()`` the fraction of end points that are finite (the moments are theirs)."""
    log_std_se: jax.Array | None = None
    """``(D,)`` the standard error of ``log_std_ratio`` from both sets' sizes and kurtoses
    (:func:`draws_check` only): ``sqrt((κ − 1) / 4n)`` each, the delta method for the log of
    a sample std; large where a coordinate's tails are heavy (Neal's funnel's ``x``)."""


def _finite_moments(z):
    """Mean ``(D,)``, std ``(D,)`` and finite fraction ``()`` of the rows of ``z (S, D)``
    with every entry finite."""
    finite = jnp.all(jnp.isfinite(z), axis=-1, keepdims=True)
    count = jnp.sum(finite)
    mean = jnp.sum(jnp.where(finite, z, 0.0), axis=0) / count
    std = jnp.sqrt(jnp.sum(jnp.where(finite, (z - mean) ** 2, 0.0), axis=0) / count)
    return mean, std, count / z.shape[0]


def _log_std_variance(z, mean, std):
    """The variance ``(D,)`` of the log of the sample std of the finite rows of ``z (S, D)``
    (their ``mean`` and ``std``, floored): ``(κ − 1) / 4n``, ``κ`` their kurtosis."""
    finite = jnp.all(jnp.isfinite(z), axis=-1, keepdims=True)
    count = jnp.sum(finite)
    m4 = jnp.sum(jnp.where(finite, (z - mean) ** 4, 0.0), axis=0) / count
    kurtosis = jnp.maximum(m4 / std**4, 1.0)
    return (kurtosis - 1.0) / (4.0 * count)


def transport_check(q0: gaussian.Gaussian, z_end: jax.Array) -> TransportCheck:
    """Compare ``q0`` with draws ``z_end (S, D)`` of the (importance-resampled) end points,
    over the finite ones (an end point whose every particle diverged is not finite).

    When the learned transitions carry particles a long way, ``q0`` can sit far from the
    posterior while the end points are right; a large ``|mean_shift|`` says so.
    """
    mean, std, finite_fraction = _finite_moments(z_end)
    return TransportCheck(
        mean_shift=(q0.loc - mean) / std,
        log_std_ratio=jnp.log(gaussian.marginal_std(q0) / std),
        finite_fraction=finite_fraction,
    )


#: the relative spread below which a coordinate of draws counts as constant (float32's
#: rounding, ~1e-7, with room): e.g. ``L[0, 0] = 1`` of a Cholesky factor of a correlation
#: matrix, which neither shifts nor spreads
CONSTANT = 1e-5


def draws_check(draws: jax.Array, reference: jax.Array) -> TransportCheck:
    """:func:`transport_check` of ``draws (S, M)`` (e.g. ``q0``'s, constrained) against
    ``reference (R, M)`` draws: ``mean_shift`` in the reference's sds, ``log_std_ratio``
    ``log(std_draws / std_reference)`` and its standard error ``log_std_se``,
    ``finite_fraction`` the reference's. Both stds are floored at :data:`CONSTANT` times
    ``1 + |reference mean|``, so that a coordinate constant in both gives 0 and 0 rather
    than NaN."""
    mean, std, _ = _finite_moments(draws)
    ref_mean, ref_std, finite_fraction = _finite_moments(reference)
    floor = CONSTANT * (1.0 + jnp.abs(ref_mean))
    std, ref_std = jnp.maximum(std, floor), jnp.maximum(ref_std, floor)
    variance = _log_std_variance(draws, mean, std) + _log_std_variance(reference, ref_mean, ref_std)
    return TransportCheck(
        mean_shift=(mean - ref_mean) / ref_std,
        log_std_ratio=jnp.log(std / ref_std),
        finite_fraction=finite_fraction,
        log_std_se=jnp.sqrt(variance),
    )
