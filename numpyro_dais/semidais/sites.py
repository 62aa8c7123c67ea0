"""The model side of :class:`~numpyro_dais.AutoSemiDAIS`: which plate and sites are local, the
checks that say when a model is inadmissible, and the per-member local log density.

A local site is a latent site inside the local (subsample) plate; each member ``n`` of the
plate's batch owns a flat unconstrained vector ``u_n (D,)`` holding its slice of every local
site. Reference: Jankowiak & Phan (2022), §7.6 and appendix A.1.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from numpyro import handlers
from numpyro.distributions import biject_to
from numpyro.distributions.util import sum_rightmost

from numpyro_dais.bridge.modelview import substituted_plates
from numpyro_dais.engine.annealing import weights
from numpyro_dais.engine.setup import curvature


class LocalSite(NamedTuple):
    """A local site: ``axis`` is the plate's axis in its unconstrained value (negative),
    ``shape`` the shape of one member's slice, ``event_dim`` the site's event dims."""

    name: str
    axis: int
    shape: tuple
    event_dim: int


class Layout(NamedTuple):
    """The local plate (name, full size ``N``, batch size ``B``, dim) and its sites."""

    plate: str
    size: int
    batch: int
    dim: int
    sites: tuple  # of LocalSite

    @property
    def D(self) -> int:
        return int(sum(np.prod(s.shape, dtype=int) for s in self.sites))


def _plates(trace):
    return {name: site for name, site in trace.items() if site["type"] == "plate"}


def _subsamples(plate_site) -> bool:
    size, subsample_size = plate_site["args"][:2]
    return subsample_size is not None and subsample_size < size


def local_plate(owner, trace, subsample_plate) -> str:
    """The name of the local plate: ``subsample_plate``, else the one plate that subsamples,
    else the model's only plate; ``ValueError`` naming the fix otherwise."""
    plates = _plates(trace)
    if subsample_plate is not None:
        if subsample_plate not in plates:
            raise ValueError(
                f"{owner}: `subsample_plate={subsample_plate!r}` is not a plate of the model; "
                f"its plates are {sorted(plates)}."
            )
        return subsample_plate
    subsampled = [n for n, s in plates.items() if _subsamples(s)]
    candidates = subsampled or list(plates)
    if len(candidates) != 1:
        what = "plates that subsample" if subsampled else "plates and none subsamples"
        raise ValueError(
            f"{owner} needs exactly one local plate, but the model has {len(candidates)} "
            f"{what} ({sorted(candidates)}): pass `subsample_plate=<name>`, and subsample "
            "no other plate (local latents of one plate member may sit in nested plates "
            "only if those are not subsampled)."
        )
    return candidates[0]


def layout(owner, trace, init_locs, plate: str) -> Layout:
    """The :class:`Layout` of ``trace`` (the model's prototype trace) for ``plate``, checked:
    a local site must be continuous, inside ``plate``, and carry the plate's batch size
    on the plate's axis; no other plate may subsample."""
    size, batch = trace[plate]["args"][:2]
    batch = size if batch is None else batch
    sites, dim = [], None
    for name, site in trace.items():
        if site["type"] != "sample" or site["is_observed"]:
            continue
        frames = {f.name: f for f in site["cond_indep_stack"]}
        if plate not in frames:
            continue
        for f in frames.values():
            if f.name != plate and _subsamples(trace[f.name]):
                raise ValueError(
                    f"{owner}: the local site {name!r} sits in a second subsampled plate "
                    f"{f.name!r}; only the local plate {plate!r} may subsample."
                )
        frame = frames[plate]
        if dim is not None and frame.dim != dim:
            raise ValueError(f"{owner}: the plate {plate!r} has two dims ({dim}, {frame.dim}).")
        dim = frame.dim
        value = jnp.asarray(init_locs[name])
        event_dim = site["fn"].event_dim
        axis = frame.dim - event_dim
        if value.ndim < -axis or value.shape[axis] != batch:
            raise ValueError(
                f"{owner}: the local site {name!r} has shape {tuple(value.shape)}, which "
                f"does not hold the plate {plate!r}'s batch of {batch} at axis {axis}; "
                "sample it inside the plate with a batch shape that includes the plate."
            )
        member = jnp.take(value, 0, axis=axis)
        sites.append(LocalSite(name, axis, tuple(member.shape), event_dim))
    if not sites:
        raise ValueError(
            f"{owner}: there are no latent sites in the local plate {plate!r}; AutoSemiDAIS "
            "is for models with local latent variables (use AutoDAIS or AutoNormal otherwise)."
        )
    return Layout(plate, size, batch, dim, tuple(sites))


