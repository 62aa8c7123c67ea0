"""The README is for users: its snippets run as they stand, its links lead somewhere, and it
keeps the project's two commands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _python_blocks(section):
    """The ```python blocks of the README section headed ``## {section}``."""
    start = README.index(f"\n## {section}\n")
    end = README.find("\n## ", start + 1)
    text = README[start : end if end != -1 else None]
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_top_screen_is_a_users():
    """Install, a fit, the guides, ArviZ and the documentation come before the development
    set-up, and the two commands are there."""
    headings = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    order = [
        "Install",
        "A first fit",
        "The guides",
        "Queries of a trained guide",
        "ArviZ",
        "Caveats",
        "Documentation",
    ]
    assert headings[: len(order)] == order, headings
    for command in ("python dev.py quickstart", "python dev.py test", "python dev.py test --fast"):
        assert command in README, command
    assert "## What to know" not in README  # moved to docs/topics/


def test_relative_links_lead_to_files():
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", README)
    assert links
    for link in links:
        assert (ROOT / link).exists(), link


def test_every_docs_topic_page_is_linked_and_in_the_nav():
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs" / "topics").glob("*.md")):
        rel = page.relative_to(ROOT / "docs").as_posix()
        assert f"docs/{rel}" in README, rel
        assert rel in mkdocs, rel


def test_snippets_run_as_they_stand():
    """The first fit, the further queries and the ArviZ export, executed in order in one
    namespace, as written but shorter (below)."""
    pytest.importorskip("arviz")
    blocks = [
        *_python_blocks("A first fit"),
        *_python_blocks("Queries of a trained guide"),
        *_python_blocks("ArviZ"),
    ]
    assert len(blocks) == 3
    assert "def model" in blocks[0] and "X =" in blocks[0] and "y =" in blocks[0]
    assert len(blocks[0].strip().splitlines()) <= 25
    namespace = {"__name__": "readme"}
    # as written, but with a tenth of the training steps and particles: what is tested is
    # that every line runs and the posterior's signs come out (the suite's time budget)
    shorter = {
        "jax.random.key(2), X, y)": "jax.random.key(2), X, y, window=50, max_steps=400)",
        ", 2000, X, y,": ", 200, X, y,",
    }
    shorter["num_particles=10_000"] = "num_particles=1000"
    for block in blocks:
        for long, short in shorter.items():
            block = block.replace(long, short)
        exec(compile(block, "README.md", "exec"), namespace)
    import numpy as np

    draws, log_Z, se = namespace["draws"], namespace["ev"].log_Z, namespace["ev"].se
    assert draws["w"].shape == (1000, 3)
    assert np.all(np.isfinite(draws["w"])) and np.isfinite(log_Z) and se < 1
    # the snippet's data come from w = (1, -2, 0.5): the posterior means have the signs
    assert np.all(np.sign(np.asarray(draws["w"]).mean(0)) == [1, -1, 1])
    assert namespace["report"].ok in (True, False)
