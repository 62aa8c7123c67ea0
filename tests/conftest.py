import os
import warnings

import pytest

# The suite's runs are small, so its time goes to XLA compilation, not to running the code:
# without LLVM's optimisation passes a compile is much cheaper (five of the slowest tests ran
# 34% faster on 2 CPU cores). Read when JAX starts its backend, so it must be set before
# the first computation; subprocesses (notebook kernels, benchmark smoke runs) inherit it.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")


@pytest.fixture(autouse=True)
def _no_numpyro_mismatch_warnings():
    """numpyro's own test config turns model/guide mismatch warnings into errors; so do we."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(not found in|missing).*guide.*")
        yield
