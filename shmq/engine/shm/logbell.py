"""The log bell: a local create of a ``wal`` queue or stream has the namespace's server
open its write-ahead log before the create returns, as a TCP create does.

Strategy: only a server with a data dir opens logs (it picks their generation after any
on disk, and snapshots a new stream or laned queue first). Such a server makes a
semaphore (``names.log_bell``) and one thread of it waits there (``Bell``); a create in
any other process posts it and waits, bounded, for the log's generation word to be set
(``await_log``). No server (its lock file not held) or a server with no data dir (no
bell): nothing will open the log, nothing is waited for, and a put says why it cannot log.
"""

import errno
import fcntl
import os
import threading
import time

import posix_ipc

from .names import broker_lock_entry, log_bell
from .segment import SHM_DIR, create_semaphore, open_semaphore, unlink_semaphore

__all__ = ["Bell", "await_log", "server_running", "BOUND_S"]

BOUND_S = 5.0  # the longest a create waits for the server to open its log
_SERVED = set()  # the namespaces whose bell this process serves: its own creates open their logs themselves


def server_running(namespace: str) -> bool:
    """Whether a process holds the namespace's broker lock (``server/lock.py``) now."""
    try:
        fd = os.open(os.path.join(SHM_DIR, broker_lock_entry(namespace)), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def await_log(namespace: str, opened, bound_s: float = BOUND_S) -> bool:
    """Ring the namespace's bell and wait, at most ``bound_s``, until ``opened()`` (the
    new object's logs have a generation). False at once if no server with a data dir
    would open them (or this process is that server)."""
    if opened() or namespace in _SERVED or not server_running(namespace):
        return opened()
    try:
        bell = open_semaphore(log_bell(namespace))
    except (posix_ipc.ExistentialError, PermissionError):
        return False  # a server with no data dir
    try:
        bell.release()
    finally:
        bell.close()
    deadline, pause = time.monotonic() + bound_s, 0.0005
    while not opened():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)  # (the log's generation word has no wake-up of its own: a short, growing poll)
        pause = min(pause * 2, 0.02)
    return True


class Bell:
    """The server's end: the semaphore, and a thread that calls ``on_ring`` each time a
    create posts it (a stale one a killed server left is taken over). ``close`` ends the
    thread and removes the semaphore."""

    def __init__(self, namespace: str, on_ring, group: int | None = None):
        self.namespace, self.on_ring = namespace, on_ring
        name = log_bell(namespace)
        unlink_semaphore(name)  # a killed server's, with its count
        self._sem = create_semaphore(name, group)
        self._stopped = False
        _SERVED.add(namespace)
        self._thread = threading.Thread(target=self._run, name="shmq-log-bell", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stopped:
            try:
                self._sem.acquire(1.0)
            except posix_ipc.BusyError:
                continue
            except posix_ipc.ExistentialError:
                return
            if self._stopped:
                return
            try:
                self.on_ring()
            except Exception:  # (logged by on_ring's owner; the bell goes on ringing)
                pass

    def close(self):
        self._stopped = True
        try:
            self._sem.release()  # ends the wait at once
        except posix_ipc.ExistentialError:
            pass
        self._thread.join(5)
        self._sem.close()
        unlink_semaphore(log_bell(self.namespace))
        _SERVED.discard(self.namespace)
