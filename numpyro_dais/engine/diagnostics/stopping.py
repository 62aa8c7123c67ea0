"""When to stop a stochastic-gradient fit: a rule on the trend of its noisy objective.

Once the optimiser has reached its stationary regime the loss keeps fluctuating around a
constant mean. The fit is run in windows of ``W`` steps; each window's mean loss is compared
with the best window's, and an improvement counts only when it exceeds ``z`` standard errors
of the difference. The standard errors come from batch means (the window cut into
``num_batches`` consecutive batches), so correlation between neighbouring steps does not
shrink them. After ``patience`` windows in a row without an improvement the fit has stopped
improving; the iterates of those windows are then stationary, and their average (Polyak &
Juditsky 1992) is a less noisy estimate of the optimum than the last iterate.

Host-side NumPy: the rule reads one window's losses at a time, between compiled windows.

Reference: Polyak & Juditsky (1992), "Acceleration of stochastic approximation by
averaging"; Dhaka et al. (2020), "Robust, accurate stochastic optimization for variational
inference" (stationarity first, then iterate averaging).
"""

from typing import NamedTuple

import numpy as np


class Rule(NamedTuple):
    """The stopping rule's settings."""

    patience: int = 3
    """windows in a row without a significant improvement after which the fit stops"""
    z: float = 2.0
    """an improvement counts when it exceeds ``z`` standard errors of the difference"""
    num_batches: int = 10
    """batches of a window behind its standard error"""


class WindowStats(NamedTuple):
    """The summary of one window's losses."""

    mean: float
    """mean of the finite losses (``nan`` when none is)"""
    se: float
    """standard error of ``mean`` from the batch means"""
    finite: float
    """fraction of the window's losses that are finite"""


class RuleState(NamedTuple):
    """What the rule remembers between windows."""

    best_mean: float = np.inf
    """the mean loss of the best window so far (the last significant improvement)"""
    best_se: float = 0.0
    """its standard error"""
    stalled: int = 0
    """windows since that improvement"""


def window_stats(losses, num_batches: int = 10) -> WindowStats:
    """:class:`WindowStats` of ``losses (W,)``: the mean of its finite values and the
    standard error of that mean from ``num_batches`` consecutive batch means (a window of
    fewer than ``2 · num_batches`` steps is cut into batches of 2)."""
    losses = np.asarray(losses, np.float64).ravel()
    finite = np.isfinite(losses)
    if not finite.any():
        return WindowStats(np.nan, np.nan, 0.0)
    num_batches = max(2, min(num_batches, losses.size // 2))
    batches = [b[np.isfinite(b)] for b in np.array_split(losses, num_batches)]
    means = np.array([b.mean() for b in batches if b.size])
    se = means.std(ddof=1) / np.sqrt(means.size) if means.size > 1 else np.inf
    return WindowStats(float(losses[finite].mean()), float(se), float(finite.mean()))


def improved(state: RuleState, stats: WindowStats, z: float) -> bool:
    """Whether the window of ``stats`` beats the best window by more than ``z`` standard
    errors of the difference (a window with no finite loss never does)."""
    if not np.isfinite(stats.mean):
        return False
    if not np.isfinite(state.best_mean):
        return True
    return state.best_mean - stats.mean > z * np.hypot(stats.se, state.best_se)


def update(rule: Rule, state: RuleState, stats: WindowStats) -> RuleState:
    """The rule's state after the window of ``stats``."""
    if improved(state, stats, rule.z):
        return RuleState(stats.mean, stats.se, 0)
    return state._replace(stalled=state.stalled + 1)


def converged(rule: Rule, state: RuleState) -> bool:
    """Whether the fit has gone ``patience`` windows without a significant improvement."""
    return state.stalled >= rule.patience
