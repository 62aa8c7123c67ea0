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
    _check_no_glitches(site)


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


#: ``\text{init\_scale}``: MathJax's text mode shows the backslash
TEXT_ESCAPE = re.compile(r"\\text(?:rm|tt|it|bf|sf)?\{[^}]*\\_")
SCRIPT_BODY = re.compile(r"<script\b[^>]*>(.*?)</script>", re.DOTALL)
URL = re.compile(r"(?:https?:)?//[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[a-z]{2,}\b")
BASES = re.compile(r"Bases: (.*?)</p>", re.DOTALL)


def _check_no_glitches(site):
    """The glitches of issue 39 stay fixed: no escaped underscore in ``\text{}`` (shown
    literally), no script that fetches from another host (nbconvert's mermaid loader) nor an
    empty ``src``, no base class from a private module ("Bases: AnnealedGuide"), no link to
    an anchor its page lacks (the notebooks' tables of contents), and no two pages with one
    title in the navigation (full and ``_quick`` results)."""
    for page in sorted(site.rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        name = page.relative_to(site).as_posix()
        assert not TEXT_ESCAPE.search(html), f"{name}: {TEXT_ESCAPE.search(html).group(0)}"
        for body in SCRIPT_BODY.findall(html):
            assert not URL.search(body), f"{name}: a script fetches {URL.search(body).group(0)}"
        assert '<script src="">' not in html, name
        for bases in BASES.findall(html):
            private = re.findall(r'title="([\w.]*\._[^".]*\.\w+)"', bases)
            assert not private, f"{name}: Bases: {private}"
        ids = set(re.findall(r'\bid="([^"]+)"', html))
        missing = {a for a in re.findall(r'href="#([^"]+)"', html) if a not in ids}
        assert not missing, f"{name}: links to #{sorted(missing)[0]}, not on the page"
    titles = _nav_titles((site / "index.html").read_text(encoding="utf-8"))
    assert len(titles) > 10
    repeated = sorted({t for t in titles if titles.count(t) > 1})
    assert not repeated, f"navigation titles used twice: {repeated}"


def _nav_titles(html):
    """The titles of the pages listed in the site's navigation (the primary sidebar)."""
    from html.parser import HTMLParser

    class Nav(HTMLParser):
        def __init__(self):
            super().__init__()
            self.primary, self.href, self.text, self.titles = False, None, [], []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            classes = (attrs.get("class") or "").split()
            if tag == "nav" and "md-nav--primary" in classes:
                self.primary = True
            href = attrs.get("href") or "#"
            if self.primary and tag == "a" and "md-nav__link" in classes and href[0] != "#":
                self.href, self.text = href, []

        def handle_endtag(self, tag):
            if tag == "a" and self.href is not None:
                self.titles.append(" ".join("".join(self.text).split()))
                self.href = None

        def handle_data(self, data):
            if self.href is not None:
                self.text.append(data)

    nav = Nav()
    nav.feed(html)
    return nav.titles


def test_result_titles_are_distinct_and_say_the_run():
    hooks = _load_hooks()
    titles = hooks._result_titles()
    assert len(set(titles.values())) == len(titles)
    for path, title in titles.items():
        if path.stem.endswith("_quick"):
            assert "(quick)" in title.lower(), title
        if path.stem.endswith("_h100"):
            assert "(H100)" in title, title


def test_notebook_pages_lose_their_cdn_loaders_and_toc_anchors_are_fixed():
    from mkdocs.structure.toc import AnchorLink

    hooks = _load_hooks()

    class Page:
        class file:
            src_uri = "examples/x.ipynb"

        toc = None

    html = (
        '<!-- Load mathjax -->\n<script src=""> </script><!-- End of mathjax configuration -->'
        '<script type="module">import("https://cdn.example/mermaid.mjs")</script>'
        '<script type="module">keep()</script><h2 id="draws-and-log-py">Draws and log p(y)</h2>'
    )
    page = Page()
    out = hooks._without_cdn_loaders(html, page)
    assert "mermaid" not in out and "mathjax" not in out.lower() and "keep()" in out
    toc = [AnchorLink("Draws and log p(y)", "draws-and", 2)]
    hooks._fix_toc_anchors(toc, {"draws-and-log-py"}, page)
    assert toc[0].url == "#draws-and-log-py"


def test_roles_resolve_from_the_docstrings_scope():
    """``docs/griffe_roles.py`` on the package: relative, scoped and ``~`` roles."""
    import griffe

    spec = importlib.util.spec_from_file_location("griffe_roles", ROOT / "docs" / "griffe_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    package = loader.load("numpyro_dais")
    loader.resolve_aliases(implicit=False, external=False)
    dais = package["engine.annealing.dais"]
    out = roles.rewrite(":func:`.weights.diverged` and :class:`~.dais.Target`", dais, loader)
    # Target is defined in engine.base and imported by engine.annealing.dais: the link goes to
    # its home
    assert 'identifier="numpyro_dais.engine.annealing.weights.diverged"' in out
    assert 'identifier="numpyro_dais.engine.base.Target"><code>Target</code>' not in out
    assert 'identifier="numpyro_dais.engine.base.Target" optional><code>Target</code>' in out
    guide = package["annealed.guide.AnnealedGuide.get_base_dist"]
    out = roles.rewrite(":meth:`get_transform`", guide, loader)
    assert 'identifier="numpyro_dais.annealed.guide.AnnealedGuide.get_transform"' in out
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
