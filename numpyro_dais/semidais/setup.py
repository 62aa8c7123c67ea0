"""Set-up of ``AutoSemiDAIS``: the model's checks, the local plate's layout, the local
model's parameters and the initial step sizes (from the local curvature).

Reference: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling", §7.6 and appendix A.1.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.infer.autoguide import AutoNormal
from numpyro.infer.initialization import init_to_median

from numpyro_dais.annealed.options import step_bounds
from numpyro_dais.bridge.modelview import trace_without_sampling
from numpyro_dais.runtime.reporting import warn
from numpyro_dais.runtime.vectorise import jit_short_run
from numpyro_dais.semidais import laplace, sites

#: ``base='auto'`` is the Laplace base up to this many local coordinates per member ``D``
#: (its curvature takes ``D`` Hessian-vector products of the batch per step), the learnt
#: Gaussian beyond.
LAPLACE_MAX_DIM = 16
#: The most members the nested Laplace fit of the globals uses (a fixed random subset of the
#: plate beyond it); also the chunk of members whose local modes are found at once.
NESTED_MEMBERS = 8192
#: Backtracked Newton iterations for the members' local modes.
MODE_ITERATIONS = 12


class LaplaceStart(NamedTuple):
    """Where the set-up's nested Laplace fit puts the globals and the members."""

    theta: dict  # {global site: unconstrained mode}
    sd: dict  # {global site: unconstrained sd}
    member_loc: np.ndarray  # (N, D) each member's local mode at theta
    curvature: np.ndarray  # (D,) the typical curvature of a member's coordinate
    largest: float  # the median over members of their blocks' largest curvature


