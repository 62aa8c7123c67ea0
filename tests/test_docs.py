"""The documentation site builds with ``mkdocs build --strict``.

Strict mode fails on broken links and references, griffe/mkdocstrings warnings and on public
API without a docstring (checked by ``docs/hooks.py``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip(
    "mkdocs", reason="mkdocs is not installed: install the docs tools with `pip install -e .[docs]`"
)
for _plugin in ("material", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
    pytest.importorskip(_plugin, reason=f"{_plugin} is not installed (`pip install -e .[docs]`)")


def _load_hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_public_api_has_docstrings():
    assert _load_hooks().missing_docstrings() == []


def test_docs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in (
        "index.html",
        "getting-started/index.html",
        "guides/autodais/index.html",
        "reference/index.html",
        "reference/engine/index.html",
        "results/index.html",
    ):
        assert (site / page).exists(), page
    # the API reference is rendered from the docstrings
    assert "num_particles" in (site / "reference" / "index.html").read_text(encoding="utf-8")
    # every benchmark result file is a page
    for result in (ROOT / "benchmarks" / "results").glob("*.md"):
        assert (site / "results" / result.stem / "index.html").exists(), result.name
    # and every notebook
    for nb in (ROOT / "examples").glob("*.ipynb"):
        assert (site / "examples" / nb.stem / "index.html").exists(), nb.name


def test_result_pages_show_only_their_own_figures():
    """A figure belongs to the results file whose name is its longest prefix, so a full-mode
    page does not also show its quick run's (or a renamed variant's) figures."""
    hooks = _load_hooks()
    pages = {p.stem for p in hooks._result_pages()}
    for fig in hooks.RESULTS.glob("*.png"):
        owner = hooks._owner(fig)
        assert owner in pages, fig.name
        longer = [s for s in pages if fig.stem.startswith(s) and len(s) > len(owner)]
        assert not longer, fig.name
    if {"dais0_gp_regression", "dais0_gp_regression_quick"} <= pages:
        page = hooks._result_page(hooks.RESULTS / "dais0_gp_regression.md")
        assert "dais0_gp_regression_fig5.png" in page
        assert "_quick_fig5.png" not in page and "_jitter1e-06_fig5.png" not in page