def check_continuous(owner, trace):
    """``ValueError`` naming the first discrete latent site of ``trace``, if any."""
    for name, site in trace.items():
        if site["type"] == "sample" and not site["is_observed"] and site["fn"].is_discrete:
            raise ValueError(
                f"{owner}: the latent site {name!r} is discrete; only continuous latent "
                "sites are supported (marginalise it out, e.g. with a mixture distribution)."
            )


def latent_names(trace) -> set:
    return {n for n, s in trace.items() if s["type"] == "sample" and not s["is_observed"]}


def pack(lay: Layout, values: dict) -> jax.Array:
    """``{site: unconstrained value}`` to ``(B, D)``, row ``n`` the member ``n``'s slice."""
    rows = [
        jnp.reshape(jnp.moveaxis(values[s.name], s.axis, 0), (values[s.name].shape[s.axis], -1))
        for s in lay.sites
    ]
    return jnp.concatenate(rows, axis=-1)


def unpack(lay: Layout, u: jax.Array) -> dict:
    """``(B, D)`` to ``{site: unconstrained value}`` with the plate on its axis."""
    out, start = {}, 0
    for s in lay.sites:
        size = int(np.prod(s.shape, dtype=int))
        block = jnp.reshape(u[:, start : start + size], (u.shape[0],) + s.shape)
        out[s.name] = jnp.moveaxis(block, 0, s.axis)
        start += size
    return out


def unconstrain(site) -> jax.Array:
    """A sample site's value in unconstrained space (its support's bijection inverted)."""
    return biject_to(site["fn"].support).inv(site["value"])


def constrain(trace, lay: Layout, u: jax.Array) -> tuple[dict, dict]:
    """Constrained values of the local sites and ``log |det J|`` of each (its batch shape)."""
    values, log_det = {}, {}
    for name, x in unpack(lay, u).items():
        fn = trace[name]["fn"]
        transform = biject_to(fn.support)
        values[name] = transform(x)
        ldj = transform.log_abs_det_jacobian(x, values[name])
        log_det[name] = sum_rightmost(ldj, jnp.ndim(ldj) - jnp.ndim(x) + fn.event_dim)
    return values, log_det


def _per_member(lay: Layout, log_prob, dim) -> jax.Array:
    """Sum a site's ``log_prob`` (batch shape, the plate at ``dim``) over every axis but the
    plate's: ``(B,)``."""
    lp = jnp.moveaxis(jnp.asarray(log_prob), dim, 0)
    return jnp.sum(jnp.reshape(lp, (lp.shape[0], -1)), axis=-1)


def member_log_density(local_model, local_args, local_kwargs, trace, lay, idx, params, u):
    """``ℓ_n(u_n) = log p(x_n, T(u_n) | θ) + log |det J(u_n)|`` for every member: ``(B,)``.

    Runs ``local_model`` on the batch ``idx`` with the local sites at ``T(u)`` and its
    parameters at ``params``; sums each site's log density inside the plate over all
    axes but the plate's. Sites outside the plate are left out (they cannot depend on a
    local latent in an admissible model)."""
    values, log_det = constrain(trace, lay, u)
    data = {**params, **values, lay.plate: idx}
    with handlers.block(), substituted_plates():
        tr = handlers.trace(handlers.substitute(local_model, data=data)).get_trace(
            *local_args, **local_kwargs
        )
    total = jnp.zeros(idx.shape[0])
    for name, site in tr.items():
        if site["type"] != "sample":
            continue
        frame = next((f for f in site["cond_indep_stack"] if f.name == lay.plate), None)
        if frame is None:
            continue
        lp = site["fn"].log_prob(site["value"])
        if name in log_det:
            lp = lp + log_det[name]
        total = total + _per_member(lay, lp, frame.dim)
    return total


