"""Shared helpers for the benchmark scripts: machine description and results files."""

import os
import platform
import shlex
import sys
from pathlib import Path

import jax

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> str:
    return (f"{platform.platform()}; {os.cpu_count()} CPU cores; python "
            f"{platform.python_version()}; jax {jax.__version__} on {jax.default_backend()}")


def write_results(name: str, lines: list[str]) -> Path:
    """Print ``lines`` and write them to ``benchmarks/results/<name>.md`` with the command and
    the machine noted."""
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    text = "\n".join([f"# {name}", "", f"command: `{command}`", "", f"machine: {machine()}", "",
                      *lines, ""])
    print(text)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text)
    return path
