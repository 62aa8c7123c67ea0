"""The engine's shared types: what kernels, samplers and targets exchange.

A kernel (:mod:`.annealing.transitions`) moves one :class:`ParticleState` with its noise, the
:class:`StepParams` of its transition and a :class:`Potential`, and returns the new state and a
:class:`TransitionInfo`; a :class:`Kernel` bundles it with what a sampler must know of it. A
sampler (:mod:`.annealing.dais`, :mod:`.smc.smc`) runs ``K`` kernels with :class:`AnnealParams` on a
:class:`Target` (and, for SMC, a :class:`ResamplingConfig`) and returns a
:class:`SamplerOutput`. Nothing here computes anything.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax

# -- one transition ------------------------------------------------------------------------


class Potential(NamedTuple):
    """The two ends of the annealing path, each ``z (D,) -> scalar``."""

    log_q0: Callable
    log_target: Callable  # ℓ(z) used by the dynamics (the full or surrogate log joint)


class ParticleState(NamedTuple):
    z: jax.Array  # (D,) position
    v: jax.Array  # (D,) momentum (zeros for Langevin)
    log_q0: jax.Array  # () log q0(z)       — tracked only when needed
    log_target: jax.Array  # () ℓ(z)         — tracked only when needed
    grad_log_q0: jax.Array  # (D,) ∇ log q0(z) — Langevin only
    grad_log_target: jax.Array  # (D,) ∇ ℓ(z)  — Langevin only


class StepParams(NamedTuple):
    """Parameters of transition ``k`` (scalars unless noted)."""

    beta_prev: jax.Array  # β_{k-1}
    beta: jax.Array  # β_k
    step_size: jax.Array  # η_k (HMC) or δ_k (Langevin)
    mass: jax.Array  # (D,) diagonal mass matrix m (HMC only)
    gamma: jax.Array  # γ ∈ (0, 1) momentum damping of the partial refresh (HMC only)


class TransitionInfo(NamedTuple):
    delta: jax.Array  # () Δ_k
    log_increment: jax.Array  # () log w̃_k, or 0 when not tracked
    log_target_eval: jax.Array  # () ℓ where the step took ∇ℓ (HMC: the leapfrog's midpoint;
    #                             Langevin: z_k), a by-product of the gradient


class Kernel(NamedTuple):
    """A transition and what a sampler must know of it.

    ``transition(noise, state, step, potential, track) -> (state, TransitionInfo)`` moves
    one particle with its ``(D,)`` standard normal ``noise``."""

    transition: Callable
    momentum: bool
    """Whether particles carry a momentum ``v ~ N(0, M)`` (HMC: a mass matrix and a damping
    are learnt, and the step size scales as ``1 / sqrt(λ)`` of the curvature)."""
    exact_energy: bool
    """Whether the state holds ``ℓ`` at its position after each step (Langevin), so the
    final term and the energy check need no extra evaluation."""


# -- a sampler run ----------------------------------------------------------------------------


class AnnealParams(NamedTuple):
    """Learnable annealing parameters shared by all particles."""

    betas: jax.Array  # (K + 1,) 0 = β_0 < … < β_K = 1
    step_sizes: jax.Array  # (K,)
    mass: jax.Array  # (D,) diagonal mass matrix (ignored by Langevin)
    gamma: jax.Array  # () momentum damping γ of the partial refresh (ignored by Langevin)

    @property
    def K(self) -> int:
        return self.step_sizes.shape[0]


class Target(NamedTuple):
    """What a sampler anneals to: ``log_dynamics`` drives the transitions, ``log_final``
    enters the final weight (``None``: the same). Both map ``z (D,) -> scalar``.

    Full-data DAIS uses the log joint for both; SL-DAIS a surrogate for the dynamics and the
    model's mini-batch estimate for the final weight; a guide whose model term supplies
    ``ℓ(z_K)`` itself passes :func:`.annealing.dais.omit_final`.
    """

    log_dynamics: Callable
    log_final: Callable | None = None


class Trace(NamedTuple):
    """Per-transition record of a run (SMC always; DAIS with ``track_increments``)."""

    ess: jax.Array  # (K,) ESS of the weights after transition k
    resampled: jax.Array  # (K,) bool: resampled just before transition k
    ancestors: jax.Array  # (K, N) int32 ancestor of each slot before transition k
    log_increments: jax.Array  # (K, N) log w̃_k (diverged entries -inf)


class SamplerOutput(NamedTuple):
    """What every sampler returns, for one system of ``N`` particles."""

    z0: jax.Array  # (N, D) initial particles, draws of q0
    z: jax.Array  # (N, D) final particles z_K
    log_weights: jax.Array  # (N,) final log weights; log-mean-exp = log_Z; diverged: -inf
    log_final_target: jax.Array  # (N,) the final term at z_K (target.log_final)
    log_Z: jax.Array  # () the bound's value, log (1/N) Σ_i w_i (DAIS) or the SMC L
    ess: jax.Array  # () effective sample size of the final weights
    num_diverged: jax.Array  # () particles dropped (non-finite weight or energy blow-up)
    trace: Trace | None  # per-transition record, or None


class ResamplingConfig(NamedTuple):
    """How and when an SMC system resamples (:func:`smc.resampling.resolve` validates it and
    turns names into functions, once, before a run).

    ``scheme``: an ancestor sampler ``(key, log_W) -> (N,)`` or its name,
    ``"multinomial"``, ``"systematic"`` or ``"stratified"``; ``when``: a decision rule
    ``(key, log_W, ess_threshold) -> bool`` or its name, ``"always"``, ``"ess"``
    (ESS < ``ess_threshold`` · N), ``"bernoulli"`` (with probability
    ``1 − (ESS − 1)/(N − 1)``) or ``"never"``; ``gradient``: ``"stop"`` (ancestors carry no
    gradient) or ``"gst"`` (gapped straight-through, Fan et al. 2022, with
    ``gst_temperature`` and ``gst_gap``).
    """

    scheme: "str | Callable" = "multinomial"
    when: "str | Callable" = "bernoulli"
    ess_threshold: float = 0.5
    gradient: str = "stop"
    gst_temperature: float = 0.1
    gst_gap: float = 1.0
