import os
import subprocess
import sys
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
      the suite fell by about half. It changes no result beyond float32 round-off. A jaxlib
      that does not know the flag aborts on it, so it is added only where a child Python
      with it starts a backend.
    """
    base = "--xla_backend_optimization_level=0"
    extra = "--xla_cpu_use_fusion_emitters=false"
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.numpy.zeros(()).block_until_ready()"],
        env=dict(os.environ, XLA_FLAGS=f"{base} {extra}", JAX_PLATFORMS="cpu"),
        capture_output=True,
        timeout=120,
    )
    return f"{base} {extra}" if probe.returncode == 0 else base


# Read when JAX starts its backend, so it must be set before the first computation. Set once,
# in the process that starts the run: pytest-xdist's workers and the subprocesses of the
# suite (notebook kernels, benchmark smoke runs, the sharding child) inherit it.
if "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = _xla_flags()


@pytest.fixture(autouse=True)
def _no_numpyro_mismatch_warnings():
    """numpyro's own test config turns model/guide mismatch warnings into errors; so do we."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(not found in|missing).*guide.*")
        yield
