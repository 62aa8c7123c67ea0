"""Execute every ``examples/*.ipynb`` top to bottom with small settings.

Each notebook reads ``NUMPYRO_DAIS_NB_SMALL=1`` and shrinks its data and step counts. A
notebook lists the guides it needs in its metadata (``"numpyro_dais": {"requires": [...]}``);
each must be a public name of the package. A notebook is skipped, with the reason, only when
nbclient, ipykernel or matplotlib are missing.
"""

import json
import os
from pathlib import Path

import pytest

import numpyro_dais

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOT = str(Path(numpyro_dais.__file__).resolve().parents[1])
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))


def _requires(path):
    meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    return meta.get("numpyro_dais", {}).get("requires", [])


def test_every_notebook_declares_its_guides():
    assert NOTEBOOKS, "no notebooks found in examples/"
    for path in NOTEBOOKS:
        assert _requires(path), f"{path.name}: metadata numpyro_dais.requires is missing"


#: notebooks stored without outputs (none now); run a notebook with
#: `jupyter nbconvert --to notebook --execute --inplace examples/<name>.ipynb`
NOT_YET_EXECUTED: set[str] = set()


def test_notebooks_are_stored_with_the_outputs_of_a_full_run():
    """The docs site renders the notebooks as stored: each is stored executed top to bottom
    (every code cell, in order) in its full mode, with its figures, and with nothing on
    stderr (a warning renders as a red box: remove its cause, or filter that one warning in
    the notebook, as the first cell does for tqdm's "IProgress not found")."""
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        counts = [c["execution_count"] for c in code]
        if path.name in NOT_YET_EXECUTED:
            assert counts == [None] * len(code), f"{path.name} is executed: update the list"
            continue
        assert counts == list(range(1, len(code) + 1)), f"{path.name}: run it top to bottom"
        outputs = [o for c in code for o in c["outputs"]]
        assert not [o for o in outputs if o["output_type"] == "error"], path.name
        stderr = [o for o in outputs if o["output_type"] == "stream" and o["name"] == "stderr"]
        assert not stderr, f"{path.name} stores stderr output: {''.join(stderr[0]['text'])[:200]}"
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name}: no figure"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="needs nbformat (the `test` extra)")
    nbclient = pytest.importorskip("nbclient", reason="needs nbclient (the `test` extra)")
    pytest.importorskip("ipykernel", reason="needs ipykernel (the `test` extra)")
    pytest.importorskip("matplotlib", reason="the notebooks plot with matplotlib")
    missing = [name for name in _requires(path) if not hasattr(numpyro_dais, name)]
    assert not missing, f"{path.name} needs numpyro_dais.{', '.join(missing)}, not exported"

    # the kernel inherits the test process's environment; monkeypatch restores it
    monkeypatch.setenv("NUMPYRO_DAIS_NB_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # the kernel imports the same numpyro_dais as this test (checked above)
    paths = [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
