"""Models whose size is a parameter, with references that do not need a long MCMC run.

* :func:`logistic`: a Bayesian logistic regression, ``D = 20`` coefficients, ``rows`` rows
  (10³–10⁶), written with a ``numpyro.plate`` that can subsample (``subsample_size``). Its
  reference: the Laplace approximation at the mode (Newton in float64), corrected by
  self-normalised importance sampling from it where that is affordable (``rows ≤ 10⁵``).
* :func:`hierarchical`: a centred normal–normal hierarchy of ``groups`` groups (10–10⁴) of
  5 rows each with a known noise scale, written with a group plate that can subsample
  (Semi-DAIS); its posterior moments are exact, by one-dimensional quadrature over ``τ``
  with ``μ`` and every ``θ_j`` integrated analytically.

Each builder returns a :class:`Case`: the full-data model and its arguments, the
mini-batched variants the scalable guides take, and the reference means and sds of the
flattened latent coordinates, in the order the model samples them.
"""

import functools
import json
from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from scipy.special import log_expit, logsumexp


class Case(NamedTuple):
    """A model with its data and the reference moments of its flattened latent coordinates
    (in the order the model samples them); ``benchmarks.time_to_answer``'s cases too."""

    name: str
    family: str
    size: int | None
    """rows (logistic) or groups (hierarchical)"""
    model: object
    """the full-data model: ``model(*args, **kwargs)``"""
    args: tuple
    kwargs: dict
    mean: np.ndarray
    sd: np.ndarray
    description: str
    subsampled: object = None
    """``batch -> model`` with the plate subsampled to ``batch`` (SL-DAIS)"""
    semi: object = None
    """``batch -> (model, local_model, global_model)`` for AutoSemiDAIS (data bound: the
    models take no arguments)"""
    sites: tuple | None = None
    """the latent sites in the order of ``mean`` and ``sd``, where not the model's own (a
    model written another way: ``benchmarks._model_forms``)"""


# -- logistic regression ------------------------------------------------------------------------

LOGISTIC_DIM = 20


def logistic_model(X, y, subsample_size=None):
    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("rows", X.shape[0], subsample_size=subsample_size):
        x_b = numpyro.subsample(X, event_dim=1)
        y_b = numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=x_b @ w), obs=y_b)


