"""Named shared-memory segments and semaphores, with shmq's naming and permissions.

Strategy: queues must outlive every process that touches them, so no process may
unlink a segment just because it exits. Python 3.11's ``SharedMemory`` registers every
segment it opens — created *or merely attached* — with the resource tracker, which
unlinks it when the process family exits (CPython issue 82300). On 3.13+ we pass
``track=False``; before that we open segments while a thread-local gate makes the
tracker hooks no-ops for that one call, so no registration ever happens (there is no
window in which a SIGKILL could leave one behind). Everything is created 0600, or 0660
with the group of a namespace shared with one (``group=``; shmq/sharing.py).

A new segment's memory is reserved at once (``posix_fallocate``), all of it or its first
bytes: /dev/shm is a tmpfs of limited size (Docker's default is 64 MiB), and a page of a
sparse segment that it cannot take kills with SIGBUS whichever process first touches it.
Queues and stream partitions reserve their header only and take the rest chunk by chunk,
each before it is written (``memory.py``); everything else is reserved whole, so a full
/dev/shm is a clear error at create time.
"""

import errno
import os
import re
import sys
import threading
from multiprocessing import shared_memory as _stdlib_shm

import posix_ipc

from ...errors import ShmqError, StorageError
from ...sharing import share_fd, share_path
from . import cpaths
from .names import lane_prefix, namespace_prefix, registry_segment

__all__ = [
    "Segment",
    "create_segment",
    "open_segment",
    "unlink_segment",
    "create_semaphore",
    "open_semaphore",
    "unlink_semaphore",
    "check_namespace",
    "check_queue_name",
    "namespace_entries",
    "destroy_namespace",
    "share_namespace",
    "allocate",
    "free_bytes",
    "SEGMENT_FDS",
]

MODE = 0o600
SEGMENT_FDS = 2  # descriptors an open Segment holds: its own and the one its mmap dups (a semaphore holds none)
SHM_DIR = "/dev/shm"
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_QUEUE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")


def check_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
        raise ValueError(f"invalid namespace {namespace!r}: use 1-40 of A-Z a-z 0-9 _ -")
    return namespace


def check_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_RE.match(name):
        raise ValueError(
            f"invalid queue name {name!r}: use 1-128 of A-Z a-z 0-9 _ . : - (not starting with . : -)"
        )
    return name


class _TrackerGate:
    """Stands in for ``resource_tracker`` inside ``multiprocessing.shared_memory``.

    It forwards every call to the real tracker, except from a thread that is opening
    or unlinking a shmq segment, for which register/unregister do nothing.
    """

    def __init__(self, real):
        self._real = real
        self._local = threading.local()

    def register(self, name, rtype):
        if not getattr(self._local, "bypass", False):
            self._real.register(name, rtype)

    def unregister(self, name, rtype):
        if not getattr(self._local, "bypass", False):
            self._real.unregister(name, rtype)

    def __getattr__(self, attr):
        return getattr(self._real, attr)


_TRACK_KW = sys.version_info >= (3, 13)
if not _TRACK_KW:
    if not isinstance(_stdlib_shm.resource_tracker, _TrackerGate):
        _stdlib_shm.resource_tracker = _TrackerGate(_stdlib_shm.resource_tracker)
    _GATE = _stdlib_shm.resource_tracker


class _Untracked:
    def __enter__(self):
        if not _TRACK_KW:
            _GATE._local.bypass = True

    def __exit__(self, *exc):
        if not _TRACK_KW:
            _GATE._local.bypass = False


class Segment(_stdlib_shm.SharedMemory):
    """A ``SharedMemory`` that the resource tracker never sees, created 0600.

    An attach that fails removes nothing: the standard library's unlinks the segment it
    opened when it cannot map it (``except OSError: self.unlink()``), and the mapping dups
    the descriptor, so a process with one descriptor left (EMFILE) or no room for another
    mapping (ENOMEM) would delete a live queue as it looked at it. Here the attach raises
    that error, and the descriptor it took is closed."""

    _mode = MODE
    _attaching = False  # while an attach runs: the stdlib's clean-up ``unlink`` is not ours to do

    def __init__(self, name: str, create: bool = False, size: int = 0):
        kwargs = {"track": False} if _TRACK_KW else {}
        self._attaching = not create  # (a create that fails removes what it made: the name was free)
        try:
            with _Untracked():
                super().__init__(name=name.lstrip("/"), create=create, size=size, **kwargs)
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            raise
        finally:
            self._attaching = False

    def unlink(self):
        if self._attaching:
            return
        with _Untracked():
            super().unlink()

    def close(self):
        """Close this mapping; one still seen through memoryviews (a delivery's ``view``)
        is unmapped when the last of them goes, so no view ever reads unmapped memory."""
        try:
            super().close()
        except BufferError:
            self._mmap = None  # the views hold it
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def create_segment(name: str, size: int, reserve: bool | int = True, group: int | None = None) -> Segment:
    """Create a new segment with its memory reserved (FileExistsError if the name is taken;
    StorageError, and nothing left behind, if /dev/shm has no room for it). ``reserve``:
    True, all of it; an int, its first that many bytes (the rest sparse: whoever writes
    there allocates first, as ``memory.Memory`` does). ``group``: a gid, for 0660 with that
    group instead of 0600."""
    seg = Segment(name, create=True, size=size)
    try:
        if group is not None:
            share_fd(seg._fd, group)
        allocate(seg, size if reserve is True else min(reserve, size))
    except BaseException:
        seg.close()
        unlink_segment(name)
        raise
    return seg


