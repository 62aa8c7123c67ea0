"""``AutoSurrogateLikelihoodDAIS``: DAIS trained on mini-batches (SL-DAIS and NS-DAIS).

The ``K`` transitions follow a cheap surrogate log likelihood ``ψ̂(z)`` instead of the full
one; only the final term of the weight touches the data, through the model's own
mini-batch estimate (algorithms.md §3). The cost of a step is ``O(K · N_s + B)``
likelihood terms instead of ``O(K · Nd)``.

Reference: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling" (SL-DAIS; NS-DAIS is their naive-subsampling baseline).
"""

import warnings

import jax
import jax.numpy as jnp
import numpyro
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.infer.initialization import init_to_uniform
from numpyro.infer.util import potential_energy
from numpyro.primitives import Messenger, _subsample_fn

from numpyro_dais._autoguide import check_choice, check_positive_int
from numpyro_dais.autodais import AutoDAIS, _zero, partial_log_prob
from numpyro_dais.engine import dais
from numpyro_dais.engine.transitions import Potential

DYNAMICS = ("surrogate", "naive")
DEFAULT_NUM_SURROGATE = 256


class _FixPlates(Messenger):
    """Sets the indices of subsample plates, ``{name: (n,) indices}``; a plate of size
    ``Nd`` then scales its sites by ``Nd / n`` (by 1 when ``n = Nd``)."""

    def __init__(self, indices):
        self.indices = indices
        super().__init__()

    def process_message(self, msg):
        if msg["type"] == "plate" and msg["name"] in self.indices:
            msg["value"] = self.indices[msg["name"]]
            msg["args"] = (msg["args"][0], msg["value"].shape[0])


class _SurrogateData(_FixPlates):
    """Runs a model on the surrogate points of its subsample plate ``name`` (RAND ansatz).

    Fixes the plate's indices to ``indices (N_s,)``, replaces the outputs of
    ``numpyro.subsample`` by the stored ``rows`` (in call order, so the data set itself is
    never read), and weights every sample site inside the plate by ``weights (N_s,)``
    instead of the plate's ``Nd / N_s``: the log likelihood becomes
    ``ψ̂(z) = Σ_m ω_m log p(ỹ_m | z)``; sites outside the plate (the prior) are untouched.

    With ``rows=None`` it fixes the indices only and records the subsampled rows
    (:attr:`recorded`), which is how the rows are stored at set-up.
    """

    def __init__(self, name, size, indices, rows=None, weights=None):
        self.name, self.size = name, size
        self.rows, self.weights = rows, weights
        self._subsampled = []
        super().__init__({name: indices})

    def __enter__(self):
        self._subsampled = []
        return super().__enter__()

    @property
    def recorded(self):
        # the messages are final once the model has run (plates subsample on postprocess)
        return [msg["value"] for msg in self._subsampled]

    def process_message(self, msg):
        super().process_message(msg)
        if msg["type"] == "subsample":
            if self.rows is not None:
                msg["value"] = self.rows[len(self._subsampled)]
                # already subsampled: with no event_dim every plate leaves the value alone
                msg["kwargs"] = {**msg["kwargs"], "event_dim": None}
            self._subsampled.append(msg)
        elif msg["type"] == "sample" and self.weights is not None:
            frame = next((f for f in msg["cond_indep_stack"] if f.name == self.name), None)
            if frame is not None:
                num = self.weights.shape[0]
                plate_scale = self.size / num if num < self.size else 1.0
                scale = 1.0 if msg["scale"] is None else msg["scale"]
                weights = jnp.reshape(self.weights, (num,) + (1,) * (-frame.dim - 1))
                msg["scale"] = weights * (scale / plate_scale)


