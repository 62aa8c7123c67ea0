"""The self-check of an annealed guide, guide side: the report of
:meth:`~numpyro_dais.annealed.guide.AnnealedGuide.transport_check` kept per set of
``params``, the warnings it gives the first time they are used for ``q0`` draws (and for
the end points of one particle), the summaries of ``q0`` that trigger it, and the chains'
program it runs (:mod:`numpyro_dais.annealed.posterior.selfcheck` holds their math).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from numpyro_dais.annealed import sampling
from numpyro_dais.annealed.binding import BindingGuide
from numpyro_dais.annealed.posterior import mala_draws, queries, selfcheck
from numpyro_dais.annealed.posterior.queries import SUMMARY_DRAWS
from numpyro_dais.results import TransportReport
from numpyro_dais.runtime import compilation


class ChainsPlan(NamedTuple):
    """The self-check's chains on a call: their compiled ``program``, the ``runs`` it is
    compiled for, the first round's ``start`` and the ``operands`` before it."""

    program: object
    runs: float
    start: mala_draws.Start
    operands: tuple


class SelfCheckingGuide(BindingGuide):
    """An annealed guide that checks ``q0`` before it is used as the posterior (the base of
    :class:`~numpyro_dais.annealed.guide.AnnealedGuide`)."""

    def _subject(self) -> selfcheck.Subject:
        names = self._coordinate_names()
        return selfcheck.Subject(
            type(self).__name__, names, self._view.unpack, self.sym_kl_weight, self.base_dist
        )

    def _self_check_report(self, params) -> TransportReport | None:
        """:meth:`transport_check` of ``params`` on the set-up data, run the first time they
        are drawn from and kept (:mod:`numpyro_dais.annealed.posterior.selfcheck`); ``None``
        where it does not run (``self_check`` off, under ``jit``, or nothing to compare
        ``q0`` with)."""
        key = selfcheck.fingerprint(params) if self.self_check else None
        if key is None:
            return None
        reports = self.__dict__.setdefault("_self_check_reports", {})
        if key not in reports:
            args, kwargs = self._setup_args
            try:
                reports[key] = self.transport_check(
                    jax.random.key(0),
                    params,
                    *args,
                    num_samples=selfcheck.NUM_SAMPLES,
                    warn=False,
                    **kwargs,
                )
            except ValueError:
                # the annealing cannot run here (e.g. a guide inside an AutoGuideList, whose
                # model hides sites that another guide draws): nothing to compare q0 with
                reports[key] = None
        return reports[key]

    def _check_q0_once(self, params) -> TransportReport | None:
        """The self-check (:meth:`_self_check_report`) the first time ``params`` are used
        for ``q0`` draws; its warning carries the fix. Returns its report, ``None`` where it
        did not run (off, done before for these ``params``, under ``jit``, or nothing to
        compare ``q0`` with)."""
        checked = self.__dict__.setdefault("_self_checked", set())
        if not self.self_check or not selfcheck.first_use(checked, params):
            return None
        report = self._self_check_report(params)
        return None if report is None else selfcheck.warn_if_failed(report)

    def _end_points_judged(self, params, method) -> bool:
        """Whether the self-check judges ``method``'s draws for ``params`` instead of their
        weights' ``k̂``: the end points of one particle (``"importance"``, ``"dais"`` with
        ``num_particles=1``), which its chains judge better than the tail of weights no
        draw was resampled by; it warns, with the fix, the first time they fail it."""
        if self.num_particles != 1 or method not in ("importance", "dais"):
            return False
        report = self._self_check_report(params)
        if report is None or report.importance_ok is None:
            return False
        checked = self.__dict__.setdefault("_end_points_checked", set())
        if selfcheck.first_use(checked, params):
            selfcheck.warn_if_failed(report, "importance")
        return True

    def _q0_of_z(self, params, check=False):
        """The trained ``q0`` as a Gaussian of the flat unconstrained ``z``; ``check``: used
        as the posterior, so checked once (:meth:`_check_q0_once`)."""
        fitted = self._params_from(params)
        if check:
            self._check_q0_once(params)
        return sampling.in_z(fitted.affine, fitted.q0)

    def _summary_draws(self, params):
        """``(SUMMARY_DRAWS, D)`` draws by ``posterior_method`` on the set-up data (fixed
        seed): what ``median`` and ``quantiles`` summarise when it is not ``"q0"``."""
        args, kwargs = self._setup_args
        args, kwargs = self._data(args, kwargs, self.posterior_method)
        fitted = self._params_from(params)
        method, key = self.posterior_method, jax.random.key(0)
        if method == "importance" and queries.applies(None, None, key, fitted, args, kwargs):
            return self._importance(key, fitted, params, args, kwargs, SUMMARY_DRAWS).z
        draw = self._compiled(self._bound_call(sampling.draw), "_draw")
        runs = queries.runs(self.K, SUMMARY_DRAWS, method=method)
        return draw.run_for(runs, key, fitted, args, kwargs, method, SUMMARY_DRAWS)

    def _summary(self, params, reduce):
        """``reduce`` (over the leading axis) of the draws behind :meth:`_summary_draws`, site
        by site: of the flat draws, constrained after (each coordinate's map is monotone),
        or, when sites run non-centred (their values need the model), of the draws'
        values."""
        draws = self._summary_draws(params)
        if not self._view.noncentred:
            return self._transform(reduce(draws))
        if self.posterior_method == "q0":
            self._check_q0_once(params)
        values = self._constrain(draws, params)
        return {name: reduce(values[name]) for name in self._view.transforms}

    def _chains_plan(self, rng_key, fitted, params, args, kwargs):
        """How the self-check's chains run on the call: a :class:`ChainsPlan`; ``None``
        where the dynamics do not run on the full-data posterior (a surrogate, a
        mini-batch), a skipped :class:`~numpyro_dais.annealed.posterior.selfcheck.ChainsCheck`
        where the budget of flops does not afford them."""
        if self._target.supports_subsampling:
            return None
        gradient_flops = self._gradient_flops(rng_key, fitted, args, kwargs)
        num_chains = selfcheck.num_check_chains(gradient_flops)
        if num_chains is None:
            return selfcheck.skipped(gradient_flops)
        return ChainsPlan(
            self._compiled(self._chains_round, "chains_round"),
            mala_draws.runs(selfcheck.CHECK_DRAWS, num_chains),
            mala_draws.first_start(self.latent_dim, fitted.q0.loc.dtype, num_chains),
            (jax.random.fold_in(rng_key, 1), fitted, params, args, kwargs),
        )

    def _chains(self, rng_key, fitted, params, args, kwargs) -> selfcheck.ChainsCheck | None:
        """The self-check's chains (:func:`numpyro_dais.annealed.posterior.selfcheck.chains_round`)
        on the call, in their own program, in rounds until they settle (:meth:`_chains_plan`)."""
        plan = self._chains_plan(rng_key, fitted, params, args, kwargs)
        if not isinstance(plan, ChainsPlan):
            return plan
        comparison, info, rounds = mala_draws.run_rounds(
            lambda start, index: plan.program.run_for(plan.runs, *plan.operands, start, index),
            plan.start,
            self._coordinate_names(),
        )
        names, unpack = self._value_coordinates()
        return selfcheck.ChainsCheck(comparison, names, unpack, info, rounds)

    def _prepare_self_check(self, params) -> None:
        """Compile the self-check's programs for ``params``' types in the background
        (:func:`numpyro_dais.runtime.compilation.prepare`): called before training, so that
        the check at its end finds them compiled. Nothing where the check is off."""
        if not self.self_check or selfcheck.fingerprint(params) is None:
            return
        rng_key, fitted = jax.random.key(0), self._params_from(params)
        args, kwargs = self._data(*self._setup_args, "importance")
        program = self._compiled(self._importance_chunk, "importance_chunk")
        operands = (fitted, params, args, kwargs)
        try:
            queries.prepare_importance(program, rng_key, self.K, selfcheck.NUM_SAMPLES, *operands)
            plan = self._chains_plan(rng_key, *operands)
        except ValueError:  # the annealing cannot run here: nor can the check
            return
        if isinstance(plan, ChainsPlan):
            plan.program.prepare(plan.runs, *plan.operands, plan.start, np.asarray(0, np.int32))

    def _gradient_flops(self, rng_key, fitted, args, kwargs) -> float:
        """XLA's flops of a gradient of the call's log density
        (:func:`numpyro_dais.annealed.posterior.selfcheck.gradient`), lowered once per input
        types."""
        operands = (rng_key, fitted, args, kwargs)
        cache = self.__dict__.setdefault("_gradient_flops_of", {})
        key = compilation.input_types(jax.tree.leaves(operands))
        if key not in cache:
            probe = jax.jit(self._bound_call(selfcheck.gradient))
            cache[key] = compilation.flops(probe.lower(*operands))
        return cache[key]

    def _chains_round(self, rng_key, fitted, params, args, kwargs, start, index):
        """:func:`numpyro_dais.annealed.posterior.selfcheck.chains_round` of the call, its
        draws compared as the flat constrained values of the latent sites."""

        def values(z):
            draws = self._constrain(z, params, args, kwargs)
            return jnp.concatenate(
                [jnp.reshape(draws[name], (z.shape[0], -1)) for name, _ in self._value_sites()],
                axis=-1,
            )

        call = self._bind(fitted, args, kwargs)
        return selfcheck.chains_round(call, rng_key, start, index, values)
