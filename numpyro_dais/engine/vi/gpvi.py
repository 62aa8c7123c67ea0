"""GPVI functional gradient and the amortized SVGD baseline, and the training objective.

For a generator ``x = f_θ(ε)``, ``N`` update particles ``ε_i`` and ``N′`` fresh particles
``ε′_j``, the descent direction for particle ``i`` (``E = −log p``) is

    g_i = (1/N′) Σ_j [ k(ε′_j, ε_i) ∇_x E(f(ε′_j)) − J_f(ε′_j)^{-T} ∇_{ε′_j} k(ε′_j, ε_i) ]

with an RBF kernel on noise space. It is pulled back to θ by minimising
``(1/N) Σ_i ⟨stop_gradient(g_i), f_θ(ε_i)⟩``. ``J^{-T} v`` is solved exactly or predicted
by a helper network trained on ``mean ‖J_fᵀ h_η − v‖²``. The helper is residual and
positively homogeneous in ``v``, ``h_η(ε, v) = v / λ + ‖v‖ · MLP_η(ε_{1:k}, v / ‖v‖)``, where
the reference code predicts ``J^{-T} v`` from scratch: it starts from the answer that is
exact for a flat ``g_θ``, learns only the correction, and sees unit-scale inputs however
small the kernel gradients ``v`` get in high dimension.
Amortized SVGD (Wang & Liu, 2016) is the same formula with the kernel on outputs and
``J ≡ I``.

References: Ratzlaff, Bai, Fuxin & Xu (ICML 2021), "Generative particle variational
inference via estimation of functional gradients", eqs. (5), (9)–(11); Wang & Liu (2016),
"Learning to draw samples: with application to amortized MLE for generative adversarial
learning".
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from numpyro_dais.engine.validation import check_choice
from numpyro_dais.engine.vi import networks
from numpyro_dais.engine.vi.kernels import RBF, ksd_u_statistic

JACOBIANS = ("exact", "helper")
ALGORITHMS = ("gpvi", "amortized_svgd")
MONITORS = ("ksd", "energy")


class Direction(NamedTuple):
    """Output of :func:`gpvi_direction` and :func:`amortized_svgd_direction`."""

    g: jax.Array  # (N, D) descent direction per update particle (no gradient)
    helper_loss: jax.Array  # () helper loss, differentiable in η; may be non-finite (0 w/o helper)
    helper_rel_loss: jax.Array  # () helper loss / mean ‖v‖² (1 = as bad as predicting 0)
    num_fallback: jax.Array  # () fresh particles whose J^{-T} v fell back to v / λ


def functional_gradient(K: jax.Array, score_prime: jax.Array, repulsion: jax.Array):
    """``g_i = (1/N′) Σ_j [−K_ji ∇log p(x′_j) − repulsion_ji]``.

    ``K (N′, N)``, ``score_prime (N′, D)``, ``repulsion (N′, N, D)`` → ``(N, D)``.
    """
    return -(K.T @ score_prime + jnp.sum(repulsion, axis=0)) / K.shape[0]


def inverse_transpose_exact(f: Callable, eps_prime: jax.Array, V: jax.Array) -> jax.Array:
    """``J_f(ε′_j)^{-T} V_ji`` by ``jnp.linalg.solve`` on ``jax.jacfwd(f)``.

    ``eps_prime (N′, D)``, ``V (N′, N, D)`` → ``(N′, N, D)``. Cost ``O(N′ D³ + N′ N D²)``.
    """

    def one(eps_j, V_j):
        J = jax.jacfwd(f)(eps_j)  # (D, D), J[a, b] = ∂f_a / ∂ε_b
        return jnp.linalg.solve(J.T, V_j.T).T

    return jax.vmap(one)(eps_prime, V)


def jacobian_transpose_product(f: Callable, eps_prime: jax.Array, W: jax.Array) -> jax.Array:
    """``J_f(ε′_j)ᵀ W_ji`` by one VJP per fresh particle: ``(N′, N, D)``."""

    def one(eps_j, W_j):
        _, vjp = jax.vjp(f, eps_j)
        return jax.vmap(lambda w: vjp(w)[0])(W_j)

    return jax.vmap(one)(eps_prime, W)


def helper_predict(helper_layers: list, eps_prime: jax.Array, V: jax.Array, lam) -> jax.Array:
    """The helper's estimate of ``J_f(ε′_j)^{-T} V_ji``: ``(N′, N, D)``.

    ``J^{-T} v`` is linear in ``v``, so the network sees ``v / ‖v‖`` and predicts the
    correction to ``v / λ`` (exact for a flat ``g_θ``), scaled back by ``‖v‖``: the estimate
    is positively homogeneous in ``v`` and equals ``v / λ`` when the network outputs 0.
    """
    k = helper_layers[0][0].shape[0]
    norm = jnp.linalg.norm(V, axis=-1, keepdims=True)
    unit = V / jnp.maximum(norm, jnp.finfo(V.dtype).tiny)
    return V / lam + norm * networks.helper_apply(helper_layers, eps_prime[:, None, :k], unit)


def helper_loss(f: Callable, eps_prime: jax.Array, V: jax.Array, W: jax.Array) -> jax.Array:
    """``mean_{j,i} ‖J_f(ε′_j)ᵀ W_ji − V_ji‖²`` with ``W = h_η(ε′_j, V_ji)`` (eq. 10)."""
    r = jacobian_transpose_product(f, eps_prime, W) - V
    return jnp.mean(jnp.sum(r * r, axis=-1))


def gpvi_direction(
    f: Callable,
    eps: jax.Array,
    eps_prime: jax.Array,
    score_prime: jax.Array,
    *,
    lam,
    jacobian: str = "exact",
    helper_layers: list | None = None,
    max_helper_rel_loss: float = 100.0,
) -> Direction:
    """GPVI descent direction ``g (N, D)`` (Ratzlaff et al. 2021, eq. 9).

    :param f: the generator ``ε (D,) → x (D,)`` with θ held fixed (stop-gradient).
    :param eps: update noise ``ε_i (N, D)``.
    :param eps_prime: fresh noise ``ε′_j (N′, D)``; ``score_prime = ∇ log p(f(ε′_j)) (N′, D)``.
    :param lam: the generator's skip weight λ; ``v / λ`` is the fallback for ``J^{-T} v``
        (exact when ``g_θ`` is flat) where a solve is not finite or the helper diverged.
    :param jacobian: ``"exact"`` or ``"helper"`` (then ``helper_layers`` are η; the helper's
        current prediction is used, and its loss at the current η is returned so that the
        caller can update η in the same step).
    :param max_helper_rel_loss: the helper counts as diverged when its loss is not finite or
        exceeds this multiple of ``mean ‖v‖²`` (the loss of predicting 0).
    """
    eps = jax.lax.stop_gradient(eps)
    eps_prime = jax.lax.stop_gradient(eps_prime)
    score_prime = jax.lax.stop_gradient(score_prime)
    kern = RBF(eps_prime, eps)
    V = kern.grad_first  # (N′, N, D) ∇_{ε′_j} k(ε′_j, ε_i)
    fallback = V / lam
    zero = jnp.zeros((), eps.dtype)
    if jacobian == "exact":
        R = inverse_transpose_exact(f, eps_prime, V)
        ok = jnp.all(jnp.isfinite(R), axis=(1, 2))  # (N′,)
        R = jnp.where(ok[:, None, None], R, fallback)
        loss, rel = zero, zero
        num_fallback = jnp.sum(~ok)
    elif jacobian == "helper":
        W = helper_predict(helper_layers, eps_prime, V, lam)
        loss = helper_loss(f, eps_prime, V, W)
        rel = jax.lax.stop_gradient(loss) / jnp.maximum(
            jnp.mean(jnp.sum(V * V, axis=-1)), jnp.finfo(V.dtype).tiny
        )
        ok = jnp.isfinite(rel) & (rel <= max_helper_rel_loss) & jnp.all(jnp.isfinite(W))
        R = jnp.where(ok, jax.lax.stop_gradient(W), fallback)
        num_fallback = jnp.where(ok, 0, eps_prime.shape[0])
    else:
        check_choice("jacobian", jacobian, JACOBIANS)
    g = functional_gradient(kern.K, score_prime, R)
    return Direction(jax.lax.stop_gradient(g), loss, rel, num_fallback)


def amortized_svgd_direction(x: jax.Array, x_prime: jax.Array, score_prime: jax.Array) -> Direction:
    """Amortized SVGD direction: kernel on outputs ``x (N, D)``, ``x′ (N′, D)`` and ``J ≡ I``.

    ``g_i = (1/N′) Σ_j [−k(x′_j, x_i) ∇log p(x′_j) − ∇_{x′_j} k(x′_j, x_i)]`` (eq. 13, negated).
    """
    x = jax.lax.stop_gradient(x)
    x_prime = jax.lax.stop_gradient(x_prime)
    kern = RBF(x_prime, x)
    g = functional_gradient(kern.K, jax.lax.stop_gradient(score_prime), kern.grad_first)
    zero = jnp.zeros((), x.dtype)
    return Direction(jax.lax.stop_gradient(g), zero, zero, jnp.zeros((), jnp.int32))


def _return_score(z: jax.Array, finite: jax.Array) -> jax.Array:
    """``(N′, D)`` score used where ``ℓ`` or ``∇ℓ`` is not finite: that of the Gaussian
    moment-matched to the finite particles, ``−(z − m) / v``. It carries particles that strayed
    into a region where the model's density is undefined back towards the others, instead of
    leaving them to drift (with a zero score only the kernel's repulsion acts on them, which
    pushes them further in). All particles non-finite: zero (nothing to return to)."""
    z = jax.lax.stop_gradient(z)
    w = finite.astype(z.dtype)[:, None]
    n = jnp.maximum(jnp.sum(w), 1.0)
    m = jnp.sum(w * z, axis=0) / n
    v = jnp.sum(w * (z - m) ** 2, axis=0) / n + 1e-6
    return jnp.where(jnp.any(finite), -(z - m) / v, 0.0)


def _after(x: jax.Array, y):
    """``y``, made to depend on ``x``'s value so that XLA computes it after ``x``.

    The generator's Jacobian work (the ``J⁻ᵀ`` solves, the helper) needs only ε′, so XLA:CPU
    runs it beside the likelihood's gradients, and on a few cores the two slow each other
    down (the AutoGPVI guide page has the measurement). ``lax.optimization_barrier`` does
    not order them (XLA:CPU drops it); a zero computed from ``x`` does, and XLA cannot fold
    ``0 · x`` away for floats. ``x`` must be finite (the scores are, after
    :func:`_return_score`).
    """
    zero = 0.0 * jnp.sum(jax.lax.stop_gradient(x))
    return jax.tree.map(lambda a: a + zero.astype(a.dtype), y)


class Objective(NamedTuple):
    """One training step of a generator: :func:`objective`'s output."""

    surrogate: jax.Array  # () its gradient is the update (θ, η, model parameters)
    monitor: jax.Array  # () the value to report (KSD² or mean energy; no gradient)
    z_prime: jax.Array  # (N′, D) the fresh particles f_θ(ε′_j) (θ stopped)
    log_joint: jax.Array  # (N′,) ℓ(z′_j), differentiable in the model's parameters
    num_nonfinite: jax.Array  # () fresh particles with a non-finite ℓ or ∇ℓ (left out)
    direction: Direction  # the functional gradient and the helper's diagnostics


