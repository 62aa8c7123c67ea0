"""What the annealing follows and what the final weight uses, built from a NumPyro model.

A target turns the model into the engine's :class:`~numpyro_dais.engine.base.Target`
(``log_dynamics`` for the transitions, ``log_final`` for the weight) for one call's data and
the current parameters. Any target composes with any sampler (DAIS or SMC):

* :class:`FullData`: the log joint on all the data, for both (DAIS, DSMCS);
* :class:`Surrogate`: a cheap surrogate log likelihood ``ψ̂`` for the dynamics and the
  model's mini-batch estimate for the final weight (SL-DAIS), either built automatically
  from ``N_s`` stored rows with learnable weights (RAND) or given as a model;
* :class:`NaiveMiniBatch`: the rescaled mini-batch estimate on a fresh batch for the
  dynamics too (NS-DAIS, the baseline that SL-DAIS improves on).

Reference: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling".
"""

import copy
import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import potential_energy

from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.checks import check_full_data
from numpyro_dais.bridge.modelview import (
    ModelView,
    data_plates,
    log_joint,
    subsampled_plates,
    trace_without_sampling,
)
from numpyro_dais.engine.annealing.dais import Target, omit_final


class Bound(NamedTuple):
    """A target bound to one call's data, parameters and mini-batch (:meth:`FullData.bind`),
    as log densities ``z -> scalar``: ``dynamics(rng_key)`` what the transitions follow (the
    key draws a naive mini-batch), ``final()`` the final weight's term on the call's batch
    (``None``: the dynamics'), ``correction`` its control variate ``z -> c(z)`` (or
    ``None``), ``anchor(rng_key)`` what the DAIS₀ term fits ``q0``'s location to (the call's
    parameters held fixed), ``start(rng_key)`` the density whose mode ``q0`` starts at, and
    ``check_plates()`` refuses the call's subsampled plates that the target does not take."""

    dynamics: Callable
    final: Callable
    correction: Callable | None
    anchor: Callable
    start: Callable
    check_plates: Callable


def build(bound: Bound, rng_key, final="target") -> Target:
    """The engine's :class:`~numpyro_dais.engine.base.Target` of ``bound``; ``final="omit"``:
    the caller adds ``ℓ(z_K)``."""
    bound.check_plates()
    return Target(bound.dynamics(rng_key), omit_final if final == "omit" else bound.final())


def _once(build):
    """``build`` called on first use only, its log density kept for the call (any key)."""
    built = []

    return lambda *key: built[0] if built else built.append(build(*key)) or built[0]


#: default size ``N_s`` of the automatic (RAND) surrogate: ``min(256, Nd)``
DEFAULT_NUM_SURROGATE = 256
#: the surrogate rows are chosen with this fixed seed, so a guide set up again on the same
#: data (another process, another key) pairs its saved weights with the same rows
SURROGATE_SEED = 0


