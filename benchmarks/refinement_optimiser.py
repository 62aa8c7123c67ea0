"""Does L-BFGS refine the Laplace start where Adam did, and how much sooner?

The set-up's Gaussian VI refinement (``numpyro_dais.engine.setup.refinement.refine``) maximises
the ELBO of ``N(μ, diag e^{2ρ})`` over 32 fixed draws in the Laplace whitening's
coordinates. It used Adam (cosine-decayed learning rate 0.1, up to 1,000 steps, stop when
every gradient coordinate is below 0.05) and now uses L-BFGS with a zoom line search on the
same deterministic objective, until within 0.01 of the optimum in the fit's own sds.
Measured here:

* on every model where the refinement fires (the hierarchies of ``real_models`` and the
  models of ``refined_start``), the fitted ``(μ, ρ)`` and the ELBO gained by each optimiser
  on the same captured objective, against a reference fit to a 10 times tighter tolerance
  (the objective's own optimum), and ``q0`` at the start against NUTS; both optimisers'
  programs are timed, compilation included;
* ``svi.init`` of a logistic GLMM with 67 groups (``D = 71``) as its rows grow, with each
  optimiser in the same process (AutoDAIS, ``K = 8``, ``num_particles = 8``, float32).

    python -m benchmarks.refinement_optimiser [--quick | --smoke]
"""

import contextlib
import functools
import inspect
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import SVI, Trace_ELBO

import numpyro_dais
from benchmarks import _large_models, _real_models, real_models, refined_start
from benchmarks._common import Stopwatch, markdown_table, parse_args, write_results
from numpyro_dais.annealed import setup
from numpyro_dais.annealed.guide import SET_UP_RUNS
from numpyro_dais.engine.setup import refinement

NAME = "refinement_optimiser"
MODULE = f"benchmarks.{NAME}"
TITLE = "The set-up's Gaussian VI refinement: L-BFGS against Adam"
HIERARCHIES = (
    "eight_schools_centred",
    "eight_schools_noncentred",
    "hier_logistic",
    "hier_logistic_centred",
    "radon",
    "gp_poisson",
)
REFINED_START = ("glmm100", "glmm400", "sv", "sv_heavy")
SETTINGS = {
    "full": dict(models=HIERARCHIES + REFINED_START, rows=(2_000, 20_000, 200_000)),
    "quick": dict(models=HIERARCHIES + REFINED_START, rows=(2_000, 20_000)),
    "smoke": dict(models=("eight_schools_noncentred",), rows=(1_000,)),
}
#: the set-up's tolerance (``refinement.refine``'s default)
LBFGS_TOL = inspect.signature(refinement.refine).parameters["tol"].default
#: the reference fit's tolerance, a tenth of the set-up's
REFERENCE_TOL = 1e-3


def reference_fit(log_density, eps):
    """The objective's optimum: L-BFGS to :data:`REFERENCE_TOL`, up to 5,000 evaluations."""
    return refinement.refine(log_density, eps, max_evals=5000, tol=REFERENCE_TOL)


def adam_refine(log_density, eps, max_iters=1000, learning_rate=0.1, tol=0.05):
    """The refinement's previous optimiser, kept as the baseline: Adam from the same start,
    its learning rate decaying from ``learning_rate`` to a hundredth over ``max_iters``
    steps, until every gradient coordinate is below ``tol``; the last point whose objective
    and gradient were finite. A :class:`~numpyro_dais.engine.setup.refinement.Refinement`."""
    dim = eps.shape[-1]
    elbo = refinement._elbo(log_density, eps)
    value_and_grad = jax.value_and_grad(elbo)
    values, grads, starts = refinement._starts(
        jax.value_and_grad(lambda p: -elbo(p)), dim, eps.dtype
    )
    start = refinement._choose_start(values, dim)
    adam = optax.adam(optax.cosine_decay_schedule(learning_rate, max_iters, alpha=0.01))

    def body(carry):
        i, params, best, state, first, gain, grad, _ = carry
        value, g = value_and_grad(params)
        finite = jnp.isfinite(value) & jnp.all(jnp.isfinite(g))
        first = jnp.where(i == 0, value, first)
        updates, state = adam.update(-g, state, params)
        best = jnp.where(finite, params, best)
        gain = jnp.where(finite, value - first, gain)
        grad = jnp.where(finite, g, grad)
        moves = finite & ~jnp.all(jnp.abs(g) < tol)
        params = jnp.where(moves, params + updates, params)
        return i + 1, params, best, state, first, gain, grad, ~moves

    params = starts[start]
    zero = jnp.zeros((), eps.dtype)
    init = (0, params, params, adam.init(params), zero, zero, grads[start], False)
    init = jax.tree.map(jnp.asarray, init)
    carry = jax.lax.while_loop(lambda c: (c[0] <= max_iters) & ~c[7], body, init)
    i, _, best, _, _, gain, grad, _ = carry
    resid = refinement._max_residual(-values[0], -grads[0, :dim], eps)
    scale = jnp.asarray(refinement.START_SCALES, eps.dtype)[start]
    converged = jnp.all(jnp.abs(grad) < tol)
    evals = i + len(refinement.START_SCALES)
    return refinement.Refinement(best[:dim], best[dim:], resid, i - 1, gain, scale, evals,
                                 converged)  # fmt: skip


