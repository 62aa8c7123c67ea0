"""The control variate of ``AutoSemiDAIS``'s mini-batch sum over the plate's members.

The bound's local part is ``Σ_n log w_n(θ)`` over all ``N`` members, estimated from a batch of
``B`` as ``(N / B) Σ_{n ∈ b} log w_n(θ)``; its noise is the spread of the members' terms. With a
fit ``c_n(θ) = a_n + s_n·θ`` of each member's term, kept from the member's last visit, the
estimate ``(N / B) Σ_{n ∈ b} (log w_n(θ) − c_n(θ)) + Σ_n c_n(θ)`` has the same expectation for
any fits (the batch is uniform), and the full sum is two running totals, ``Σ a_n`` and
``Σ s_n``, updated with the batch (``O(B)`` per step). Only the residuals' spread is left: what
``θ`` moved since the member's last visit beyond the linear fit, and the chains' own noise. The
value and the gradient both lose the members' spread, so the loss that the stopping rule of
:func:`~numpyro_dais.run_until_converged` reads, and the globals' gradient, are far less noisy.

``θ`` is the float inputs of the local model (what the global model returns, and the local
model's parameters). The fits are numpyro mutable state (``numpyro.mutable``), which ``SVI``
carries from step to step with ``Trace_ELBO`` and ``TraceMeanField_ELBO`` at
``num_particles=1``.

Reference: Defazio, Bach & Lacoste-Julien (2014), "SAGA: a fast incremental gradient method
with support for non-strongly convex composite objectives" (a table of the members' last
gradients, whose total corrects the batch's).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro

from numpyro_dais.semidais import sites

#: The control variate's per-member slopes cover at most this many floats of the local
#: model's inputs (the globals it receives and its parameters); beyond them it is a fit of
#: the value alone in those coordinates (memory ``N ×`` this, and as many forward passes).
CONTROL_VARIATE_SLOPES = 64


class MemberFits(NamedTuple):
    """This visit's linear fits of the batch's terms in the local model's float inputs
    ``θ``: the term ``log w_n`` (whole: ``ℓ_n`` at the end point included) ``(B,)``, its
    slope ``s_n (B, P)`` and where both are finite ``(B,)``."""

    term: jax.Array
    slope: jax.Array
    ok: jax.Array


def statistics(log_density, operands, z, log_w, loc) -> MemberFits:
    """:class:`MemberFits` of a batch: the term from the emitted ``log_w`` (which leaves
    ``ℓ_n(z)`` to the model) plus ``ℓ_n(z)``; the slope ``∂ℓ_n(loc_n; θ)/∂θ`` at the base's
    mean ``loc (B, D)``, a noise-free stand-in for the term's own (for the Laplace base, the
    local marginal's score up to its curvature term), over the first
    :data:`CONTROL_VARIATE_SLOPES` floats of ``θ``. No gradient flows through either."""
    operands = sites.stop_float_gradients(operands)
    z, log_w, loc = jax.lax.stop_gradient((z, log_w, loc))
    term = log_w + log_density(z, operands)
    theta, rebuild = sites.float_vector(operands)
    P = min(theta.shape[0], CONTROL_VARIATE_SLOPES)
    if P == 0:
        slope = jnp.zeros((z.shape[0], 0), z.dtype)
    else:
        rest = theta[P:]
        slope = jax.jacfwd(lambda t: log_density(loc, rebuild(jnp.concatenate([t, rest]))))(
            theta[:P]
        )
    ok = jnp.isfinite(term) & jnp.all(jnp.isfinite(slope), axis=-1)
    return MemberFits(jnp.where(ok, term, 0.0), jnp.where(ok[:, None], slope, 0.0), ok)


def control_variate(prefix, size, idx, stats: MemberFits, operands):
    """The control variate of the batch's terms: ``c_n(θ) (B,)``, each member's linear
    fit ``a_n + s_n·θ`` from its last visit, and its sum over the whole plate
    ``Σ_n c_n(θ)`` (two running totals); both differentiable in ``θ``. Stores this
    visit's fits (numpyro mutable state, updated by ``SVI`` with the step)."""
    theta = sites.float_vector(operands)[0][: stats.slope.shape[-1]]
    N, P = size, theta.shape[0]
    init = {
        "value": jnp.zeros(N),
        "slope": jnp.zeros((N, P)),
        "total_value": jnp.zeros(()),
        "total_slope": jnp.zeros(P),
    }
    state = numpyro.primitives.mutable(f"{prefix}_control_variate", init)
    old_value, old_slope = state["value"][idx], state["slope"][idx]
    c = old_value + old_slope @ theta
    total = state["total_value"] + state["total_slope"] @ theta
    here = jax.lax.stop_gradient(theta)
    value = jnp.where(stats.ok, stats.term - stats.slope @ here, old_value)
    slope = jnp.where(stats.ok[:, None], stats.slope, old_slope)
    state["value"] = state["value"].at[idx].set(value)
    state["slope"] = state["slope"].at[idx].set(slope)
    state["total_value"] = state["total_value"] + jnp.sum(value - old_value)
    state["total_slope"] = state["total_slope"] + jnp.sum(slope - old_slope, axis=0)
    return c, total
