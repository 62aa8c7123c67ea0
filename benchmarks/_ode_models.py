"""A pharmacokinetic ODE model for the benchmarks: one compartment, oral absorption, one
patient, its ODE solved inside the model.

A dose ``DOSE`` (mg) enters the gut at ``t = 0`` and is absorbed at rate ``ka`` into a
central compartment of volume ``V``, which clears at ``CL`` (elimination rate
``ke = CL / V``)::

    dA_gut/dt = −ka A_gut,    dA_c/dt = ka A_gut − ke A_c,    C(t) = A_c(t) / V

and 14 plasma concentrations over 24 h are observed with a proportional (log-normal) error of
scale ``sigma``. Four latent parameters: ``log_ka``, ``log_cl``, ``log_v`` (Normal priors
around typical values, half an order of magnitude wide) and ``sigma`` (HalfNormal). The data
are simulated with NumPy from the closed form (Bateman's function) and a fixed seed.

Two variants solve the same ODE: :func:`rk4` by fixed-step fourth-order Runge-Kutta in
``jax.lax.scan`` (:data:`RK4_STEPS` steps of 5 minutes), :func:`odeint` by
``jax.experimental.ode.odeint`` (adaptive Dormand-Prince, differentiated by its
``custom_vjp`` adjoint). Each builder returns ``(model, args, kwargs, description)``:
``model(*args, **kwargs)`` is the conditioned model.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.experimental import ode

#: the oral dose (mg)
DOSE = 100.0
#: the observation times (h)
TIMES = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0])
#: RK4 steps over the 24 h horizon (5 minutes each); every observation time is on the grid
RK4_STEPS = 288
#: the tolerances of the ``odeint`` variant (float32-sized)
ODEINT_TOL = 1e-6
#: the parameters the data are simulated from: ka (1/h), CL (L/h), V (L), sigma
TRUE = {"ka": 1.2, "cl": 4.0, "v": 40.0, "sigma": 0.15}


def concentrations(t, ka, cl, v, dose=DOSE):
    """Bateman's closed-form solution ``C(t)``, with NumPy (the data's source)."""
    ke = cl / v
    return dose * ka / (v * (ka - ke)) * (np.exp(-ke * t) - np.exp(-ka * t))


def simulate(seed=0):
    """14 noisy concentrations (mg/L) at :data:`TIMES` from :data:`TRUE`."""
    rng = np.random.default_rng(seed)
    mean = concentrations(TIMES, TRUE["ka"], TRUE["cl"], TRUE["v"])
    return (mean * np.exp(TRUE["sigma"] * rng.standard_normal(TIMES.shape))).astype(np.float32)


def _rhs(y, ka, ke):
    gut, central = y[0], y[1]
    return jnp.stack([-ka * gut, ka * gut - ke * central])


def solve_rk4(ka, ke, times, steps=RK4_STEPS):
    """The central compartment's amount at ``times`` (on the grid of ``steps`` RK4 steps over
    ``[0, times[-1]]``), ``(T,)``: the whole trajectory from one ``lax.scan``, read at the
    observation steps."""
    dt = times[-1] / steps

    def step(y, _):
        k1 = _rhs(y, ka, ke)
        k2 = _rhs(y + 0.5 * dt * k1, ka, ke)
        k3 = _rhs(y + 0.5 * dt * k2, ka, ke)
        k4 = _rhs(y + dt * k3, ka, ke)
        y = y + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        return y, y[1]

    y0 = jnp.array([DOSE, 0.0], dtype=jnp.result_type(ka))
    _, central = jax.lax.scan(step, y0, None, length=steps)
    index = jnp.rint(times / times[-1] * steps).astype(jnp.int32) - 1
    return central[index]


def solve_odeint(ka, ke, times):
    """The central compartment's amount at ``times`` by ``jax.experimental.ode.odeint``."""
    y0 = jnp.array([DOSE, 0.0], dtype=jnp.result_type(ka))
    t = jnp.concatenate([jnp.zeros(1, y0.dtype), jnp.asarray(times, y0.dtype)])
    ys = ode.odeint(
        lambda y, _, ka, ke: _rhs(y, ka, ke), y0, t, ka, ke, rtol=ODEINT_TOL, atol=ODEINT_TOL
    )
    return ys[1:, 1]


def pk_model(times, conc=None, solver="rk4"):
    """One patient's concentrations ``conc`` at ``times`` under the one-compartment oral
    model, the ODE solved by ``solver`` (``"rk4"`` or ``"odeint"``)."""
    log_ka = numpyro.sample("log_ka", dist.Normal(np.log(1.0), 0.5))
    log_cl = numpyro.sample("log_cl", dist.Normal(np.log(5.0), 0.5))
    log_v = numpyro.sample("log_v", dist.Normal(np.log(50.0), 0.5))
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.5))
    ka, v = jnp.exp(log_ka), jnp.exp(log_v)
    ke = jnp.exp(log_cl) / v
    solve = solve_rk4 if solver == "rk4" else solve_odeint
    central = solve(ka, ke, times)
    mean = jnp.maximum(central / v, 1e-6)
    numpyro.deterministic("mean", mean)
    numpyro.sample("conc", dist.LogNormal(jnp.log(mean), sigma), obs=conc)


def _builder(solver, what):
    def build(seed=0):
        model = lambda times, conc=None: pk_model(times, conc, solver=solver)  # noqa: E731
        args = (jnp.asarray(TIMES, jnp.float32), jnp.asarray(simulate(seed)))
        description = (
            f"one-compartment oral PK, one patient, {len(TIMES)} concentrations over 24 h, "
            f"4 latents (log ka, log CL, log V, sigma); the ODE by {what}"
        )
        return model, args, {}, description

    build.__name__ = solver
    build.__doc__ = f"``(model, args, kwargs, description)`` of the PK model by {what}."
    return build


rk4 = _builder("rk4", f"fixed-step RK4 in lax.scan ({RK4_STEPS} steps)")
odeint = _builder("odeint", "jax.experimental.ode.odeint (custom_vjp)")

#: the builders by name
BUILDERS = {"rk4": rk4, "odeint": odeint}
