"""MkDocs hooks of the documentation site (registered in ``mkdocs.yml``).

What they do, so that the site cannot drift from the repository:

* **Reproduced results.** ``benchmarks/results/*.md`` (and their figures) become pages under
  ``results/`` at build time; the "Reproduced results" nav section lists whatever is there.
* **Notebooks.** ``examples/*.ipynb`` become pages under ``examples/`` (rendered with their
  stored outputs, not executed, by mkdocs-jupyter); none present is fine.
* **Engine reference.** ``reference/engine.md`` has one ``::: numpyro_dais.engine.<module>``
  block per module file of ``numpyro_dais/engine/``: its own modules first, then each family's
  folder (``annealing/``, ``smc/``, ...) under a heading of its package.
* **MathJax, offline.** The MathJax 3 files (``tex-mml-chtml.js``, its fonts and lazily
  loaded extensions) are copied from the ``django-static-mathjax`` package (the ``docs``
  extra) into ``javascripts/mathjax/``, so the maths renders without the network.
* **Distinct navigation titles.** A results file's nav title is its first heading, marked
  "(quick)" for a ``_quick`` run and "(H100)" for an ``_h100`` one, so full, quick and GPU
  runs of one benchmark can be told apart; any title still shared gets its file name.
* **Notebook pages, offline and linked.** nbconvert's template puts a MathJax 2 loader (an
  empty ``src``; the site's own MathJax 3 renders the maths) and a mermaid loader from a CDN
  into every notebook page; both are removed (the notebooks have no mermaid diagrams, and a
  removed loader fails the strict build if one ever appears). A table-of-contents entry whose
  anchor is not a heading of its page (mkdocs-jupyter slugs a heading with inline code
  differently from nbconvert) is pointed at the heading it names.
* **Docstrings.** Every member of ``numpyro_dais.__all__`` and every public method, property
  and nested class it declares must have a docstring; a missing one is a warning, which
  ``mkdocs build --strict`` turns into a failure.
"""

import logging
import re
from collections import Counter
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

# Under the "mkdocs" logger, so that warnings count towards --strict.
log = logging.getLogger("mkdocs.hooks.numpyro_dais")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "numpyro_dais"
RESULTS = ROOT / "benchmarks" / "results"
EXAMPLES = ROOT / "examples"
ENGINE = ROOT / PACKAGE / "engine"


def _title(text, default):
    """The first Markdown heading of ``text``, else ``default``."""
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return default


def _notebook_title(path):
    import json

    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return path.stem
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", []))
            return _title(source, path.stem)
    return path.stem


def _result_pages():
    return sorted(RESULTS.glob("*.md"))


#: a results file's name ends with the run's mode or machine; its title says so
RUN_SUFFIXES = {"_quick": "(quick)", "_h100": "(H100)"}


def _result_titles():
    """``{path: nav title}`` of the results files: the first heading, with the run's mode or
    machine ("(quick)", "(H100)") added where the heading does not say it, and the file's
    stem added to a title that is still not unique."""
    titles = {}
    for p in _result_pages():
        title = _title(p.read_text(encoding="utf-8"), p.stem)
        for suffix, label in RUN_SUFFIXES.items():
            if p.stem.endswith(suffix) and label.lower() not in title.lower():
                title = f"{title} {label}"
        titles[p] = title
    counts = Counter(titles.values())
    return {p: t if counts[t] == 1 else f"{t} ({p.stem})" for p, t in titles.items()}


def _notebooks():
    return sorted(EXAMPLES.glob("*.ipynb"))


# -- nav ----------------------------------------------------------------------------------


def _expand(nav):
    """Replace the ``examples/index.md`` and ``results/index.md`` entries by sections."""
    out = []
    for item in nav:
        if isinstance(item, dict):
            ((title, value),) = item.items()
            if value == "results/index.md":
                pages = [{t: f"results/{p.name}"} for p, t in _result_titles().items()]
                value = [value, *pages]
            elif value == "examples/index.md":
                value = [value, *({_notebook_title(p): f"examples/{p.name}"} for p in _notebooks())]
            elif isinstance(value, list):
                value = _expand(value)
            item = {title: value}
        out.append(item)
    return out


def on_config(config):
    config["nav"] = _expand(config["nav"])
    return config


# -- docstring check ----------------------------------------------------------------------


