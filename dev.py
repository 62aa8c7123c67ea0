"""The project's two commands; each does its own set-up on a machine with only Python.

    python dev.py quickstart   # fit a Bayesian logistic regression with AutoDAIS vs AutoNormal
    python dev.py test         # run the test suite (what CI runs)
    python dev.py test --fast  # ... only the tests not marked `slow`: about a minute
    python dev.py docs         # build the documentation site into site/ (mkdocs --strict)
    python dev.py docs serve   # ... or preview it at http://127.0.0.1:8000 while editing

On first use (or when pyproject.toml changes) this creates ``.venv/`` and installs the
package with its test dependencies (which include the documentation tools) into it. Extra
arguments are passed on (to pytest, to the quick-start script, or to mkdocs).

``--fast`` is ``pytest -m "not slow"``: the unit tests of every module, without the tests that
train a guide for long, run a notebook, a benchmark or a child process, or build the docs
(``tests/conftest.py`` lists them). It is for the edit-test loop; ``python dev.py test`` runs
everything, and CI runs exactly that.
"""

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".installed"


def ensure_venv():
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest and PYTHON.exists():
        return
    if not PYTHON.exists():
        print(f"creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing numpyro-dais and its test dependencies ...", flush=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(digest)


def main(argv):
    if not argv or argv[0] not in ("quickstart", "test", "docs"):
        print(__doc__)
        return 2
    ensure_venv()
    command, rest = argv[0], argv[1:]
    if command == "quickstart":
        cmd = [str(PYTHON), str(ROOT / "examples" / "quickstart.py"), *rest]
    elif command == "docs":
        if rest and rest[0] == "serve":
            cmd = [str(PYTHON), "-m", "mkdocs", "serve", *rest[1:]]
        else:
            cmd = [str(PYTHON), "-m", "mkdocs", "build", "--strict", *rest]
    else:
        cmd = pytest_command(rest)
    return subprocess.run(cmd, cwd=ROOT).returncode


def pytest_command(args, python=PYTHON):
    """The pytest command line of ``python dev.py test ARGS``: ``--fast`` deselects the tests
    marked ``slow``; every other argument goes to pytest as it is."""
    fast = "--fast" in args
    args = [a for a in args if a != "--fast"]
    return [
        str(python),
        "-m",
        "pytest",
        "-n",
        "auto",
        "-q",
        *(["-m", "not slow"] if fast else []),
        *args,
    ]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
