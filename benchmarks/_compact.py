"""The compact-posterior method suite shared by the GP and logistic-regression benchmarks."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import optax
from numpyro.infer import SVI, RenyiELBO, Trace_ELBO
from numpyro.infer.autoguide import AutoDiagonalNormal

from benchmarks._common import fit_svi, gaussian_moments, log_joint_fn
from benchmarks.baselines import msc
from numpyro_dais import AutoDAIS


def sir_moments(key, q, log_joint, num_draws, num_proposals):
    """Sampling importance resampling from ``q``: each of ``num_draws`` draws is picked by
    weight from its own ``num_proposals`` proposals; returns the draws' mean and std."""

    def one(k):
        k1, k2 = jax.random.split(k)
        z = q.sample(k1, (num_proposals,))
        log_w = log_joint(z) - q.to_event(1).log_prob(z)
        return z[jax.random.categorical(k2, log_w)]

    z = jax.lax.map(one, jax.random.split(key, num_draws), batch_size=100)
    return np.asarray(z.mean(0)), np.asarray(z.std(0))


def symkl_optimum(log_p, z_p, init_loc, key, num_draws=4000, num_steps=3000, lr=1e-2):
    """The mean-field ``q = N(m, diag(s²))`` minimising ``KL(q‖p) + KL(p‖q)``: the K → ∞
    limit of DAIS₀ with transitions that mix (Zenn & Bamler, 2024, Thm. 4.1).

    ``log_p``: unnormalised log density of one point ``(d,)``; ``z_p``: draws from ``p``,
    ``(M, d)``. Both KLs are estimated on fixed draws (``ε ~ N(0, I)`` reparameterising ``q``,
    and ``z_p``), so the objective is deterministic; Adam from ``N(init_loc, I)``. Returns
    ``(loc, scale)``, each ``(d,)``.
    """
    d = z_p.shape[-1]
    eps = jax.random.normal(key, (num_draws, d))

    def objective(theta):
        m, s = theta[0], jnp.exp(theta[1])
        q = dist.Normal(m, s).to_event(1)
        z_q = m + s * eps
        reverse = jnp.mean(q.log_prob(z_q) - jax.vmap(log_p)(z_q))
        forward = -jnp.mean(q.log_prob(z_p))  # + E_p[log p], constant in q
        return reverse + forward

    theta = jnp.stack([jnp.asarray(init_loc, jnp.float32), jnp.zeros(d)])
    opt = optax.adam(lr)

    def step(carry, _):
        theta, state = carry
        updates, state = opt.update(jax.grad(objective)(theta), state)
        return (optax.apply_updates(theta, updates), state), None

    run = jax.jit(lambda t: jax.lax.scan(step, (t, opt.init(t)), None, num_steps)[0][0])
    theta = run(theta)
    return np.asarray(theta[0]), np.asarray(jnp.exp(theta[1]))


def mae(est, truth):
    """MAE per seed, shape ``(S,)``."""
    return np.mean(np.abs(np.asarray(est) - truth[None]), axis=-1)


def fit_compact_methods(
    model,
    args,
    site,
    init,
    init_scale,
    cfg,
    keys,
    *,
    K,
    num_particles,
    lr,
    dais_batch_size,
    dais_kwargs=None,
):
    """IWVI, IWVI with SIR, DAIS₀, DAIS end points and MSC₈c on one model with one latent
    ``site`` of dimension ``d``; ``keys = (iwvi, sir, dais, dais_draws, msc)``.

    ``dais_kwargs`` go to ``AutoDAIS`` (e.g. step-size bounds). Returns
    ``{method: (means (S, d), stds (S, d))}`` over ``cfg["seeds"]`` seeds.
    """
    seeds, out = cfg["seeds"], {}
    k_iwvi, k_sir, k_dais, k_draws, k_msc = keys

    iwvi = AutoDiagonalNormal(model, init_scale=init_scale, init_loc_fn=init)
    svi = SVI(model, iwvi, optax.adam(lr), RenyiELBO(0.0, num_particles))
    params, _ = fit_svi(svi, args, jax.random.split(k_iwvi, seeds), cfg["steps"])
    qs = [iwvi.get_posterior(jax.tree.map(lambda x, s=s: x[s, -1], params)) for s in range(seeds)]
    out["IWVI"] = (np.stack([q.loc for q in qs]), np.stack([q.scale for q in qs]))
    log_joint = jax.vmap(log_joint_fn(model, args, site))
    sir = [
        sir_moments(k, q, log_joint, *cfg["sir"])
        for k, q in zip(jax.random.split(k_sir, seeds), qs, strict=True)
    ]
    out["IWVI_SIR"] = tuple(np.stack(x) for x in zip(*sir, strict=True))

    dais = AutoDAIS(
        model,
        K=K,
        num_particles=num_particles,
        init_scale=init_scale,
        init_loc_fn=init,
        **(dais_kwargs or {}),
    )
    svi = SVI(model, dais, optax.adam(lr), Trace_ELBO())
    params, _ = fit_svi(svi, args, jax.random.split(k_dais, seeds), cfg["steps"])
    per_seed = [jax.tree.map(lambda x, s=s: x[s, -1], params) for s in range(seeds)]
    q0s = [gaussian_moments(dais.get_posterior(p)) for p in per_seed]
    out["DAIS0(16)"] = (np.stack([m for m, _ in q0s]), np.stack([sd for _, sd in q0s]))
    draws = [
        dais.sample_posterior(
            k,
            p,
            *args,
            sample_shape=(cfg["dais_draws"],),
            method="dais",
            batch_size=dais_batch_size,
        )[site]
        for k, p in zip(jax.random.split(k_draws, seeds), per_seed, strict=True)
    ]
    out["DAIS(16)"] = (np.stack([x.mean(0) for x in draws]), np.stack([x.std(0) for x in draws]))

    dim = out["IWVI"][0].shape[-1]
    fitted = jax.jit(
        jax.vmap(
            lambda k: msc.fit(
                k,
                log_joint_fn(model, args, site),
                jnp.zeros(dim),
                init_scale,
                num_particles=num_particles,
                num_chains=8,
                num_steps=cfg["steps"],
                learning_rate=lr,
            )
        )
    )(jax.random.split(k_msc, seeds))
    out["MSC8c"] = (np.asarray(fitted.loc[:, -1]), np.asarray(fitted.scale[:, -1]))
    return out
