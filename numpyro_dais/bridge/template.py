"""The template every guide fills in: ``sample_posterior``'s skeleton and, for a flat
guide, the training call.

:class:`DrawTemplate` owns the checks and shaping of posterior draws (every guide's, Semi-DAIS's
too); :class:`GuideTemplate` (a base of
:class:`~numpyro_dais.bridge.autoguide.ContinuousGuide`) adds the protocol of a flat guide's
call under NumPyro (a ``Predictive`` draw, ``svi.init``, the loss term and its factor site),
whose hooks ``AnnealedGuide`` and ``AutoGPVI`` fill in.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro

from numpyro_dais.bridge import numpyro_private
from numpyro_dais.bridge.checks import check_batch_size, check_mesh, check_sample_shape


class DrawPlan(NamedTuple):
    """A ``sample_posterior`` call's checked ``sample_shape``, its ``num_draws`` (their
    product, at least 1), ``batch_size`` and ``mesh``."""

    sample_shape: tuple
    num_draws: int
    batch_size: int | None
    mesh: object


class DrawTemplate:
    """The skeleton of every guide's ``sample_posterior``: :meth:`_draw_plan` (the checked
    shape, count, batch size and mesh) first, :meth:`_shape_draws` last."""

    def _draw_plan(self, sample_shape, batch_size, mesh) -> "DrawPlan":
        """The checked shape, count, batch size and mesh of a ``sample_posterior`` call: the
        first half of every guide's ``sample_posterior`` (the second: :meth:`_shape_draws`,
        within a flat guide's :meth:`GuideTemplate._finish_draws`)."""
        sample_shape = check_sample_shape(sample_shape)
        batch_size = check_batch_size(batch_size)
        num_draws = int(math.prod(sample_shape)) if sample_shape else 1
        mesh = check_mesh(type(self).__name__, mesh, num_draws, batch_size, "draws")
        return DrawPlan(sample_shape, num_draws, batch_size, mesh)

    @staticmethod
    def _shape_draws(draws, plan: "DrawPlan"):
        """Draws ``(S, ...)`` shaped ``plan.sample_shape + event shape``."""
        shape = plan.sample_shape
        return jax.tree.map(lambda x: jnp.reshape(x, shape + x.shape[1:]), draws)


class GuideTemplate(DrawTemplate):
    """The training call of a flat guide (:meth:`_latent_sample`, with the hooks
    ``_read_params``, ``_posterior_draw``, ``_in_loss``, ``_init_draw``, ``_loss_term``) and
    its draws constrained and shaped (:meth:`_finish_draws`)."""

    #: the name of the factor site that carries the guide's log weight in a loss
    _weight_site = "log_weight"

    def _latent_sample(self, *args, **kwargs):
        """The training-call protocol every flat guide shares (a NumPyro guide call's
        flat latent, bridged in :mod:`numpyro_dais.bridge.numpyro_private`), filled in by the hooks
        below: outside a loss (e.g. ``Predictive``) one posterior draw; under ``svi.init``, which
        keeps only the parameters and a latent value, a cheap draw and a zero weight; in a loss, the
        guide's objective (one compiled program when the guide runs eagerly), whose log weight
        enters the ELBO as a factor site. Returns the flat latent ``z (D,)`` handed to the model."""
        kwargs.pop("sample_shape", None)
        rng_key = numpyro.prng_key()
        call = self._read_params(args, kwargs)
        if not numpyro_private.in_loss():
            return self._posterior_draw(rng_key, call, args, kwargs)
        call = self._in_loss(call, args, kwargs)
        site = f"{self.prefix}_{self._weight_site}"
        if numpyro_private.in_svi_init():
            numpyro_private.emit_log_weight(site, jnp.zeros(()))
            return self._init_draw(rng_key, call, args, kwargs)
        z, log_weight = self._loss_term(rng_key, call, args, kwargs)
        numpyro_private.emit_log_weight(site, log_weight)
        return z

    def _read_params(self, args, kwargs):
        """The call's parameters, read from its ``numpyro.param`` sites."""
        raise NotImplementedError

    def _posterior_draw(self, rng_key, call, args, kwargs):
        """One flat posterior draw ``(D,)``, as ``sample_posterior`` draws."""
        raise NotImplementedError

    def _in_loss(self, call, args, kwargs):
        """What a loss needs beyond ``call`` (checks, the mini-batch), before ``svi.init``."""
        return call

    def _init_draw(self, rng_key, call, args, kwargs):
        """The latent value ``svi.init`` keeps: by default a posterior draw."""
        return self._posterior_draw(rng_key, call, args, kwargs)

    def _loss_term(self, rng_key, call, args, kwargs):
        """``(z, log_weight)``: the particle handed to the model and the guide's factor."""
        raise NotImplementedError

    def _finish_draws(self, latents, params, args, kwargs, plan: "DrawPlan"):
        """Flat draws ``(S, D)`` constrained (deterministic sites included) and shaped
        ``plan.sample_shape + event shape``."""
        return self._shape_draws(
            self._constrain(latents, params, args, kwargs, plan.batch_size), plan
        )
