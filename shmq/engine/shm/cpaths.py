"""The seam for C: whether ``_fast.c`` is built and wanted (``SHMQ_PURE_PYTHON=1`` turns
it off), and the one default the handles take their paths from when they attach.

Strategy: redis-py's ``parser_class``, picked once and handed to each connection. A
handle binds a paths object when it attaches (``queues/paths.py``'s ``QueuePaths``,
``streams/paths.py``'s ``PartitionPaths``): the C one, or the Python one, whose entries
are None ("take the Python path"). ``set_enabled`` (for the tests and the benchmark)
changes only this module's default, so only handles attached afterwards; nothing here
rewrites another module, and this module imports nothing of the engine but ``layout``
(the C calls' return codes, ``layout.RETURNS``).
"""

import os
import warnings

from . import layout as L

try:
    from .. import _fast
except ImportError as e:  # pragma: no cover - depends on the build
    _fast = None
    if os.environ.get("SHMQ_PURE_PYTHON", "") in ("", "0"):  # never silently three times slower
        warnings.warn(f"shmq's C hot paths are not built for {os.path.dirname(os.path.abspath(__file__))} ({e}): "
                      "running on the pure-Python paths, about three times slower. Build them with "
                      "`pip install -e .` in this checkout (gcc and the Python headers), or set "
                      "SHMQ_PURE_PYTHON=1 to choose the Python paths and silence this.", RuntimeWarning, stacklevel=2)

__all__ = ["FAST", "C", "OWNERDEAD", "FALLBACK", "BUSY", "EMPTY", "SLEEP", "FULL", "W_REGISTER", "W_FILL", "EXPIRED",
           "DELETED", "WAL_MAX_PAYLOAD", "serve_own", "Sem", "set_enabled", "enabled"]

FAST = _fast is not None and os.environ.get("SHMQ_PURE_PYTHON", "") in ("", "0")
C = _fast if FAST else None  # the extension whose calls the C paths objects hold (None: no C paths here)
# what the C calls return (they mean something only where C runs)
OWNERDEAD = L.R_OWNERDEAD if FAST else None  # the lock was taken from a dead holder: repair, then unlock
FALLBACK = L.R_FALLBACK if FAST else None  # not a plain case: nothing done, take the Python path
BUSY = L.R_BUSY if FAST else None  # the lock stayed busy past LOCK_WAIT_NS (a stopped holder?): Python waits on
EMPTY = L.R_EMPTY if FAST else None  # a take found nothing ready and nothing due: spin, or sleep
SLEEP = L.R_SLEEP if FAST else None  # ... and counted the caller as a sleeper (W_REGISTER): sleep, then take again
FULL = L.R_FULL if FAST else None  # a put found no room now (SLEEP: and counted the caller as waiting for some)
W_REGISTER = _fast.W_REGISTER if FAST else 0  # a take's wait bit: count the caller as a sleeper when it finds nothing
W_FILL = _fast.W_FILL if FAST else 0  # a put's wait bit: copy the body with the lock let go (layout.FILL_OFF)
EXPIRED = L.R_EXPIRED if FAST else None
DELETED = L.R_DELETED if FAST else None
WAL_MAX_PAYLOAD = _fast.WAL_MAX_PAYLOAD if FAST else 0  # larger wal puts take the Python fast path
serve_own = _fast.serve_own if _fast is not None else None  # the C paths' side of ``waits.serving``
# a doorbell semaphore whose wait lets a signal handler's exception through (posix_ipc's loses it)
Sem = _fast.Sem if FAST else None

_use_c = FAST  # the default: what a handle attached now runs


def set_enabled(enabled: bool) -> None:
    """Whether handles attached from now on in this process run the C paths (the
    benchmark and the tests run both); handles already attached keep theirs. Without a
    C build (or with SHMQ_PURE_PYTHON=1) they run Python's either way."""
    global _use_c
    _use_c = bool(enabled) and FAST


def enabled() -> bool:
    """Whether a handle attached now runs the C paths."""
    return _use_c
