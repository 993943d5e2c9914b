"""A keyed store's commits heard as they land: inotify on its ``-wal`` file.

Strategy: every commit to a store in WAL mode writes its ``-wal`` file, whichever process
makes it, so an inotify watch for IN_MODIFY there is a doorbell that rings within
microseconds of any write, with no process of ours in the writer's path. It is only a
hint (a waiter looks at the store's stamp when it rings, and at least every so often
anyway: a watch misses a store deleted and made anew), and it is optional: where
inotify cannot be had (no such call, the per-user limit of instances reached) ``watch``
returns None and the waiter polls. Closing an inotify descriptor waits for the kernel's
grace period (``synchronize_srcu``: some milliseconds), so a watch is closed by a thread
of its own (one per process, made on first use), never by the waiter that is returning.
"""

import ctypes
import os
import queue
import select
import threading

__all__ = ["WalWatch", "watch"]

_IN_MODIFY = 0x2
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_libc = None


def _lib():
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc


class WalWatch:
    """An inotify descriptor watching one ``-wal`` file: readable after a write to it."""

    def __init__(self, fd: int):
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def fileno(self) -> int:
        return self.fd

    def wait(self, seconds: float) -> bool:
        """Sleep until the file is written or ``seconds`` pass; whether it was written."""
        if self._poll.poll(max(0, int(seconds * 1000 + 0.999))):
            self.drain()
            return True
        return False

    def drain(self) -> None:
        """Forget the writes heard so far."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Let go of the watch (closed by the closer thread: the caller does not wait)."""
        if self.fd >= 0:
            _closer().put(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def watch(path: str) -> WalWatch | None:
    """A watch on the writes to ``path`` (a store's ``-wal``), or None where inotify cannot
    be had (the caller polls)."""
    lib = _lib()
    if not lib:
        return None
    fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        return None  # EMFILE: this user's inotify instances are all taken (fs.inotify.max_user_instances)
    if lib.inotify_add_watch(fd, os.fsencode(path), _IN_MODIFY) < 0:  # (no such file, the watch limit...)
        os.close(fd)
        return None
    return WalWatch(fd)


_closing = (None, None)  # (pid, the queue of descriptors its closer thread closes)


def _closer() -> queue.SimpleQueue:
    global _closing
    pid, q = _closing
    if pid != os.getpid():  # (a child of fork() has no thread of its parent's)
        q = queue.SimpleQueue()
        threading.Thread(target=_close_each, args=(q,), name="shmq-walwatch-closer", daemon=True).start()
        _closing = (os.getpid(), q)
    return q


def _close_each(q):
    while True:
        fd = q.get()
        try:
            os.close(fd)
        except OSError:
            pass