MEMBERS = "semidais_members"  # the vmap axis of the plate's members


def member_target(log_density, operands):
    """``u (D,) -> ℓ_n(u)`` for the member ``n`` of the enclosing ``vmap`` over the axis
    :data:`MEMBERS`, from ``log_density(U (B, D), operands) -> (B,)``, which must be
    separable (entry ``n`` depends on row ``n`` only, as in an admissible model).

    All members' positions are gathered and the batch is evaluated once (``O(B)``, not once
    per member); the gradient of the batch's sum is computed once too, and member ``n``
    takes its row of it (a custom VJP: exact because of the separability). ``operands``
    (a pytree) are the differentiable inputs (θ, the model's params); the gradient reaches
    them through the rows, so the bound's gradient is the ordinary one."""
    leaves, treedef = jax.tree.flatten(operands)
    dynamic = [_is_float_array(x) for x in leaves]
    fixed = [None if d else x for x, d in zip(leaves, dynamic, strict=True)]

    def rebuild(floats):
        it = iter(floats)
        return treedef.unflatten(
            [next(it) if d else x for x, d in zip(fixed, dynamic, strict=True)]
        )

    @jax.custom_vjp
    def member(u, floats):
        U = jax.lax.all_gather(u, MEMBERS)
        return log_density(U, rebuild(floats))[jax.lax.axis_index(MEMBERS)]

    def forward(u, floats):
        U = jax.lax.all_gather(u, MEMBERS)

        def total(U):
            ell = log_density(U, rebuild(floats))
            return jnp.sum(ell), ell

        (_, ell), rows = jax.value_and_grad(total, has_aux=True)(U)
        n = jax.lax.axis_index(MEMBERS)
        return ell[n], (rows[n], U, floats, n)

    def backward(res, cotangent):
        row, U, floats, n = res
        # the operands' cotangent: only where ℓ's value itself is differentiated (the
        # transitions use its gradient alone, and XLA drops this otherwise)
        _, vjp = jax.vjp(lambda f: log_density(U, rebuild(f))[n], floats)
        return cotangent * row, vjp(cotangent)[0]

    member.defvjp(forward, backward)
    # θ and the params reach the bound through every chain: one diverged chain must not
    # make their gradients NaN
    floats = weights.zero_nonfinite_grads([x for x, d in zip(leaves, dynamic, strict=True) if d])

    def target(u):
        return member(u, floats)

    return target


def float_vector(tree):
    """``(theta, rebuild)``: the float array leaves of ``tree`` raveled into one vector, and
    ``theta -> tree`` with those leaves replaced (the other leaves kept)."""
    leaves, treedef = jax.tree.flatten(tree)
    dynamic = [_is_float_array(x) for x in leaves]
    floats = [jnp.ravel(x) for x, d in zip(leaves, dynamic, strict=True) if d]
    theta = jnp.concatenate(floats) if floats else jnp.zeros(0)

    def rebuild(theta):
        out, start = [], 0
        for x, d in zip(leaves, dynamic, strict=True):
            if d:
                size = int(np.prod(jnp.shape(x), dtype=int))
                out.append(jnp.reshape(theta[start : start + size], jnp.shape(x)))
                start += size
            else:
                out.append(x)
        return treedef.unflatten(out)

    return theta, rebuild


def stop_float_gradients(tree):
    """``tree`` with no gradient through its float array leaves (other leaves as they are)."""
    return jax.tree.map(lambda x: jax.lax.stop_gradient(x) if _is_float_array(x) else x, tree)


