"""Set-up of ``AutoSemiDAIS``: the model's checks, the local plate's layout, the local
model's parameters and the initial step sizes (from the local curvature).

Reference: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling", §7.6 and appendix A.1.
"""

import warnings

import jax
import numpy as np
from numpyro import handlers
from numpyro.infer.initialization import init_to_median

from numpyro_dais import _semidais_sites as sites
from numpyro_dais._modelview import trace_without_sampling
from numpyro_dais._setup import step_bounds


class SemiDAISSetUp:
    """The set-up hooks of :class:`~numpyro_dais.AutoSemiDAIS` (called once, by
    ``_numpyro.SetUpHooks``, on the first call with data)."""

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
        self._step_bounds = self._initial_step_bounds(local_args, local_kwargs, typical)

    def _initial_step_bounds(self, local_args, local_kwargs, typical):
        """``(eta_init, eta_max)``: as given, else from the members' curvatures at the
        model's prior medians (see the class)."""
        eta_max, lam = self.eta_max, None
        if eta_max is None:
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
            lam = float(np.median(lams))
            if not np.isfinite(lam) or lam <= 0:
                warnings.warn(
                    f"{type(self).__name__}: the curvature of the local log densities at the "
                    f"prior medians is {lam:.3g} (nan: the guide was set up under jit), no "
                    "guide to a step size; using numpyro's eta_max=0.1. Pass `eta_max` "
                    "(below the local posterior's scale), or call `svi.init` outside jit.",
                    UserWarning,
                    stacklevel=5,
                )
                eta_max = 0.1
        (eta_init, eta_max), _ = step_bounds(
            self.eta_init, eta_max, lam, 0.0, self._kernel.momentum
        )
        if self.eta_init is None:
            # chains that move from the start: a tenth of the cap left them nearly still
            eta_init = eta_max / 4
            if self.local_guide is None:
                eta_init = min(eta_init, self.init_scale)  # stable on q0 itself at beta = 0
        return eta_init, eta_max

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