@contextlib.contextmanager
def captured_refinement(into):
    """Within: the set-up's refinement inputs (its problem and Laplace whitening) go in
    the dict ``into``, and ``into["seconds"]`` holds the refinement's time (its trigger's and
    fit's programs, compilation included)."""
    original = setup._refine

    def capture(problem, affine, dtype):
        into.update(problem=problem, affine=affine, dtype=dtype)
        start = time.perf_counter()
        out = original(problem, affine, dtype)
        into["seconds"] = time.perf_counter() - start
        return out

    setup._refine = capture
    try:
        yield into
    finally:
        setup._refine = original


@contextlib.contextmanager
def optimiser(fit, runs):
    """Within: the set-up refines with ``fit`` (``refine``'s signature), its program compiled
    for ``runs`` loop bodies (``setup.REFINE_RUNS``)."""
    original = refinement.refine, setup.REFINE_RUNS
    refinement.refine, setup.REFINE_RUNS = fit, runs
    try:
        yield
    finally:
        refinement.refine, setup.REFINE_RUNS = original


#: ``(fit, runs)``: each optimiser, its program compiled as the set-up compiled it (Adam's
#: for the set-up's count of loop bodies, made for its up to 1,000 steps)
OPTIMISERS = {
    "Adam": (adam_refine, SET_UP_RUNS),
    "L-BFGS": (refinement.refine, setup.REFINE_RUNS),
}


def svi_init(model, args, kwargs, **options):
    """``(seconds, guide, params, captured)``: ``svi.init`` of AutoDAIS(``options``) on
    ``model``."""
    guide = numpyro_dais.AutoDAIS(model, **options)
    svi = SVI(model, guide, optax.adam(1e-2), Trace_ELBO())
    with captured_refinement({}) as captured, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        state = jax.block_until_ready(svi.init(jax.random.PRNGKey(0), *args, **kwargs))
    return time.perf_counter() - start, guide, svi.get_params(state), captured


def q0_errors(name, guide, params, args, kwargs, num_draws=4000):
    """``(max mean error in NUTS sds, max |log sd ratio|)`` of ``q0`` (the refined start, no
    training) over every latent coordinate of ``real_models``'s model ``name`` against its
    stored NUTS reference; ``None`` for a model without one."""
    refs = real_models.load_references()
    if name not in refs:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draws = guide.sample_posterior(jax.random.PRNGKey(1), params, *args,
                                       sample_shape=(num_draws,), **kwargs)  # fmt: skip
    sites = real_models.latent_sites(_real_models.load(name), args, kwargs)
    m = real_models.metrics(refs[name], *real_models.flatten(draws, sites))
    return m["max_mean_err"], m["max_log_sd"]


def refit(captured, fit, runs=setup.REFINE_RUNS):
    """``(seconds, Refinement)``: ``fit(log_density, eps)`` on the objective the set-up
    refined, as the set-up runs it (one program compiled for ``runs`` loop bodies,
    compilation included)."""
    loc, scale = (np.asarray(x, captured["dtype"]) for x in captured["affine"][:2])
    eps = refinement.antithetic_draws(setup.REFINE_DRAWS, loc.shape[0], captured["dtype"])

    def run(dynamics, start, loc, scale, eps):
        with jax.default_matmul_precision("highest"):
            return fit(lambda u: start(loc + scale @ u), eps)

    operands = loc, scale, eps
    key = jax.random.key(0)
    c = captured
    start = time.perf_counter()
    out = setup.on_dynamics(c["problem"], run, key, *operands, runs=runs)
    out = jax.tree.map(np.asarray, out)
    return time.perf_counter() - start, out