class SemiDAISSetUp:
    """The set-up hooks of :class:`~numpyro_dais.AutoSemiDAIS` (called once, by
    ``numpyro_private.SetUpHooks``, on the first call with data)."""

    @property
    def _laplace_base(self):
        """Whether the members' bases are their local Laplace approximations."""
        if self.local_guide is not None or self.base == "gaussian":
            return False
        return self.base == "laplace" or self._layout.D <= LAPLACE_MAX_DIM

    @property
    def _curvature(self):
        D = self._layout.D
        return jnp.ones(D) if self._start is None else jnp.asarray(self._start.curvature)

    def _global_start(self):
        """Initial values of an ``AutoNormal`` global guide's parameters at the nested
        Laplace fit (its loc at the mode, its scale at the sds); SVI's own values, substituted
        outside, override them after ``svi.init``."""
        guide, start = self.global_guide, self._start
        if start is None or not isinstance(guide, AutoNormal):
            return {}
        out = {}
        for name, loc in start.theta.items():
            out[f"{name}_{guide.prefix}_loc"] = loc
            out[f"{name}_{guide.prefix}_scale"] = start.sd[name]
        return out

    def _check_model(self, args, kwargs):
        with handlers.block(), handlers.trace() as tr, handlers.seed(rng_seed=0):
            self.model(*args, **kwargs)  # before numpyro's set-up, which asks for funsor
        sites.check_continuous(type(self).__name__, tr)

    def _after_setup(self, args, kwargs):
        name, trace = type(self).__name__, self.prototype_trace
        plate = sites.local_plate(name, trace, self.subsample_plate)
        self._layout = sites.layout(name, trace, self.init_locs, plate)
        local = {s.name for s in self._layout.sites}
        global_names = sites.latent_names(trace) - local
        if self.global_guide is None and global_names:
            raise ValueError(
                f"{name}: the model has global latent sites {sorted(global_names)} outside "
                f"the plate {plate!r}: pass `global_guide`, e.g. AutoNormal(global_model), "
                "with local_model taking global_model's return value."
            )
        typical = trace_without_sampling(self.model, args, kwargs, init_fn=init_to_median)
        local_args, local_kwargs = self._local_args_at_setup(args, kwargs, global_names, typical)
        with handlers.block(), handlers.trace() as tr, handlers.seed(rng_seed=0):
            self.local_model(*local_args, **local_kwargs)
        if sites.latent_names(tr) != local:
            raise ValueError(
                f"{name}: `local_model` has latent sites {sorted(sites.latent_names(tr))}, "
                f"but the model's local sites (in plate {plate!r}) are {sorted(local)}: "
                "local_model must be the part of the model with the plate, no more, no less."
            )
        self._local_params = {
            k: (s["value"], s["kwargs"]) for k, s in tr.items() if s["type"] == "param"
        }
        if self.local_guide is not None:
            with handlers.block(), handlers.trace() as tr, handlers.seed(rng_seed=0):
                self.local_guide(*local_args, **local_kwargs)
            missing = local - sites.latent_names(tr)
            if missing:
                raise ValueError(
                    f"{name}: `local_guide` does not sample the local sites {sorted(missing)}."
                )
            for s in self._layout.sites:
                sites.normal_base(name, tr[s.name]["fn"], s.name)
        self._start = None
        if self._laplace_base:
            self._start = self._nested_laplace(args, kwargs, sorted(global_names), typical)
        self._step_bounds = self._initial_step_bounds(local_args, local_kwargs, typical)

    def _initial_step_bounds(self, local_args, local_kwargs, typical):
        """``(eta_init, eta_max)``: as given, else from the members' curvatures at the nested
        Laplace fit's modes (``base='laplace'``) or at the model's prior medians (see the
        class)."""
        eta_max, lam = self.eta_max, None
        if eta_max is None:
            if self._start is not None:
                lam, where = self._start.largest, "at the local modes"
            else:
                lam, where = self._median_curvature(local_args, local_kwargs, typical)
            if not np.isfinite(lam) or lam <= 0:
                warn(
                    f"{type(self).__name__}: the curvature of the local log densities {where} "
                    f"is {lam:.3g} (nan: the guide was set up under jit), no guide to a step "
                    "size; using numpyro's eta_max=0.1. Pass `eta_max` (below the local "
                    "posterior's scale), or call `svi.init` outside jit.",
                    UserWarning,
                )
                eta_max = 0.1
        (eta_init, eta_max), _ = step_bounds(
            self.eta_init, eta_max, lam, 0.0, self._kernel.momentum
        )
        if self.eta_init is None:
            # chains that move from the start: a tenth of the cap left them nearly still
            eta_init = eta_max / 4
            if self.local_guide is None and not self._laplace_base:
                eta_init = min(eta_init, self.init_scale)  # stable on q0 itself at beta = 0
        return eta_init, eta_max

    def _median_curvature(self, local_args, local_kwargs, typical):
        """The median over the set-up batch's members of their largest curvature at the
        model's prior medians (``nan`` where the data are traced)."""
        params = {k: value for k, (value, _) in self._local_params.items()}
        lay, trace = self._layout, self.prototype_trace
        u = sites.pack(lay, {s.name: sites.unconstrain(typical[s.name]) for s in lay.sites})
        idx = typical[lay.plate]["value"]  # the members whose medians u holds
        try:
            lams = sites.member_curvatures(
                self.local_model, local_args, local_kwargs, trace, lay, idx, u, params
            )
        except jax.errors.JAXTypeError:  # set up under jit (traced data or parameters)
            lams = np.array([np.nan])
        return float(np.median(lams)), "at the prior medians"

    def _nested_laplace(self, args, kwargs, global_names, typical):
        """:class:`LaplaceStart`: the globals' mode and sds under the nested Laplace
        approximation (each member's local latents integrated out by Laplace's method),
        fitted on up to :data:`NESTED_MEMBERS` members (a fixed random subset beyond), and
        every member's local mode there. ``None`` where the data are traced (set-up under
        ``jit``) and, with a warning, where the fit does not converge."""
        try:
            fit = self._fit_nested_laplace(args, kwargs, global_names, typical)
        except jax.errors.JAXTypeError:  # set up under jit (traced data or parameters)
            return None
        if fit is None:
            warn(
                f"{type(self).__name__}: the nested Laplace fit of the global latents did not "
                "converge; the global guide starts at its own initial values and the members' "
                "expansion points at the prior medians, which can take many more steps. Pass "
                "`base='gaussian'` to skip the fit.",
                UserWarning,
            )
        return fit

    def _fit_nested_laplace(self, args, kwargs, global_names, typical):
        lay, trace, model = self._layout, self.prototype_trace, self.local_model
        params = {k: value for k, (value, _) in self._local_params.items()}
        medians = sites.pack(lay, {s.name: sites.unconstrain(typical[s.name]) for s in lay.sites})
        theta0, unravel, global_part = self._global_part(args, kwargs, global_names, typical)
        dtype = jnp.result_type(float)
        m0 = jnp.asarray(np.median(np.asarray(medians), axis=0), dtype)
        count = min(lay.size, NESTED_MEMBERS)
        if count < lay.size:
            subset = np.sort(np.random.default_rng(0).choice(lay.size, count, replace=False))
        else:
            subset = np.arange(lay.size)
        weight = lay.size / count

        def log_density(U, operands):
            args, kwargs, idx = operands
            return sites.member_log_density(model, args, kwargs, trace, lay, idx, params, U)

        def modes(theta, m, curvature, idx):
            operands = (*global_part(theta)[1], idx)
            return laplace.modes(log_density, operands, m, curvature, MODE_ITERATIONS)

        def derivatives(theta, m, curvature, idx):
            def f(theta):
                lp, (args, kwargs) = global_part(theta)
                members = laplace.marginal(log_density, (args, kwargs, idx), m, curvature)
                return lp + weight * members

            return f(theta), jax.grad(f)(theta), jax.hessian(f)(theta)

        modes, derivatives = jit_short_run(modes), jit_short_run(derivatives)
        idx = jnp.asarray(subset)
        curvature = np.ones(lay.D)
        state = {"m": jnp.broadcast_to(m0, (count, lay.D))}
        state["m"], diag, _ = modes(jnp.asarray(theta0, dtype), state["m"], curvature, idx)
        curvature = laplace.typical_curvature(diag)

        def objective(theta):
            theta = jnp.asarray(theta, dtype)
            state["m"], _, _ = modes(theta, state["m"], curvature, idx)
            out = derivatives(theta, state["m"], curvature, idx)
            return tuple(np.asarray(x, np.float64) for x in out)

        fit = laplace.nested_fit(objective, np.asarray(theta0))
        if not fit.converged:
            return None
        theta = jnp.asarray(fit.theta, dtype)
        member_loc, lam = np.zeros((lay.size, lay.D)), np.zeros(lay.size)
        for lo in range(0, lay.size, count):  # every member, in chunks of the fit's size
            chunk = np.arange(lo, lo + count) % lay.size
            m, _, top = modes(theta, jnp.broadcast_to(m0, (count, lay.D)), curvature, chunk)
            n = min(count, lay.size - lo)
            member_loc[lo : lo + n], lam[lo : lo + n] = np.asarray(m)[:n], np.asarray(top)[:n]
        return LaplaceStart(
            unravel(theta),
            unravel(jnp.asarray(fit.sd, dtype)),
            member_loc,
            curvature,
            float(np.median(lam)),
        )

    def _global_part(self, args, kwargs, global_names, typical):
        """``(theta0, unravel, part)``: the globals' prior medians as one unconstrained vector,
        its inverse, and ``theta -> (log p(θ) in the unconstrained space, (local_args,
        local_kwargs))``."""
        trace = self.prototype_trace
        theta0 = {k: sites.unconstrain(typical[k]) for k in global_names}
        flat, unravel = ravel_pytree(theta0)

        def part(theta):
            values, log_det = {}, 0.0
            for k, u in unravel(theta).items():
                transform = biject_to(trace[k]["fn"].support)
                values[k] = transform(u)
                log_det = log_det + jnp.sum(transform.log_abs_det_jacobian(u, values[k]))
            if self.global_guide is None:
                return log_det, (args, dict(kwargs))
            with handlers.block(), handlers.trace() as tr, handlers.seed(rng_seed=0):
                out = handlers.substitute(self.global_guide.model, data=values)(*args, **kwargs)
            lp = log_det
            for site in tr.values():
                if site["type"] == "sample":
                    lp = lp + jnp.sum(site["fn"].log_prob(site["value"]))
            return lp, ((out,), {})

        return flat, unravel, part

    def _local_args_at_setup(self, args, kwargs, global_names, typical):
        if self.global_guide is None:
            return args, dict(kwargs)
        # the global latents at their prior medians (the curvature is measured there)
        init = {k: typical[k]["value"] for k in global_names}
        with handlers.block(), handlers.trace() as tr, handlers.seed(rng_seed=0):
            out = handlers.substitute(self.global_guide.model, data=init)(*args, **kwargs)
        if sites.latent_names(tr) != global_names:
            raise ValueError(
                f"{type(self).__name__}: the global guide's model has latent sites "
                f"{sorted(sites.latent_names(tr))}, but the model's global sites are "
                f"{sorted(global_names)}."
            )
        return (out,), {}
