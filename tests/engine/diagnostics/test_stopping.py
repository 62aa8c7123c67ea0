"""The stopping rule (``numpyro_dais.engine.diagnostics.stopping``): batch-means standard errors and
the patience count, on sequences whose answer is known."""

import numpy as np
import pytest

from numpyro_dais.engine.diagnostics import stopping


def test_window_stats_is_the_mean_and_the_batch_means_standard_error():
    losses = np.arange(20.0)
    stats = stopping.window_stats(losses, num_batches=4)
    means = losses.reshape(4, 5).mean(1)
    assert stats.mean == pytest.approx(9.5)
    assert stats.se == pytest.approx(means.std(ddof=1) / 2.0)
    assert stats.finite == 1.0


def test_window_stats_leaves_out_non_finite_losses():
    losses = np.array([1.0, np.nan, 3.0, np.inf, 5.0, 7.0])
    stats = stopping.window_stats(losses, num_batches=3)
    assert stats.mean == pytest.approx(4.0)
    assert stats.finite == pytest.approx(4 / 6)
    assert np.isnan(stopping.window_stats(np.full(8, np.nan)).mean)


def _run(window_means, se=0.1, patience=2):
    """The window at which the rule stops (1-based), or None."""
    rule = stopping.Rule(patience=patience)
    state = stopping.RuleState()
    for w, m in enumerate(window_means, 1):
        state = stopping.update(rule, state, stopping.WindowStats(m, se, 1.0))
        if stopping.converged(rule, state):
            return w
    return None


def test_a_flat_loss_stops_after_patience_windows_past_the_first():
    assert _run([5.0, 5.0, 5.0, 5.0]) == 3


def test_an_improvement_beyond_z_standard_errors_resets_the_count():
    # 0.3 > 2 * hypot(0.1, 0.1) = 0.28: an improvement; 0.2 is not
    assert _run([5.0, 5.0, 4.7, 4.7, 4.7]) == 5
    assert _run([5.0, 5.0, 4.8, 4.8]) == 3


def test_a_slow_steady_improvement_is_seen_once_it_adds_up():
    """Each window 0.1 below the last (half a standard error of the difference): the
    rule compares with the last significant improvement, so the sum is seen every third
    window and the fit goes on."""
    assert _run([5.0 - 0.1 * w for w in range(12)], patience=3) is None


def test_a_window_with_no_finite_loss_is_no_improvement():
    assert _run([5.0, np.nan, np.nan]) == 3