def objective(
    f: Callable,
    f_fixed: Callable,
    log_joint: Callable,
    eps: jax.Array,
    eps_prime: jax.Array,
    *,
    lam,
    algorithm: str = "gpvi",
    jacobian: str = "exact",
    helper_layers: list | None = None,
    max_helper_rel_loss: float = 100.0,
    monitor: str = "ksd",
) -> Objective:
    """The surrogate whose gradient is one GPVI (or amortized SVGD) step, and a monitor.

    :param f: the generator ``ε (D,) → z (D,)``, differentiable in θ.
    :param f_fixed: the same generator with θ (and λ) held fixed.
    :param log_joint: ``ℓ(z)``, differentiable in the model's own parameters.
    :param eps: update noise ``ε_i (N, D)``; ``eps_prime``: fresh noise ``ε′_j (N′, D)``.
    :return: gradients of ``surrogate``: θ gets ``∇_θ (1/N) Σ_i ⟨g_i, f_θ(ε_i)⟩`` (the
        pull-back of the direction ``g``), the helper η its loss, the model's parameters
        ``−∇ mean_j ℓ(z′_j)`` at stopped particles. Particles with a non-finite ``ℓ`` or
        ``∇ℓ`` are left out of the latter and, in the direction, follow the score of the
        Gaussian moment-matched to the finite particles (back towards them).
    """
    check_choice("algorithm", algorithm, ALGORITHMS)
    check_choice("monitor", monitor, MONITORS)
    z_prime = jax.vmap(f_fixed)(eps_prime)
    ell, score = jax.vmap(jax.value_and_grad(log_joint))(z_prime)
    finite = jnp.isfinite(ell) & jnp.all(jnp.isfinite(score), axis=-1)
    score = jnp.where(finite[:, None], jax.lax.stop_gradient(score), _return_score(z_prime, finite))
    mean_ell = jnp.sum(jnp.where(finite, ell, 0.0)) / jnp.maximum(jnp.sum(finite), 1)
    if algorithm == "gpvi":
        eps, eps_prime = _after(score, (eps, eps_prime))
        out = gpvi_direction(
            f_fixed,
            eps,
            eps_prime,
            score,
            lam=jax.lax.stop_gradient(lam),
            jacobian=jacobian,
            helper_layers=helper_layers,
            max_helper_rel_loss=max_helper_rel_loss,
        )
    else:
        out = amortized_svgd_direction(jax.vmap(f_fixed)(eps), z_prime, score)
    surrogate = (
        jnp.mean(jnp.sum(out.g * jax.vmap(f)(eps), axis=-1))
        + jnp.where(jnp.isfinite(out.helper_loss), out.helper_loss, 0.0)
        - mean_ell
    )
    value = ksd_u_statistic(z_prime, score) if monitor == "ksd" else -mean_ell
    return Objective(surrogate, jax.lax.stop_gradient(value), z_prime, ell, jnp.sum(~finite), out)
