"""TCP handles across fork(): the open brokers of this process, told in a child.

Strategy: redis-py checks ``os.getpid()`` before each command (``_checkpid``); here
``os.register_at_fork`` tells each open broker once, in the child, before anything else
runs there (only the forking thread does), so the request path checks nothing (on
glibc >= 2.25 ``getpid`` is a system call, about 180 ns). Each transport's ``_forked``
says what the child does instead of using its parent's connection.
"""

import os
import weakref

__all__ = ["track", "untrack"]

_open = weakref.WeakSet()  # brokers with a connection of this process, until closed


def track(broker) -> None:
    """``broker`` holds a connection: in a child of fork() its ``_forked(parent_pid)`` runs."""
    _open.add(broker)


def untrack(broker) -> None:
    """``broker`` was closed: a child has nothing to do for it."""
    _open.discard(broker)


def _after_fork_in_child():
    parent = os.getppid()
    for broker in list(_open):
        broker._forked(parent)


os.register_at_fork(after_in_child=_after_fork_in_child)
