"""The reaper: removes the namespaces a process made from /dev/shm once that process is
gone, however it went (SIGKILL included).

Strategy: nothing runs in a process killed with SIGKILL, so its cleanup must run in
another: this one, started by the owner with a pipe as its stdin (``shmq.mp``). The
owner writes a namespace's name, one line, before it creates the namespace; the
kernel closes the pipe when the owner exits or dies (fork children close their copy
at once, and it is close-on-exec), and at EOF the reaper unlinks every entry of those
namespaces and exits. It runs as a script, ``python -I -S reaper.py``, importing
nothing of shmq (the package costs 0.15 s and 20 MB a process), so which names belong
to a namespace is written twice: here and in ``segment.namespace_entries``, and a test
fails when the two disagree.
"""

import os
import re
import signal
import sys

__all__ = ["entries", "destroy", "main"]

SHM_DIR = "/dev/shm"
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")  # segment.check_namespace's rule


def entries(namespace: str, names) -> list[str]:
    """Which of ``names`` (a listing of /dev/shm) belong to ``namespace``."""
    prefix = f"shmq.{namespace}."
    return sorted(n for n in names
                  if n.startswith(prefix) or n.startswith("sem." + prefix) or n == f"shmq.{namespace}")


def destroy(namespace: str) -> int:
    """Unlink every segment and semaphore of ``namespace`` (a semaphore is the file
    ``sem.NAME`` there); returns how many went."""
    removed = 0
    for name in entries(namespace, os.listdir(SHM_DIR)):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def main() -> None:
    # Ctrl-C and the terminal's signals are the owner's: the reaper outlives it to clean up
    # (it is also started in a session of its own)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    namespaces = []
    for line in sys.stdin.buffer:  # until EOF: the owner is gone
        name = line.strip().decode("ascii", "replace")
        if line.endswith(b"\n") and _NAMESPACE.match(name):
            namespaces.append(name)
    for name in namespaces:
        destroy(name)


if __name__ == "__main__":
    main()
