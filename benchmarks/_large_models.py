"""Models of ``benchmarks`` whose data set is large, built at any size.

:func:`logistic_glmm` is a logistic GLMM with 67 groups (``D = 71`` latents: the intercept,
the group scale, 2 fixed effects and 67 non-centred group intercepts), and
:func:`logistic_glmm_data` simulates its data for any number of rows from
``numpy.random.default_rng(seed)``. Its joint mode overfits the group intercepts, so the
set-up refines the Laplace start by Gaussian VI (``numpyro_dais.engine.setup.refinement``), each
step of which costs full-data gradients: the model measures what that costs as the data
grow.
"""

import numpy as np
import numpyro
import numpyro.distributions as dist

#: groups of :func:`logistic_glmm`
GLMM_GROUPS = 67
#: fixed-effect covariates of :func:`logistic_glmm`
GLMM_COVARIATES = 2


def logistic_glmm(X, group, y=None, *, num_groups=GLMM_GROUPS):
    """Bernoulli rows with logit ``mu + tau · a_raw[group] + X β``: ``mu ~ N(0, 2)``,
    ``tau ~ HalfNormal(1)``, ``β ~ N(0, 1)`` per column of ``X (n, p)``, non-centred group
    intercepts ``a_raw ~ N(0, 1)`` (``num_groups``), ``group (n,)`` integer labels."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("groups", num_groups):
        a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
    with numpyro.plate("rows", X.shape[0]):
        logits = mu + tau * a_raw[group] + X @ beta
        numpyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


def logistic_glmm_data(num_rows, seed=0, num_groups=GLMM_GROUPS):
    """``((X, group), {"y": y, "num_groups": num_groups})`` for :func:`logistic_glmm`:
    ``num_rows`` rows spread over the groups at random (unbalanced: group shares drawn
    from a Dirichlet(2)), 2 standard normal covariates, group intercepts
    ``-0.3 + 0.7 · N(0, 1)``, slopes ``(0.8, -0.4)``; numpy float64 and int arrays."""
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(num_groups, 2.0))
    group = rng.choice(num_groups, size=num_rows, p=shares)
    X = rng.normal(size=(num_rows, GLMM_COVARIATES))
    a = -0.3 + 0.7 * rng.normal(size=num_groups)
    logits = a[group] + X @ np.array([0.8, -0.4])
    y = (rng.random(num_rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float64)
    return (X, group), {"y": y, "num_groups": num_groups}
