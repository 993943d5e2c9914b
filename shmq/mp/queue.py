"""shmq.mp's queues: ``multiprocessing.Queue``, ``SimpleQueue`` and ``JoinableQueue``
in shared memory.

Strategy: each queue is a private namespace (``mp<pid>x<random>``) holding one shmq
queue, so it needs no name from the user and passes to children by that name (fork,
spawn, ``Pool`` initargs, or any pickle). Objects are pickled in the caller (protocol
5): a pickle of up to 64 KiB is the message; a larger one, or one with out-of-band
buffers of 64 KiB and more, is written to a segment of its own and the message names
it. ``maxsize`` counts items with a POSIX semaphore of free slots, as the stdlib's
does; a JoinableQueue counts unfinished tasks in another. There is no feeder thread:
``put`` returns once the object is in shared memory. ``get`` takes and acks at once,
so it is at most once, like the stdlib's; ``lease`` keeps the object in the queue
until it is acked, and gives it to another get if its holder dies. The namespace lives
as long as its creator (``lifetime.py``).
"""

import io
import math
import numbers
import operator
import os
import pickle
import struct
import time
import types
from multiprocessing.reduction import ForkingPickler

import posix_ipc

from ..engine.broker import Broker
from ..engine.queues.queue import Queue as _EngineQueue
from ..engine.shm.names import mp_body_segment, mp_semaphore
from ..engine.shm.segment import (MODE, create_segment, destroy_namespace, open_segment, open_semaphore,
                                  unlink_segment)
from ..errors import DeliveryExpired, QueueFull, QueueNotFound
from .lifetime import owner

__all__ = ["Queue", "SimpleQueue", "JoinableQueue", "Lease"]

INLINE_MAX = 64 * 2**10  # a larger pickle (or out-of-band buffer) goes to a segment of its own
RING_BYTES = 4 * 2**20  # the ring of an unbounded queue (~75,000 ints: 56-byte records)
MIN_RING_BYTES = 256 * 2**10
JOIN_SLICE_S = 0.1  # a join re-reads the unfinished count at least this often
FOREVER_SLICE_S = 60.0  # a wait with no deadline sleeps this long at most before it sleeps again
SEM_VALUE_MAX = posix_ipc.SEMAPHORE_VALUE_MAX

_now = time.monotonic
_BLOB = b"B"  # a message naming an object's segment (a pickle starts with b"\x80")
_COUNT = struct.Struct("<I")


