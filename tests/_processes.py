"""How the suite starts the worker processes of its multi-process and fault tests:
``WORKERS``, a ``forkserver`` context whose server has imported shmq, pytest and the
workers' modules once. A worker is a fork of that server (a few milliseconds), not a new
interpreter importing them again (about 0.3 CPU-seconds each, and a SIGKILL test starts
dozens). It starts as spawn's workers do: no threads, none of the test's state, its target
named by module.

What it does not take from the test is the environment: a worker has the server's, which
conftest starts once per session (``start``), before any test. A test whose workers need
an environment of their own, or that is about how a process starts, uses spawn.
"""

import multiprocessing
import multiprocessing.forkserver

from bench import harness

# what the server imports once (the benches' roles too: a bench run in a test forks from it)
PRELOAD = harness.PRELOAD + ("pytest", "tests._workers", "tests._wait")


def context():
    """The context the suite's workers start in (its server imports ``PRELOAD``)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


WORKERS = context()


def start():
    """Start the server now, with the environment the session has (conftest: once, before
    any test), unless one runs."""
    context()
    multiprocessing.forkserver.ensure_running()


def server_pid():
    """The running server's pid (a process of the session, not a stray), or None."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
