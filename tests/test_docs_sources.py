"""The documentation sources, as read on GitHub or in a checkout (no build needed): every
relative link reaches a file that exists, and every public guide has its row on the home
page and its entry in the API reference."""

import re
from pathlib import Path

import numpyro_dais

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
GUIDES = [n for n in numpyro_dais.__all__ if n.startswith("Auto")]


def _relative_links(path):
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+:", target):
            yield target


def test_relative_links_of_the_docs_sources_reach_existing_files():
    pages = [*DOCS.rglob("*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    missing = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in pages
        if page.exists()
        for target in _relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not missing, "links to pages that only a build makes (use the site URL):\n" + "\n".join(
        missing
    )


def test_every_public_guide_is_on_the_home_table_and_in_the_api_reference():
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    reference = (DOCS / "reference" / "index.md").read_text(encoding="utf-8")
    assert len(GUIDES) >= 6
    for name in GUIDES:
        assert f"::: numpyro_dais.{name}\n" in reference, name
    for name in (
        "AutoDAIS",
        "AutoSurrogateLikelihoodDAIS",
        "AutoDSMCS",
        "AutoGPVI",
        "AutoSemiDAIS",
    ):
        assert f"[`{name}`]" in home, name
