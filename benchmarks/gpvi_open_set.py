"""Reproduce the GPVI paper's open-category classification task on 8×8 digits with ``AutoGPVI``.

The paper (Ratzlaff et al., ICML 2021, sec. 4.4, Table 3) trains a LeNet-5 Bayesian neural
network on MNIST digits 0–5 and detects the unseen digits 6–9 from the predictive
uncertainty: AUC 0.988 for GPVI (clean accuracy 99.3%). The offline substitute here
(reproduction-targets.md) is scikit-learn's bundled 8×8 ``load_digits`` with the same 6/4
split: a one-hidden-layer BNN (64 → 16 tanh → 6, ``N(0, 1)`` priors on all weights and
biases, categorical likelihood; 1,142 latent dimensions) is trained on a stratified 70% of
the digits 0–5. Every held-out image is scored by the entropy of the posterior predictive
(the mean of the softmax over posterior draws); we report the AUROC of that score for
separating the held-out inliers (label 0) from all images of 6–9 (label 1), the AUROC of the
paper's own score (the predictive variance across draws, summed over classes) and the
accuracy of the predictive mean on the held-out inliers.

Methods, all under ``SVI``: GPVI with the helper network and amortized SVGD (``AutoGPVI``,
built and trained as in ``benchmarks/gpvi_reproduction.py``, but with the generators'
learning rate 10× smaller: ``GENERATOR_LR`` below; runs at the original rate are reported
too), numpyro's ``AutoNormal``
(mean-field VI) and ``AutoDelta`` (MAP, a point estimate: its predictive variance is 0, so
only its entropy AUROC is defined). Same data split for every seed; the seed sets the
initialisation and the training noise. Time per SVI step is measured in the same run,
the methods taking turns.

Run from the repository root: ``python -m benchmarks.gpvi_open_set [--quick|--smoke]``;
writes ``benchmarks/results/gpvi_open_set{_quick,_smoke}.md``.
"""

import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import SVI, Trace_ELBO, init_to_median
from numpyro.infer.autoguide import AutoDelta

from benchmarks import gpvi_reproduction as repro
from benchmarks._common import (
    Stopwatch,
    markdown_table,
    parse_args,
    time_interleaved,
    write_results,
)
from numpyro_dais import AutoGPVI

NAME = "gpvi_open_set"
MODULE = f"benchmarks.{NAME}"
INLIERS = 6  # digits 0..5 are inliers, 6..9 outliers
PAPER_AUC = 0.988  # GPVI, MNIST, LeNet-5 (Table 3); the paper's score is the predictive variance
PAPER_ACC = 0.993
# The generators' learning rate. gpvi_reproduction trains them at 5e-2 (cosine decay to 2%),
# with hidden layers as wide as its 2- to 5-D targets; here a 64-unit hidden layer
# feeds 1,142 outputs and one Adam step at 5e-2 moves every output by about lr · Σ_m |h_m|,
# more than the posterior's own scale (measured in the run: the first-step shift column). 5e-3
# is that setting divided by 10, chosen from the size of the first step, not from the AUROC;
# the 5e-2 runs are reported beside it. AutoNormal and AutoDelta keep 5e-2.
GENERATOR_LR = 5e-3
DEFAULT_LR = 5e-2
HELPER_LR = 3e-3
FULL = dict(
    seeds=3,
    steps=1000,
    particles=32,
    helper_hidden=100,
    hidden=16,
    draws=100,
    timing_repeats=3,
    timing_steps=10,
    train_subset=None,
    test_subset=None,
    default_lr_rows=True,
)
SETTINGS = {
    "full": FULL,
    "quick": dict(FULL, seeds=1, steps=300, timing_steps=5),
    "smoke": dict(
        seeds=1,
        steps=2,
        particles=4,
        helper_hidden=8,
        hidden=4,
        draws=4,
        timing_repeats=1,
        timing_steps=1,
        train_subset=60,
        test_subset=30,
        default_lr_rows=False,
    ),
}
# (name, gpvi_reproduction's method name, generator learning rate)
METHODS = (
    ("GPVI (helper)", "GPVI (helper)", GENERATOR_LR),
    ("amortized SVGD", "amortized SVGD", GENERATOR_LR),
    ("AutoNormal (MF-VI)", "AutoNormal", DEFAULT_LR),
    ("AutoDelta (MAP)", "AutoDelta", DEFAULT_LR),
)
#: the generator's input width k of these rows (the others: D): it reads the first k noise
#: coordinates, the skip term λε keeps all D (the paper's hypernetwork takes noise narrower
#: than D)
NOISE_WIDTH = {"GPVI (helper), noise width 64": 64, "amortized SVGD, noise width 64": 64}
METHODS += tuple((name, name.split(",")[0], GENERATOR_LR) for name in NOISE_WIDTH)
DEFAULT_LR_METHODS = (
    ("GPVI (helper), lr 5e-2", "GPVI (helper)", DEFAULT_LR),
    ("amortized SVGD, lr 5e-2", "amortized SVGD", DEFAULT_LR),
)


