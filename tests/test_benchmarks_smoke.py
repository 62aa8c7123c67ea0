"""Smoke test: benchmark scripts run end to end in their ``--smoke`` mode."""

import os
import subprocess
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
    "gpvi_open_set",
    "gpvi_reproduction",
    "scaling_devices",
    "sldais_scaling",
    "sldais_vs_dais",
]
#: scripts whose results are tables only
NO_FIGURE = {
    "dsmcs_static_target",
    "gpvi_open_set",
    "scaling_devices",
    "sldais_scaling",
    "sldais_vs_dais",
}
#: scripts that need scikit-learn (a test dependency, pyproject.toml): its data sets
NEEDS_SKLEARN = {"dais0_logistic", "gpvi_open_set", "sldais_vs_dais"}
#: rows or sections a script's table must have, beyond the command and the machine
EXPECTED = {
    "dsmcs_static_target": ("**hmc-paper**", "**Budget**"),
    "sldais_vs_dais": ("## breast-cancer", "| SL-DAIS K=8 |", "surrogate loss"),
    "gpvi_open_set": (
        "| GPVI (helper) |",
        "| AutoDelta (MAP) |",
        "Where we fall short of the paper",
    ),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_smoke(name, tmp_path):
    if name in NEEDS_SKLEARN:
        pytest.importorskip("sklearn")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--smoke", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = tmp_path / f"{name}_smoke.md"
    assert result.exists()
    text = result.read_text()
    assert f"python -m benchmarks.{name} --smoke" in text
    assert "cpu count" in text and "jax" in text
    for expected in EXPECTED.get(name, ()):
        assert expected in text, expected
    assert bool(list(tmp_path.glob("*.png"))) == (name not in NO_FIGURE)
