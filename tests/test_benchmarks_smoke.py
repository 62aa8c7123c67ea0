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
    "gpvi_reproduction",
    "scaling_devices",
    "sldais_scaling",
]
#: scripts whose results are tables only
NO_FIGURE = {"dsmcs_static_target", "scaling_devices", "sldais_scaling"}


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_smoke(name, tmp_path):
    if name == "dais0_logistic":
        pytest.importorskip("sklearn")  # its data sets; a test dependency (pyproject.toml)
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
    assert bool(list(tmp_path.glob("*.png"))) == (name not in NO_FIGURE)


def test_gpvi_open_set_smoke(tmp_path):
    """``gpvi_open_set --smoke``: a table (no figure) from a subset of the 8×8 digits."""
    pytest.importorskip("sklearn")  # load_digits and roc_auc_score
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpvi_open_set", "--smoke", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "gpvi_open_set_smoke.md").read_text()
    assert "python -m benchmarks.gpvi_open_set --smoke" in text
    assert "cpu count" in text and "jax" in text
    assert "| GPVI (helper) |" in text and "| AutoDelta (MAP) |" in text
    assert "Where we fall short of the paper" in text
    assert not list(tmp_path.glob("*.png"))
