"""Pareto k̂ of the annealed guides' weights: in ``log_evidence``, behind annealed draws, and
the warning when the weights' tail is too heavy (Vehtari et al. 2024)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import pytest
from numpyro.infer import SVI, Trace_ELBO, init_to_value

from numpyro_dais import AutoDAIS, AutoDSMCS
from numpyro_dais.annealed.posterior import queries

Y = jnp.array([0.8, 1.3, 0.2, 1.9, 1.1, 0.7])


def model(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.fixture(scope="module")
def trained():
    """AutoDAIS only: AutoDSMCS's weights go through the same code (its k̂ per transition is
    tested below, its evidence's in test_autodsmcs.py)."""
    guide = AutoDAIS(model, K=3, num_particles=8)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    return guide, svi.run(jax.random.key(0), 300, Y, progress_bar=False).params


def test_a_good_guide_has_light_tailed_weights_and_no_warning(trained):
    """The conjugate posterior is Gaussian and the Laplace start exact: the weights are
    nearly constant, so k̂ is far below 0.5 (measured about −1.4), and nothing warns."""
    guide, params = trained
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ev = guide.log_evidence(jax.random.key(1), params, Y, num_particles=1000)
        ev_b = guide.log_evidence(jax.random.key(1), params, Y, num_particles=1000, batch_size=100)
        draws, k = guide.sample_posterior(
            jax.random.key(2),
            params,
            Y,
            sample_shape=(100,),
            method="importance",
            return_pareto_k=True,
        )
    assert float(ev.pareto_k) < 0.5 and float(ev_b.pareto_k) < 0.5
    assert k.shape == () and float(k) < 0.5 and draws["mu"].shape == (100,)
    _, k_q0 = guide.sample_posterior(jax.random.key(2), params, method="q0", return_pareto_k=True)
    assert k_q0 is None


def test_a_misplaced_q0_gives_heavy_tailed_weights_and_a_warning():
    """An untrained q0 far from the posterior (at mu = −2, sd 0.05, posterior 0.89 ± 0.38)
    with one transition: a few particles carry all the weight, k̂ > 0.7 (measured 0.90),
    and ``log_evidence`` warns naming k̂, the weights and the fix."""
    guide = AutoDAIS(
        model,
        K=1,
        laplace_init=False,
        init_scale=0.05,
        init_loc_fn=init_to_value(values={"mu": -2.0}),
    )
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(0), Y))
    # confirmed on a fresh sample of four times the particles before it warns
    match = r"Pareto k̂ = .* of log_evidence's weights \(S = 8000\)"
    with pytest.warns(RuntimeWarning, match=match) as got:
        ev = guide.log_evidence(jax.random.key(1), params, Y, num_particles=2000)
    assert float(ev.pareto_k) > 0.7
    # the warning names the user's line, not the library's (nor ``sys:1``)
    assert {w.filename for w in got if "Pareto" in str(w.message)} == {__file__}
    with pytest.warns(RuntimeWarning, match="more particles, a larger K.*AutoDSMCS") as got:
        _, k = guide.sample_posterior(
            jax.random.key(1),
            params,
            Y,
            sample_shape=(2000,),
            method="importance",
            return_pareto_k=True,
        )
    assert float(k) > 0.7
    assert {w.filename for w in got if "Pareto" in str(w.message)} == {__file__}


def test_a_k_hat_past_its_threshold_by_chance_is_judged_again_on_four_times_the_particles(
    trained, monkeypatch
):
    """k̂ of S weights is noisy (about ±0.15 at S = 1000 around a threshold of 0.67), so a
    first k̂ past the threshold (forced here) makes ``log_evidence`` draw a fresh sample of
    4S particles: it returns that estimate, exactly the one of asking for 4S with the key
    folded with 1, and warns only if its k̂ is past too (a light tail here: no warning)."""
    guide, params = trained
    judged = []

    def first_past(k, num_particles, *rest):
        judged.append(num_particles)
        return len(judged) == 1 or real(k, num_particles, *rest)

    real = queries.confirm_heavy_tail
    monkeypatch.setattr(queries, "confirm_heavy_tail", first_past)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        ev = guide.log_evidence(jax.random.key(1), params, Y, num_particles=500)
    assert judged == [500]  # the 2,000 are judged by the warning alone
    monkeypatch.undo()
    again = guide.log_evidence(
        jax.random.fold_in(jax.random.key(1), 1), params, Y, num_particles=2000
    )
    np.testing.assert_allclose(ev.log_Z, again.log_Z, rtol=1e-6)
    np.testing.assert_allclose(ev.pareto_k, again.pareto_k, rtol=1e-6)


def test_numpyros_psis_diagnostic_judges_our_extended_space_weights():
    """``numpyro.infer.psis_diagnostic`` weighs each guide run by ``log p − log q`` of its
    trace; our guide's trace carries the factor ``ℓ(z*) − log Ẑ``, so that difference is the
    annealing's own log weight on the extended space, and numpyro's k̂ tells what ours does:
    light for a good guide (measured 0.10 against our 0.18, different draws), heavy for the
    misplaced q0 above (1.00 against 1.13). Tolerance: the verdicts agree, not the values
    (two k̂ estimates from 2000 independent draws differ by ~0.1)."""
    from numpyro.infer import psis_diagnostic

    for options, heavy in [
        (dict(K=3), False),
        (
            dict(
                K=1,
                laplace_init=False,
                init_scale=0.05,
                init_loc_fn=init_to_value(values={"mu": -2.0}),
            ),
            True,
        ),
    ]:
        guide = AutoDAIS(model, **options)
        svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.key(0), Y))
        k_numpyro = psis_diagnostic(jax.random.key(3), params, model, guide, Y, num_particles=2000)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            k_ours = float(
                guide.log_evidence(jax.random.key(3), params, Y, num_particles=2000).pareto_k
            )
        assert (k_numpyro > 0.7) == heavy and (k_ours > 0.7) == heavy


def test_smc_diagnostics_judge_each_transitions_weights():
    """With N = 64 particles each transition's incremental weights have a tail to fit; on
    the conjugate model after training they are light (measured below 0.5)."""
    guide = AutoDSMCS(model, K=3, num_particles=64)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    params = svi.run(jax.random.key(0), 200, Y, progress_bar=False).params
    d = guide.diagnostics(jax.random.key(1), params, Y)
    assert d.pareto_k.shape == (3,) and bool(jnp.all(d.pareto_k < 0.7))


def test_psis_draws_pool_the_systems_and_match_the_conjugate_posterior(trained):
    """``method="psis"``: 2000 systems of 8 particles pooled and 2000 draws resampled by the
    smoothed weights. Posterior N(0.857, 0.378²); the mean of 2000 draws (some duplicated)
    has an sd near 0.01, the sd an error near 0.01: tolerance 0.04 for both."""
    guide, params = trained
    draws, k = guide.sample_posterior(
        jax.random.key(5), params, Y, sample_shape=(2000,), method="psis", return_pareto_k=True
    )
    mu = draws["mu"]
    assert mu.shape == (2000,) and float(k) < 0.5
    assert abs(float(mu.mean()) - float(Y.sum() / 7)) < 0.04
    assert abs(float(mu.std()) - 7**-0.5) < 0.04
