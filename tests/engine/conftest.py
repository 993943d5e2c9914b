"""The engine tests' shared fixture: ``impl`` runs a test on the C hot paths and on the
pure-Python ones (the reference they are compared against)."""

import pytest

from shmq.engine import cpaths


@pytest.fixture(params=["fast", "pure"])
def impl(request):
    if request.param == "fast" and not cpaths.FAST:
        pytest.skip("the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
    cpaths.set_enabled(request.param == "fast")
    yield request.param
    cpaths.set_enabled(True)
