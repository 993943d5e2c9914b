"""A process-shared robust pthread mutex placed inside a shared-memory segment.

Strategy: a lock must survive its holder being SIGKILLed. A robust mutex does: the
kernel walks a dead thread's robust list and marks the mutex owner-dead, so the next
``lock`` returns EOWNERDEAD instead of hanging. That caller then repairs the data it
protects and calls ``pthread_mutex_consistent``. We reach libc through ctypes: the
uncontended path is a userspace compare-and-swap, ~0.45 us per lock+unlock pair from
Python, against ~2.1 us for an fcntl OFD lock (two syscalls). See docs/DESIGN.md.

``trylock``/``unlock`` go through ``PyDLL`` (the GIL stays held: they never block);
only a contended ``lock`` goes through ``CDLL``, which releases the GIL while it waits.
"""

import ctypes
import errno

__all__ = ["MUTEX_SIZE", "RobustMutex", "init_mutex"]

MUTEX_SIZE = 64  # bytes reserved in the segment (sizeof(pthread_mutex_t) is 40 on x86-64 glibc)

_EOWNERDEAD = getattr(errno, "EOWNERDEAD", 130)
_ENOTRECOVERABLE = getattr(errno, "ENOTRECOVERABLE", 131)
_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc_nogil = ctypes.PyDLL(None)

_proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_pyproto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_lock = _proto(("pthread_mutex_lock", _libc))
_trylock = _pyproto(("pthread_mutex_trylock", _libc_nogil))
_unlock = _pyproto(("pthread_mutex_unlock", _libc_nogil))
_consistent = _pyproto(("pthread_mutex_consistent", _libc_nogil))


def init_mutex(address: int) -> None:
    """Initialise a robust, process-shared mutex at ``address`` (done once, by the creator)."""
    attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t is 4 bytes; be generous
    for rc in (
        _libc.pthread_mutexattr_init(attr),
        _libc.pthread_mutexattr_setpshared(attr, _PTHREAD_PROCESS_SHARED),
        _libc.pthread_mutexattr_setrobust(attr, _PTHREAD_MUTEX_ROBUST),
        _libc.pthread_mutex_init(ctypes.c_void_p(address), attr),
    ):
        if rc != 0:
            raise OSError(rc, "cannot initialise a robust pthread mutex: " + errno.errorcode.get(rc, str(rc)))
    _libc.pthread_mutexattr_destroy(attr)


class RobustMutex:
    """Handle on a robust mutex at a fixed address of a mapped segment.

    ``acquire`` returns True when the previous owner died while holding the lock: the
    caller now holds it, must repair the protected state, then call ``mark_consistent``
    before ``release``. The owner must not be a different handle in the same thread.
    """

    __slots__ = ("address", "_ptr")

    def __init__(self, address: int):
        self.address = address
        self._ptr = ctypes.c_void_p(address)

    def acquire(self) -> bool:
        rc = _trylock(self._ptr)
        if rc == 0:
            return False
        if rc == errno.EBUSY:
            rc = _lock(self._ptr)
            if rc == 0:
                return False
        if rc == _EOWNERDEAD:
            return True
        if rc == _ENOTRECOVERABLE:
            raise OSError(rc, "shmq lock is not recoverable (a repair was abandoned)")
        raise OSError(rc, "pthread_mutex_lock failed: " + errno.errorcode.get(rc, str(rc)))

    def mark_consistent(self) -> None:
        rc = _consistent(self._ptr)
        if rc != 0:
            raise OSError(rc, "pthread_mutex_consistent failed")

    def release(self) -> None:
        _unlock(self._ptr)
