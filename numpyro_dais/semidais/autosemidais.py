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

from numpyro_dais.annealed import objective, sampling
from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.checks import check_positive_float, check_positive_int, check_step_sizes
from numpyro_dais.bridge.options import declare, parse
from numpyro_dais.bridge.template import DrawTemplate
from numpyro_dais.engine.annealing import dais, gaussian, transitions, weights
from numpyro_dais.engine.annealing.path import betas_from_increments
from numpyro_dais.runtime.reporting import report_diverged
from numpyro_dais.runtime.vectorise import CompiledPrograms
from numpyro_dais.semidais import cv, laplace, sites
from numpyro_dais.semidais.queries import SemiDAISQueries
from numpyro_dais.semidais.setup import SemiDAISSetUp

__all__ = ["AutoSemiDAIS"]


class SemiDAISOptions(NamedTuple):
    """AutoSemiDAIS's options and their defaults, documented on :class:`AutoSemiDAIS`; the
    first seven in the order of numpyro's positional arguments."""

    K: int = 8
    eta_init: float | None = None
    eta_max: float | None = None
    gamma_init: float = 0.9
    init_scale: float = 0.1
    subsample_plate: str | None = None
    use_global_dais_params: bool = True
    num_particles: int = 1
    kernel: str = "hmc"
    prefix: str = "auto"
    forward_mode_differentiation: bool = False
    report_divergences: bool = True
    base: str = "auto"
    control_variate: bool = True


