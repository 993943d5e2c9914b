"""The job runners' tests: ``url``, a kombu url of the test's namespace on each transport."""

import pytest

from tests.conftest import ThreadedServer


@pytest.fixture(params=["local", "tcp"])
def url(request, broker):
    """The kombu url of the test's namespace: a local attach, or a TCP server of it."""
    if request.param == "local":
        yield f"shmq:///{broker.namespace}"
        return
    srv = ThreadedServer(broker.namespace)
    try:
        yield f"shmq://127.0.0.1:{srv.port}"
    finally:
        srv.stop()
