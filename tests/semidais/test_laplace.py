"""The local Laplace step's linear algebra (fast tier)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpyro_dais.semidais import laplace


def lapack(A, g, floor):
    """The general path: shift by the least eigenvalue, Cholesky, triangular solves."""
    lowest = np.linalg.eigvalsh(A)[:, 0]
    A = A + np.maximum(floor - lowest, 0.0)[:, None, None] * np.eye(A.shape[-1])
    chol = np.linalg.cholesky(A)
    log_det = 2 * np.log(np.diagonal(chol, 0, 1, 2)).sum(-1)
    return A, np.linalg.solve(A, g[..., None])[..., 0], log_det


@pytest.mark.parametrize("D", [1, 2])
def test_closed_forms_of_small_blocks_match_the_general_path(D):
    # positive definite, indefinite and negative definite blocks, in float64 (the shifted
    # blocks are ill-conditioned, so float32 would compare rounding): tolerance 1e-9
    rng = np.random.default_rng(0)
    M = rng.normal(size=(64, D, D))
    A = M @ np.swapaxes(M, -1, -2) + rng.normal(size=(64, 1, 1)) * np.eye(D)
    g = rng.normal(size=(64, D))
    with jax.enable_x64(True):
        got = laplace._shifted_solve(jnp.asarray(A), jnp.asarray(g), 1e-3)
        for x, y in zip(got, lapack(A, g, 1e-3), strict=True):
            np.testing.assert_allclose(np.asarray(x), y, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("D", [1, 2])
def test_closed_forms_differentiate_like_the_general_path(D):
    # the step's gradient in A and g, through the closed form and through the general path
    # (D = 3 pads a unit coordinate), on positive definite blocks and on blocks shifted up
    # to the floor (no gradient through the shift on either path): identical math, so
    # float32 rounding alone (1e-3)
    rng = np.random.default_rng(1)
    M = rng.normal(size=(8, D, D))
    offset = np.where(np.arange(8) % 2, 1.0, -3.0)[:, None, None]
    A = jnp.asarray(M @ np.swapaxes(M, -1, -2) + offset * np.eye(D), jnp.float32)
    g = jnp.asarray(rng.normal(size=(8, D)), jnp.float32)

    def loss(A, g, pad):
        A = 0.5 * (A + jnp.swapaxes(A, -1, -2))  # as `newton` symmetrises
        if pad:
            A = jnp.pad(A, ((0, 0), (0, 3 - D), (0, 3 - D))) + jnp.diag(jnp.arange(3) >= D).astype(
                A.dtype
            )
            g = jnp.pad(g, ((0, 0), (0, 3 - D)))
        _, step, log_det = laplace._shifted_solve(A, g, 1e-3)
        return jnp.sum(step**2) + jnp.sum(log_det)

    closed, general = jax.grad(loss, (0, 1))(A, g, False), jax.grad(loss, (0, 1))(A, g, True)
    for x, y in zip(closed, general, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-4)