# -- data and model ----------------------------------------------------------------------------


def load_data(train_subset=None, test_subset=None):
    """Pixels scaled to [0, 1]; a stratified 70/30 split of the digits 0–5 (fixed seed), and
    all digits 6–9 as outliers. ``*_subset``: keep only the first rows (smoke mode)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32)
    y = digits.target
    inlier = y < INLIERS
    X_tr, X_te, y_tr, y_te = train_test_split(
        X[inlier], y[inlier], test_size=0.3, stratify=y[inlier], random_state=0
    )
    X_out = X[~inlier]
    if train_subset is not None:
        X_tr, y_tr = X_tr[:train_subset], y_tr[:train_subset]
    if test_subset is not None:
        X_te, y_te, X_out = X_te[:test_subset], y_te[:test_subset], X_out[:test_subset]
    return jnp.asarray(X_tr), jnp.asarray(y_tr), X_te, y_te, X_out


def bnn_model(hidden):
    def model(X, y=None):
        w1 = numpyro.sample("w1", dist.Normal(0.0, 1.0).expand([X.shape[1], hidden]).to_event(2))
        b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([hidden]).to_event(1))
        w2 = numpyro.sample("w2", dist.Normal(0.0, 1.0).expand([hidden, INLIERS]).to_event(2))
        b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0).expand([INLIERS]).to_event(1))
        logits = jnp.tanh(X @ w1 + b1) @ w2 + b2
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Categorical(logits=logits), obs=y)

    return model


SITES = ("w1", "b1", "w2", "b2")


def class_probs(draws, X):
    """Softmax outputs of every posterior draw: ``(S, n, 6)``."""

    def one(w1, b1, w2, b2):
        return jax.nn.softmax(jnp.tanh(X @ w1 + b1) @ w2 + b2)

    return np.asarray(jax.vmap(one)(*(draws[s] for s in SITES)), dtype=np.float64)


# -- guides and training -------------------------------------------------------------------------


def make_guide(base, model, cfg, noise_dim=None):
    if base == "AutoDelta":
        return AutoDelta(model, init_loc_fn=init_to_median)
    # gpvi_reproduction's guides: one hidden layer of 64 units in the generator (AutoGPVI's
    # default width), noise width D unless given, init_to_median
    return repro.make_guide(
        base, model, (64,), cfg["particles"], cfg["helper_hidden"], noise_dim=noise_dim
    )


def train(base, model, cfg, seed, data, lr, noise_dim=None):
    """gpvi_reproduction's training (Adam, cosine decay from ``lr`` to 2% of it; the helper at
    a constant 3e-3), stepped from Python through one jitted ``svi.update`` so that the
    timing below reuses the compiled step. Counts the steps on which AutoGPVI warned.

    Returns ``(guide, params, seconds after compilation, fallbacks, nonfinite, shift, stepper)``,
    ``shift`` the RMS change of the generator's output over the first step,
    ``stepper`` a zero-argument call that takes one more step (for the timing)."""
    guide = make_guide(base, model, cfg, noise_dim)
    svi = SVI(model, guide, repro.optimiser(cfg["steps"], lr, HELPER_LR), Trace_ELBO())
    update = jax.jit(svi.update)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = svi.init(jax.random.PRNGKey(seed), *data)
        before = _outputs(guide, svi.get_params(state))
        state, loss = update(state, *data)  # compiles
        jax.block_until_ready(loss)
        shift = _rms(before, _outputs(guide, svi.get_params(state)))
        t0 = time.perf_counter()
        for _ in range(cfg["steps"] - 1):
            state, loss = update(state, *data)
        jax.block_until_ready(loss)
        secs = time.perf_counter() - t0
    messages = [str(w.message) for w in caught]
    fallbacks = sum("helper network diverged" in m for m in messages)
    nonfinite = sum("non-finite" in m for m in messages)
    box = [state]

    def stepper():
        box[0], out = update(box[0], *data)
        return out

    return guide, svi.get_params(state), secs, fallbacks, nonfinite, shift, stepper


def _outputs(guide, params, n=64):
    """A generator's outputs ``f_θ(ε)`` at ``n`` fixed noises; ``None`` for other guides."""
    return guide._draw(jax.random.PRNGKey(7), params, n) if isinstance(guide, AutoGPVI) else None


