"""The example scripts of ``examples/`` run and say what their docs say."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_model_comparison_agrees_with_the_exact_bayes_factor(capsys):
    """Short training (300 steps): the estimate is still consistent, with a larger se."""
    diff, se, exact = _load("model_comparison").main(steps=300)
    assert 0 < se < 0.05
    assert abs(diff - exact) < 4 * se + 0.01
    assert diff < 0  # the simpler model wins, as the docs say
    assert "log Bayes factor" in capsys.readouterr().out
