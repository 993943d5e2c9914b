"""The namespace registry: which queues exist, in one small shared segment.

Strategy: creating a queue takes several steps (segment, two semaphores, header), so
it happens under the registry's robust mutex with the entry marked CREATING; delete
marks it DELETING first. A process killed half-way leaves that mark behind, and the
next holder of the lock (it gets EOWNERDEAD) removes the half-made queue. Queue
operations never touch the registry: it is only on the create/delete/list path.

The registry's own mode and group say whether the namespace is shared with a group
(shmq/sharing.py): ``group``, read by each create (never by an attach), is what it copies.
"""

import contextlib
import ctypes
import itertools
import os
import struct
import time

from .mutex import RobustMutex, init_mutex
from .process import current_identity, is_alive
from .names import registry_segment
from .segment import SHM_DIR, create_segment, open_segment, unlink_segment
from ...sharing import refused, shared_gid

__all__ = ["Registry", "FREE", "CREATING", "LIVE", "DELETING", "read_header", "identity", "creation_guard"]

_MAGIC = b"SHMR"
_VERSION = 1
_HEADER = struct.Struct("<4sHHQQQ")  # magic, version, pad, entries, creator pid, creator start_ms
_MUTEX_OFF = 64
_ENTRIES_OFF = 128
_ENTRY = struct.Struct("<QQ128s")  # state, name length, name
MAX_QUEUES = 1024
_SIZE = _ENTRIES_OFF + MAX_QUEUES * _ENTRY.size
_ENTRY_WORDS = _ENTRY.size // 8  # an entry's state is its first u64: every 18th word from _ENTRIES_OFF

FREE, CREATING, LIVE, DELETING = 0, 1, 2, 3
_INIT_WAIT_S = 2.0


class Registry:
    """The registry segment of one namespace: made by the first create of a queue, a
    stream or an exchange in it (``Broker``), or by ``shmq server``."""

    def __init__(self, namespace: str, create: bool = True, group: int | None = None):
        """``create=False``: attach only (FileNotFoundError if the namespace has no
        registry, or one its creator has not published). ``created``: this call made it;
        ``group`` (a gid): one made here is shared with that group. Unauthorized if the
        namespace is another user's (not shared with a group of ours)."""
        self.namespace = namespace
        self._name = registry_segment(namespace)
        self.created = False
        try:
            self._seg = self._open_or_create(group) if create else self._open_published()
        except PermissionError:
            raise refused(f"namespace {namespace!r}", os.path.join(SHM_DIR, self._name.lstrip("/"))) from None
        self._mm = self._seg._mmap
        self._mutex = RobustMutex(ctypes.addressof(ctypes.c_char.from_buffer(self._mm, _MUTEX_OFF)))

    def _open_published(self):
        try:
            seg = open_segment(self._name)
        except ValueError:  # zero-sized
            raise FileNotFoundError(f"registry {self._name} is not initialised") from None
        if seg.size < _SIZE or _HEADER.unpack_from(seg._mmap, 0)[0] != _MAGIC:
            seg.close()
            raise FileNotFoundError(f"registry {self._name} is not initialised")
        return seg

    @property
    def group(self) -> int | None:
        """The gid the namespace is shared with (its registry's group, when that may read
        and write it), else None: what its creates give their segments and semaphores.
        Read afresh (one fstat) each time: a namespace shared meanwhile is seen at once."""
        return shared_gid(os.fstat(self._seg._fd))

    # --- segment life -------------------------------------------------------------
    def _open_or_create(self, group):
        deadline = time.monotonic() + _INIT_WAIT_S
        while True:
            try:
                seg = create_segment(self._name, _SIZE, group=group)
            except FileExistsError:
                pass
            else:
                pid, start = current_identity()
                _HEADER.pack_into(seg._mmap, 0, b"\0\0\0\0", _VERSION, 0, MAX_QUEUES, pid, start)
                init_mutex(ctypes.addressof(ctypes.c_char.from_buffer(seg._mmap, _MUTEX_OFF)))
                seg._mmap[0:4] = _MAGIC  # published: attachers wait for this
                self.created = True
                return seg
            try:
                seg = open_segment(self._name)
            except FileNotFoundError:
                continue  # deleted between our two calls: try creating again
            except ValueError:
                seg = None  # zero-sized: the creator has not sized it yet
            if seg is not None and seg.size >= _SIZE:
                magic, _v, _p, _n, pid, start = _HEADER.unpack_from(seg._mmap, 0)
                if magic == _MAGIC:
                    return seg
                if pid and not is_alive(pid, start):
                    seg.close()
                    unlink_segment(self._name)  # its creator died before publishing it
                    continue
            if seg is not None:
                seg.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"registry {self._name} was never initialised by its creator")
            time.sleep(0.001)  # the creator is between shm_open and publishing (microseconds)

    def __del__(self):
        self.close()

    def close(self):
        if getattr(self, "_seg", None) is not None:
            self._mutex = None
            self._seg.close()
            self._seg = None

    # --- locking ------------------------------------------------------------------
    def __enter__(self):
        if self._mutex.acquire():
            # The previous holder died mid create/delete; entries it left CREATING or
            # DELETING are finished off by the caller via ``stale_entries``.
            self._mutex.mark_consistent()
        return self

    def __exit__(self, *exc):
        self._mutex.release()

    @contextlib.contextmanager
    def held(self, wait_s: float):
        """The lock, as ``with registry``, waiting ``wait_s`` seconds at most (LockTimeout)."""
        if self._mutex.acquire(wait_s=wait_s):
            self._mutex.mark_consistent()
        try:
            yield self
        finally:
            self._mutex.release()

    # --- entries (call with the lock held) ----------------------------------------
    def _entry(self, i):
        state, n, raw = _ENTRY.unpack_from(self._mm, _ENTRIES_OFF + i * _ENTRY.size)
        return state, raw[:n].decode()

    def _set(self, i, state, name):
        raw = name.encode()
        _ENTRY.pack_into(self._mm, _ENTRIES_OFF + i * _ENTRY.size, state, len(raw), raw)

    def entries(self):
        """(index, state, name) of every used entry. The states are read in one strided
        look (an idle broker lists its queues often; 1024 unpacks cost half a millisecond)."""
        with memoryview(self._mm) as mm, mm[_ENTRIES_OFF:_SIZE] as table, table.cast("Q") as words:
            states = words[::_ENTRY_WORDS].tolist()
        return [(i, states[i], self._entry(i)[1]) for i in itertools.compress(range(MAX_QUEUES), states)]

    def find(self, name):
        for i, state, n in self.entries():
            if n == name:
                return i, state
        return None, FREE

    def claim(self, name, state):
        """Mark a free entry with ``name``; returns its index."""
        for i in range(MAX_QUEUES):
            if _ENTRY.unpack_from(self._mm, _ENTRIES_OFF + i * _ENTRY.size)[0] == FREE:
                self._set(i, state, name)
                return i
        raise RuntimeError(f"namespace {self.namespace!r} holds {MAX_QUEUES} queues already")

    def set_state(self, i, state, name):
        self._set(i, state, name)

    def free(self, i):
        self._set(i, FREE, "")