def load(name):
    """``(model, args, kwargs)`` as JAX arrays of the default precision."""
    if name in refined_start.MODELS:
        model, data, _ = refined_start.MODELS[name]
        args, kwargs = data()
    else:
        m = _real_models.load(name)
        model, args, kwargs = m.model, m.args, m.kwargs
    convert = lambda x: jnp.asarray(x) if isinstance(x, np.ndarray | jax.Array) else x  # noqa: E731
    return model, tuple(map(convert, args)), {k: convert(v) for k, v in kwargs.items()}


def distance(ref, fit):
    """``(max_i |μ_i − μ_ref,i| e^{−ρ_ref,i}, max_i |ρ_i − ρ_ref,i|)``: how far ``fit`` is
    from ``ref``, in ``ref``'s own sds (the whitened units are no posterior sds where the
    Laplace Gaussian is far off, as on a flat direction)."""
    mu = np.abs(fit.loc - ref.loc) * np.exp(-ref.log_scale)
    return float(np.max(mu)), float(np.max(np.abs(fit.log_scale - ref.log_scale)))


def compare_row(name):
    """One row of the objective table: Adam, L-BFGS and the reference on ``name``'s captured
    refinement objective, and ``q0`` at the start after each (``svi.init``) against NUTS."""
    model, args, kwargs = load(name)
    svi_init(model, args, kwargs)  # discarded: the model's first programs, JAX's start-up
    with optimiser(*OPTIMISERS["Adam"]):
        init_adam, guide_adam, params_adam, _ = svi_init(model, args, kwargs)
    init_lbfgs, guide, params, captured = svi_init(model, args, kwargs)
    r = guide.refinement
    if r is None or int(r.num_evals) == 0:
        return [name, "—", "—" if r is None else f"{float(r.residual):.3g}"] + ["—"] * 10
    t_adam, adam = refit(captured, *OPTIMISERS["Adam"])
    t_lbfgs, lbfgs = refit(captured, *OPTIMISERS["L-BFGS"])
    _, ref = refit(captured, reference_fit)

    off = functools.partial(distance, ref)
    (adam_mu, adam_rho), (lbfgs_mu, lbfgs_rho) = off(adam), off(lbfgs)
    steps = lambda fit: f"{int(fit.num_iters)}{'' if fit.converged else '*'} / {int(fit.num_evals)}"  # noqa: E731
    q0 = [
        q0_errors(name, g, p, args, kwargs) for g, p in ((guide_adam, params_adam), (guide, params))
    ]
    cell = "—" if q0[0] is None else " · ".join(f"{m:.2f} / {s:.2f}" for m, s in q0)
    return [
        name,
        str(adam.loc.shape[0]),
        f"{float(r.residual):.3g}",
        f"{float(r.start_scale):g}",
        f"{steps(adam)} · {steps(lbfgs)}",
        f"{float(adam.gain):.3f} · {float(lbfgs.gain):.3f} · {float(ref.gain):.3f}",
        f"{adam_mu:.3f} · {lbfgs_mu:.3f}",
        f"{adam_rho:.3f} · {lbfgs_rho:.3f}",
        "{:.3f} / {:.3f}".format(*distance(adam, lbfgs)),
        "yes" if bool(ref.converged) else "no",
        cell,
        f"{t_adam:.2f} · {t_lbfgs:.2f}",
        f"{init_adam:.2f} · {init_lbfgs:.2f}",
    ]