def _rms(before, after):
    """RMS of ``after − before``; ``nan`` without a generator."""
    return np.nan if before is None else float(jnp.sqrt(jnp.mean((after - before) ** 2)))


# -- evaluation --------------------------------------------------------------------------------


def auroc(scores_in, scores_out):
    from sklearn.metrics import roc_auc_score

    labels = np.r_[np.zeros(len(scores_in)), np.ones(len(scores_out))]
    return float(roc_auc_score(labels, np.r_[scores_in, scores_out]))


def entropy(p):
    return -np.sum(p * np.log(np.clip(p, 1e-300, None)), axis=-1)


def evaluate(guide, params, cfg, seed, data, X_te, y_te, X_out, point):
    draws = guide.sample_posterior(
        jax.random.PRNGKey(1000 + seed), params, *data, sample_shape=(cfg["draws"],)
    )
    p_in, p_out = class_probs(draws, X_te), class_probs(draws, X_out)
    m_in, m_out = p_in.mean(0), p_out.mean(0)
    flat = np.concatenate([np.asarray(draws[s]).reshape(cfg["draws"], -1) for s in SITES], 1)
    return dict(
        auc_entropy=auroc(entropy(m_in), entropy(m_out)),
        # a point estimate has no spread: its variance score is 0 for every image
        auc_variance=np.nan if point else auroc(p_in.var(0).sum(-1), p_out.var(0).sum(-1)),
        accuracy=float(np.mean(m_in.argmax(-1) == y_te)),
        draw_accuracy=float(np.mean(p_in.argmax(-1) == y_te[None])),
        draw_sd=float(flat.std(0).mean()),
    )


def run(name, base, lr, model, cfg, seed, data, test):
    """Train and evaluate one method from one seed: ``(metrics, stepper)``."""
    guide, params, secs, fallbacks, nonfinite, shift, stepper = train(
        base, model, cfg, seed, data, lr, NOISE_WIDTH.get(name)
    )
    r = evaluate(guide, params, cfg, seed, data, *test, point=base == "AutoDelta")
    r.update(train_s=secs, fallbacks=fallbacks, nonfinite=nonfinite, shift=shift)
    r["train_ms"] = 1e3 * secs / max(cfg["steps"] - 1, 1)
    print(
        f"{name} seed {seed}: AUROC entropy {r['auc_entropy']:.3f} variance "
        f"{r['auc_variance']:.3f} accuracy {r['accuracy']:.3f} (per draw "
        f"{r['draw_accuracy']:.3f}) draw sd {r['draw_sd']:.2f}, first-step shift {shift:.3f}; "
        f"{secs:.0f} s after compiling, "
        f"{fallbacks} helper fallbacks, {nonfinite} non-finite warnings",
        flush=True,
    )
    return r, stepper


