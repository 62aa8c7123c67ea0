"""The whitening of :mod:`numpyro_dais.engine.setup.preconditioning`: a square root of the
Laplace covariance that does not depend on the order of the coordinates."""

import jax.numpy as jnp
import numpy as np

from numpyro_dais.engine.annealing import gaussian
from numpyro_dais.engine.setup import preconditioning


def _covariance(dim, seed=0):
    a = np.random.default_rng(seed).normal(size=(dim, dim))
    return a @ a.T + 0.1 * np.eye(dim)


def test_block_root_is_a_square_root_block_triangular_over_levels():
    """``L Lᵀ = Σ`` to float64 round-off; zero above the level blocks; symmetric blocks."""
    cov = _covariance(6)
    levels = np.array([8, 1, 8, 1, 3, 8])
    L = preconditioning.block_root(cov, levels)
    np.testing.assert_allclose(L @ L.T, cov, atol=1e-10)
    for i in range(6):
        for j in range(6):
            if levels[j] > levels[i]:
                assert L[i, j] == 0.0
            if levels[j] == levels[i]:
                assert abs(L[i, j] - L[j, i]) < 1e-10


def test_block_root_permutes_with_the_coordinates():
    """``P`` permuting the coordinates (levels with them): ``L(PΣPᵀ) = P L(Σ) Pᵀ`` exactly
    but for round-off, which a Cholesky factor breaks (it fails by O(1) here)."""
    cov, levels = _covariance(7, seed=1), np.array([1, 1, 4, 4, 4, 4, 1])
    perm = np.random.default_rng(2).permutation(7)
    L = preconditioning.block_root(cov, levels)
    L_perm = preconditioning.block_root(cov[np.ix_(perm, perm)], levels[perm])
    np.testing.assert_allclose(L_perm, L[np.ix_(perm, perm)], atol=1e-10)
    chol, chol_perm = np.linalg.cholesky(cov), np.linalg.cholesky(cov[np.ix_(perm, perm)])
    assert np.abs(chol_perm - chol[np.ix_(perm, perm)]).max() > 0.1


def test_laplace_log_det_and_push():
    """The Laplace map's ``log |det L|`` is ``−½ log det H``, and ``push`` gives ``q0`` of
    ``z`` the covariance ``L S Sᵀ Lᵀ`` as a lower Cholesky factor."""
    h = np.linalg.inv(_covariance(4, seed=3))
    affine = preconditioning.laplace(np.zeros(4), h, levels=np.array([1, 2, 2, 1]))
    np.testing.assert_allclose(affine.log_det, -0.5 * np.linalg.slogdet(h)[1], rtol=1e-10)
    q0 = gaussian.Gaussian(jnp.ones(4), jnp.array([0.5, 1.0, 2.0, 1.5]))
    pushed = preconditioning.push(affine, q0)
    factor = affine.scale * np.asarray(q0.scale)[None, :]
    np.testing.assert_allclose(pushed.scale @ pushed.scale.T, factor @ factor.T, rtol=1e-4)
    assert np.allclose(np.triu(np.asarray(pushed.scale), 1), 0.0)
    assert np.all(np.diagonal(np.asarray(pushed.scale)) > 0)
