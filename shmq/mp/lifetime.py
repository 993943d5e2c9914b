"""How long the namespaces of shmq.mp's queues live: as long as the process that
created them.

Strategy: a namespace is destroyed when its creator exits, by a multiprocessing
finalizer on a normal exit (priority -100: after the stdlib has joined the children at
exit), and by a reaper process (``engine/shm/reaper.py``) whose stdin pipe closes when the
creator dies, even by SIGKILL. The creator names a namespace to the reaper before the
namespace exists, so no moment leaves one unreaped.
"""

import os
import subprocess
import sys
import threading
from multiprocessing import util as _mp_util

from ..engine.shm import reaper
from ..engine.shm.segment import destroy_namespace

__all__ = ["Owner", "owner"]


class Owner:
    """This process's namespaces and the reaper that removes them when it is gone."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = None  # the reaper (subprocess.Popen), started with the first queue
        self._fd = -1  # the write end of its stdin (a plain fd: nothing to flush or lock at fork)
        self._mine = []  # namespaces this process created
        self._pid = None  # the process that registered the exit finalizer

    def adopt(self, ns):
        """Tell the reaper about ``ns`` (starting it if need be), before ``ns`` exists."""
        with self._lock:
            if self._pid != os.getpid():
                # after the children are joined (the stdlib joins them at exit first)
                _mp_util.Finalize(None, self.cleanup, exitpriority=-100)
                self._pid = os.getpid()
            self._mine.append(ns)
            if self._proc is not None:
                try:
                    return self._send([ns])
                except BrokenPipeError:  # the reaper was killed: a new one gets every name
                    self._stop()
            r, self._fd = os.pipe()  # close-on-exec, both ends
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", reaper.__file__], stdin=r, stdout=subprocess.DEVNULL,
                    close_fds=True, start_new_session=True)
            except BaseException:
                os.close(self._fd)
                self._fd = -1
                raise
            finally:
                os.close(r)
            self._send(self._mine)

    def _send(self, names):
        data = "".join(f"{n}\n" for n in names).encode()
        while data:
            data = data[os.write(self._fd, data):]

    def _stop(self):
        """Close the reaper's stdin and wait for it (it unlinks what is left, then exits)."""
        proc, self._proc = self._proc, None
        os.close(self._fd)
        self._fd = -1
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def cleanup(self):
        """Destroy this process's queues and stop its reaper (at exit; also for tests)."""
        with self._lock:
            for ns in self._mine:
                destroy_namespace(ns)
            self._mine.clear()
            if self._proc is not None:
                self._stop()

    def reaper_pid(self):
        return None if self._proc is None else self._proc.pid

    def after_fork_in_child(self):
        # The child owns none of these, and its copy of the pipe must not keep the reaper
        # waiting after the creator is gone.
        self._lock = threading.Lock()
        self._mine = []
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._proc is not None:
            self._proc.returncode = 0  # not this process's child: Popen must never wait for it here
            self._proc = None


owner = Owner()
os.register_at_fork(after_in_child=owner.after_fork_in_child)
