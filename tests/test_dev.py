"""``dev.py``'s test command and the fast tier's list of slow tests."""

import ast
import importlib.util
from pathlib import Path

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def _dev():
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fast_deselects_the_slow_tests_and_passes_the_rest_on():
    dev = _dev()
    full = dev.pytest_command(["-x"], python="py")
    assert full == ["py", "-m", "pytest", "-n", "auto", "-q", "-x"]
    fast = dev.pytest_command(["--fast", "tests/engine"], python="py")
    assert fast == ["py", "-m", "pytest", "-n", "auto", "-q", "-m", "not slow", "tests/engine"]


def test_ci_runs_the_whole_suite():
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("python3 dev.py test")


def test_every_slow_entry_names_a_test():
    """An entry of ``conftest.SLOW`` whose test was renamed or removed would silently put a
    slow test back in the fast tier: each names a test file and a test function in it."""
    functions = {}
    for entry in conftest.SLOW:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        if path not in functions:
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            functions[path] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert not name or name.split("[")[0] in functions[path], entry


def test_matching_stops_at_a_parameter_list_or_a_file():
    match = conftest._matches
    assert match("tests/a.py::test_x[1-2]", "tests/a.py::test_x")
    assert match("tests/a.py::test_x", "tests/a.py::test_x")
    assert not match("tests/a.py::test_x_y", "tests/a.py::test_x")
    assert match("tests/a.py::test_x", "tests/a.py")
    assert not match("tests/ab.py::test_x", "tests/a.py")
