"""Posterior queries of ``AutoSemiDAIS``: draws for a set of the plate's members and the
evidence ``log p(x)`` over the whole plate.

Given ``θ ~ q(θ)``, one chain per member ``n`` gives ``w_n`` with ``E[w_n | θ] = p(x_n | θ)``,
so ``w = p(θ) Π_n w_n / q(θ)`` (all ``N`` members) has ``E[w] = p(x)``: the evidence is the
log-mean-exp of independent such weights, as for AutoDAIS. One weight is minus the loss of
one full-plate draw (``Trace_ELBO`` with the plate's indices fixed to all members).

Reference: Jankowiak & Phan (2022), "Surrogate likelihoods for variational annealed
importance sampling", §7.6 and appendix A.1.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpyro
from numpyro import handlers
from numpyro.infer import Trace_ELBO

from numpyro_dais.annealed import sampling
from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.checks import check_batch_size, check_positive_int
from numpyro_dais.results import LogEvidence
from numpyro_dais.runtime.compilation import annealing_runs
from numpyro_dais.runtime.vectorise import map_batched, map_chunks
from numpyro_dais.semidais import sites

#: Draws are run in slices of about this many members' chains (``max(4, this / members)``
#: draws at a time): one vmap over every draw at once is memory-bound on a CPU.
DRAW_CHAINS = 16384


class SemiDAISQueries:
    """``sample_posterior`` and ``log_evidence`` of :class:`~numpyro_dais.AutoSemiDAIS`."""

    def sample_posterior(self, rng_key, params, *args, sample_shape=(), **kwargs):
        """Draws of the global latents (global guide) and of the local latents of the
        plate's batch (the chains' end points). For a given set of the plate's members (of
        any size; ``jnp.arange(N)`` for all), run it under
        ``handlers.substitute(data={plate_name: indices})``."""
        self._set_up_with(rng_key, params, args, kwargs)
        lay = self._layout
        plate_key, rng_key = jax.random.split(rng_key)
        with handlers.seed(rng_seed=plate_key), sites.substituted_plates():
            with numpyro.plate(lay.plate, lay.size, subsample_size=lay.batch, dim=lay.dim) as idx:
                pass  # the members: substituted outside, else a batch drawn once for all draws
        plan = self._draw_plan(sample_shape, None, None)
        keys = jax.random.split(rng_key, plan.num_draws)
        with numpyro_private.isolated():
            draws = self._compiled(self._draws).run_for(self.K, keys, params, idx, args, kwargs)
        return self._shape_draws(draws, plan)

    def _draws(self, keys, params, idx, args, kwargs):
        """The latent sites of one guide run per key, for the members ``idx``: one compiled
        program per guide and argument structure, run with no handler from outside
        (:func:`~numpyro_dais.bridge.numpyro_private.isolated`), so that ``idx`` stays an input."""
        names = sites.latent_names(self.prototype_trace)

        def one(key):
            fixed = {**params, self._layout.plate: idx}
            with handlers.trace() as tr, handlers.seed(rng_seed=key), self._query():
                with handlers.substitute(data=fixed), sites.substituted_plates():
                    self(*args, **kwargs)
            return {k: s["value"] for k, s in tr.items() if s["type"] == "sample" and k in names}

        chunk = max(4, DRAW_CHAINS // max(int(idx.shape[0]), 1))
        return map_batched(one, keys, chunk)

    def log_evidence(
        self, rng_key, params, *args, num_particles=1000, batch_size=None, **kwargs
    ) -> LogEvidence:
        """Estimate ``log p(x)`` from ``num_particles`` weights, each from one draw
        ``θ ~ q(θ)`` and one chain per member of the **whole** plate (``N`` chains, whatever
        the training batch), in chunks of at most ``batch_size`` weights (memory
        ``batch_size · N`` chains).

        Returns ``LogEvidence(log_Z, ess, se, pareto_k)`` as ``AutoDAIS.log_evidence``: the
        estimate is biased low by about ``se² / 2``, and a ``RuntimeWarning`` says when the
        weights' Pareto ``k̂`` makes it unreliable.
        """
        num_particles = check_positive_int("num_particles", num_particles)
        batch_size = check_batch_size(batch_size)
        self._set_up_with(rng_key, params, args, kwargs)
        evidence = self._compiled(self._log_evidence)
        runs = annealing_runs(self.K, num_particles, batch_size)
        out = evidence.run_for(runs, rng_key, params, args, kwargs, num_particles, batch_size)
        what = f"log_evidence's weights (S = {num_particles})"
        sampling.warn_if_heavy_tailed(type(self).__name__, out.pareto_k, num_particles, what)
        return out

    def _log_evidence(self, rng_key, params, args, kwargs, num_particles, batch_size):
        everyone = {self._layout.plate: jnp.arange(self._layout.size)}

        def weight(key):
            with sites.substituted_plates(), handlers.substitute(data=everyone):
                return -Trace_ELBO().loss(key, params, self.model, self, *args, **kwargs)

        weights_of = lambda key, n: jax.vmap(weight)(jax.random.split(key, n))
        log_w = map_chunks(weights_of, rng_key, num_particles, batch_size)
        return sampling.evidence_of(log_w)

    @contextlib.contextmanager
    def _query(self):
        """A guide run for a query, not a training step: no control variate."""
        before, self._querying = self._querying, True
        try:
            yield
        finally:
            self._querying = before

    def _set_up_with(self, rng_key, params, args, kwargs):
        with handlers.seed(rng_seed=rng_key), handlers.substitute(data=params):
            self._set_up_once(args, kwargs)
