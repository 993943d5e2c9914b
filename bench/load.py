"""A run under load: ``hogs(n)`` keeps ``n`` processes busy on the CPUs (a Python loop each,
at normal priority, placed by the OS) for as long as its ``with`` lasts, so that every
system of a run meets the same competition for the CPUs as a busy host gives it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

__all__ = ["hogs"]

_HOG = "while True: pass"


@contextlib.contextmanager
def hogs(n: int):
    """``n`` CPU-bound processes while the block runs (their pids as the value); all killed
    and reaped when it ends, however it ends."""
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", _HOG], stdin=subprocess.DEVNULL))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
