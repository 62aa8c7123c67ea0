"""The sdist and the wheel build, and a fresh virtual environment can install the wheel and
import every public name.

Offline and fast: ``python -m build --no-isolation`` uses the setuptools of this
environment, and the fresh venv (no pip of its own) finds the dependencies (JAX, NumPyro,
...) of this environment through a path entry, so ``pip install --no-deps --no-index`` of
the wheel is all it installs. This environment's own install of numpyro-dais (an editable
one, say) is not seen there: a path entry does not run that directory's ``.pth`` files.
"""

import json
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("build", reason="needs `build` (the `test` extra)")
setuptools = pytest.importorskip("setuptools", reason="needs setuptools (the `test` extra)")
if int(setuptools.__version__.split(".")[0]) < 77:
    pytest.skip("needs setuptools >= 77 (PEP 639 license metadata)", allow_module_level=True)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("numpyro_dais-*.whl")
    (sdist,) = out.glob("numpyro_dais-*.tar.gz")
    return wheel, sdist


def test_wheel_and_sdist_contents(dist):
    wheel, sdist = dist
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = zf.read(meta_name).decode()
    assert "numpyro_dais/py.typed" in names
    assert "numpyro_dais/engine/annealing/dais.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)
    assert "License-Expression: Apache-2.0" in meta
    assert "Requires-Python: >=3.11" in meta
    assert "Requires-Dist: jax>=0.7" in meta
    assert "Project-URL: Source, " in meta and "Classifier: Typing :: Typed" in meta
    assert "Provides-Extra: arviz" in meta
    # the README is the package page: it is for users, not for contributors' set-up
    assert "pip install numpyro-dais" in meta and "../shared" not in meta
    with tarfile.open(sdist) as tf:
        members = {Path(m).relative_to(Path(m).parts[0]).as_posix() for m in tf.getnames()[1:]}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"} <= members
    assert "numpyro_dais/py.typed" in members
    # the whole source tree, so that the tests run from an unpacked sdist (MANIFEST.in)
    assert {"tests/conftest.py", "tests/models.py", "tests/engine/__init__.py"} <= members
    assert {"dev.py", "mkdocs.yml", "docs/hooks.py", "examples/quickstart.py"} <= members
    assert not any("__pycache__" in m or m.endswith(".pyc") for m in members)
    tracked = _tracked_files()
    if tracked is not None:  # every file of the repository but git's own
        missing = tracked - members - {".gitignore"}
        assert not missing, sorted(missing)[:20]


def _tracked_files():
    """The files git tracks in this checkout, or ``None`` outside a git checkout (an
    unpacked sdist)."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, timeout=60
        )
    except OSError:
        return None
    if proc.returncode != 0:
        return None
    return {line for line in proc.stdout.splitlines() if (ROOT / line).is_file()}


def test_fresh_venv_installs_the_wheel_and_imports_every_public_name(dist, tmp_path):
    wheel, _ = dist
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_dependencies.pth").write_text("\n".join(sorted(here)) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    check = """
import json, numpyro_dais
missing = [n for n in numpyro_dais.__all__ if not hasattr(numpyro_dais, n)]
import numpyro_dais.engine as engine
print(json.dumps({"file": numpyro_dais.__file__, "all": numpyro_dais.__all__,
                  "missing": missing, "version": numpyro_dais.__version__}))
"""
    proc = subprocess.run(
        [str(python), "-I", "-c", check], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(info["file"]).resolve().is_relative_to(env.resolve()), info["file"]
    assert not info["missing"]
    assert {"AutoDAIS", "to_inference_data", "plot_ess", "transition_params"} <= set(info["all"])
    assert Path(purelib, "numpyro_dais", "py.typed").exists()


def test_help_of_every_public_guide_shows_its_own_docstrings():
    # help(AutoDAIS) once showed the private adapter's __init__ docstring
    import pydoc

    import numpyro_dais

    guides = [getattr(numpyro_dais, n) for n in numpyro_dais.__all__ if n.startswith("Auto")]
    assert len(guides) >= 6
    for cls in guides:
        text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
        init = text[text.index("__init__(self") :].split("\n |  \n", 1)[0]
        assert f"the options are {cls.__name__}'s" in init, (cls.__name__, init[-300:])
        assert cls.__doc__.strip().split()[0] in text
