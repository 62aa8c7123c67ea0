"""Local Laplace approximations for ``AutoSemiDAIS``: each member's base ``q0`` given the drawn
globals, and the set-up's nested Laplace fit that starts the global guide and the members'
expansion points near the posterior.

Member ``n``'s local log density ``ℓ_n(u; θ)`` (unconstrained, Jacobian included) has, at a
point ``m``, gradient ``g`` and Hessian ``−A``; a Newton step ``δ = A⁻¹ g`` moves ``m`` to the
mode of the Gaussian that matches ``ℓ_n`` there, and ``1 / sqrt(A_dd)`` are the scales of the
diagonal Gaussian closest to it (``KL(q ‖ p)``). For a Gaussian ``p(u | x_n, θ)`` (a normal
hierarchy) one step from any ``m`` lands on the exact conditional for every ``θ``.

The Hessian blocks come from ``D`` Hessian-vector products of the batch's sum, whose Hessian
is block diagonal because the members are separable (an admissible model). Where a block is
not positive definite it is shifted up to :data:`FLOOR` times the typical curvature; where it
is not finite the step is 0 and the typical curvature stands in.

Reference: Rue, Martino & Chopin (2009), "Approximate Bayesian inference for latent Gaussian
models by using integrated nested Laplace approximations" (the nested fit of the globals).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

#: The largest Newton step of the base, in the base's standard deviations (the step's norm
#: in the metric of ``A``, over ``sqrt(D)``): a member whose expansion point is far from its
#: mode moves that far towards it and no further.
MAX_SDS = 4.0
#: A curvature block's eigenvalues are kept at least this fraction of the typical curvature.
FLOOR = 1e-4
#: Backtracking factors of the set-up's Newton iterations (the largest that raises ``ℓ_n``).
BACKTRACK = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.015625, 0.0)


class Curvature(NamedTuple):
    """``ℓ (B,)``, ``g (B, D)`` and ``A (B, D, D)`` (minus the Hessian blocks) at ``U``."""

    ell: jax.Array
    g: jax.Array
    A: jax.Array


def curvature(log_density, U, operands) -> Curvature:
    """:class:`Curvature` of the separable batch ``log_density(U, operands) -> (B,)``."""
    B, D = U.shape

    def total(U):
        ell = log_density(U, operands)
        return jnp.sum(ell), ell

    def grad(U):
        g, ell = jax.grad(total, has_aux=True)(U)
        return g, ell

    (g, ell), linear = jax.linearize(grad, U)
    tangents = jnp.broadcast_to(jnp.eye(D, dtype=U.dtype)[:, None, :], (D, B, D))
    columns = jax.vmap(lambda t: linear(t)[0])(tangents)  # (D, B, D): column d of each block
    return Curvature(ell, g, -jnp.moveaxis(columns, 0, -1))


def newton(c: Curvature, typical):
    """``(δ (B, D), diag(A) (B, D), log det A (B,))``: the Newton step, capped at
    :data:`MAX_SDS`, and the diagonal and log determinant of the (shifted) curvature.
    ``typical (D,)``: the typical curvature (its :data:`FLOOR` fraction the least eigenvalue
    kept; it stands in where ``A`` is not finite)."""
    D = c.g.shape[-1]
    eye = jnp.eye(D, dtype=c.g.dtype)
    finite = jnp.all(jnp.isfinite(c.A), axis=(-2, -1)) & jnp.all(jnp.isfinite(c.g), axis=-1)
    A = jnp.where(finite[:, None, None], 0.5 * (c.A + jnp.swapaxes(c.A, -1, -2)), eye)
    g = jnp.where(finite[:, None], c.g, 0.0)
    floor = FLOOR * jnp.min(typical)
    A, step, log_det = _shifted_solve(A, g, floor)
    # the step's squared length in A's metric, per coordinate; the cap's factor computed
    # only where it binds (no gradient through a square root at 0)
    length2 = jnp.sum(step * g, axis=-1) / D
    capped = length2 > MAX_SDS**2
    factor = jnp.where(capped, MAX_SDS / jnp.sqrt(jnp.where(capped, length2, 1.0)), 1.0)
    step = step * factor[:, None]
    diag = jnp.where(finite[:, None], jnp.diagonal(A, axis1=-2, axis2=-1), typical)
    return jnp.where(finite[:, None], step, 0.0), diag, log_det


def _shifted_solve(A, g, floor):
    """``(A + s I, (A + s I)⁻¹ g, log det(A + s I))`` for symmetric blocks ``A (B, D, D)``,
    ``s = max(floor − λ_min(A), 0)`` (no gradient through ``λ_min``). Blocks of one or two
    coordinates in closed form: a CPU runs batched LAPACK calls on such tiny matrices one
    matrix at a time, slowly."""
    D = A.shape[-1]
    eye = jnp.eye(D, dtype=A.dtype)
    if D == 1:
        a = A[:, 0, 0]
        a = a + jnp.maximum(floor - jax.lax.stop_gradient(a), 0.0)
        return a[:, None, None], g / a[:, None], jnp.log(a)
    if D == 2:
        a, b, c = A[:, 0, 0], A[:, 0, 1], A[:, 1, 1]
        lowest = 0.5 * (a + c) - jnp.sqrt((0.5 * (a - c)) ** 2 + b**2)
        shift = jnp.maximum(floor - jax.lax.stop_gradient(lowest), 0.0)
        a, c = a + shift, c + shift
        det = a * c - b**2
        step = jnp.stack([c * g[:, 0] - b * g[:, 1], a * g[:, 1] - b * g[:, 0]], -1) / det[:, None]
        return A + shift[:, None, None] * eye, step, jnp.log(det)
    lowest = jax.lax.stop_gradient(jnp.linalg.eigvalsh(A)[:, 0])
    A = A + jnp.maximum(floor - lowest, 0.0)[:, None, None] * eye
    chol = jnp.linalg.cholesky(A)
    step = jax.scipy.linalg.cho_solve((chol, True), g[..., None])[..., 0]
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    return A, step, log_det


def base(log_density, operands, m, r, typical):
    """``(loc, scale)`` of the members' bases: one Newton step from the expansion points
    ``m (B, D)`` on ``ℓ_n(·; θ)``, scales ``r / sqrt(diag A)`` (``r (B, D)``, learnt)."""
    step, diag, _ = newton(curvature(log_density, m, operands), typical)
    return m + step, r / jnp.sqrt(diag)


def modes(log_density, operands, m, typical, iterations):
    """``(modes (B, D), diag A there (B, D), largest eigenvalue of A there (B,))``:
    ``iterations`` Newton steps from ``m``, each backtracked (:data:`BACKTRACK`) to the
    largest fraction that raises ``ℓ_n``."""
    fractions = jnp.asarray(BACKTRACK, m.dtype)

    def one(m, _):
        c = curvature(log_density, m, operands)
        step, _, _ = newton(c, typical)
        trial = jax.vmap(lambda t: log_density(m + t * step, operands))(fractions)  # (T, B)
        better = jnp.isfinite(trial) & (trial > c.ell[None, :])
        first = jnp.argmax(jnp.concatenate([better, jnp.ones_like(better[:1])]), axis=0)
        t = jnp.concatenate([fractions, jnp.zeros(1, m.dtype)])[first]
        return m + t[:, None] * step, None

    m, _ = jax.lax.scan(one, m, None, length=iterations)
    c = curvature(log_density, m, operands)
    _, diag, _ = newton(c, typical)
    symmetric = 0.5 * (c.A + jnp.swapaxes(c.A, -1, -2))
    return m, diag, jnp.linalg.eigvalsh(symmetric)[:, -1]


def marginal(log_density, operands, m, typical):
    """The Laplace approximation of ``Σ_n log p(x_n | θ)`` (without the constant
    ``D/2 log 2π`` per member) from points ``m`` near the members' modes: one Newton step,
    then ``ℓ_n − ½ log det A_n`` there. Differentiable in ``operands``: the step carries the
    modes' dependence on ``θ`` to first order."""
    step, _, _ = newton(curvature(log_density, m, operands), typical)
    c = curvature(log_density, m + step, operands)
    _, _, log_det = newton(c, typical)
    return jnp.sum(c.ell - 0.5 * log_det)