def _is_float_array(x) -> bool:
    return isinstance(x, jax.Array | np.ndarray | float) and jnp.issubdtype(
        jnp.result_type(x), jnp.inexact
    )


def normal_base(owner, fn, name):
    """The Normal behind a local guide's site (through expand, to_event and the transform to
    the support), or a ``ValueError``."""
    base = fn
    while isinstance(
        base, dist.ExpandedDistribution | dist.Independent | dist.TransformedDistribution
    ):
        base = base.base_dist
    if type(base) is not dist.Normal:
        raise ValueError(
            f"{owner}: `local_guide` gives the local site {name!r} a {type(fn).__name__}; "
            "the chains start from a Gaussian, so it must be Normal in unconstrained space "
            "(dist.Normal, or AutoNormal)."
        )
    return base


def member_curvatures(local_model, local_args, local_kwargs, trace, lay, idx, u, params):
    """Largest eigenvalue of each member's ``−∇²ℓ_n`` at ``u (B, D)``, unconstrained local
    values of the members ``idx``: ``(B,)``, at least 0, ``inf`` where not finite. By separability
    the batch sum's Hessian is block diagonal, so one power iteration runs all the members' blocks
    at once (:func:`~numpyro_dais.engine.setup.curvature.max_eigenvalue` with ``blocks``; one
    compiled program)."""

    def lams(u, forward):
        def total(U):
            ell = member_log_density(
                local_model, local_args, local_kwargs, trace, lay, idx, params, U
            )
            return jnp.sum(ell)

        key = jax.random.key(0)
        return curvature.max_eigenvalue(key, total, u, 30, forward=forward, blocks=True)

    return curvature.forward_or_reverse(
        lambda forward: np.asarray(jax.jit(lams, static_argnums=1)(jnp.asarray(u), forward))
    )


class Chains(NamedTuple):
    """The members' chains, ``P`` particles each: start ``z0 (B, P, D)`` and
    ``log_q0_z0 (B, P)``, end ``z (B, P, D)``, ``log_w (B, P)`` (``-inf`` where diverged)
    and its final term ``log_final (B, P)`` (``ℓ_n(z_K)``; 0 with one particle, whose
    weight leaves it to the model)."""

    z0: jax.Array
    log_q0_z0: jax.Array
    z: jax.Array
    log_w: jax.Array
    log_final: jax.Array


def member_terms(rng_key, chains: Chains):
    """Each member's emitted end point ``(B, D)``, its weight without ``ℓ_n`` there
    ``(B,)`` (the model's own term supplies it), and the diverged particles ``(B, P)``.

    With ``P`` particles the member's term is ``log (1/P) Σ_i w_i`` (an importance-weighted
    bound of ``p(x_n | θ)``), emitted at one particle drawn by its weight (no gradient
    through the draw), whose ``ℓ_n`` cancels against the model's. A diverged particle has
    weight 0; a member whose particles all diverged keeps its first start, ``z_0``, for this
    step, and its term is the ``K = 0`` bound (finite loss, finite gradients)."""
    bad = ~jnp.isfinite(chains.log_w)
    lost = jnp.all(bad, axis=-1)
    if chains.log_w.shape[-1] == 1:
        j = jnp.zeros(bad.shape[:1], jnp.int32)
    else:
        logits = jax.lax.stop_gradient(jnp.where(lost[:, None], 0.0, chains.log_w))
        j = jax.random.categorical(rng_key, logits)
    pick = lambda a: jnp.take_along_axis(a, j.reshape((-1,) + (1,) * (a.ndim - 1)), 1)[:, 0]
    z = jnp.where(lost[:, None], chains.z0[:, 0], pick(chains.z))
    safe = jnp.where(lost[:, None], 0.0, chains.log_w)  # no NaN gradients where all are lost
    log_w = weights.log_mean_exp(safe, axis=-1) - pick(chains.log_final)
    return z, jnp.where(lost, -chains.log_q0_z0[:, 0], log_w), bad
