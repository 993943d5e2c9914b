"""multiprocessing's start-method contexts with shmq's queues:
``mp.get_context("spawn").Queue()`` is a shmq.mp.Queue.

Strategy: one subclass per stdlib context class, overriding the three queue factories
and ``get_context`` and nothing else, so a context's Process, Pool, Lock, Event,
Manager, Value, ... are the stdlib's, of the same start method. The stdlib's own code
that asks a context for a queue reaches into it (a Pool's task and result queues, and
``concurrent.futures.ProcessPoolExecutor``'s results, are read through the queue's
pipe), so a factory called from ``multiprocessing.*`` or ``concurrent.futures.*``
returns the stdlib's queue; every other caller gets shmq's. Which start method is the
default stays one fact, multiprocessing's: ``get_context()`` follows
``multiprocessing.set_start_method``.
"""

import multiprocessing
import sys
from multiprocessing import context as _std

from .queue import JoinableQueue, Queue, SimpleQueue

__all__ = ["get_context", "ForkContext", "SpawnContext", "ForkServerContext"]

_STDLIB_CALLERS = ("multiprocessing.", "concurrent.futures.")  # they use the stdlib queue's internals


def _from_stdlib(depth=2) -> bool:
    """Whether the caller of the factory that calls this is the stdlib's multiprocessing
    or concurrent.futures."""
    return sys._getframe(depth).f_globals.get("__name__", "").startswith(_STDLIB_CALLERS)


class _ShmqQueues:
    """What a shmq context changes in the stdlib context it extends."""

    def Queue(self, maxsize=0, *, max_bytes=None):
        """A shmq.mp.Queue (it passes to a child of any start method)."""
        if _from_stdlib():
            return super().Queue(maxsize)
        return Queue(maxsize, max_bytes=max_bytes)

    def JoinableQueue(self, maxsize=0, *, max_bytes=None):
        """A shmq.mp.JoinableQueue."""
        if _from_stdlib():
            return super().JoinableQueue(maxsize)
        return JoinableQueue(maxsize, max_bytes=max_bytes)

    def SimpleQueue(self, *, max_bytes=None):
        """A shmq.mp.SimpleQueue."""
        if _from_stdlib():
            return super().SimpleQueue()
        return SimpleQueue(max_bytes=max_bytes)

    def get_context(self, method=None):
        return self if method is None else get_context(method)


class ForkContext(_ShmqQueues, _std.ForkContext):
    """multiprocessing's fork context, with shmq's queues."""


class SpawnContext(_ShmqQueues, _std.SpawnContext):
    """multiprocessing's spawn context, with shmq's queues."""


class ForkServerContext(_ShmqQueues, _std.ForkServerContext):
    """multiprocessing's forkserver context, with shmq's queues."""


_CONTEXTS = {c._name: c() for c in (ForkContext, SpawnContext, ForkServerContext)}


def get_context(method=None):
    """The context of start method ``method`` (None: multiprocessing's default, as
    ``multiprocessing.get_context()`` fixes it) with shmq's queues; ValueError for a
    method this platform does not have."""
    return _CONTEXTS[multiprocessing.get_context(method).get_start_method()]