def missing_docstrings(search_path=ROOT):
    """Public API objects of ``numpyro_dais`` without a docstring (dotted paths).

    Checks every name in ``numpyro_dais.__all__`` (classes and functions) and the public
    methods, properties and nested classes that each exported class declares itself
    (inherited numpyro methods are numpyro's business). Static analysis with griffe: nothing
    is imported.
    """
    import griffe

    package = griffe.load(
        PACKAGE, search_paths=[str(search_path)], resolve_aliases=True, resolve_external=False
    )
    exports = package.exports or []
    missing = []
    for name in sorted(exports):
        if name.startswith("__"):
            continue
        obj = package[name]
        obj = obj.final_target if obj.is_alias else obj
        if not (obj.is_class or obj.is_function):
            continue
        if not (obj.docstring and obj.docstring.value.strip()):
            missing.append(f"{PACKAGE}.{name}")
        if not obj.is_class:
            continue
        for member_name, member in obj.members.items():
            if member_name.startswith("_") or member.is_alias:
                continue
            is_property = member.is_attribute and "property" in member.labels
            if not (member.is_function or member.is_class or is_property):
                continue
            if not (member.docstring and member.docstring.value.strip()):
                missing.append(f"{PACKAGE}.{name}.{member_name}")
    return missing


def on_pre_build(config):
    for path in missing_docstrings():
        log.warning("public API without a docstring: %s", path)


# -- generated files ------------------------------------------------------------------------


def _results_index():
    lines = [
        "# Reproduced results",
        "",
        "Results of the benchmark scripts in `benchmarks/`, which reproduce experiments of the",
        "papers behind the guides. Each page below *is* the file `benchmarks/results/<name>.md`",
        "written by the script (copied at build time, so it cannot drift); the figures it",
        "names are shown at its end. Quick-mode runs use far fewer steps than the papers:",
        "read the settings and the shortfall notes of each page before comparing numbers.",
        "",
    ]
    pages = _result_pages()
    for p, title in _result_titles().items():
        lines.append(f"* [{title}]({p.name}) (`benchmarks/results/{p.name}`)")
    if not pages:
        lines.append("No result files are present in `benchmarks/results/` in this checkout.")
    return "\n".join(lines) + "\n"


def _owner(figure):
    """The results file a figure belongs to: the longest results stem that prefixes its name
    (so ``x_quick_fig.png`` goes with ``x_quick.md``, not with ``x.md``)."""
    stems = [p.stem for p in _result_pages() if figure.stem.startswith(p.stem)]
    return max(stems, key=len, default=None)


def _result_page(path):
    text = path.read_text(encoding="utf-8").rstrip() + "\n"
    figures = [f for f in sorted(RESULTS.glob("*.png")) if _owner(f) == path.stem]
    if figures:
        text += "\n## Figures\n\n"
        for fig in figures:
            text += f"![{fig.name}]({fig.name})\n\n*`{fig.name}`*\n\n"
    return text


def _examples_index():
    lines = [
        "# Examples",
        "",
        "Notebooks from `examples/`, rendered as stored: with the outputs and figures of a",
        "full run where the notebook has been run (they are not executed while the site is",
        "built; the test suite executes them in a small mode). `examples/quickstart.py` is",
        "what `python dev.py quickstart` runs.",
        "",
    ]
    nbs = _notebooks()
    for p in nbs:
        lines.append(f"* [{_notebook_title(p)}]({p.name}) (`examples/{p.name}`)")
    if not nbs:
        lines.append("No notebooks are present in `examples/` in this checkout.")
    return "\n".join(lines) + "\n"


def _engine_reference():
    lines = [
        "# Engine reference",
        "",
        "The pure-JAX engine (`numpyro_dais.engine`): functions of arrays and log-density",
        "callables, no NumPyro. See [How it works](../how-it-works.md) for the map from",
        "these modules to the math.",
        "",
        f"::: {PACKAGE}.engine",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
    ]
    families = sorted(p for p in ENGINE.iterdir() if (p / "__init__.py").exists())
    for folder, level in [(ENGINE, 2)] + [(p, 3) for p in families]:
        package = ".".join(folder.relative_to(ROOT).parts)
        if folder != ENGINE:
            lines += [
                f"::: {package}",
                "    options:",
                "      members: false",
                "      show_root_full_path: true",
                "",
            ]
        for path in sorted(folder.glob("*.py")):
            if path.stem.startswith("_"):
                continue
            lines += [
                f"::: {package}.{path.stem}",
                "    options:",
                "      show_bases: true",
                "      show_if_no_docstring: true",
                "      show_root_full_path: true",
                f"      heading_level: {level}",
                "",
            ]
    return "\n".join(lines)


