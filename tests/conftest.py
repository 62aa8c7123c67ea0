import warnings

import pytest


@pytest.fixture(autouse=True)
def _no_numpyro_mismatch_warnings():
    """numpyro's own test config turns model/guide mismatch warnings into errors; so do we."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*(not found in|missing).*guide.*")
        yield
