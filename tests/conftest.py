import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

import pytest


def _xla_flags():
    """XLA flags that make compilation cheap; the suite's runs are small, so its time goes to
    XLA compilation, not to running the code.

    * ``--xla_backend_optimization_level=0``: no LLVM optimisation passes (five of the
      slowest tests ran 34% faster on 2 CPU cores).
    * ``--xla_cpu_use_fusion_emitters=false``: XLA:CPU's older loop emitters instead of its
      MLIR fusion emitters, which cost about as much again as the rest of a compile: the
      compile of an AutoDAIS ``svi.update`` took 1.1 s instead of 2.6 s, and the CPU time of
      the suite fell by about 40%.
    * ``--xla_cpu_parallel_codegen_split_count=1``: one LLVM module per program, not one
      split into parts that threads compile in parallel; splitting costs CPU time that 2
      cores, both busy with a test each, cannot recover (compiles took 20% less CPU time).

    None of them changes a result beyond float32 round-off. A jaxlib that does not know a
    flag aborts on it, so the last two are added only where a child Python with them starts
    a backend.
    """
    base = "--xla_backend_optimization_level=0"
    extra = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.numpy.zeros(()).block_until_ready()"],
        env=dict(os.environ, XLA_FLAGS=f"{base} {extra}", JAX_PLATFORMS="cpu"),
        capture_output=True,
        timeout=120,
    )
    return f"{base} {extra}" if probe.returncode == 0 else base


# Read when JAX starts its backend, so it must be set before the first computation. Set once,
# in the process that starts the run: pytest-xdist's workers and the subprocesses of the
# suite (notebook kernels, the sharding child, scaling_devices' children) inherit it.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = _xla_flags()


def _compilation_cache():
    """One JAX compilation cache for the run's test processes.

    The suite's time is mostly XLA compilation, and many tests compile a program that an
    earlier test, in either pytest-xdist worker, compiled too: the same small model under
    the same guide options, numpyro's eager set-up operations. JAX keys an entry on the
    program's HLO, compile options and versions, so a hit is the program it would compile;
    programs with host callbacks are never cached. With it, pytest's time on 2 cores fell
    from 6:24-6:51 to 5:23-5:33 (clean clones; one cache per worker instead: 5:41; letting
    the smoke runs write it too gained nothing measurable).

    The cache is made by the process that starts the run, so nothing carries over between
    runs. JAX writes an entry in place, and a second worker reading it half-written would
    warn and compile it again, so each test process writes its entries whole
    (:func:`_write_cache_entries_whole`), and the tests' other child processes only read it
    (:func:`_child_processes_only_read_the_cache`). Set through the environment before JAX
    is imported, so that the children inherit it.
    """
    if "NUMPYRO_DAIS_TEST_CACHE" not in os.environ:  # the process that starts the run
        os.environ["NUMPYRO_DAIS_TEST_CACHE"] = tempfile.mkdtemp(prefix="numpyro_dais_jax_cache_")
        atexit.register(shutil.rmtree, os.environ["NUMPYRO_DAIS_TEST_CACHE"], ignore_errors=True)
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=os.environ["NUMPYRO_DAIS_TEST_CACHE"],
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",  # every program, however small
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    _write_cache_entries_whole()


def _write_cache_entries_whole():
    """Make JAX's file cache write each entry to a temporary file and rename it into place
    (atomic on one file system), so that a reader sees the whole entry or none. Without the
    hook this relies on (a private one: ``jax._src.lru_cache.LRUCache.put``) the cache is
    switched off in this process instead."""
    import jax

    try:
        from jax._src import lru_cache

        put, suffix = lru_cache.LRUCache.put, lru_cache._CACHE_SUFFIX
    except (ImportError, AttributeError):
        jax.config.update("jax_enable_compilation_cache", False)
        return

    def put_whole(self, key, value):
        path = self.path / f"{key}{suffix}"
        if self.eviction_enabled or not key or not isinstance(path, os.PathLike):
            return put(self, key, value)
        if path.exists():
            return
        part = path.with_name(f".{path.name}.{os.getpid()}.part")
        part.write_bytes(value)
        os.replace(part, path)

    lru_cache.LRUCache.put = put_whole


_compilation_cache()


@pytest.fixture(scope="session", autouse=True)
def _child_processes_only_read_the_cache():
    """The child processes of the tests (notebook kernels, a benchmark's children, ...) load
    programs from the run's cache but never write it: JAX in a child writes entries in
    place. A pytest child (the sharding child) writes, whole, as every test process does."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1e9")
        yield


#: tests that run for tens of seconds (most in a child process), slowest first (a node id
#: prefix each)
LONG_RUNNING = (
    "tests/test_benchmarks_smoke.py::test_benchmark_smoke[sldais_scaling]",
    "tests/test_benchmarks_smoke.py::test_benchmark_smoke[gpvi_reproduction]",
    "tests/test_notebooks.py::test_notebook_executes",
    "tests/test_sharding.py::test_on_four_host_devices",
    "tests/test_benchmarks_smoke.py",
    "tests/test_examples.py",
    "tests/test_reliability.py::test_sldais_checkpoint_resumes_exactly_in_a_fresh_process",
    "tests/test_docs.py::test_docs_build_strict",
)


def _rank(item):
    return next((i for i, p in enumerate(LONG_RUNNING) if item.nodeid.startswith(p)), None)


def pytest_collection_modifyitems(config, items):
    """Spread the long-running tests over the first 60% of the run, slowest first, so that
    with pytest-xdist both workers get some of them early and the run does not end on one of
    them while the other worker waits. The rest keep their order, and a long test goes in
    only between two test files, so that no module-scoped fixture is set up twice. The
    order changes no result: every test sets up its own state."""
    ranked = sorted((r, i) for i, item in enumerate(items) if (r := _rank(item)) is not None)
    if not ranked:
        return
    long = [items[i] for _, i in ranked]
    rest = [item for item in items if _rank(item) is None]
    step = 0.6 * len(items) / len(long)
    order = []
    for k, item in enumerate(long):
        while rest and (len(order) < round(k * step) or (order and order[-1].path == rest[0].path)):
            order.append(rest.pop(0))
        order.append(item)
    items[:] = order + rest


@pytest.fixture(autouse=True)
def _no_numpyro_mismatch_warnings():
    """numpyro's own test config turns model/guide mismatch warnings into errors; so do we."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(not found in|missing).*guide.*")
        yield


@pytest.fixture(autouse=True)
def _q0_self_check_only_where_tested(request, monkeypatch):
    """The q0 self-check compiles an importance-draw program the first time each set of
    params is used as the posterior: seconds per test, against a 5000-step fit's few percent.
    Its own tests (``test_setup.py``) run it; tests of other behaviour skip it."""
    if request.module.__name__.split(".")[-1] == "test_setup":
        yield
        return
    from numpyro_dais import _queries

    monkeypatch.setattr(_queries, "check_q0_once", lambda guide, params: None)
    yield