#: what the site needs of MathJax's ``es5`` folder: the combined TeX component, its output
#: fonts, and the extensions, UI and accessibility parts it loads on demand
MATHJAX_PARTS = ("tex-mml-chtml.js", "output/chtml", "input/tex/extensions", "ui", "a11y")


def mathjax_files():
    """``{site path: source path}`` of the bundled MathJax; empty (and a warning, which fails
    the strict build) without the ``django-static-mathjax`` package."""
    import importlib.util

    spec = importlib.util.find_spec("mathjax")
    root = None
    if spec is not None and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax" / "es5"
    if root is None or not (root / MATHJAX_PARTS[0]).exists():
        log.warning(
            "MathJax is not installed, so the maths would not render offline: install the "
            "docs tools with `pip install -e .[docs]` (django-static-mathjax)."
        )
        return {}
    found = {}
    for part in MATHJAX_PARTS:
        path = root / part
        for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            found[f"javascripts/mathjax/{f.relative_to(root).as_posix()}"] = f
    return found


@event_priority(100)  # before mkdocs-jupyter picks the notebooks out of the file list
def on_files(files, config):
    def add(src_uri, **kwargs):
        existing = files.get_file_from_path(src_uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, src_uri, **kwargs))

    add("results/index.md", content=_results_index())
    for path in _result_pages():
        add(f"results/{path.name}", content=_result_page(path))
    for fig in sorted(RESULTS.glob("*.png")):
        add(f"results/{fig.name}", abs_src_path=str(fig))
    add("examples/index.md", content=_examples_index())
    for nb in _notebooks():
        # A plain File rooted at the repository (src_uri "examples/<name>.ipynb"): the
        # notebook wrapper of mkdocs-jupyter needs `src_dir`, which generated files lack.
        existing = files.get_file_from_path(f"examples/{nb.name}")
        if existing is not None:
            files.remove(existing)
        files.append(
            File(
                f"examples/{nb.name}",
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    add("reference/engine.md", content=_engine_reference())
    for uri, path in mathjax_files().items():
        add(uri, abs_src_path=str(path))
    return files


# -- rendered pages -------------------------------------------------------------------------

#: nbconvert's MathJax 2 loader and configuration in a notebook page (an empty ``src``; the
#: site's own MathJax 3 renders the maths)
NB_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.DOTALL)
MODULE_SCRIPT = re.compile(r'<script type="module">.*?</script>', re.DOTALL)
ELEMENT_ID = re.compile(r'<[a-z][a-z0-9]*\b[^>]*\bid="([^"]+)"')


def _without_cdn_loaders(html, page):
    """A notebook page without nbconvert's MathJax 2 and mermaid loaders."""
    html = NB_MATHJAX.sub("", html)
    html = MODULE_SCRIPT.sub(lambda m: "" if "mermaid" in m.group(0) else m.group(0), html)
    if re.search(r'class="[^"]*\bjp-Mermaid\b', html):
        log.warning(
            "%s has a mermaid diagram, but its loader (from a CDN) is removed: vendor mermaid "
            "into the site first",
            page.file.src_uri,
        )
    return html


def _fix_toc_anchors(toc, ids, page):
    """Point each table-of-contents entry at an element of the page: an anchor that is none
    is the prefix of the heading it names (``posterior-draws-and`` for
    ``posterior-draws-and-log-py``); a warning where no single element fits."""
    for item in toc:
        if item.id not in ids:
            fits = [i for i in ids if i.startswith(f"{item.id}-")]
            if len(fits) == 1:
                item.id = fits[0]
            else:
                log.warning("%s: no heading for the contents entry #%s", page.file.src_uri, item.id)
        _fix_toc_anchors(item.children, ids, page)


def on_page_content(html, page, config, files):
    if page.file.src_uri.endswith(".ipynb"):
        html = _without_cdn_loaders(html, page)
    if page.toc:
        _fix_toc_anchors(page.toc, set(ELEMENT_ID.findall(html)), page)
    return html