class FullData:
    """The model's log joint on all the data of the call, for dynamics and final weight."""

    supports_subsampling = False
    #: the dynamics need the call's data (``method="dais"`` without data is refused)
    dynamics_need_data = True
    #: the final term takes a control variate built from the start density's linearisation
    #: at the set-up's mode (:meth:`Surrogate.correction`)
    control_variate = False
    #: the parameter sites that hold that linearisation (none here)
    control_variate_names = ()
    #: the dynamics read their key (a fresh mini-batch per run)
    dynamics_per_key = False

    def setup(self, view: ModelView, prototype_trace, args, kwargs, prefix) -> "FullData":
        """This target set up with the first call's arguments: a new one (this is not changed)."""
        new = copy.copy(self)
        new._set_up(view, prototype_trace, args, kwargs, prefix)
        return new

    def _set_up(self, view, prototype_trace, args, kwargs, prefix):
        """Fill in :meth:`setup`'s new target (nothing here)."""

    def param_sites(self) -> dict:
        """``{name: (initial value, param kwargs)}`` of the target's own parameters."""
        return {}

    def dynamics(self, view, args, kwargs, params, rng_key):
        return log_joint(view, args, kwargs, params)

    def final(self, view, args, kwargs, params, batch=None):
        """The final weight's term; ``None``: the dynamics' own (full-data) log joint."""
        return None

    def correction(self, view, args, kwargs, params, batch):
        """``z -> c(z)``, a zero-mean control variate that the bound adds to the final term
        on ``batch``, or ``None`` (none here)."""
        return None

    def anchor(self, view, args, kwargs, params, rng_key, batch=None):
        """The log density (``z -> ℓ(z)``, unnormalised) whose posterior the DAIS₀ term fits
        ``q0``'s location to: the posterior's own, here the dynamics' log joint."""
        return self.dynamics(view, args, kwargs, params, rng_key)

    def start(self, view, args, kwargs, params, rng_key):
        """The log density whose mode ``q0`` starts at (the Laplace start): the posterior's."""
        return self.dynamics(view, args, kwargs, params, rng_key)

    def bound_batch(self, view, args, kwargs, model=None):
        """This call's mini-batch, drawn inside the guide run (none here)."""
        return None

    def _check_plates(self, view, plates):
        """Refuse this call's subsampled ``plates`` (``{name: (size, subsample_size)}``): a
        plate full at set-up may subsample later (numpyro's own ``test_subsample``), refused
        once per call, before the model draws its indices inside the sampler's ``vmap``."""
        check_full_data(view.guide_name, plates)

    def bind(self, view, args, kwargs, params, batch=None) -> Bound:
        """This target bound to a call's data, ``params`` and the model's mini-batch ``batch``
        (``None``: all the data): each log density built once, when first asked for."""
        if self.dynamics_per_key:
            dynamics = functools.partial(self.dynamics, view, args, kwargs, params)
        else:  # the key is not read: one log density for every key
            dynamics = _once(lambda rng_key: self.dynamics(view, args, kwargs, params, None))
        correction = self.correction(view, args, kwargs, params, batch)
        final = _once(lambda: self._final_with(view, args, kwargs, params, batch, correction))

        def anchor(rng_key):  # the call's parameters held fixed
            return self.anchor(view, args, kwargs, jax.lax.stop_gradient(params), rng_key, batch)

        start = functools.partial(self.start, view, args, kwargs, params)

        def check_plates():
            plates = subsampled_plates(trace_without_sampling(view.model, args, kwargs))
            self._check_plates(view, plates)

        return Bound(dynamics, final, correction, anchor, start, check_plates)

    def _final_with(self, view, args, kwargs, params, batch, correction):
        """:meth:`final` on ``batch`` given its already built ``correction``."""
        return self.final(view, args, kwargs, params, batch)


class _MiniBatchTarget(FullData):
    """Targets for models with a subsampled plate: the final weight is the model's own
    mini-batch estimate ``log p(z) + (Nd / B) Σ_{n∈I} log p(y_n | z)``."""

    supports_subsampling = True

    def _set_up(self, view, prototype_trace, args, kwargs, prefix):
        self.plates = data_plates(prototype_trace)
        if not self.plates:
            raise ValueError(
                f"{view.guide_name} found no subsample plate in the model to build its "
                "surrogate from. Put the likelihood in `numpyro.plate(name, Nd, "
                "subsample_size=B)`, or pass `surrogate_model`."
            )

    def _check_plates(self, view, plates):
        # a call on all the data (e.g. sample_posterior) is fine; another mini-batch is not
        if any(self.plates.get(name) != plate for name, plate in plates.items()):
            raise ValueError(
                f"{view.guide_name} fixed its subsample plates at set-up as {self.plates} "
                f"((size, subsample_size) by name), but this call has {plates}. The guide "
                "draws the mini-batch indices for the model, so both must stay the same: "
                "set the guide up (svi.init) with data of the training size and mini-batch "
                "size, and keep them fixed."
            )

    def final(self, view, args, kwargs, params, batch=None):
        if batch is None:
            batch = {name: jnp.arange(nd) for name, (nd, _) in self.plates.items()}
        return log_joint(view, args, kwargs, params, handler=numpyro_private.FixPlates(batch))

    def start(self, view, args, kwargs, params, rng_key):
        # the full data, read once at set-up: the mode of a surrogate on N_s rows (or of one
        # mini-batch) lies ~sqrt(Nd / N_s) posterior sd from the posterior's
        return self.final(view, args, kwargs, params)

    def bound_batch(self, view, args, kwargs, model=None):
        """Open the plates that ``model`` (default: the guide's own) subsamples in this call
        in the guide, with indices drawn in ``O(B)``; the ELBO replays them into the model,
        so the model's own term (and with ``N > 1`` the guide's final term) uses these rows,
        not drawn by numpyro's sampler (a loop of ``B`` sequential steps on CPU that would
        dominate an SL-DAIS step). A model that runs on all the data gets none."""
        model = view.model if model is None else model
        plates = subsampled_plates(trace_without_sampling(model, args, kwargs))
        return {
            name: numpyro_private.guide_plate_indices(name, size, subsample_size)
            for name, (size, subsample_size) in self.plates.items()
            if plates.get(name) == (size, subsample_size)
        }