def read_header(namespace: str):
    """(size, published, creator pid, creator start_ms) of the registry of
    ``namespace`` as it is in /dev/shm, without attaching; None if there is none."""
    path = os.path.join(SHM_DIR, registry_segment(namespace).lstrip("/"))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(_HEADER.size)
    except FileNotFoundError:
        return None
    if len(head) < _HEADER.size:
        return size, False, 0, 0
    magic, _v, _p, _n, pid, start = _HEADER.unpack(head)
    return size, magic == _MAGIC, pid, start


def identity(namespace: str) -> str | None:
    """Which registry of ``namespace`` is in /dev/shm now, as a string no other registry
    of it has (its file's inode, its creator's pid and start time), or None if it has no
    published one: a server compares it with the one its data dir saw last, to tell a
    namespace whose memory outlived the server (same registry: what it no longer lists
    was deleted) from one made anew (a reboot: everything is rebuilt)."""
    path = os.path.join(SHM_DIR, registry_segment(namespace).lstrip("/"))
    header = read_header(namespace)
    if header is None or not header[1]:
        return None
    try:
        ino = os.stat(path).st_ino
    except FileNotFoundError:
        return None
    return f"{ino}-{header[2]}-{header[3]}"


@contextlib.contextmanager
def creation_guard(namespace: str):
    """Hold the registry name of a namespace that has none, unpublished and with this
    process as its creator: until the end of the block no process can create the
    namespace's registry (``Registry`` waits for it), hence no queue or stream in it.
    FileExistsError if the namespace has a registry. ``shmq doctor --clean`` removes a
    registry-less namespace's leftovers under it. Killed meanwhile, the guard is a
    registry whose creator is dead: the next ``Registry`` removes it."""
    name = registry_segment(namespace)
    seg = create_segment(name, _SIZE)
    try:
        pid, start = current_identity()
        _HEADER.pack_into(seg._mmap, 0, b"\0\0\0\0", _VERSION, 0, MAX_QUEUES, pid, start)
        yield
    finally:
        ours = os.fstat(seg._fd)
        seg.close()
        try:
            now = os.stat(os.path.join(SHM_DIR, name.lstrip("/")))
            if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):
                unlink_segment(name)
        except FileNotFoundError:
            pass