@declare
class AutoSemiDAIS(
    SemiDAISSetUp, SemiDAISQueries, DrawTemplate, CompiledPrograms, numpyro_private.AutoGuideBridge
):
    """Semi-DAIS guide: ``global_guide`` for the global latents, a DAIS chain of ``K``
    transitions (our engine's, vmapped over the plate's members) for each member's local
    latents. Under ``SVI(model, guide, optim, Trace_ELBO())`` the loss is minus the
    Semi-DAIS bound (value and gradient), with the plate subsampled or not.

    A drop-in for numpyro's ``AutoSemiDAIS`` (same arguments and meaning) plus
    ``num_particles``, ``kernel``, ``report_divergences``, ``base`` and
    ``control_variate``. Two defaults differ from numpyro's: ``K = 8`` and
    ``use_global_dais_params=True``.

    By default (``base='auto'``, up to :data:`~numpyro_dais.semidais.setup.LAPLACE_MAX_DIM`
    local coordinates per member) each member's base ``q0`` is its local Laplace
    approximation given the drawn globals: one Newton step on ``ℓ_n(·; θ)`` from the member's
    expansion point, scales from the curvature there times one learnt factor per coordinate
    (:mod:`numpyro_dais.semidais.laplace`). The base follows ``θ``, so the chains' gap does
    not grow as ``θ`` moves away from the centre (which narrows ``q(θ)`` when it does), and
    it needs no per-member training, which a member visited once every ``N / B`` steps does
    not get. ``svi.init`` fits the globals by the nested Laplace approximation (the local
    latents integrated out member by member) and starts an ``AutoNormal`` global guide
    there, and every member's expansion point at its local mode. The mini-batch sum over the
    members carries a control variate (:mod:`numpyro_dais.semidais.cv`) that removes the
    spread between members from the loss and its gradient.

    :param model: a NumPyro model with global latents outside one local plate and local
        latents inside it.
    :param local_model: the part of ``model`` holding the local plate; called as
        ``local_model(global_model(*args, **kwargs))`` when there is a global guide, else as
        ``local_model(*args, **kwargs)``. ``None`` builds the guide, as numpyro's signature
        allows (``AutoGuideList`` then refuses it), and fails at its first call.
    :param global_guide: a guide of the global latents (e.g. ``AutoNormal(global_model)``);
        ``global_guide.model`` is the global model. ``None`` only for a model without
        global latents. An ``AutoNormal`` starts at the nested Laplace fit (Laplace base);
        other guides start at their own initial values.
    :param local_guide: an amortised base ``q0`` of the local latents (e.g. an encoder):
        a guide taking ``local_model``'s arguments whose local sites are Normal in
        unconstrained space (``dist.Normal``, or ``AutoNormal``'s transformed Normal).
        ``None``: the base of ``base``.
    :param int K: transitions per chain. 8 by default (numpyro's is 4).
    :param float eta_init: initial step size; ``eta_max`` its cap. ``None`` (the default):
        ``eta_max = 1 / sqrt(λ)``, half the leapfrog's stability limit for the median over
        members of the largest curvature ``λ_n`` of their local log densities, at their
        local modes with the Laplace base, else over the set-up batch at the model's prior
        medians (a typical point: the initial one is random, and its curvature swung the
        cap tenfold between seeds); ``eta_init`` is ``eta_max / 4``, with the learnt
        Gaussian base at most ``init_scale``. Stiffer members' steps are braked if they
        diverge. numpyro's defaults are 0.01 and 0.1.
    :param float gamma_init: initial momentum damping ``γ`` in (0, 1).
    :param float init_scale: initial scale of the learnt Gaussian base (``base='gaussian'``).
    :param str subsample_plate: name of the local plate; needed when no plate subsamples
        and the model has several plates.
    :param bool use_global_dais_params: one set of annealing parameters for all members
        (``True``, the default: trained on every step by the whole batch, and a step whose
        cost does not grow with ``N``) or one per member of the full plate (``False``,
        numpyro's default).
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
        step sizes are pushed down (:func:`numpyro_dais.annealed.objective.divergence_brake`).
    :param str base: the members' base without a ``local_guide``: ``"laplace"`` (above;
        ``{prefix}_z_0_loc (N, D)`` the expansion points, fixed at the set-up's local modes
        when its fit converged, ``{prefix}_z_0_scale (D,)`` the learnt factor), ``"gaussian"``
        (numpyro's: a learnt diagonal Gaussian per member, ``{prefix}_z_0_loc`` and
        ``{prefix}_z_0_scale`` of shape ``(N, D)``, started at 0 and ``init_scale``), or
        ``"auto"`` (the default: ``"laplace"`` up to ``LAPLACE_MAX_DIM`` coordinates per
        member, whose curvature costs ``D`` Hessian-vector products of the batch per step,
        else ``"gaussian"``).
    :param bool control_variate: carry the control variate of the mini-batch sum when the
        plate subsamples (default ``True``). Its fits are numpyro mutable state, which
        ``SVI`` carries with ``Trace_ELBO`` or ``TraceMeanField_ELBO`` at
        ``num_particles=1``; pass ``False`` for other ELBOs.
    """

    defaults = (SemiDAISOptions(),)
    #: numpyro's AutoSemiDAIS takes its first seven options by position too
    positional_options = 7

    def __init__(self, model, local_model=None, global_guide=None, local_guide=None, *args, **kw):
        """Build the guide: the options are AutoSemiDAIS's."""
        (o,) = parse(type(self), kw, args)
        base, K, kernel = o.base, o.K, o.kernel
        eta_init, eta_max, gamma_init = o.eta_init, o.eta_max, o.gamma_init
        if base not in ("auto", "laplace", "gaussian"):
            raise ValueError(f"`base` must be 'auto', 'laplace' or 'gaussian', got {base!r}.")
        self.base = base
        self.control_variate = bool(o.control_variate)
        self._querying = False
        self.report_divergences = bool(o.report_divergences)
        self.K = check_positive_int("K", K)
        self.num_particles = check_positive_int("num_particles", o.num_particles)
        check_step_sizes(eta_init, eta_max)
        if not 0 < gamma_init < 1:
            raise ValueError(f"`gamma_init` must lie in (0, 1), got {gamma_init!r}.")
        self.init_scale = check_positive_float("init_scale", o.init_scale)
        if local_model is not None and not callable(local_model):
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
        self.subsample_plate = o.subsample_plate
        self.use_global_dais_params = bool(o.use_global_dais_params)
        super().__init__(
            model,
            prefix=o.prefix,
            init_loc_fn=init_to_uniform,
            forward_mode_differentiation=o.forward_mode_differentiation,
        )

    # -- the guide ------------------------------------------------------------------------

    def _set_up_once(self, args, kwargs):
        if self.local_model is None:  # numpyro's signature builds without it; nothing runs
            raise ValueError(
                "AutoSemiDAIS needs `local_model`, the callable part of `model` that holds the "
                "local plate, e.g. AutoSemiDAIS(model, local_model, AutoNormal(global_model))."
            )
        super()._set_up_once(args, kwargs)

    def __call__(self, *args, **kwargs):
        self._set_up_once(args, kwargs)
        global_latents, local_args, local_kwargs = self._globals(args, kwargs)
        return {**global_latents, **self._locals(local_args, local_kwargs)}

    def _globals(self, args, kwargs):
        """Draws of the global guide, and the local model's arguments given them."""
        if self.global_guide is None:
            return {}, args, dict(kwargs)
        with handlers.substitute(data=self._global_start()):  # initial values only
            latents = self.global_guide(*args, **kwargs)
        with handlers.block(), handlers.substitute(data=latents):
            out = self.global_guide.model(*args, **kwargs)
        return latents, (out,), {}

    def _anneal_params(self, idx) -> dais.AnnealParams:
        """Per-member :class:`~numpyro_dais.engine.base.AnnealParams` (leading axis ``B``)."""
        lay = self._layout
        lead = () if self.use_global_dais_params else (lay.size,)
        params = sampling.anneal_param_sites(
            self.prefix, lay.D, self.K, self._step_bounds, self._kernel.momentum,
            self.gamma_init, lead,
        )  # fmt: skip
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
        if self._laplace_base:
            # expansion points at the set-up's local modes, kept there (the Newton step
            # follows θ); one learnt factor of the Laplace scales, shared by the members
            start = self._start
            shape = (lay.size, lay.D)
            loc0 = jnp.zeros(shape) if start is None else jnp.asarray(start.member_loc)
            loc = numpyro.param(f"{p}_z_0_loc", loc0)[idx]
            if start is not None:
                loc = jax.lax.stop_gradient(loc)
            scale = numpyro.param(
                f"{p}_z_0_scale", jnp.ones(lay.D), constraint=constraints.positive
            )
            return gaussian.Gaussian(loc, jnp.broadcast_to(scale, loc.shape))
        if self.local_guide is None:
            shape = (lay.size, lay.D)
            loc = numpyro.param(f"{p}_z_0_loc", jnp.zeros(shape))
            scale = numpyro.param(
                f"{p}_z_0_scale", jnp.full(shape, self.init_scale), constraint=constraints.positive
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
            fits = self.control_variate and idx.shape[0] < lay.size and not self._querying
            z, log_w, bad, stats = members.run_for(
                self.K, numpyro.prng_key(), q0, anneal, idx, params, local_args, local_kwargs, fits
            )
            values, log_det = sites.constrain(self.prototype_trace, lay, z)
            result = {}
            for s in lay.sites:
                delta = dist.Delta(
                    values[s.name], log_density=-log_det[s.name], event_dim=s.event_dim
                )
                result[s.name] = numpyro.sample(s.name, delta)
            fraction = jnp.mean(bad, axis=-1)
            log_w = log_w + jax.vmap(objective.divergence_brake)(step_sizes, fraction)
            if self.report_divergences:  # adds 0.0: the loss keeps the check in the program
                log_w = log_w + self._report(bad)
            if fits:
                operands = (local_args, local_kwargs, params)
                c, total = cv.control_variate(self.prefix, lay.size, idx, stats, operands)
                log_w = log_w - c
            log_w = jnp.reshape(log_w, (-1,) + (1,) * (-lay.dim - 1))
            numpyro_private.emit_log_weight(f"{self.prefix}_local_dais_factor", -log_w)
        if fits:
            numpyro_private.emit_log_weight(f"{self.prefix}_control_variate_total", -total)
        return result

    def _report(self, diverged):
        info = (
            f"If this persists, lower `eta_init` and `eta_max` (now {self._step_bounds[0]:.3g} "
            f"and {self._step_bounds[1]:.3g}) below the local posterior's scale."
        )
        name = type(self).__name__
        return report_diverged(name, jnp.sum(diverged), diverged.size, info, fell_back=True)

    def _members(self, rng_key, q0, anneal, idx, params, local_args, local_kwargs, fits=False):
        """:func:`~numpyro_dais.semidais.sites.member_terms` of the batch's chains
        (:meth:`_chains`), and with ``fits`` the control variate's fits of the batch's terms
        (:func:`~numpyro_dais.semidais.cv.statistics`): a pure function, compiled as one
        program (:meth:`_compiled`), so that a call of the guide outside ``jit``
        (``svi.init``, ``Predictive``, ``sample_posterior``) runs it whole instead of
        operation by operation, each operation compiled on its own."""
        chain_key, select_key = jax.random.split(rng_key)
        out, loc = self._chains(chain_key, q0, anneal, idx, params, local_args, local_kwargs)
        z, log_w, bad = sites.member_terms(select_key, out)
        if not fits:
            return z, log_w, bad, None
        lay, trace, model = self._layout, self.prototype_trace, self.local_model

        def log_density(U, operands):
            args, kwargs, params = operands
            return sites.member_log_density(model, args, kwargs, trace, lay, idx, params, U)

        operands = (local_args, local_kwargs, params)
        stats = cv.statistics(log_density, operands, z, log_w, loc)
        return z, log_w, bad, stats

    def _chains(self, rng_key, q0, anneal, idx, params, local_args, local_kwargs):
        """``num_particles`` DAIS chains per member (:func:`numpyro_dais.engine.annealing.dais.run`,
        vmapped over the batch). Member ``n``'s target is ``ℓ_n``
        (:func:`~numpyro_dais.semidais.sites.member_target`: the batch evaluated once per
        leapfrog step for all members). With one particle the weight omits ``ℓ_n(u_K)``,
        which the model's own term supplies; with several it is whole."""
        lay, B, trace, model = self._layout, idx.shape[0], self.prototype_trace, self.local_model
        P = self.num_particles

        def log_density(U, operands):
            args, kwargs, params = operands
            return sites.member_log_density(model, args, kwargs, trace, lay, idx, params, U)

        log_dynamics = sites.member_target(log_density, (local_args, local_kwargs, params))
        target = dais.Target(log_dynamics, dais.omit_final if P == 1 else None)

        if self._laplace_base:
            operands = (local_args, local_kwargs, params)
            loc, scale = laplace.base(log_density, operands, q0.loc, q0.scale, self._curvature)
            q0 = gaussian.Gaussian(loc, scale)

        def chain(key, loc, scale, anneal_n):
            q0_n = gaussian.Gaussian(loc, scale)
            out = dais.run(key, q0_n, target, anneal_n, P, kernel=self._kernel)
            log_q0_z0 = gaussian.log_prob(q0_n, out.z0)
            chains = sites.Chains(out.z0, log_q0_z0, out.z, out.log_weights, out.log_final_target)
            return chains, loc

        keys = jax.random.split(rng_key, B)
        out, loc = jax.vmap(chain, axis_name=sites.MEMBERS)(keys, q0.loc, q0.scale, anneal)
        return out, loc