class Surrogate(_MiniBatchTarget):
    """SL-DAIS: the dynamics follow ``log p(z) + ψ̂(z)``, which never reads the data set.

    With ``model=None`` (RAND), ``ψ̂(z) = Σ_m ω_m log p(ỹ_m | z)`` on ``num_surrogate`` rows
    chosen once with a fixed seed from the plate the model subsamples and stored at set-up,
    with learnable positive weights ``ω`` (``{prefix}_surrogate_weights``, init ``Nd / N_s``).
    With a ``model`` (same latent sites, called with no arguments), ``ψ̂`` is its log joint
    and its ``numpyro.param`` sites are learnt.
    """

    dynamics_need_data = False
    control_variate = True

    def __init__(self, model=None, num_surrogate=None):
        self.model, self.num_surrogate = model, num_surrogate
        self._linear = {}

    def linearise(self, linear):
        """Keep ``(ẑ, ℓ(ẑ), ∇ℓ(ẑ))`` (the full-data log joint at the set-up's mode; host
        arrays) for :meth:`correction`, as the initial values of the sites
        :attr:`control_variate_names` (gradient stopped: a saved state resumes exactly);
        ``None``: no control variate. A new target (this is not changed)."""
        new, names = copy.copy(self), self.control_variate_names
        new._linear = {
            name: (np.asarray(value, np.asarray(linear[0]).dtype), {})
            for name, value in zip(names, linear or (), strict=bool(linear))
        }
        return new

    def _covers(self, batch):
        return bool(batch) and set(batch) == set(self.plates)

    def correction(self, view, args, kwargs, params, batch):
        """``c(z) = [ℓ(ẑ) + ∇ℓ(ẑ)·(z − ẑ)] − [ℓ_I(ẑ) + ∇ℓ_I(ẑ)·(z − ẑ)]`` for the mini-batch
        estimate ``ℓ_I`` on ``batch`` and the full-data log joint ``ℓ``, linearised at the
        set-up's point ``ẑ`` (Bardenet et al. 2017; Baker et al. 2019): ``E_I[c(z)] = 0`` for
        every ``z``, so ``ℓ_I + c`` is unbiased for ``ℓ`` like ``ℓ_I``; ``ℓ_I − ℓ_I(ẑ)
        − ∇ℓ_I(ẑ)·(z − ẑ)`` is a remainder of second order in ``z − ẑ``, so near ``ẑ`` its
        variance is far below that of ``ℓ_I``, which grows as ``Nd² / B``. ``None`` without
        a linearisation or where ``batch`` does not hold the target's plates."""
        names = self.control_variate_names
        if not all(name in params for name in names) or not self._covers(batch):
            return None
        fixed = jax.lax.stop_gradient(params)
        point, value, grad = (fixed[name] for name in names)
        batch_log_joint = _MiniBatchTarget.final(self, view, args, kwargs, fixed, batch)
        at_point, slope = jax.lax.stop_gradient(jax.value_and_grad(batch_log_joint)(point))
        offset, slope = value - at_point, grad - slope

        def c(z):
            return offset + jnp.dot(slope, z - point)

        return c

    def final(self, view, args, kwargs, params, batch=None):
        correction = self.correction(view, args, kwargs, params, batch)
        return self._final_with(view, args, kwargs, params, batch, correction)

    def _final_with(self, view, args, kwargs, params, batch, correction):
        ell = super().final(view, args, kwargs, params, batch)
        return ell if correction is None else lambda z: ell(z) + correction(z)

    def anchor(self, view, args, kwargs, params, rng_key, batch=None):
        """The mini-batch estimate of the full-data log joint with its control variate, on
        ``batch`` (the model's), or on one drawn with ``rng_key`` where no model's batch is
        known (``None``); on all the data where the loss's model runs on all of it (an
        empty ``batch``). Unbiased for the posterior's log joint, in which the reverse KL's
        gradient is linear; not the surrogate's, whose posterior sits about
        ``sqrt(Nd / N_s)`` posterior standard deviations away until its weights are
        learnt."""
        if batch is not None and not self._covers(batch):
            return self.final(view, args, kwargs, params)
        if batch is None:
            keys = jax.random.split(rng_key, len(self.plates))
            batch = {
                name: numpyro_private.subsample_indices(size, subsample_size, key)
                for key, (name, (size, subsample_size)) in zip(
                    keys, self.plates.items(), strict=True
                )
            }
        return self.final(view, args, kwargs, params, batch)

    def _set_up(self, view, prototype_trace, args, kwargs, prefix):
        self._params = {}
        #: the parameter sites of the control variate's linearisation ``(ẑ, ℓ(ẑ), ∇ℓ(ẑ))``
        self.control_variate_names = tuple(
            f"{prefix}_control_variate_{part}" for part in ("point", "value", "grad")
        )
        if self.model is not None:
            self.plates = data_plates(prototype_trace)
            self._setup_model(view, prototype_trace)
            return
        super()._set_up(view, prototype_trace, args, kwargs, prefix)
        if len(self.plates) > 1:
            raise ValueError(
                f"The model subsamples plates {sorted(self.plates)}; the automatic surrogate "
                "handles one subsample plate. Pass `surrogate_model`, or subsample a single "
                "plate."
            )
        ((name, (size, _)),) = self.plates.items()
        num = min(DEFAULT_NUM_SURROGATE, size) if self.num_surrogate is None else self.num_surrogate
        if num > size:
            raise ValueError(
                f"`num_surrogate`={num} is larger than the {size} data points of plate "
                f"{name!r}; choose num_surrogate <= {size}."
            )
        key = jax.random.key(SURROGATE_SEED)
        indices = jnp.sort(jax.random.choice(key, size, (num,), replace=False))
        recorder = numpyro_private.SurrogateData(name, size, indices)
        # the latent values do not matter here, only the rows; init_to_uniform needs no
        # sampler, so improper priors work too
        seeded = handlers.substitute(handlers.seed(view.model, key), substitute_fn=init_to_uniform)
        with handlers.block(), recorder:
            seeded(*args, **kwargs)
        self._rows = (name, size, indices, recorder.recorded)
        self.weights_name = f"{prefix}_surrogate_weights"
        self._params = {
            self.weights_name: (jnp.full(num, size / num), {"constraint": constraints.positive})
        }

    @property
    def plate(self) -> str:
        """The subsample plate whose rows the RAND surrogate stores."""
        return self._rows[0]

    @property
    def indices(self) -> jax.Array:
        """``(N_s,)`` indices of the stored rows in that plate (chosen with a fixed seed)."""
        return self._rows[2]

    def _setup_model(self, view, prototype_trace):
        with handlers.block():
            trace = handlers.trace(handlers.seed(self.model, 0)).get_trace()

        def latent_shapes(tr):
            return {
                name: jnp.shape(site["value"])
                for name, site in tr.items()
                if site["type"] == "sample" and not site["is_observed"]
            }

        model_latents, surrogate_latents = latent_shapes(prototype_trace), latent_shapes(trace)
        if model_latents != surrogate_latents:
            raise ValueError(
                "`surrogate_model` must have the same latent sites (names and shapes) as "
                f"`model`: model {model_latents}, surrogate {surrogate_latents}."
            )
        self._params = {
            name: (site["value"], dict(site["kwargs"]))
            for name, site in trace.items()
            if site["type"] == "param"
        }

    def param_sites(self):
        return {**self._params, **self._linear}

    def dynamics(self, view, args, kwargs, params, rng_key):
        if self.model is not None:
            surrogate = self.model

            def log_surrogate(z):
                with handlers.block(), handlers.substitute(data=params):
                    return -potential_energy(surrogate, (), {}, view.unpack(z))

            return log_surrogate
        name, size, indices, rows = self._rows
        handler = numpyro_private.SurrogateData(
            name, size, indices, rows, params[self.weights_name]
        )
        return log_joint(view, args, kwargs, params, handler=handler)


class NaiveMiniBatch(_MiniBatchTarget):
    """NS-DAIS: the dynamics use the rescaled estimate ``(Nd / B) Σ_{n∈J} log p(y_n | z)``
    on a mini-batch ``J`` drawn fresh from the call's data on every run."""

    dynamics_per_key = True

    def dynamics(self, view, args, kwargs, params, rng_key):
        keys = jax.random.split(rng_key, len(self.plates))
        batch = {
            name: numpyro_private.subsample_indices(size, subsample_size, key)
            for key, (name, (size, subsample_size)) in zip(keys, self.plates.items(), strict=True)
        }
        return log_joint(view, args, kwargs, params, handler=numpyro_private.FixPlates(batch))