def logistic_data(rows, dim=LOGISTIC_DIM, seed=0):
    """Covariates with correlations up to ~0.5 (a shared factor), coefficients ~N(0, 1/4)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, dim)) + 0.5 * rng.normal(size=(rows, 1))
    X /= np.sqrt(1.25)
    w = rng.normal(0.0, 0.5, dim)
    y = (rng.random(rows) < 1.0 / (1.0 + np.exp(-(X @ w)))).astype(np.float64)
    return X, y


def _logistic_log_post(W, X, y):
    """``(S,)`` log posterior (up to a constant) of coefficients ``W (S, D)``, in chunks."""
    out = -0.5 * np.sum(W**2, axis=1)
    for start in range(0, X.shape[0], 20_000):
        logits = X[start : start + 20_000] @ W.T
        yb = y[start : start + 20_000, None]
        out += np.sum(yb * log_expit(logits) + (1 - yb) * log_expit(-logits), axis=0)
    return out


def logistic_reference(X, y, num_draws=20_000, seed=1):
    """``(mean, sd, pareto-free ESS)``: Newton to the mode (float64), its Laplace Gaussian,
    and for ``rows ≤ 10⁵`` self-normalised importance weights of ``num_draws`` draws of a
    Student-t (ν = 10) with the Laplace covariance."""
    w = np.zeros(X.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        grad = X.T @ (y - p) - w
        hess = (X * (p * (1 - p))[:, None]).T @ X + np.eye(X.shape[1])
        step = np.linalg.solve(hess, grad)
        w += step
        if np.max(np.abs(step)) < 1e-12:
            break
    cov = np.linalg.inv(hess)
    if X.shape[0] > 100_000:
        return w, np.sqrt(np.diag(cov)), float("inf")
    rng = np.random.default_rng(seed)
    nu, D = 10.0, X.shape[1]
    L = np.linalg.cholesky(cov)
    u = rng.standard_normal((num_draws, D)) / np.sqrt(rng.chisquare(nu, (num_draws, 1)) / nu)
    W = w + u @ L.T
    log_q = -0.5 * (nu + D) * np.log1p(np.sum(u**2, axis=1) / nu)
    log_w = _logistic_log_post(W, X, y) - log_q
    weights = np.exp(log_w - logsumexp(log_w))
    mean = weights @ W
    sd = np.sqrt(weights @ (W - mean) ** 2)
    return mean, sd, float(1.0 / np.sum(weights**2))


#: The logistic references, computed once (the importance-corrected one of 10⁵ rows takes
#: minutes): ``{"logistic_<rows>_<seed>": {"mean": [...], "sd": [...]}}``.
REFERENCE_CACHE = Path(__file__).parent / "results" / "scale_references.json"


def _cached_reference(name, compute):
    """``(mean, sd)`` of ``name`` from :data:`REFERENCE_CACHE`, else ``compute()`` stored
    there."""
    cache = json.loads(REFERENCE_CACHE.read_text()) if REFERENCE_CACHE.exists() else {}
    if name not in cache:
        mean, sd = compute()
        cache[name] = {"mean": np.asarray(mean).tolist(), "sd": np.asarray(sd).tolist()}
        REFERENCE_CACHE.write_text(json.dumps(cache, indent=1) + "\n")
    return np.asarray(cache[name]["mean"]), np.asarray(cache[name]["sd"])


def logistic(rows, batch=1000, seed=0):
    """:class:`Case` of a ``D = 20`` logistic regression with ``rows`` rows."""
    X, y = logistic_data(rows, seed=seed)
    mean, sd = _cached_reference(f"logistic_{rows}_{seed}", lambda: logistic_reference(X, y)[:2])
    args = (jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32))

    def subsampled(b):
        return lambda X, y: logistic_model(X, y, subsample_size=min(b, rows))

    return Case(
        f"logistic_{rows}",
        "logistic",
        rows,
        logistic_model,
        args,
        {},
        mean,
        sd,
        f"logistic regression, D = {LOGISTIC_DIM}, {rows:,} rows, N(0, 1) priors",
        subsampled=subsampled,
    )


# -- a normal-normal hierarchy ------------------------------------------------------------------

PER_GROUP = 5
SIGMA_Y = 1.0
MU_SCALE = 5.0
TAU_SCALE = 2.0


def hierarchical_global():
    mu = numpyro.sample("mu", dist.Normal(0.0, MU_SCALE))
    tau = numpyro.sample("tau", dist.HalfNormal(TAU_SCALE))
    return {"mu": mu, "tau": tau}


def hierarchical_local(g, y, subsample_size=None):
    with numpyro.plate("groups", y.shape[0], subsample_size=subsample_size):
        theta = numpyro.sample("theta", dist.Normal(g["mu"], g["tau"]))
        y_b = numpyro.subsample(y, event_dim=1)
        numpyro.sample("y", dist.Normal(theta[:, None], SIGMA_Y).to_event(1), obs=y_b)


def hierarchical_model(y, subsample_size=None):
    """Centred: ``θ_j ~ N(μ, τ)``, ``y_jk ~ N(θ_j, 1)``; ``y (groups, 5)``."""
    hierarchical_local(hierarchical_global(), y, subsample_size)


def hierarchical_data(groups, seed=0):
    rng = np.random.default_rng(seed)
    theta = 1.0 + 0.8 * rng.normal(size=groups)
    return theta[:, None] + SIGMA_Y * rng.normal(size=(groups, PER_GROUP))


def hierarchical_reference(y, num_tau=4000):
    """Exact posterior means and sds of ``(μ, τ, θ_1, …, θ_J)``: ``ȳ_j | μ, τ ~ N(μ, τ² +
    s²)`` with ``s² = 1 / 5``, so ``μ | τ`` is normal and ``p(τ | y)`` is one-dimensional;
    ``θ_j | μ, τ`` is normal and linear in ``μ``. Quadrature over ``log τ``."""
    ybar = y.mean(axis=1)
    s2 = SIGMA_Y**2 / y.shape[1]
    log_tau = np.linspace(np.log(1e-4), np.log(50.0), num_tau)
    tau = np.exp(log_tau)
    c = np.broadcast_to(tau[:, None] ** 2 + s2, (num_tau, ybar.shape[0]))  # (T, J)
    precision = np.sum(1.0 / c, axis=1) + 1.0 / MU_SCALE**2
    b = np.sum(ybar / c, axis=1)
    m, v = b / precision, 1.0 / precision
    log_marginal = (
        -0.5 * np.sum(np.log(c), axis=1)
        - 0.5 * np.sum(ybar**2 / c, axis=1)
        + 0.5 * b**2 / precision
        - 0.5 * np.log(precision)
    )
    log_prior = -0.5 * (tau / TAU_SCALE) ** 2  # half-normal, in τ
    log_w = log_marginal + log_prior + log_tau  # density in log τ: Jacobian τ
    w = np.exp(log_w - logsumexp(log_w))
    mu_mean = w @ m
    mu_sd = np.sqrt(w @ (v + m**2) - mu_mean**2)
    tau_mean = w @ tau
    tau_sd = np.sqrt(w @ tau**2 - tau_mean**2)
    vj = 1.0 / (1.0 / tau[:, None] ** 2 + 1.0 / s2)  # (T, J)
    a = vj / tau[:, None] ** 2  # θ_j's mean is a μ + c_j
    cj = vj * ybar / s2
    e1 = a * m[:, None] + cj
    e2 = vj + a**2 * (v + m**2)[:, None] + 2 * a * m[:, None] * cj + cj**2
    theta_mean = w @ e1
    theta_sd = np.sqrt(np.maximum(w @ e2 - theta_mean**2, 0.0))
    mean = np.concatenate([[mu_mean, tau_mean], theta_mean])
    sd = np.concatenate([[mu_sd, tau_sd], theta_sd])
    return mean, sd


def hierarchical(groups, seed=0):
    """:class:`Case` of the centred hierarchy with ``groups`` groups of 5 rows."""
    y = hierarchical_data(groups, seed)
    mean, sd = hierarchical_reference(y)
    args = (jnp.asarray(y, jnp.float32),)

    def semi(b):
        """``(model, local_model, global_model)`` with ``y`` bound and the group plate
        subsampled to ``b`` groups: AutoSemiDAIS's arguments (the models take none)."""
        batch = min(b, groups)
        local_model = functools.partial(hierarchical_local, y=args[0], subsample_size=batch)

        def model():
            local_model(hierarchical_global())

        return model, local_model, hierarchical_global

    return Case(
        f"hierarchical_{groups}",
        "hierarchical",
        groups,
        hierarchical_model,
        args,
        {},
        mean,
        sd,
        f"centred normal hierarchy, {groups:,} groups × {PER_GROUP} rows, known noise sd, "
        "mu ~ N(0, 5), tau ~ HalfNormal(2)",
        semi=semi,
    )