class AutoSurrogateLikelihoodDAIS(AutoDAIS):
    """DAIS for models whose likelihood sits in a subsampled ``numpyro.plate`` (SL-DAIS).

    The dynamics anneal from ``q0`` to ``log p(z) + ψ̂(z)``, a surrogate that never reads
    the data set; the final term of ``log w`` is the model's mini-batch estimate
    ``log p(z_K) + (Nd / B) Σ_{n∈I} log p(y_n | z_K)``. Under ``SVI(..., Trace_ELBO())``
    the loss is minus this bound (for ``num_particles = 1`` the model's own term of the
    ELBO supplies the final term, on the mini-batch the model draws).

    The surrogate ``ψ̂`` is either

    * ``surrogate_model``: a user model with the same latent sites as ``model``, called
      with no arguments (bind its data with ``functools.partial``); its ``numpyro.param``
      sites become parameters of the guide (numpyro's signature); or
    * built automatically (``surrogate_model=None``, RAND): ``num_surrogate`` points drawn
      once at set-up from the plate that the model subsamples, with learnable positive
      weights ``ω`` (``{prefix}_surrogate_weights``, init ``Nd / N_s`` each, summing to
      ``Nd``): ``ψ̂(z) = Σ_m ω_m log p(ỹ_m | z)``. The chosen rows are stored at set-up
      (for data the model picks with ``numpyro.subsample``), so after training
      ``sample_posterior`` needs no data: ``method="q0"`` (DAIS₀, the default) and
      ``method="dais"`` run on the stored rows. Arguments of the call that the model does
      not subsample (e.g. a prior scale) are read fresh on every call.

    ``dynamics="naive"`` gives **NS-DAIS**, the paper's baseline: the dynamics use the
    rescaled estimate ``(Nd / B) Σ_{n∈J} log p(y_n | z)`` on a mini-batch ``J`` drawn
    fresh from the current data on every run (so sampling it needs the data).

    With ``num_particles = N > 1`` the guide evaluates the mini-batch estimate at every
    particle inside ``log (1/N) Σ_i w_i``, on the same mini-batch as the model (the guide
    creates the subsample plates, and ``SVI`` replays their indices into the model). A
    noisy term inside the concave logarithm of a mean makes that estimate biased *upwards*
    for ``B < Nd`` (it can exceed ``log Z``); ``N = 1`` is unbiased.

    ``log_evidence`` and ``method="importance"`` weight the particles by the exact
    full-data log joint, so they need the data.

    :param model: a NumPyro model with continuous global latent sites.
    :param surrogate_model: optional surrogate model (see above); ``None``: RAND.
    :param int num_surrogate: RAND surrogate size ``N_s`` (default ``min(256, Nd)``).
    :param str dynamics: ``"surrogate"`` (SL-DAIS) or ``"naive"`` (NS-DAIS).
    :param int num_particles: particles ``N`` in the bound; defaults to 1 (see above).

    Other arguments as :class:`~numpyro_dais.AutoDAIS`.
    """

    supports_subsampling = True

    def __init__(
        self,
        model,
        surrogate_model=None,
        *,
        K=4,
        num_particles=1,
        num_surrogate=None,
        dynamics="surrogate",
        kernel="hmc",
        base_dist="diagonal",
        eta_init=None,
        eta_max=None,
        gamma_init=0.9,
        prefix="auto",
        init_loc_fn=init_to_uniform,
        init_scale=0.1,
        posterior_method="q0",
        sym_kl_weight=None,
        report_divergences=True,
        forward_mode_differentiation=False,
    ):
        check_choice("dynamics", dynamics, DYNAMICS)
        if num_surrogate is not None:
            check_positive_int("num_surrogate", num_surrogate)
        if surrogate_model is not None and dynamics == "naive":
            raise ValueError(
                "`surrogate_model` is not used with dynamics='naive' (NS-DAIS); "
                "drop it or use dynamics='surrogate'."
            )
        if surrogate_model is not None and num_surrogate is not None:
            raise ValueError(
                "`num_surrogate` sizes the automatic (RAND) surrogate; with a "
                "`surrogate_model` drop `num_surrogate`."
            )
        super().__init__(
            model,
            K=K,
            num_particles=num_particles,
            kernel=kernel,
            base_dist=base_dist,
            eta_init=eta_init,
            eta_max=eta_max,
            gamma_init=gamma_init,
            prefix=prefix,
            init_loc_fn=init_loc_fn,
            init_scale=init_scale,
            posterior_method=posterior_method,
            sym_kl_weight=sym_kl_weight,
            report_divergences=report_divergences,
            forward_mode_differentiation=forward_mode_differentiation,
        )
        self.surrogate_model = surrogate_model
        self.num_surrogate = num_surrogate
        self.dynamics = dynamics
        if num_particles > 1:
            warnings.warn(
                f"AutoSurrogateLikelihoodDAIS with num_particles={num_particles}: the "
                "mini-batch estimate of the log likelihood enters the log-mean-exp of the "
                "weights, so the bound is biased upwards when the plate subsamples "
                "(B < Nd) and may exceed log Z. Use num_particles=1 for an unbiased bound.",
                UserWarning,
                stacklevel=2,
            )

    # -- set-up -------------------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        # plates declared with a `subsample_size` (B = Nd included): name -> (Nd, B)
        self._data_plates = {
            name: tuple(site["args"][:2])
            for name, site in self.prototype_trace.items()
            if site["type"] == "plate" and site["args"][1] is not None
        }
        self._surrogate_param_sites = {}
        if self.surrogate_model is not None:
            self._setup_user_surrogate()
            return
        if not self._data_plates:
            raise ValueError(
                "AutoSurrogateLikelihoodDAIS found no subsample plate in the model to build "
                "its surrogate from. Put the likelihood in "
                "`numpyro.plate(name, Nd, subsample_size=B)`, or pass `surrogate_model`."
            )
        if self.dynamics == "surrogate":
            self._setup_rand_surrogate(args, kwargs)

    def _setup_rand_surrogate(self, args, kwargs):
        """Choose ``N_s`` points at random, store their rows, register the weights ``ω``."""
        if len(self._data_plates) > 1:
            raise ValueError(
                f"The model subsamples plates {sorted(self._data_plates)}; the automatic "
                "surrogate handles one subsample plate. Pass `surrogate_model`, or subsample "
                "a single plate."
            )
        ((name, (size, _)),) = self._data_plates.items()
        num = min(DEFAULT_NUM_SURROGATE, size) if self.num_surrogate is None else self.num_surrogate
        if num > size:
            raise ValueError(
                f"`num_surrogate`={num} is larger than the {size} data points of plate "
                f"{name!r}; choose num_surrogate <= {size}."
            )
        indices = jnp.sort(jax.random.choice(numpyro.prng_key(), size, (num,), replace=False))
        recorder = _SurrogateData(name, size, indices)
        with handlers.block(), recorder:
            handlers.seed(self.model, numpyro.prng_key())(*args, **kwargs)
        self._surrogate_data = (name, size, indices, recorder.recorded)
        self._surrogate_param_sites = {
            self._weights_name: (jnp.full(num, size / num), {"constraint": constraints.positive})
        }

    def _setup_user_surrogate(self):
        with handlers.block():
            trace = handlers.trace(
                handlers.seed(self.surrogate_model, numpyro.prng_key())
            ).get_trace()

        def latent_shapes(tr):
            return {
                name: jnp.shape(site["value"])
                for name, site in tr.items()
                if site["type"] == "sample" and not site["is_observed"]
            }

        model_latents, surrogate_latents = latent_shapes(self.prototype_trace), latent_shapes(trace)
        if model_latents != surrogate_latents:
            raise ValueError(
                "`surrogate_model` must have the same latent sites (names and shapes) as "
                f"`model`: model {model_latents}, surrogate {surrogate_latents}."
            )
        self._surrogate_param_sites = {
            name: (site["value"], dict(site["kwargs"]))
            for name, site in trace.items()
            if site["type"] == "param"
        }

    @property
    def _weights_name(self):
        return f"{self.prefix}_surrogate_weights"

    # -- parameters -----------------------------------------------------------------------

    def _model_params(self):
        """Current parameters of the model *and* of the surrogate (both enter the dynamics)."""
        surrogate = {
            name: numpyro.param(name, value, **kw)
            for name, (value, kw) in self._surrogate_param_sites.items()
        }
        return {**super()._model_params(), **surrogate}

    def _model_params_from(self, params):
        surrogate = {k: params[k] for k in self._surrogate_param_sites if k in params}
        return {**super()._model_params_from(params), **surrogate}

    # -- the engine --------------------------------------------------------------------------

    def _potential(self, q0, args, kwargs, model_params, rng_key=None):
        """The dynamics' path ends: ``q0`` and ``log p(z) + ψ̂(z)`` (SL-DAIS), or the
        model's log joint on a mini-batch drawn with ``rng_key`` (NS-DAIS)."""
        if self.dynamics == "naive":
            keys = jax.random.split(rng_key, len(self._data_plates))
            batch = {
                name: _subsample_fn(size, subsample_size, key)
                for key, (name, (size, subsample_size)) in zip(
                    keys, self._data_plates.items(), strict=True
                )
            }
            log_target = self._log_joint(args, kwargs, model_params, handler=_FixPlates(batch))
        elif self.surrogate_model is not None:
            log_target = self._log_user_surrogate(model_params)
        else:
            name, size, indices, rows = self._surrogate_data
            handler = _SurrogateData(name, size, indices, rows, model_params[self._weights_name])
            log_target = self._log_joint(args, kwargs, model_params, handler=handler)
        return Potential(partial_log_prob(q0), log_target)

    def _log_user_surrogate(self, params):
        def log_joint(z):
            with handlers.block(), handlers.substitute(data=params):
                return -potential_energy(self.surrogate_model, (), {}, self._unpack_latent(z))

        return log_joint

    def _run(
        self,
        rng_key,
        q0,
        anneal,
        model_params,
        args,
        kwargs,
        num_particles,
        model_supplies_final=False,
        final_indices=None,
    ):
        """Run the sampler on the surrogate dynamics. The final term is left out with
        ``model_supplies_final``; else it is the model's log joint on the mini-batch
        ``final_indices`` (``{plate: (B,) indices}``), by default on all the data."""
        if not args and not kwargs:
            args, kwargs = self._setup_args
        key_batch = None
        if self.dynamics == "naive":
            rng_key, key_batch = jax.random.split(rng_key)
        potential = self._potential(q0, args, kwargs, model_params, key_batch)
        if model_supplies_final:
            final = _zero
        else:
            if final_indices is None:
                final_indices = {
                    name: jnp.arange(nd) for name, (nd, _) in self._data_plates.items()
                }
            final = self._log_joint(args, kwargs, model_params, handler=_FixPlates(final_indices))
        return dais.run(
            rng_key,
            q0,
            potential,
            anneal,
            num_particles,
            kernel=self.kernel,
            log_final_target=final,
        )

    def _run_for_bound(self, rng_key, q0, anneal, model_params, args, kwargs):
        if self.num_particles == 1:
            return super()._run_for_bound(rng_key, q0, anneal, model_params, args, kwargs)
        # The guide draws the mini-batch: SVI replays these plates' indices into the model,
        # so the guide's final term and the model's term use the same rows.
        batch = {
            name: numpyro.plate(name, size, subsample_size=subsample_size)._indices
            for name, (size, subsample_size) in self._data_plates.items()
        }
        return self._run(
            rng_key, q0, anneal, model_params, args, kwargs, self.num_particles, final_indices=batch
        )
