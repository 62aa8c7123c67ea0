"""Whitened coordinates: ``q0`` and the transitions run in ``u = L⁻¹(z − m)``.

With ``m`` a mode of the posterior and ``L Lᵀ`` its Laplace covariance, a nearly Gaussian
posterior is nearly standard normal in ``u`` whatever the scale and correlation of its
coordinates (an uncentred or badly scaled covariate, collinear predictors). The optimiser
(which moves a parameter by about its learning rate per step), the step sizes and the
diagonal mass matrix then all act in units of the posterior's own widths, and a diagonal
``q0`` in ``u`` is a full-rank ``q0`` in ``z``.

``L`` is not a Cholesky factor: a Cholesky factor depends on the order of the coordinates,
and so would every diagonal quantity in ``u`` (``q0``'s scales, the mass matrix), i.e. the
answer would depend on the order in which the model's ``sample`` statements are written.
:func:`block_root` orders the coordinates by *level* instead (the guides use the size of
each coordinate's site, so a hierarchy's hyperparameters come before its group effects,
which are then whitened given them, as in its non-centred form) and takes the symmetric
root within a level, which permuting the coordinates permutes the same way (the whitening
of least distortion; Kessy et al. 2018). ``L`` then depends only on the levels, not on the
order or the names of the sites, nor on ``plate`` against ``.to_event``.

The density of ``u`` is ``ℓ(m + L u) + log |det L|``, so weights, bounds and evidence are
those of ``z``.

References: Hoffman et al. (2019), "NeuTra-lizing bad geometry in Hamiltonian Monte Carlo
using neural transport" (sampling in the coordinates of a fitted transport map); Kessy,
Lewin & Strimmer (2018), "Optimal whitening and decorrelation".
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.engine.base import Target


class Affine(NamedTuple):
    """``z = loc + scale u``."""

    loc: jax.Array  # (D,)
    scale: jax.Array  # (D, D) invertible
    log_det: jax.Array  # () log |det scale|, kept beside it: no factorisation per step


def to_z(affine: Affine, u: jax.Array) -> jax.Array:
    """``m + L u`` for ``u (..., D)``."""
    return affine.loc + u @ affine.scale.T


def log_abs_det(affine: Affine) -> jax.Array:
    """``log |det L|``, shape ``()``."""
    return affine.log_det


def pull_back(affine: Affine, log_density):
    """The density of ``u`` for a log density ``ℓ`` of ``z``: ``ℓ(m + L u) + log |det L|``
    (``None`` stays ``None``)."""
    if log_density is None:
        return None
    return lambda u: log_density(to_z(affine, u)) + log_abs_det(affine)


def whiten(target: Target, affine: Affine) -> Target:
    """``target`` in ``u``: each log density ``ℓ`` becomes :func:`pull_back`'s."""
    return Target(pull_back(affine, target.log_dynamics), pull_back(affine, target.log_final))


def push(affine: Affine, q0: gaussian.Gaussian) -> gaussian.Gaussian:
    """``q0`` of ``u`` as the Gaussian of ``z = m + L u``: covariance ``F Fᵀ`` with
    ``F = L S`` (``S``: ``q0``'s diagonal or triangular scale), as its Cholesky factor
    ``(D, D)``, read off the QR factorisation of ``Fᵀ`` (``F Fᵀ = Rᵀ R``), which does not
    square ``F``'s condition number as factoring ``F Fᵀ`` would."""
    scale = jnp.diag(q0.scale) if gaussian.is_diagonal(q0) else q0.scale
    r = jnp.linalg.qr((affine.scale @ scale).T, mode="r")
    signs = jnp.where(jnp.diagonal(r) < 0, -1.0, 1.0).astype(r.dtype)
    return gaussian.Gaussian(to_z(affine, q0.loc), r.T * signs[None, :])


#: smallest curvature of the Laplace precision relative to the largest (a condition number
#: of 10¹⁰ at most): a direction the data leave flat gets a finite width
RELATIVE_FLOOR = 1e-10


