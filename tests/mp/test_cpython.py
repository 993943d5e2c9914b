"""CPython's own tests of multiprocessing's queues (``test._test_multiprocessing``:
``_TestQueue`` and ``TestSimpleQueue``), run against shmq.mp under fork and spawn.

The tests are CPython's, unchanged: the ``multiprocessing`` they name is shmq.mp while
they run (the module they import in ``test_no_import_lock_contention`` too), their
``self.Queue`` and the rest come from ``mp.get_context(method)``. Two fail by design,
marked xfail (strict), each a difference docs/MULTIPROCESSING.md states.
"""

import multiprocessing
import sys
import unittest

import pytest

from shmq import mp

cpython = pytest.importorskip("test._test_multiprocessing", reason="CPython's test package is not installed")

METHODS = ["fork", "spawn"]


@pytest.fixture(autouse=True)
def as_shmq(request, monkeypatch):
    """While a test runs, its module's ``multiprocessing`` is shmq.mp and the start
    method is its class's (as CPython's ``setUpModule`` sets it)."""
    monkeypatch.setattr(cpython, "multiprocessing", mp)
    method = getattr(request.cls, "start_method", None)
    old = multiprocessing.get_start_method(allow_none=True)
    if method:
        multiprocessing.set_start_method(method, force=True)
    yield
    multiprocessing.set_start_method(old, force=True)


class _QueueTests(cpython._TestQueue):
    __test__ = False

    @pytest.mark.xfail(strict=True, raises=AttributeError,
                       reason="put pickles in the caller: an object that does not pickle raises there "
                              "(the stdlib's feeder thread prints the error and drops it)")
    def test_queue_feeder_donot_stop_onexc(self):
        super().test_queue_feeder_donot_stop_onexc()

    def test_no_import_lock_contention(self):
        # its module's ``import multiprocessing`` must find shmq.mp too
        old = sys.modules["multiprocessing"]
        sys.modules["multiprocessing"] = mp
        try:
            super().test_no_import_lock_contention()
        finally:
            sys.modules["multiprocessing"] = old


class _SimpleQueueTests(cpython.TestSimpleQueue):
    __test__ = False

    @pytest.mark.xfail(strict=True, raises=AttributeError,
                       reason="CPython-only: it reads the private pipe ends of the stdlib's SimpleQueue")
    def test_closed(self):
        super().test_closed()


def _install(base, name, method):
    """``base``'s tests as the test class ``name`` of this module (spawn children find
    it here by name), with the queues, events and processes of shmq's ``method``
    context."""
    ctx = mp.get_context(method)
    cls = type(name, (base, cpython.BaseMixin, unittest.TestCase), {
        "__test__": True, "__module__": __name__, "__qualname__": name, "start_method": method,
        "TYPE": "processes", "Process": ctx.Process, "Queue": staticmethod(ctx.Queue),
        "JoinableQueue": staticmethod(ctx.JoinableQueue), "SimpleQueue": staticmethod(ctx.SimpleQueue),
        "Event": staticmethod(ctx.Event), "Lock": staticmethod(ctx.Lock),
    })
    globals()[name] = cls


for _method in METHODS:
    _install(_QueueTests, f"TestQueue{_method.capitalize()}", _method)
    _install(_SimpleQueueTests, f"TestSimpleQueue{_method.capitalize()}", _method)


def test_the_tests_use_shmq_s_queues():
    """The guard of this file: what the tests above build is shmq's."""
    for method in METHODS:
        cls = globals()[f"TestQueue{method.capitalize()}"]
        assert type(cls.Queue()) is mp.Queue and type(cls.JoinableQueue()) is mp.JoinableQueue
        assert cls.Process is multiprocessing.get_context(method).Process
    assert cpython.multiprocessing is mp  # (the fixture's)

