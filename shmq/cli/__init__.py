"""The ``shmq`` command line (click): one module per family of commands, all on the group
``main`` (``app``), each imported when one of its commands runs (``app.COMMANDS``). Errors
print one line on stderr, never a traceback."""

from .app import main

__all__ = ["main"]
