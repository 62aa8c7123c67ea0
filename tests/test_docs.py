"""The documentation site builds with ``mkdocs build --strict``.

Strict mode fails on broken links and references, griffe/mkdocstrings warnings and on public
API without a docstring (checked by ``docs/hooks.py``).
"""

import importlib.util
import os
import re
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
    # and every notebook, with the figures it is stored with
    for nb in (ROOT / "examples").glob("*.ipynb"):
        assert (site / "examples" / nb.stem / "index.html").exists(), nb.name
        figures = nb.read_text(encoding="utf-8").count('"image/png"')
        html = (site / "examples" / nb.stem / "index.html").read_text(encoding="utf-8")
        assert html.count("data:image/png;base64") >= figures, nb.name
    _check_offline_and_no_literal_roles(site)


ROLE = re.compile(r":(?:meth|func|class|attr|mod|data|exc|obj):")
EXTERNAL = re.compile(
    r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=[\"'](?:https?:)?//", re.IGNORECASE
)


def _check_offline_and_no_literal_roles(site):
    """The built site shows no Sphinx role literally (the docstrings' roles become links) and
    loads nothing from another host: MathJax and the fonts come with the site."""
    pages = sorted(site.rglob("*.html"))
    assert pages
    for page in pages:
        html = page.read_text(encoding="utf-8")
        name = page.relative_to(site).as_posix()
        # a role in a code block of the site's own docs would be fine; none is expected
        assert not ROLE.search(html), f"{name}: {ROLE.search(html).group(0)} shown literally"
        external = EXTERNAL.search(html)
        assert not external, f"{name}: loads {html[external.start() : external.end() + 60]}"
    assert (site / "javascripts" / "mathjax" / "tex-mml-chtml.js").exists()
    fonts = site / "javascripts" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert any(fonts.glob("*.woff"))
    guide = (site / "guides" / "autodais" / "index.html").read_text(encoding="utf-8")
    assert 'src="../../javascripts/mathjax/tex-mml-chtml.js"' in guide
    assert 'class="arithmatex"' in guide  # the maths is there for MathJax to render
    # the roles became links to the objects they name
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert 'href="#numpyro_dais.AutoDAIS"' in reference or "autodais/#numpyro_dais.AutoDAIS" in (
        reference
    )


def test_roles_resolve_from_the_docstrings_scope():
    """``docs/griffe_roles.py`` on the package: relative, scoped and ``~`` roles."""
    import griffe

    spec = importlib.util.spec_from_file_location("griffe_roles", ROOT / "docs" / "griffe_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    package = loader.load("numpyro_dais")
    loader.resolve_aliases(implicit=False, external=False)
    dais = package["engine.dais"]
    out = roles.rewrite(":func:`.weights.diverged` and :class:`~.dais.Target`", dais, loader)
    assert 'identifier="numpyro_dais.engine.weights.diverged"' in out
    assert 'identifier="numpyro_dais.engine.dais.Target"><code>Target</code>' not in out
    assert 'identifier="numpyro_dais.engine.dais.Target" optional><code>Target</code>' in out
    guide = package["_queries.PosteriorQueries.get_base_dist"]
    out = roles.rewrite(":meth:`get_transform`", guide, loader)
    assert 'identifier="numpyro_dais._queries.PosteriorQueries.get_transform"' in out
    out = roles.rewrite(":class:`~numpyro_dais.AutoDAIS`", guide, loader)
    assert 'identifier="numpyro_dais.AutoDAIS" optional><code>AutoDAIS</code>' in out
    assert roles.rewrite(":func:`no_such_name`", guide, loader) == "`no_such_name`"


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