def time_methods(steppers, cfg):
    """Seconds per step of each method's compiled step (from its last trained state), the
    methods taking turns block by block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return time_interleaved(steppers, cfg["timing_repeats"], cfg["timing_steps"])


# -- report ------------------------------------------------------------------------------------


def fmt(values, digits=3):
    values = np.asarray(values, dtype=float)
    if np.all(np.isnan(values)):
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def table(results, times=None):
    headers = [
        "method",
        "AUROC (entropy)",
        "AUROC (pred. variance)",
        "accuracy (pred. mean)",
        "accuracy (single draw)",
        "draw sd",
        "first-step shift",
        "helper fallback steps",
    ]
    if times is not None:
        headers += ["ms / step", "ms / step (training)"]
    rows = []
    for name, rs in results.items():
        col = lambda key, rs=rs: [r[key] for r in rs]
        row = [
            name,
            fmt(col("auc_entropy")),
            fmt(col("auc_variance")),
            fmt(col("accuracy")),
            fmt(col("draw_accuracy")),
            fmt(col("draw_sd"), 2),
            fmt(col("shift")),
            "/".join(str(r["fallbacks"]) for r in rs) if "GPVI" in name else "–",
        ]
        if times is not None:
            row += [f"{1e3 * times[name]:.2f}", fmt(col("train_ms"), 2)]
        rows.append(row)
    return markdown_table(headers, rows)


def main(argv=None):
    args = parse_args(__doc__.splitlines()[0], argv)
    cfg = SETTINGS[args.mode]
    stopwatch = Stopwatch()
    X_tr, y_tr, X_te, y_te, X_out = load_data(cfg["train_subset"], cfg["test_subset"])
    data, test = (X_tr, y_tr), (X_te, y_te, X_out)
    model = bnn_model(cfg["hidden"])
    dim = cfg["hidden"] * (X_tr.shape[1] + 1) + INLIERS * (cfg["hidden"] + 1)
    print(f"train {X_tr.shape[0]}, test inliers {len(y_te)}, outliers {len(X_out)}, D = {dim}")

    results = {name: [] for name, _, _ in METHODS}
    steppers = {}  # the last seed's compiled step of each method, for the timing
    with stopwatch.lap("training and evaluation"):
        for seed in range(cfg["seeds"]):
            for name, base, lr in METHODS:
                r, steppers[name] = run(name, base, lr, model, cfg, seed, data, test)
                results[name].append(r)
    default_results = {}
    if cfg["default_lr_rows"]:
        with stopwatch.lap("lr 5e-2 runs (one seed)"):
            for name, base, lr in DEFAULT_LR_METHODS:
                default_results[name] = [run(name, base, lr, model, cfg, 0, data, test)[0]]
    with stopwatch.lap("timing"):
        times = time_methods(steppers, cfg)
    print({k: f"{1e3 * v:.2f} ms" for k, v in times.items()})

    seeds = cfg["seeds"]
    spread = "mean ± sd over 3 seeds" if seeds > 1 else "one seed"
    main_table = table(results, times)
    parts = [
        f"Settings: {cfg}; BNN 64 → {cfg['hidden']} tanh → 6, D = {dim} latent dimensions; "
        f"train {X_tr.shape[0]} images of 0–5, test {len(y_te)} held-out images of 0–5 "
        f"(inliers) and {len(X_out)} images of 6–9 (outliers); posterior predictive from "
        f"{cfg['draws']} draws. Training: `gpvi_reproduction.optimiser`, Adam with cosine decay to "
        f"2% over {cfg['steps']} full-batch steps, from {GENERATOR_LR:g} for the two "
        f"generators (see below) and {DEFAULT_LR:g} for AutoNormal / AutoDelta; the helper "
        f"at a constant {HELPER_LR:g}; generator 1 × 64 hidden units, noise width D (rows "
        "marked *noise width 64*: the generator's MLP reads the first 64 of the D noise "
        "coordinates, its skip term λε all D), "
        f"{cfg['particles']} particles per step, helper width {cfg['helper_hidden']}.",
        "",
        f"Results ({spread}). Paper (GPVI, MNIST, LeNet-5): AUROC {PAPER_AUC} from the "
        f"predictive variance, clean accuracy {PAPER_ACC}. *accuracy (single draw)*: the "
        "mean accuracy of one posterior draw on its own; *draw sd*: the standard deviation "
        "of the draws, averaged over the latent coordinates (prior: 1); *first-step shift*: "
        "the RMS change of a generator's output `f_θ(ε)` (64 fixed noises) over the first "
        "SVI step, against a posterior whose scale is about 1; *helper fallback "
        "steps*: steps on which the helper counted as diverged and GPVI used `J^-T v ≈ v/λ` "
        "(per seed); *ms / step*: one jitted SVI step once compiled, the methods taking "
        f"turns ({cfg['timing_repeats']} blocks of {cfg['timing_steps']} steps, median); "
        "*(training)*: the same, averaged over each training run after its first "
        "(compiling) step, per seed; the two differ where the machine's load changed.",
        "",
        main_table,
    ]
    if default_results:
        parts += [
            "",
            f"The generators at gpvi_reproduction's learning rate {DEFAULT_LR:g} (seed 0, same "
            "steps and schedule). Adam's first step moves each weight by about the learning "
            "rate, so every output of a generator with 64 hidden units moves by about "
            "`lr · Σ_m |h_m|`: more than the posterior's scale at 5e-2 (first-step shift), and "
            f"the draws spread beyond the prior. Hence {GENERATOR_LR:g} above, chosen from "
            "the size of that step, not from the AUROC:",
            "",
            table(default_results),
        ]
    parts += [
        "",
        "## Where we fall short of the paper",
        "",
        "* Data: scikit-learn's 1,797 8×8 digits (64 pixels, 16 grey levels), "
        f"{X_tr.shape[0]} training images, not MNIST's 28×28 images (about 36,000 training "
        "images of 0–5). Outliers here are all 6–9 images of the bundled set; the paper "
        "uses MNIST's test split of 6–9.",
        f"* Network: one hidden layer of {cfg['hidden']} tanh units ({dim} weights) instead "
        "of LeNet-5 (about 60,000); the paper's hypernetwork is a 3-layer MLP with a noise "
        "width well below D, ours AutoGPVI's default one-layer 64-unit generator with noise "
        "width D.",
        f"* Training: {cfg['steps']} full-batch steps with {cfg['particles']} particles, "
        "against 100 epochs of minibatches with 10 particles; no hyperparameter search.",
        f"* Score: the entropy of the predictive mean ({cfg['draws']} draws) is our headline; "
        "the paper computes AUC from the variance of the predictions over its 10 sampled "
        "networks (our second column, summed over classes: the paper does not say how it "
        "reduces the classes).",
        "* The paper's other methods (SVGD, GFSF, KSD, deep ensembles, Bayes by Backprop) are "
        "not run; AutoNormal is numpyro's mean-field Gaussian, not Bayes by Backprop with a "
        "scale-mixture prior.",
    ]
    body = "\n".join(parts)
    title = "GPVI open-category digits" + ("" if args.mode == "full" else f" ({args.mode})")
    path = write_results(args.out_dir, NAME, args.mode, title, MODULE, body, stopwatch)
    print(body)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