class NestedFit(NamedTuple):
    theta: np.ndarray  # (P,) the globals' (unconstrained) mode of the Laplace marginal
    sd: np.ndarray  # (P,) sqrt(diag) of the inverse of minus its Hessian there
    converged: bool


def nested_fit(objective, theta, iterations=100, tolerance=1e-6) -> NestedFit:
    """Levenberg–Marquardt damped Newton ascent of ``objective``: ``theta (P,) -> (f, g, H)``
    (value, gradient, Hessian; host arrays) from ``theta``, until the Newton decrement
    ``gᵀ(−H)⁻¹g / 2`` falls below ``tolerance`` per coordinate where ``−H`` is positive
    definite. The damping is raised until the damped ``−H`` is positive definite and the
    step raises ``f``, and lowered after each accepted step."""
    theta = np.asarray(theta, np.float64)
    f, g, H = objective(theta)
    damping, converged = 0.0, False
    for _ in range(iterations):
        if not (np.isfinite(f) and np.all(np.isfinite(g)) and np.all(np.isfinite(H))):
            break
        neg = -0.5 * (H + H.T)
        scale = np.diag(np.maximum(np.abs(np.diag(neg)), 1e-12))
        chol = _cholesky(neg + damping * scale)
        while chol is None and damping < 1e12:
            damping = max(10.0 * damping, 1e-3)
            chol = _cholesky(neg + damping * scale)
        if chol is None:
            break
        step = np.linalg.solve(chol.T, np.linalg.solve(chol, g))
        if damping == 0.0 and 0.5 * float(g @ step) < tolerance * theta.size:
            converged = True
            break
        f_new, g_new, H_new = objective(theta + step)
        if np.isfinite(f_new) and f_new >= f:
            theta, f, g, H = theta + step, f_new, g_new, H_new
            damping = 0.0 if damping <= 1e-3 else damping / 10.0
        else:
            damping = max(10.0 * damping, 1e-3)
    neg = -0.5 * (H + H.T)
    chol = _cholesky(neg)
    if chol is None:
        return NestedFit(theta, np.full(theta.shape, np.nan), False)
    inverse = np.linalg.inv(chol)
    return NestedFit(theta, np.sqrt(np.sum(inverse**2, axis=0)), converged)


def _cholesky(matrix):
    try:
        return np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        return None


def typical_curvature(diag) -> np.ndarray:
    """The median over members of each coordinate's curvature, where finite and positive;
    1 where none is."""
    diag = np.asarray(diag, np.float64)
    out = np.ones(diag.shape[-1])
    for d in range(diag.shape[-1]):
        ok = diag[:, d][np.isfinite(diag[:, d]) & (diag[:, d] > 0)]
        if ok.size:
            out[d] = np.median(ok)
    return out