def allocate(seg: Segment, n: int) -> None:
    """Allocate the first ``n`` bytes of ``seg`` now; StorageError naming /dev/shm's free
    room when it has too little (nothing is taken back: the caller unlinks)."""
    try:
        os.posix_fallocate(seg._fd, 0, n)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # cannot reserve here: taken as written
            return
        if e.errno == errno.ENOSPC:
            raise StorageError(f"{SHM_DIR} has {_mib(free_bytes())} free, too little for the "
                               f"{_mib(n)} segment {seg._name}: free space there, ask for less, "
                               f"or enlarge {SHM_DIR} (Docker: --shm-size)") from None
        raise


def free_bytes() -> int:
    """Bytes /dev/shm has free now."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def open_segment(name: str) -> Segment:
    """Attach to an existing segment (FileNotFoundError if there is none)."""
    return Segment(name)


def unlink_segment(name: str) -> bool:
    """Remove a segment's name; mappings stay valid until closed. False if absent."""
    try:
        seg = Segment.__new__(Segment)
        seg._name = name if name.startswith("/") else "/" + name
        Segment.unlink(seg)
        return True
    except FileNotFoundError:
        return False


def create_semaphore(name: str, group: int | None = None) -> posix_ipc.Semaphore:
    """A new semaphore at 0 (ExistentialError if the name is taken); ``group``: as
    ``create_segment``'s (the file is /dev/shm/sem.NAME)."""
    sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=MODE, initial_value=0)
    if group is not None:
        try:
            share_path(os.path.join(SHM_DIR, "sem." + name.lstrip("/")), group)
        except BaseException:
            sem.close()
            unlink_semaphore(name)
            raise
    return sem


class PySem:
    """posix_ipc's semaphore with the C one's ``wait`` (the pure-Python build's doorbell).
    Where a signal interrupts its wait, posix_ipc runs the handlers and raises SignalError
    in place of what one raised (KeyboardInterrupt aside): that exception is lost here."""

    __slots__ = ("_sem", "name", "release", "close")

    def __init__(self, name: str):
        self._sem = posix_ipc.Semaphore(name)
        self.name, self.release, self.close = self._sem.name, self._sem.release, self._sem.close

    @property
    def value(self) -> int:
        return self._sem.value

    def wait(self, timeout_ns: int) -> bool:
        try:
            self._sem.acquire(max(timeout_ns, 0) / 1e9)
            return True
        except (posix_ipc.BusyError, posix_ipc.SignalError):
            return False


def open_semaphore(name: str):
    """An existing semaphore: ``wait(timeout_ns)``, ``release()``, ``close()``. The C one
    (``cpaths.Sem``) where built: its wait lets a signal handler's exception through.
    posix_ipc.ExistentialError if there is none by that name, from either."""
    if cpaths.Sem is None:
        return PySem(name)
    try:
        return cpaths.Sem(name if name.startswith("/") else "/" + name)
    except FileNotFoundError:
        raise posix_ipc.ExistentialError(f"no semaphore {name!r}") from None


def unlink_semaphore(name: str) -> bool:
    try:
        posix_ipc.unlink_semaphore(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def namespace_entries(namespace: str) -> list[str]:
    """Every file in /dev/shm that belongs to ``namespace`` (segments and semaphores)."""
    prefix = namespace_prefix(namespace)
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(
        n for n in names if n.startswith(prefix) or n.startswith("sem." + prefix) or n == prefix[:-1]
    )


def lane_entries(namespace: str, name: str) -> list[str]:
    """The files in /dev/shm of lanes 1.. of queue ``name`` (``names.lane_name``), as ``/NAME``
    segment and semaphore names: what a create cut short or a delete leaves to unlink."""
    prefix = lane_prefix(namespace, name)
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted("/" + (n[4:] if n.startswith("sem.") else n) for n in names
                  if n.startswith(prefix) or n.startswith("sem." + prefix))


def share_namespace(namespace: str, group: int) -> None:
    """Give every segment and semaphore of ``namespace`` to group ``group``, 0660 (the
    registry last: what it says is the namespace's setting). ShmqError, before any change,
    if one of them is another user's."""
    paths = [os.path.join(SHM_DIR, e) for e in namespace_entries(namespace)]
    uid = os.geteuid()
    theirs = [p for p in paths if os.stat(p).st_uid != uid]
    if theirs and uid != 0:
        raise ShmqError(f"cannot share namespace {namespace!r}: {theirs[0]} is uid {os.stat(theirs[0]).st_uid}'s, "
                        "not yours; its owner must share it")
    registry = registry_segment(namespace).lstrip("/")
    for path in sorted(paths, key=lambda p: os.path.basename(p) == registry):
        share_path(path, group)


def destroy_namespace(namespace: str) -> int:
    """Unlink every segment and semaphore of ``namespace`` (its registry and all its
    queues, with their messages); returns how many were removed. Processes still
    attached keep their mappings until they close them."""
    check_namespace(namespace)
    removed = 0
    for entry in namespace_entries(namespace):
        if entry.startswith("sem."):
            removed += unlink_semaphore("/" + entry[4:])
        else:
            removed += unlink_segment("/" + entry)
    return removed
