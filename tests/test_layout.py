"""The house rules of the layout (CONTRIBUTING.md), checked statically."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "numpyro_dais"
#: NumPyro's private names the package needs, all reached through bridge/numpyro_private.py
NUMPYRO_PRIVATE = (
    "_setup_prototype",
    "_init_locs",
    "_init_latent",
    "_unpack_latent",
    "_PYRO_STACK",
    "_subsample_fn",
    "_postprocess_fn",
    "_sample_latent",
)


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        yield name.removesuffix(".__init__"), path


def _imports(path):
    """The package modules ``path`` imports at module level."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("numpyro_dais"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (ROOT.parent / (full.replace(".", "/") + ".py")).exists()
                out.add(full if is_module else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("numpyro_dais")}
    return out


def test_no_guide_layer_module_is_over_400_lines():
    long = {
        name: n
        for name, path in _modules()
        if ".engine" not in name and (n := len(path.read_text().splitlines())) > 400
    }
    assert not long, f"split these by capability: {long}"


def test_no_import_cycle():
    graph = {name: _imports(path) for name, path in _modules()}
    done, stack = set(), []

    def visit(name):
        if name in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(name) :])}")
        if name in done or name not in graph:
            return
        stack.append(name)
        for dep in graph[name]:
            if dep != name and not name.startswith(dep + "."):  # a package's own __init__
                visit(dep)
        stack.pop()
        done.add(name)

    for name in graph:
        visit(name)


def test_the_engine_imports_no_numpyro():
    for name, path in _modules():
        if ".engine" in name:
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                assert not any(n.split(".")[0] == "numpyro" for n in names), name


def test_numpyros_private_names_only_in_the_numpyro_module():
    for name, path in _modules():
        if name == "numpyro_dais.bridge.numpyro_private":
            continue
        text = path.read_text()
        used = [p for p in NUMPYRO_PRIVATE if p in text]
        assert not used, (
            f"{name} touches NumPyro's private {used}: go through bridge/numpyro_private.py"
        )
