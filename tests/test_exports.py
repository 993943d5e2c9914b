"""The public surface: exactly these names, one exception hierarchy."""

import queue

import shmq
from shmq import errors


def test_all_exports_exist():
    for name in shmq.__all__:
        assert hasattr(shmq, name), name
    assert {"connect", "Broker", "Queue", "Delivery", "QueueStats"} <= set(shmq.__all__)


def test_one_exception_hierarchy():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, shmq.ShmqError)
        assert getattr(shmq, name) is cls
    assert issubclass(shmq.QueueFull, queue.Full)
    assert issubclass(shmq.QueueEmpty, queue.Empty)
