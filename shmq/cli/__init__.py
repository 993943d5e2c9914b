"""The ``shmq`` command line (click): one module per family of commands, all on the group
``main`` (``app``). Errors print one line on stderr, never a traceback."""

from . import deadletters, exchanges, files, namespaces, ops, queues, status, stores, streams  # noqa: F401  (each registers its commands)
from .app import main

__all__ = ["main"]