# ---------------------------------------------------------------- the queues
class _Shared:
    """What every mp queue does: create or attach, put and get objects, lease."""

    _joinable = False

    def __init__(self, maxsize=0, *, max_bytes=None):
        maxsize = operator.index(maxsize)
        if maxsize > SEM_VALUE_MAX:
            raise ValueError(f"maxsize must be at most {SEM_VALUE_MAX}, not {maxsize}")
        maxsize = max(maxsize, 0)
        if max_bytes is None:
            max_bytes = RING_BYTES if not maxsize else \
                min(RING_BYTES, max(MIN_RING_BYTES, (maxsize + 1) * (INLINE_MAX + 64)))
        max_bytes = operator.index(max_bytes)
        ns = f"mp{os.getpid()}x{os.urandom(6).hex()}"
        owner.adopt(ns)  # before anything exists: a SIGKILL from here on leaves nothing
        try:
            Broker(ns).create_queue("q", max_bytes=max_bytes, max_message_bytes=min(INLINE_MAX, max_bytes // 4),
                                    durability="memory").close()
            if maxsize:
                _new_semaphore(ns, "slots", maxsize)
            if self._joinable:
                _new_semaphore(ns, "unfinished", 0)
                _new_semaphore(ns, "idle", 0)
            self.__setstate__((ns, maxsize, os.getpid()))
        except BaseException:
            destroy_namespace(ns)
            raise

    def __getstate__(self):
        return self._ns, self._maxsize, self._creator

    def __setstate__(self, state):
        ns, maxsize, creator = state
        self._ns, self._maxsize, self._creator = state
        self._closed = False
        try:
            self._q = _EngineQueue(ns, "q")
            self._slots = open_semaphore(mp_semaphore(ns, "slots")) if maxsize else None
            if self._joinable:
                self._unfinished = open_semaphore(mp_semaphore(ns, "unfinished"))
                self._idle = open_semaphore(mp_semaphore(ns, "idle"))
        except (QueueNotFound, posix_ipc.ExistentialError):
            raise QueueNotFound(f"{type(self).__name__} {ns} is gone: the process that created it "
                                f"(pid {creator}) has exited") from None

    def __repr__(self):
        return f"<shmq.mp.{type(self).__name__} {self._ns} maxsize={self._maxsize}>"

    def _closed_error(self):
        return ValueError(f"Queue {self!r} is closed")

    def _check_open(self):
        if self._closed:
            raise self._closed_error()

    def _detach(self):
        if not self._closed:
            self._closed = True
            self._q.close()
            if self._slots is not None:
                self._slots.close()

    def _put(self, obj, block, timeout):
        data, buffers = _dumps(obj)  # an object that does not pickle raises here; nothing changed
        deadline = _deadline(block, timeout)
        if self._slots is not None and not _acquire(self._slots, deadline):
            raise QueueFull(f"{self!r} is full")
        try:
            if self._joinable:
                self._unfinished.release()  # before the item is visible: a task_done never runs ahead
            try:
                if buffers or len(data) > self._q.max_message_bytes:
                    self._put_segment(data, buffers, deadline)
                else:
                    self._q.put(data, timeout=_remaining(deadline))
            except BaseException:
                if self._joinable:
                    _acquire(self._unfinished, _now())
                raise
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    def _put_segment(self, data, buffers, deadline):
        """Write the pickle and its buffers to a segment of their own; put its name."""
        parts = [memoryview(data), *buffers]
        head = struct.pack(f"<I{len(parts)}Q", len(parts), *(p.nbytes for p in parts))
        key = os.urandom(8).hex()
        name = mp_body_segment(self._ns, key)
        seg = create_segment(name, len(head) + sum(p.nbytes for p in parts))  # StorageError if /dev/shm is full
        try:
            try:
                buf = seg.buf
                buf[:len(head)] = head
                at = len(head)
                for p in parts:
                    buf[at:at + p.nbytes] = p.cast("B")
                    at += p.nbytes
            finally:
                seg.close()
            self._q.put(_BLOB + key.encode(), timeout=_remaining(deadline))
        except BaseException:
            unlink_segment(name)
            raise

    def _take(self, block, timeout, visibility_timeout=None):
        return self._q.get(timeout=_remaining(_deadline(block, timeout)), visibility_timeout=visibility_timeout)

    def _get(self, block, timeout):
        deadline = _deadline(block, timeout)
        while True:
            d = self._q.get(timeout=_remaining(deadline))
            try:
                d.ack()
                break
            except DeliveryExpired:  # the lease lapsed while this process was stopped: another get has it
                continue
        if self._slots is not None:
            self._slots.release()
        return self._load(d.body, unlink=True)

    def _load(self, body, unlink):
        if body[:1] != _BLOB:
            return pickle.loads(body)
        name = mp_body_segment(self._ns, body[1:].decode())
        try:
            seg = open_segment(name)
        except FileNotFoundError:
            raise QueueNotFound(f"{self!r}: the segment of an object in it is gone (its creator exited?)") from None
        try:
            if unlink:
                unlink_segment(name)
            return _load_segment(seg.buf)
        finally:
            seg.close()

    def _size(self) -> int:
        return self._q.stats().ready


class Queue(_Shared):
    """``multiprocessing.Queue`` in shared memory: the same methods, ``queue.Empty`` and
    ``queue.Full`` (shmq's ``QueueEmpty`` / ``QueueFull`` are subclasses of them).

    ``maxsize`` counts items (0 or less: unbounded). ``max_bytes`` sizes the ring that
    holds the pickles of up to 64 KiB (default 4 MiB, less for a small ``maxsize``);
    larger objects take a segment each and ~70 bytes of the ring. When the ring is full,
    ``put`` waits for room as on a full queue (``put_nowait`` raises ``queue.Full``).
    The queue lives until the process that created it exits.
    """

    def put(self, obj, block=True, timeout=None) -> None:
        """Pickle ``obj`` here (an error pickling it raises here, and nothing is queued),
        then enqueue it; ``queue.Full`` after ``timeout`` seconds, or at once if not
        ``block``. ValueError once closed."""
        self._check_open()
        self._put(obj, block, timeout)

    def get(self, block=True, timeout=None):
        """Remove and return the oldest object; ``queue.Empty`` after ``timeout`` seconds,
        or at once if not ``block``. At most once: if this process dies during the call,
        the object may be lost (use ``lease`` for at least once)."""
        self._check_open()
        return self._get(block, timeout)

    def put_nowait(self, obj) -> None:
        return self.put(obj, False)

    def get_nowait(self):
        return self.get(False)

    def lease(self, block=True, timeout=None, visibility_timeout=None) -> "Lease":
        """Take the oldest object but keep it in the queue until ``Lease.ack()``. If this
        process dies first, or the lease lapses (``visibility_timeout`` seconds, default
        30), the object is given to another get. ``queue.Empty`` as ``get``."""
        self._check_open()
        d = self._take(block, timeout, visibility_timeout)
        return Lease(self, d, self._load(d.body, unlink=False))

    def _settle(self, d):
        d.ack()
        if d.body[:1] == _BLOB:
            unlink_segment(mp_body_segment(self._ns, d.body[1:].decode()))
        if self._slots is not None:
            self._slots.release()

    def qsize(self) -> int:
        """How many objects are waiting (leased ones are not counted)."""
        self._check_open()
        return self._size()

    def empty(self) -> bool:
        self._check_open()
        return self._size() == 0

    def full(self) -> bool:
        self._check_open()
        return self._slots is not None and self._slots.value == 0

    def close(self) -> None:
        """No more puts or gets through this handle, in this process (ValueError after);
        the queue stays for the others."""
        self._detach()

    def join_thread(self) -> None:
        """Nothing to wait for (``put`` leaves nothing behind); the stdlib's precondition
        stays: AssertionError unless closed."""
        assert self._closed, f"Queue {self!r} not closed"

    def cancel_join_thread(self) -> None:
        """Nothing to cancel: a process exits at once whatever it put."""


class JoinableQueue(Queue):
    """``multiprocessing.JoinableQueue``: ``task_done`` once per object got, ``join``
    until every object put (by any process) is done."""

    _joinable = True

    def task_done(self) -> None:
        """ValueError if called more times than objects were put."""
        if not _acquire(self._unfinished, _now()):
            raise ValueError("task_done() called too many times")
        if self._unfinished.value == 0 and self._idle.value == 0:
            self._idle.release()  # wake a joiner (each one woken wakes the next)

    def join(self) -> None:
        """Block until every object put is task_done (re-read at least every 0.1 s)."""
        while self._unfinished.value:
            _acquire(self._idle, _now() + JOIN_SLICE_S)
        if self._idle.value == 0:
            self._idle.release()


class SimpleQueue(_Shared):
    """``multiprocessing.SimpleQueue``: put, get, empty, close (unbounded)."""

    def __init__(self, *, max_bytes=None):
        super().__init__(0, max_bytes=max_bytes)

    def _closed_error(self):
        return OSError("handle is closed")

    def put(self, obj) -> None:
        self._check_open()
        self._put(obj, True, None)

    def get(self):
        self._check_open()
        return self._get(True, None)

    def empty(self) -> bool:
        self._check_open()
        return self._size() == 0

    def close(self) -> None:
        self._detach()

    __class_getitem__ = classmethod(types.GenericAlias)


class Lease:
    """An object taken with ``Queue.lease``, still in the queue: ``ack()`` removes it,
    ``nack()`` gives it back. Both raise DeliveryExpired if the lease lapsed (nothing
    changed: the object is, or will be, given to another get)."""

    __slots__ = ("value", "_queue", "_delivery")

    def __init__(self, queue, delivery, value):
        self._queue = queue
        self._delivery = delivery
        self.value = value

    def ack(self) -> None:
        self._queue._settle(self._delivery)

    def nack(self) -> None:
        self._delivery.nack()


# ---------------------------------------------------------------- pickles
def _dumps(obj):
    """(pickle, out-of-band buffers): protocol 5, with the contiguous buffers of at least
    ``INLINE_MAX`` bytes left out of the stream, to be copied once, into a segment."""
    buffers = []

    def in_band(pb):
        try:
            raw = pb.raw()
        except BufferError:  # not contiguous
            return True
        if raw.nbytes < INLINE_MAX:
            return True
        buffers.append(raw)
        return False

    f = io.BytesIO()
    ForkingPickler(f, 5, True, in_band).dump(obj)  # the stdlib's pickler: its reducers too
    return f.getvalue(), buffers


def _load_segment(buf):
    """The object in a segment ``_put_segment`` wrote: its buffers are copied out (so
    arrays come back writable), the pickle is read in place."""
    n, = _COUNT.unpack_from(buf, 0)
    sizes = struct.unpack_from(f"<{n}Q", buf, _COUNT.size)
    at = _COUNT.size + 8 * n
    data = buf[at:at + sizes[0]]
    try:
        at += sizes[0]
        buffers = []
        for size in sizes[1:]:
            buffers.append(bytearray(buf[at:at + size]))
            at += size
        return pickle.loads(data, buffers=buffers)
    finally:
        data.release()


# ---------------------------------------------------------------- waiting
def _deadline(block, timeout):
    """When a wait ends: None (never) or a ``time.monotonic()`` value. As the stdlib's:
    ``block=False`` ignores ``timeout``, and a negative timeout does not wait."""
    if not block:
        return _now()
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if timeout != timeout:
        raise ValueError("timeout must be a number of seconds, not nan")
    return None if timeout == math.inf else _now() + max(float(timeout), 0.0)


def _remaining(deadline):
    return None if deadline is None else max(0.0, deadline - _now())


def _acquire(sem, deadline) -> bool:
    """Take one unit of ``sem`` before ``deadline`` (None: no deadline); False when it
    passed. What a signal handler raises meanwhile raises here (``open_semaphore``'s wait)."""
    while True:
        left = _remaining(deadline)
        if sem.wait(int((FOREVER_SLICE_S if left is None else left) * 1e9)):
            return True
        if deadline is not None and _now() >= deadline:
            return False


def _new_semaphore(ns, what, value):
    posix_ipc.Semaphore(mp_semaphore(ns, what), posix_ipc.O_CREX, mode=MODE, initial_value=value).close()
