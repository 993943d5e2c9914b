"""``from shmq import mp``: a drop-in for ``import multiprocessing as mp`` whose queues
are shmq's, in shared memory.

``mp.Queue``, ``mp.SimpleQueue``, ``mp.JoinableQueue`` and the same factories of every
context (``mp.get_context("spawn").Queue()``) make shmq.mp queues (``queue.py``);
every other name of ``multiprocessing.__all__`` (Process, Pool, Manager, Lock, Event,
Value, cpu_count, set_start_method, ...) is multiprocessing's own object, and so are
its other attributes and submodules (``mp.pool.ThreadPool``, ``mp.shared_memory``).
What multiprocessing builds on its own queues keeps them: a Pool's task and result
queues, a Manager's ``Queue()`` proxy.
"""

import functools
import importlib
import multiprocessing
import pkgutil

from .contexts import get_context
from .queue import JoinableQueue, Lease, Queue, SimpleQueue

_OURS = {"Queue", "SimpleQueue", "JoinableQueue", "get_context"}

# multiprocessing's names as its own module holds them (bound to its default context)
globals().update({name: getattr(multiprocessing, name) for name in multiprocessing.__all__ if name not in _OURS})

__all__ = [*multiprocessing.__all__, "Lease"]


@functools.cache
def _submodules():
    return frozenset(m.name for m in pkgutil.iter_modules(multiprocessing.__path__))


def __getattr__(name):
    """multiprocessing's other attributes: its submodules (``mp.pool``, loaded on first
    use as ``import multiprocessing.pool`` would) and constants (``mp.SUBDEBUG``)."""
    if not name.startswith("__"):
        try:
            return getattr(multiprocessing, name)
        except AttributeError:
            if name in _submodules():
                return importlib.import_module(f"multiprocessing.{name}")
    raise AttributeError(f"module 'shmq.mp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(dir(multiprocessing)) | _submodules())
