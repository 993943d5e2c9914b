"""Who holds a lease: a process identity that survives pid reuse.

Strategy: a pid alone is ambiguous once the kernel recycles it, so an identity is
(pid, start time). The start time comes from psutil (boot time + the process's start
ticks), the same number every time it is read for the same process, so equality is
exact. A zombie counts as dead: it can hold no lease it will ever settle.
"""

import os

import psutil

__all__ = ["current_identity", "is_alive", "monotonic_offset"]

_identity = None
_offset = None


def _start_ms(proc: psutil.Process) -> int:
    return round(proc.create_time() * 1000)


def current_identity() -> tuple[int, int]:
    """(pid, start_ms) of this process, cached until the next fork."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, _start_ms(psutil.Process(pid)))
    return _identity


def monotonic_offset() -> int:
    """This process's CLOCK_MONOTONIC offset in ns, as its time namespace sets it (0 in
    the initial one, or where the kernel has no time namespaces).

    Lease deadlines are CLOCK_MONOTONIC values shared by every process of a queue, so
    all of them must read the same clock. Cached until the next fork (a child of a
    process that unshared its time namespace lives in the new one)."""
    global _offset
    if _offset is None:
        _offset = 0
        try:
            with open("/proc/self/timens_offsets") as f:
                for line in f:
                    clock, sec, nsec = line.split()
                    if clock in ("monotonic", "1"):
                        _offset = int(sec) * 10**9 + int(nsec)
        except (OSError, ValueError):
            pass
    return _offset


def _forget_identity():
    global _identity, _offset
    _identity = _offset = None


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
