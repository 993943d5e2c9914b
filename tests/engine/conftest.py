"""The engine tests' shared fixture: ``impl`` runs a test on the C hot paths and on the
pure-Python ones (the reference they are compared against)."""

import pytest

from shmq.engine.shm import cpaths
from shmq.engine.queues import paths as queue_paths
from shmq.engine.streams import paths as stream_paths


@pytest.fixture(params=["fast", "pure"])
def impl(request):
    """The paths every handle the test attaches runs (handles take ``cpaths``' default
    as they attach: the test's own handles, all attached after this fixture's set-up)."""
    if request.param == "fast" and not cpaths.FAST:
        pytest.skip("the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
    cpaths.set_enabled(request.param == "fast")
    kind = "c" if request.param == "fast" else "python"
    assert (queue_paths.chosen().kind, stream_paths.chosen().kind) == (kind, kind)
    yield request.param
    cpaths.set_enabled(True)
