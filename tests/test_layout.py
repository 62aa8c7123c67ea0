"""The house rules of the layout (CONTRIBUTING.md), checked statically."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "numpyro_dais"
ENGINE = "numpyro_dais.engine"
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
#: the one module that touches them
NUMPYRO_BOUNDARY = "numpyro_dais.bridge.numpyro_private"
#: the most modules one folder of the package holds (its ``__init__.py`` not counted)
MAX_MODULES_PER_FOLDER = 12


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        yield name.removesuffix(".__init__"), path


def _is_module(name):
    path = ROOT.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _ancestors(name):
    """The packages whose ``__init__`` runs before ``name``: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _import_statements(path):
    """``(module, names)`` of each module-level ``from numpyro_dais... import`` and
    ``import numpyro_dais...`` of ``path`` (``names`` empty for a plain import)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("numpyro_dais"):
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("numpyro_dais"):
                    yield alias.name, []


def _imports(name, path):
    """The package modules that importing ``name`` runs at module level: each one it names,
    and the ``__init__`` of each package above those (Python runs it first), except its own
    packages (a package's ``__init__`` may import its modules)."""
    out = set()
    for module, names in _import_statements(path):
        targets = [f"{module}.{n}" if _is_module(f"{module}.{n}") else module for n in names]
        for target in targets or [module]:
            out |= {target, *_ancestors(target)}
    return out - {name, *_ancestors(name)}


def test_no_folder_holds_more_than_12_modules():
    folders = {}
    for path in ROOT.rglob("*.py"):
        if path.name != "__init__.py":
            folders.setdefault(path.parent.relative_to(ROOT.parent).as_posix(), []).append(path)
    crowded = {f: len(m) for f, m in folders.items() if len(m) > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"split these folders by family: {crowded}"
    assert len(folders) >= 10  # the package, its families and the engine's


def test_no_guide_layer_module_is_over_400_lines():
    long = {
        name: n
        for name, path in _modules()
        if not name.startswith(ENGINE) and (n := len(path.read_text().splitlines())) > 400
    }
    assert not long, f"split these by capability: {long}"


def test_no_import_cycle():
    """No cycle among the modules and the ``__init__`` of their packages: importing any
    module of the package first, whichever, finds every name it imports defined."""
    graph = {name: _imports(name, path) for name, path in _modules()}
    done, stack = set(), []

    def visit(name):
        if name in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(name) :])}")
        if name in done or name not in graph:
            return
        stack.append(name)
        for dep in graph[name]:
            visit(dep)
        stack.pop()
        done.add(name)

    for name in graph:
        visit(name)


def test_a_module_imports_its_own_package_by_module():
    """Within its own packages a module imports modules (``from numpyro_dais.annealed import
    sampling``), never a name their ``__init__`` exports: that ``__init__`` is still running
    when the module is imported through it."""
    for name, path in _modules():
        for module, names in _import_statements(path):
            if module in _ancestors(name):
                names_not_modules = [n for n in names if not _is_module(f"{module}.{n}")]
                assert not names_not_modules, (name, module, names_not_modules)


def test_the_engine_imports_no_numpyro():
    engine = [(name, path) for name, path in _modules() if name.startswith(ENGINE)]
    assert len(engine) >= 20, [name for name, _ in engine]
    for name, path in engine:
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
    names = [name for name, _ in _modules()]
    assert NUMPYRO_BOUNDARY in names
    for name, path in _modules():
        if name == NUMPYRO_BOUNDARY:
            continue
        text = path.read_text()
        used = [p for p in NUMPYRO_PRIVATE if p in text]
        assert not used, f"{name} touches NumPyro's private {used}: go through {NUMPYRO_BOUNDARY}"


#: The module-level functions that take a guide, each by design: the user utilities whose
#: public argument is the user's guide (and the helper that calls its public methods per
#: chain), and the bridge's accessors of NumPyro's private attributes of a guide. The rooms
#: take a bound call instead (numpyro_dais/annealed/sampling.py, ``Call``). Only shrinks.
TAKE_A_GUIDE = {
    "numpyro_dais.arviz": {"to_inference_data", "_one_chain"},
    "numpyro_dais.diagnostics": {"transition_params"},
}


def _outside_classes(tree):
    """The nodes of ``tree`` outside class bodies, each with the function it lies in."""

    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                continue
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and function is None:
                inner = child.name
            yield child, inner
            yield from walk(child, inner)

    yield from walk(tree, None)


def test_no_function_outside_a_class_takes_or_reads_a_guide():
    """A room is a function of a bound call, never of the guide: no module-level function
    has a parameter ``guide`` and no code outside a class reads ``guide.<name>``, but for
    the functions of :data:`TAKE_A_GUIDE`."""
    taking, reading = {}, {}
    for name, path in _modules():
        for node, function in _outside_classes(ast.parse(path.read_text())):
            allowed = function in TAKE_A_GUIDE.get(name, ())
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and function == node.name:
                a = node.args
                params = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}
                if "guide" in params and not allowed:
                    taking.setdefault(name, []).append(node.name)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "guide"
                and not allowed
            ):
                reading.setdefault(name, []).append(f"{function}: guide.{node.attr}")
    assert not taking, f"these take the guide; bind a call instead: {taking}"
    assert not reading, f"these read the guide outside it: {reading}"
    present = {
        name: {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        for name, path in _modules()
        if name in TAKE_A_GUIDE
    }
    stale = {m: fns - present.get(m, set()) for m, fns in TAKE_A_GUIDE.items()}
    assert not any(stale.values()), f"drop these from TAKE_A_GUIDE: {stale}"
