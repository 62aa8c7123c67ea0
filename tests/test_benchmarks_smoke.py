"""Smoke test: benchmark scripts run end to end in their ``--smoke`` mode.

Each script's ``main()`` runs in the test process, with the command line it would get from
``python -m benchmarks.<name> --smoke --out-dir <tmp>``: the scripts read nothing else
from their process, and a run in the test process shares JAX's start-up, numpyro's small
eager programs and the run's compilation cache with the rest of the suite (the ten runs
took 149 s in one process against 190 s as ten processes, on 2 CPU cores).
``scaling_devices`` still starts its own children, one per device count.
"""

import importlib
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "dais0_bimodal",
    "dais0_gp_regression",
    "dais0_logistic",
    "dais0_quickstart",
    "dsmcs_static_target",
    "funnel_metric",
    "gpvi_open_set",
    "gpvi_reproduction",
    "mala_draws",
    "model_families",
    "ode_profile",
    "real_models",
    "refined_start",
    "refinement_optimiser",
    "scaling_devices",
    "self_check",
    "setup_scaling",
    "sldais_scaling",
    "sldais_vs_dais",
    "time_to_answer",
]
#: scripts whose results are tables only
NO_FIGURE = {
    "dsmcs_static_target",
    "funnel_metric",
    "gpvi_open_set",
    "mala_draws",
    "model_families",
    "ode_profile",
    "real_models",
    "refined_start",
    "refinement_optimiser",
    "scaling_devices",
    "self_check",
    "setup_scaling",
    "sldais_scaling",
    "sldais_vs_dais",
}
#: scripts that need scikit-learn (a test dependency, pyproject.toml): its data sets
NEEDS_SKLEARN = {"dais0_logistic", "gpvi_open_set", "sldais_vs_dais"}
#: rows or sections a script's table must have, beyond the command and the machine
EXPECTED = {
    "model_families": ("| ours q0 |", "| AutoNormal |", "with no warning from our guide"),
    "ode_profile": (
        "| phase | ours N=8 |",
        "self-check: MALA chains",
        "by jax.experimental.ode.odeint",
        "| unbatched |",
    ),
    "refined_start": ("| refined (default) |", "| Laplace at the mode |", "## Models"),
    "refinement_optimiser": (
        "| eight_schools_noncentred |",
        "| 1,000 | L-BFGS |",
        "| 1,000 | Adam |",
    ),
    "dsmcs_static_target": ("**hmc-paper**", "**Budget**", "Trained parameters under each rule"),
    "real_models": (
        "| ours q0 |",
        "| ours importance |",
        "| AutoNormal |",
        "median max mean err",
        "results > 1 sd off with no warning from our guide",
        "## NUTS references",
    ),
    "self_check": (
        "| kid_score | defaults | 1 |",
        "## The self-check's tolerances on this set",
        "## Every fit",
    ),
    "mala_draws": ("| kid_score | 1 |", "## q0 judged by the chains instead of NUTS"),
    "funnel_metric": ("| exact |", "| max abs log sd ratio |", "| 0 | mala |"),
    "setup_scaling": ("| 500 |", "AutoDAIS K=8 N=8: svi.init (s)"),
    "time_to_answer": ("| logistic_1000 |", "## Summary", "A right answer: every latent"),
    "sldais_vs_dais": ("## breast-cancer", "| SL-DAIS K=8 |", "surrogate loss"),
    "gpvi_open_set": (
        "| GPVI (helper) |",
        "| AutoDelta (MAP) |",
        "Where we fall short of the paper",
    ),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_smoke(name, tmp_path, monkeypatch):
    if name in NEEDS_SKLEARN:
        pytest.importorskip("sklearn")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the children a script starts (scaling_devices) find the package from the repository
    monkeypatch.chdir(ROOT)
    paths = [str(ROOT), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    monkeypatch.setattr(
        sys, "argv", [f"benchmarks/{name}.py", "--smoke", "--out-dir", str(tmp_path)]
    )
    importlib.import_module(f"benchmarks.{name}").main()
    plt.close("all")
    result = tmp_path / f"{name}_smoke.md"
    assert result.exists()
    text = result.read_text()
    assert f"python -m benchmarks.{name} --smoke" in text
    assert "cpu count" in text and "jax" in text
    for expected in EXPECTED.get(name, ()):
        assert expected in text, expected
    assert bool(list(tmp_path.glob("*.png"))) == (name not in NO_FIGURE)