def laplace(mode, neg_hess, levels=None) -> Affine:
    """The Laplace approximation ``N(m, Σ)`` at a mode ``m (D,)`` with potential Hessian
    ``H = −∇²ℓ(m) (D, D)``, as the affine map of its whitening, on the host in float64.

    ``Σ⁻¹ = V max(|Λ|, floor) Vᵀ`` for ``H = V Λ Vᵀ``: eigenvalues by magnitude (a point
    short of a mode can have negative curvature; its magnitude is still the local scale),
    floored at :data:`RELATIVE_FLOOR` times the largest; ``L`` is :func:`block_root` of
    ``Σ`` over ``levels``. Returns ``None`` when ``H`` is not finite or is zero.
    """
    h = np.asarray(neg_hess, np.float64)
    if not np.all(np.isfinite(h)) or not np.all(np.isfinite(mode)):
        return None
    eigenvalues, vectors = np.linalg.eigh((h + h.T) / 2)
    magnitudes = np.abs(eigenvalues)
    if magnitudes.max() <= 0:
        return None
    precision = np.maximum(magnitudes, RELATIVE_FLOOR * magnitudes.max())
    cov = (vectors / precision) @ vectors.T
    log_det = -0.5 * np.sum(np.log(precision))
    return Affine(np.asarray(mode, np.float64), block_root(cov, levels), np.float64(log_det))


def _symmetric_root(a):
    eigenvalues, vectors = np.linalg.eigh((a + a.T) / 2)
    root = (vectors * np.sqrt(np.maximum(eigenvalues, 0.0))) @ vectors.T
    return (root + root.T) / 2


def block_root(cov, levels=None):
    """A square root ``L (D, D)`` of the covariance ``cov`` (``L Lᵀ = cov``, host float64),
    block lower-triangular over ``levels (D,)`` (coordinates of a lower level first; default:
    one level), with the symmetric root of each level's conditional covariance (the Schur
    complement given the lower levels) on its diagonal block.

    A level's coordinates are thus whitened given those of the levels below, as a
    non-centred hierarchy is written (its group effects given its hyperparameters), and
    within a level by the symmetric root, which permuting the coordinates permutes the same
    way. So ``L`` does not depend on the order of the coordinates, only on their levels; a
    Cholesky factor (one coordinate a level, in the order given) does."""
    cov = np.asarray(cov, np.float64)
    levels = np.zeros(cov.shape[0]) if levels is None else np.asarray(levels)
    L = np.zeros_like(cov)
    rest = cov.copy()  # the covariance of the coordinates not yet placed, given the placed
    for level in np.unique(levels):
        b, r = np.flatnonzero(levels == level), np.flatnonzero(levels > level)
        root = _symmetric_root(rest[np.ix_(b, b)])
        L[np.ix_(b, b)] = root
        if r.size:
            lower = np.linalg.solve(root, rest[np.ix_(b, r)]).T  # Σ_rb root⁻¹ (root symmetric)
            L[np.ix_(r, b)] = lower
            rest[np.ix_(r, r)] -= lower @ lower.T
    return L


def rescale(affine: Affine, loc, scale) -> Affine:
    """``z = m + L (loc + diag(scale) u)``: ``affine`` followed by a diagonal Gaussian's map
    in its coordinates (host, float64)."""
    L = np.asarray(affine.scale, np.float64)
    loc = np.asarray(affine.loc, np.float64) + L @ np.asarray(loc, np.float64)
    scale = np.asarray(scale, np.float64)
    log_det = np.float64(affine.log_det) + np.sum(np.log(scale))
    return Affine(loc, L * scale[None, :], log_det)


def whitened_curvature(affine: Affine, neg_hess) -> float:
    """Largest eigenvalue of ``Lᵀ H L``, the potential's Hessian in ``u`` (at least 0;
    ``inf`` when not finite); 1 at the mode the Laplace map was formed at."""
    L = np.asarray(affine.scale, np.float64)
    h = L.T @ np.asarray(neg_hess, np.float64) @ L
    if not np.all(np.isfinite(h)):
        return np.inf
    return max(float(np.linalg.eigvalsh((h + h.T) / 2)[-1]), 0.0)