def glmm_rows(rows, warm=500):
    """Rows of the ``svi.init`` table: the large GLMM at each size, Adam then L-BFGS, after a
    discarded ``svi.init`` that warms JAX up; each fit's distance from the reference fit of
    that size's objective."""
    options = dict(K=8, num_particles=8)
    out = []
    for n in (warm, *rows):
        (X, group), kw = _large_models.logistic_glmm_data(n)
        args = (jnp.asarray(X), jnp.asarray(group))
        kwargs = dict(y=jnp.asarray(kw["y"]), num_groups=kw["num_groups"])
        fits = []
        for label, (fit, runs) in OPTIMISERS.items():
            with optimiser(fit, runs):
                seconds, guide, _, captured = svi_init(_large_models.logistic_glmm, args,
                                                       kwargs, **options)  # fmt: skip
            fits.append((label, seconds, captured.get("seconds", float("nan")), guide.refinement))
        if n == warm:
            continue
        _, ref = refit(captured, reference_fit)
        for label, seconds, refining, r in fits:
            out.append([
                f"{n:,}",
                label,
                f"{seconds:.1f}",
                f"{refining:.1f}",
                f"{float(r.residual):.3g}",
                f"{int(r.num_iters)}{'' if r.converged else '*'} / {int(r.num_evals)}",
                f"{float(r.gain):.3f} ({float(ref.gain):.3f})",
                "{:.3f} / {:.3f}".format(*distance(ref, r)),
            ])  # fmt: skip
            print(" | ".join(out[-1]), flush=True)
    return out


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    sw = Stopwatch()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in cfg["models"]:
            with sw.lap(name):
                rows.append(compare_row(name))
                print(" | ".join(rows[-1]), flush=True)
        with sw.lap("large GLMM"):
            glmm = glmm_rows(cfg["rows"])
    headers = [
        "model",
        "D",
        "residual",
        "start s",
        "iterations / evaluations: Adam · L-BFGS",
        "ELBO gain: Adam · L-BFGS · reference",
        "μ off the reference, in its sds: Adam · L-BFGS",
        "ρ off the reference: Adam · L-BFGS",
        "L-BFGS off Adam, μ (Adam's sds) / ρ",
        "reference converged",
        "q0 at the start vs NUTS, max mean err / max log sd: Adam · L-BFGS",
        "refinement program (s): Adam · L-BFGS",
        "svi.init (s): Adam · L-BFGS",
    ]
    glmm_headers = [
        "rows",
        "optimiser",
        "svi.init (s)",
        "of which the refinement (s)",
        "residual",
        "iterations / evaluations",
        "ELBO gain (reference's)",
        "off the reference: μ (its sds) / ρ",
    ]
    body = "\n\n".join(
        [
            "## Settings",
            "Float32 (the default), AutoDAIS at its defaults for the objectives (`svi.init`, "
            "PRNGKey(0)); each model's refinement objective (the set-up's whitened log "
            "density and its 32 fixed draws) captured from `svi.init` and fitted again by "
            "Adam (the previous optimiser: learning rate 0.1 cosine-decayed to 0.001 over "
            "1,000 steps, until every gradient coordinate is below 0.05) and by L-BFGS "
            f"(`refinement.refine`: memory {refinement.LBFGS_MEMORY}, zoom line search, up "
            f"to 1,000 evaluations, until within {LBFGS_TOL:g} of the optimum in its own "
            "sds: every `|∂ELBO/∂μ_i| e^{ρ_i}`, `|∂ELBO/∂ρ_i|` and the last step's "
            f"`|Δμ_i| e^{{−ρ_i}}`, `|Δρ_i|` below {LBFGS_TOL:g}), and by a reference "
            f"(L-BFGS to {REFERENCE_TOL:g}, up to 5,000 evaluations). Distances in `μ` are "
            "in the reference's sds `e^{ρ_ref}` (the whitened units are no posterior sds "
            "along a direction the Laplace Gaussian gets badly wrong), in `ρ` (a log scale) "
            "absolute, both the largest over the coordinates. An evaluation is the ELBO and "
            "its gradient over the 32 draws (the 5 starts' included); `*`: stopped before "
            "its convergence test passed. `q0` at the start: 4,000 draws of the refined "
            "start (no training step) against `real_models`' NUTS references, largest "
            "|mean error| in NUTS sds / largest |log sd ratio| over all latent coordinates. "
            "Program and `svi.init` times include compilation (`svi.init` after a "
            "discarded one of the same model) "
            "(each fit is one program, compiled as the set-up compiled it: Adam's for the "
            "set-up's 300 loop bodies, L-BFGS's for its own run, `annealed.setup.REFINE_RUNS`).",
            f"## The refinement objective\n\n{markdown_table(headers, rows)}",
            "## `svi.init` of a large logistic GLMM",
            "`benchmarks._large_models.logistic_glmm`: 67 groups (unbalanced), 2 covariates, "
            "non-centred intercepts, D = 71; AutoDAIS with K = 8, num_particles = 8, "
            "float32; the set-up refines with Adam or with L-BFGS in the same process, after "
            "a discarded `svi.init` of 500 rows (JAX's start-up). The refinement's time is "
            "its trigger's and fit's programs, compilation included; the reference is that "
            "size's objective fitted as in the table above.",
            markdown_table(glmm_headers, glmm),
        ]
    )
    print(body)
    path = write_results(args.out_dir, NAME, args.mode, TITLE, MODULE, body, sw)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
