"""The training objective of the annealed guides: the bound, the DAIS₀ term and the brake.

References: Geffner & Domke (2021), the DAIS bound; Zenn & Bamler (2024), DAIS₀'s
symmetrised-KL term.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.sampling import Call, Fitted
from numpyro_dais.engine.annealing import dais0, gaussian
from numpyro_dais.engine.setup import preconditioning
from numpyro_dais.runtime.reporting import report_diverged


class LossCall(NamedTuple):
    """What a training call of an annealed guide hands its loss term: the ``fitted``
    parameters (non-finite gradients zeroed), the step sizes before that guard (for the
    divergence brake) and the model's mini-batch, opened by the guide (``None``: not opened;
    the model draws its own). The loss term binds them into a :class:`Call`."""

    fitted: Fitted
    step_sizes: jax.Array
    batch: dict | None


def divergence_brake(step_sizes, fraction):
    """``f · (b − stop(b))``, ``b = −Σ_k log η_k``: zero in value; in gradient, a push of
    every step size down by ``f / η_k``, ``f`` the fraction of the step's particles that
    diverged (0 on a healthy step).

    A diverged particle is dropped from the bound, so the bound's gradient never learns that
    its steps were too long; worse, its non-finite values turn the shared parameters'
    gradients non-finite, which are then zeroed. Left alone, a run whose learnt steps drift
    into instability can lose every particle on every later step and stop learning with a
    non-finite loss. The brake acts on the step sizes as they were before the NaN guard, so
    it is the one gradient they get on such a step, and it shortens them until trajectories
    stay stable again."""
    brake = -jnp.sum(jnp.log(step_sizes))
    return jax.lax.stop_gradient(fraction) * (brake - jax.lax.stop_gradient(brake))


def step_info(kernel, curvature, eta_max):
    """What the step sizes are and how to fix them, for divergence warnings (``kernel``: a
    :class:`~numpyro_dais.engine.base.Kernel`)."""
    power = "1 / sqrt(λ)" if kernel.momentum else "1 / λ"
    if curvature is None:
        return (
            f"The step sizes are capped at eta_max = {eta_max:.3g} (given): lower "
            "`eta_max` and `eta_init`, or leave both unset to derive them from the "
            "posterior's curvature."
        )
    return (
        f"The curvature measured at set-up, λ ≈ {curvature:.3g}, set eta_max = "
        f"{power} = {eta_max:.3g}; the posterior is stiffer than at the initial point: "
        "pass a smaller `eta_max` (and `eta_init`), or start nearer the posterior "
        "(`init_loc_fn=init_to_median`)."
    )


def bound(call: Call, rng_key):
    """One particle ``z*`` ``(D,)`` for the model, the log weight ``ℓ(z*) − objective`` that
    makes the ELBO equal the objective (the bound plus the symmetrised-KL term), and the
    fraction of particles that diverged.

    A mini-batch target's control variate ``c`` (:meth:`~numpyro_dais.annealed.targets.Surrogate.
    correction`, on the model's mini-batch that the call is bound to) joins the final term:
    inside the weights for ``N > 1``; for ``N = 1``, where the model's own term is the final
    term, in the objective."""
    # one split for every key of the step (each split is a generator in the program)
    key_target, key_run, key_sym, key_pick = jax.random.split(rng_key, 4)
    N = call.num_particles
    final = "omit" if N == 1 else "target"  # N = 1: the model's own term supplies ℓ(z_K)
    whitened = sampling.run_whitened(call, key_run, key_target, N, final)
    out = sampling.out_in_z(call.fitted.affine, whitened, call.mesh)
    correction = call.target.correction
    objective = out.log_Z + sym_kl_term(call, whitened, key_sym)
    if correction is not None and N == 1:
        objective += correction(out.z[0])
    if call.divergence_info is not None:  # adds 0.0: the loss keeps the check in the program
        objective += report_diverged(call.name, out.num_diverged, N, call.divergence_info)
    # Hand one particle to the model, picked by its weight (so the model's deterministic
    # sites see a posterior-like draw). The factor makes the ELBO equal the objective:
    # ELBO = ℓ(z*) − (ℓ(z*) − objective).
    if N == 1:
        idx = 0
    else:
        idx = jax.random.categorical(key_pick, jax.lax.stop_gradient(out.log_weights))
    own = out.log_final_target[idx]  # the model's term at z*: without the control variate
    if correction is not None and N > 1:
        own -= correction(out.z[idx])
    return out.z[idx], own - objective, out.num_diverged / N


def sym_kl_term(call: Call, whitened, rng_key):
    """``−(w / K) · Ĵ`` with value 0: only its gradient in ``q0``'s location counts.

    ``Ĵ`` estimates ``KL(q0 ‖ p) + KL(p ‖ q0)``
    (:func:`~numpyro_dais.engine.annealing.dais0.symmetrized_kl`) for the posterior of the target's
    anchor (:meth:`~numpyro_dais.annealed.targets.FullData.anchor`: the full-data log joint, or for
    a mini-batch target its unbiased estimate on the call's batch, never a surrogate's). The term
    anchors the location, where learnt transitions make the bound flat; the scale follows the bound
    alone, whose finite-K optimum sits nearer the posterior's marginal stds than the
    symmetrised-KL fit does. The model's parameters, the scale, the particles and the weights are
    held fixed in it, so the transitions and the model see only the bound. ``whitened``: the
    particle system in the sampler's coordinates
    (:func:`~numpyro_dais.annealed.sampling.run_whitened`), where the term is evaluated (the
    symmetrised KL is invariant under the whitening, and ``q0`` is diagonal or triangular there).
    """
    if not call.sym_kl_weight:
        return 0.0
    q0, affine = call.fitted.q0, call.fitted.affine
    anchor = call.target.anchor(rng_key)
    if affine is not None:
        anchor = preconditioning.pull_back(affine, anchor)
    located = q0._replace(scale=jax.lax.stop_gradient(q0.scale))
    u0 = q0.loc + jax.lax.stop_gradient(whitened.z0 - q0.loc)  # moves with the loc
    J = dais0.symmetrized_kl(
        lambda u: gaussian.log_prob(located, u), anchor, u0, whitened.z, whitened.log_weights
    )
    return -(call.sym_kl_weight / call.K) * (J - jax.lax.stop_gradient(J))
