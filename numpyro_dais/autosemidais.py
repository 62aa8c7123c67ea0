"""``AutoSemiDAIS``: a parametric guide for the global latents and, given them, one DAIS
chain per member of a (mini-batched) local plate over that member's local latents.

For global latents ``θ ~ q(θ)`` and each member ``n`` of the batch ``b`` (``B`` of ``N``),
a chain from ``q0_n(u_n)`` to ``p(x_n, u_n | θ)`` gives a log weight ``log w_n`` with
``E[w_n] = p(x_n | θ)``; the bound is

    L = E_q(θ)[ log p(θ) − log q(θ) + (N / B) Σ_{n ∈ b} log w_n ],

unbiased under subsampling of the plate, since each chain depends on its member alone.

References: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling", §7.6 and appendix A.1; Geffner & Domke (2021), "MCMC variational
inference via uncorrected Hamiltonian annealing"; Geffner & Domke (2022), "Variational
inference with locally enhanced bounds for hierarchical models".
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform

from numpyro_dais import _numpyro, _objective
from numpyro_dais import _semidais_sites as sites
from numpyro_dais._checks import check_positive_float, check_positive_int, check_step_sizes
from numpyro_dais._reporting import report_diverged
from numpyro_dais._semidais_queries import SemiDAISQueries
from numpyro_dais._semidais_setup import SemiDAISSetUp
from numpyro_dais._vectorise import CompiledPrograms
from numpyro_dais.engine import dais, gaussian, transitions, weights
from numpyro_dais.engine.annealing import betas_from_increments

__all__ = ["AutoSemiDAIS"]


class AutoSemiDAIS(SemiDAISSetUp, SemiDAISQueries, CompiledPrograms, _numpyro.AutoGuideBridge):
    """Semi-DAIS guide: ``global_guide`` for the global latents, a DAIS chain of ``K``
    transitions (our engine's, vmapped over the plate's members) for each member's local
    latents. Under ``SVI(model, guide, optim, Trace_ELBO())`` the loss is minus the
    Semi-DAIS bound (value and gradient), with the plate subsampled or not.

    A drop-in for numpyro's ``AutoSemiDAIS`` (same arguments and meaning) plus
    ``num_particles``, ``kernel`` and ``report_divergences``.

    :param model: a NumPyro model with global latents outside one local plate and local
        latents inside it.
    :param local_model: the part of ``model`` holding the local plate; called as
        ``local_model(global_model(*args, **kwargs))`` when there is a global guide, else as
        ``local_model(*args, **kwargs)``.
    :param global_guide: a guide of the global latents (e.g. ``AutoNormal(global_model)``);
        ``global_guide.model`` is the global model. ``None`` only for a model without
        global latents.
    :param local_guide: an amortised base ``q0`` of the local latents (e.g. an encoder):
        a guide taking ``local_model``'s arguments whose local sites are Normal in
        unconstrained space (``dist.Normal``, or ``AutoNormal``'s transformed Normal).
        ``None``: a learnt diagonal Gaussian per member (``{prefix}_z_0_loc``,
        ``{prefix}_z_0_scale``, shape ``(N, D)``).
    :param int K: transitions per chain. 8 by default (numpyro's is 4): on a conjugate
        model whose local posteriors shift with the globals, ``q(θ)``'s sd came out 0.79 of
        the exact one with K = 4 and 0.91 with K = 8 (each chain's start does not follow
        θ, so its gap grows away from the centre and narrows ``q(θ)``; more transitions
        close it, as does a ``local_guide`` that takes the globals).
    :param float eta_init: initial step size; ``eta_max`` its cap. ``None`` (the default):
        ``eta_max = 1 / sqrt(λ)``, half the leapfrog's stability limit for the median over
        the set-up batch's members of the largest curvature ``λ_n`` of their local log
        densities at the model's prior medians (a typical point: the initial one is random,
        and its curvature swung the cap tenfold between seeds); ``eta_init`` the smaller of
        ``eta_max / 4`` and ``init_scale``. Stiffer members' steps are braked if they
        diverge. numpyro's defaults are 0.01 and 0.1.
    :param float gamma_init: initial momentum damping ``γ`` in (0, 1).
    :param float init_scale: initial scale of ``q0`` (without ``local_guide``).
    :param str subsample_plate: name of the local plate; needed when no plate subsamples
        and the model has several plates.
    :param bool use_global_dais_params: one set of annealing parameters for all members
        (``True``) or one per member of the full plate (``False``, the default).
    :param int num_particles: chains per member ``P``: the member's term is
        ``log (1/P) Σ_i w_{n,i}``, a tighter bound of ``log p(x_n | θ)`` (IWAE per member; the
        bound stays unbiased under subsampling), and the local draws are resampled by those
        weights; the cost grows as ``P``. 1 (the default) is numpyro's.
    :param str kernel: ``"hmc"`` (uncorrected HMC, partial momentum refresh) or
        ``"langevin"``.
    :param str prefix: prefix of the parameter names (``{prefix}_step_size``, ...).
    :param bool forward_mode_differentiation: as numpyro's autoguides, for the set-up.
    :param bool report_divergences: warn (``RuntimeWarning``) from inside the jitted step
        when chains diverged. A diverged chain always falls back to its start for that step
        (its term is the ``K = 0`` bound, ``log p(x_n, z_0 | θ) − log q0(z_0)``) and its
        step sizes are pushed down (:func:`numpyro_dais._objective.divergence_brake`).
    """

    def __init__(
        self,
        model,
        local_model,
        global_guide=None,
        local_guide=None,
        K=8,
        eta_init=None,
        eta_max=None,
        gamma_init=0.9,
        init_scale=0.1,
        subsample_plate=None,
        use_global_dais_params=False,
        *,
        num_particles=1,
        kernel="hmc",
        prefix="auto",
        forward_mode_differentiation=False,
        report_divergences=True,
    ):
        self.report_divergences = bool(report_divergences)
        self.K = check_positive_int("K", K)
        self.num_particles = check_positive_int("num_particles", num_particles)
        check_step_sizes(eta_init, eta_max)
        if not 0 < gamma_init < 1:
            raise ValueError(f"`gamma_init` must lie in (0, 1), got {gamma_init!r}.")
        self.init_scale = check_positive_float("init_scale", init_scale)
        if not callable(local_model):
            raise TypeError("`local_model` must be the callable part of `model` with the plate.")
        if global_guide is not None and not hasattr(global_guide, "model"):
            raise TypeError(
                "`global_guide` must be an autoguide of the global model (with a `.model`), "
                "e.g. AutoNormal(global_model)."
            )
        self._kernel = transitions.as_kernel(kernel)
        self.kernel = kernel
        self.local_model, self.global_guide, self.local_guide = (
            local_model,
            global_guide,
            local_guide,
        )
        self.eta_init, self.eta_max, self.gamma_init = eta_init, eta_max, gamma_init
        self.subsample_plate = subsample_plate
        self.use_global_dais_params = bool(use_global_dais_params)
        super().__init__(
            model,
            prefix=prefix,
            init_loc_fn=init_to_uniform,
            forward_mode_differentiation=forward_mode_differentiation,
        )

    # -- the guide ------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        self._set_up_once(args, kwargs)
        global_latents, local_args, local_kwargs = self._globals(args, kwargs)
        return {**global_latents, **self._locals(local_args, local_kwargs)}

    def _globals(self, args, kwargs):
        """Draws of the global guide, and the local model's arguments given them."""
        if self.global_guide is None:
            return {}, args, dict(kwargs)
        latents = self.global_guide(*args, **kwargs)
        with handlers.block(), handlers.substitute(data=latents):
            out = self.global_guide.model(*args, **kwargs)
        return latents, (out,), {}

    def _anneal_params(self, idx) -> dais.AnnealParams:
        """Per-member :class:`~numpyro_dais.engine.base.AnnealParams` (leading axis ``B``)."""
        p, K, D, lay = self.prefix, self.K, self._layout.D, self._layout
        lead = () if self.use_global_dais_params else (lay.size,)
        inc = numpyro.param(
            f"{p}_beta_increments", jnp.ones(lead + (K,)), constraint=constraints.positive
        )
        step = numpyro.param(
            f"{p}_step_size",
            jnp.full(lead + (K,), self._step_bounds[0]),
            constraint=constraints.interval(0.0, self._step_bounds[1]),
        )
        if self._kernel.momentum:
            mass = numpyro.param(
                f"{p}_mass_matrix", jnp.ones(lead + (D,)), constraint=constraints.positive
            )
            gamma = numpyro.param(
                f"{p}_gamma",
                jnp.full(lead, self.gamma_init),
                constraint=constraints.interval(0.0, 1.0),
            )
        else:
            mass, gamma = jnp.ones(lead + (D,)), jnp.zeros(lead)
        params = (inc, step, mass, gamma)
        B = idx.shape[0]
        if self.use_global_dais_params:
            params = tuple(jnp.broadcast_to(a, (B,) + jnp.shape(a)) for a in params)
        else:
            params = tuple(a[idx] for a in params)
        inc, step, mass, gamma = params
        # the batch's rows only (O(B), not O(N)): keep the geometric mean at 1, so that
        # training cannot undo the eta_max cap
        mass = mass / jnp.exp(jnp.mean(jnp.log(mass), axis=-1, keepdims=True))
        return dais.AnnealParams(jax.vmap(betas_from_increments)(inc), step, mass, gamma)

    def _base(self, idx, local_args, local_kwargs) -> gaussian.Gaussian:
        """``q0`` of each member: ``loc``, ``scale`` of shape ``(B, D)``."""
        lay, p = self._layout, self.prefix
        if self.local_guide is None:
            shape = (lay.size, lay.D)
            loc = numpyro.param(f"{p}_z_0_loc", jnp.zeros(shape))
            scale = numpyro.param(
                f"{p}_z_0_scale",
                jnp.full(shape, self.init_scale),
                constraint=constraints.positive,
            )
            return gaussian.Gaussian(loc[idx], scale[idx])
        key = numpyro.prng_key()
        seeded = handlers.seed(self.local_guide, key if key is not None else 0)
        # the local guide's params go to the optimiser; its draws are not the guide's
        with handlers.block(hide_fn=lambda msg: msg["type"] != "param"):
            with handlers.substitute(data={lay.plate: idx}), handlers.trace() as tr:
                with sites.substituted_plates():
                    seeded(*local_args, **local_kwargs)
        loc, scale = {}, {}
        for s in lay.sites:
            base = sites.normal_base(type(self).__name__, tr[s.name]["fn"], s.name)
            shape = jnp.shape(sites.unpack(lay, jnp.zeros((idx.shape[0], lay.D)))[s.name])
            loc[s.name] = jnp.broadcast_to(base.loc, shape)
            scale[s.name] = jnp.broadcast_to(base.scale, shape)
        return gaussian.Gaussian(sites.pack(lay, loc), sites.pack(lay, scale))

    def _locals(self, local_args, local_kwargs):
        """Run the chains on the plate's batch; emit the local sites and the log weights."""
        lay = self._layout
        params = {k: numpyro.param(k, value, **kw) for k, (value, kw) in self._local_params.items()}
        with sites.substituted_plates():  # a given set of members, any size
            plate = numpyro.plate(lay.plate, lay.size, subsample_size=lay.batch, dim=lay.dim)
        with plate as idx:  # the batch, drawn or substituted; q0 is built outside the plate
            pass
        q0 = self._base(idx, local_args, local_kwargs)
        anneal = self._anneal_params(idx)
        step_sizes = anneal.step_sizes  # before the guard: the brake's gradient survives it
        # a diverged chain must not turn the shared parameters' gradients into NaN
        q0, anneal = weights.zero_nonfinite_grads((q0, anneal))
        with plate:
            members = self._compiled(self._members)
            z, log_w, bad = members.run_for(
                self.K, numpyro.prng_key(), q0, anneal, idx, params, local_args, local_kwargs
            )
            values, log_det = sites.constrain(self.prototype_trace, lay, z)
            result = {}
            for s in lay.sites:
                delta = dist.Delta(
                    values[s.name], log_density=-log_det[s.name], event_dim=s.event_dim
                )
                result[s.name] = numpyro.sample(s.name, delta)
            fraction = jnp.mean(bad, axis=-1)
            log_w = log_w + jax.vmap(_objective.divergence_brake)(step_sizes, fraction)
            if self.report_divergences:  # adds 0.0: the loss keeps the check in the program
                log_w = log_w + self._report(bad)
            log_w = jnp.reshape(log_w, (-1,) + (1,) * (-lay.dim - 1))
            _numpyro.emit_log_weight(f"{self.prefix}_local_dais_factor", -log_w)
        return result

    def _report(self, diverged):
        info = (
            f"If this persists, lower `eta_init` and `eta_max` (now {self._step_bounds[0]:.3g} "
            f"and {self._step_bounds[1]:.3g}) below the local posterior's scale."
        )
        name = type(self).__name__
        return report_diverged(name, jnp.sum(diverged), diverged.size, info, fell_back=True)

    def _members(self, rng_key, q0, anneal, idx, params, local_args, local_kwargs):
        """:func:`member_terms` of the batch's chains (:meth:`_chains`): a pure function,
        compiled as one program (:meth:`_compiled`), so that a call of the guide outside
        ``jit`` (``svi.init``, ``Predictive``, ``sample_posterior``) runs it whole instead of
        operation by operation, each operation compiled on its own."""
        chain_key, select_key = jax.random.split(rng_key)
        out = self._chains(chain_key, q0, anneal, idx, params, local_args, local_kwargs)
        return member_terms(select_key, out)

    def _chains(self, rng_key, q0, anneal, idx, params, local_args, local_kwargs):
        """``num_particles`` DAIS chains per member (:func:`numpyro_dais.engine.dais.run`,
        vmapped over the batch). Member ``n``'s target is ``ℓ_n``
        (:func:`~numpyro_dais._semidais_sites.member_target`: the batch evaluated once per
        leapfrog step for all members). With one particle the weight omits ``ℓ_n(u_K)``,
        which the model's own term supplies; with several it is whole."""
        lay, B, trace, model = self._layout, idx.shape[0], self.prototype_trace, self.local_model
        P = self.num_particles

        def log_density(U, operands):
            args, kwargs, params = operands
            return sites.member_log_density(model, args, kwargs, trace, lay, idx, params, U)

        log_dynamics = sites.member_target(log_density, (local_args, local_kwargs, params))
        target = dais.Target(log_dynamics, dais.omit_final if P == 1 else None)

        def chain(key, loc, scale, anneal_n):
            q0_n = gaussian.Gaussian(loc, scale)
            out = dais.run(key, q0_n, target, anneal_n, P, kernel=self._kernel)
            log_q0_z0 = gaussian.log_prob(q0_n, out.z0)
            return Chains(out.z0, log_q0_z0, out.z, out.log_weights, out.log_final_target)

        keys = jax.random.split(rng_key, B)
        return jax.vmap(chain, axis_name=sites.MEMBERS)(keys, q0.loc, q0.scale, anneal)


class Chains(NamedTuple):
    """The members' chains, ``P`` particles each: start ``z0 (B, P, D)`` and
    ``log_q0_z0 (B, P)``, end ``z (B, P, D)``, ``log_w (B, P)`` (``-inf`` where diverged)
    and its final term ``log_final (B, P)`` (``ℓ_n(z_K)``; 0 with one particle, whose
    weight leaves it to the model)."""

    z0: jax.Array
    log_q0_z0: jax.Array
    z: jax.Array
    log_w: jax.Array
    log_final: jax.Array


def member_terms(rng_key, chains: Chains):
    """Each member's emitted end point ``(B, D)``, its weight without ``ℓ_n`` there
    ``(B,)`` (the model's own term supplies it), and the diverged particles ``(B, P)``.

    With ``P`` particles the member's term is ``log (1/P) Σ_i w_i`` (an importance-weighted
    bound of ``p(x_n | θ)``), emitted at one particle drawn by its weight (no gradient
    through the draw), whose ``ℓ_n`` cancels against the model's. A diverged particle has
    weight 0; a member whose particles all diverged keeps its first start, ``z_0``, for this
    step, and its term is the ``K = 0`` bound (finite loss, finite gradients)."""
    bad = ~jnp.isfinite(chains.log_w)
    lost = jnp.all(bad, axis=-1)
    if chains.log_w.shape[-1] == 1:
        j = jnp.zeros(bad.shape[:1], jnp.int32)
    else:
        logits = jax.lax.stop_gradient(jnp.where(lost[:, None], 0.0, chains.log_w))
        j = jax.random.categorical(rng_key, logits)
    pick = lambda a: jnp.take_along_axis(a, j.reshape((-1,) + (1,) * (a.ndim - 1)), 1)[:, 0]
    z = jnp.where(lost[:, None], chains.z0[:, 0], pick(chains.z))
    safe = jnp.where(lost[:, None], 0.0, chains.log_w)  # no NaN gradients where all are lost
    log_w = weights.log_mean_exp(safe, axis=-1) - pick(chains.log_final)
    return z, jnp.where(lost, -chains.log_q0_z0[:, 0], log_w), bad
