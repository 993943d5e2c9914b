"""Who holds a lease: a process identity that survives pid reuse.

Strategy: a pid alone is ambiguous once the kernel recycles it, so an identity is
(pid, start time). The start time comes from psutil (boot time + the process's start
ticks), the same number every time it is read for the same process, so equality is
exact. A zombie counts as dead: it can hold no lease it will ever settle.
"""

import os

import psutil

__all__ = ["current_identity", "is_alive"]

_identity = None


def _start_ms(proc: psutil.Process) -> int:
    return round(proc.create_time() * 1000)


def current_identity() -> tuple[int, int]:
    """(pid, start_ms) of this process, cached until the next fork."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, _start_ms(psutil.Process(pid)))
    return _identity


def _forget_identity():
    global _identity
    _identity = None


os.register_at_fork(after_in_child=_forget_identity)


def is_alive(pid: int, start_ms: int) -> bool:
    """True while the process (pid, start_ms) runs; False once it exited or is a zombie."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if _start_ms(proc) != start_ms:
            return False  # the pid now belongs to someone else
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # cannot see it: assume alive rather than steal its leases
