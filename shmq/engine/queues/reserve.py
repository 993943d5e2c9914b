"""``Queue.reserve``: a producer fills a message in place, in the ring, and publishes it
as its ``with`` block ends (iceoryx2's loan and send).

Strategy: a reservation is a fill (``layout.FILL_OFF``). Entering waits for room as a
put does and places the record past the tail (and past any fills before it) as FILLING,
held by this process, then lets go of the lock: the block writes the body while every
other caller of the queue goes on (a put meanwhile goes after it, seen once it is
published). A normal exit makes the record READY and moves the tail over it (and over
the done records after it), an exception makes it a PAD; a process killed inside the
block leaves a FILLING record of a dead holder, which housekeeping makes a PAD. A logged
queue keeps the older way, the lock held while the block runs (its log is written in
commit order), so a call on that queue from inside the block raises RuntimeError.

The writable buffer is a memoryview of an object made on the mapping for this one
reservation (``_fast.Loan``, which counts the views taken of it; on the pure-Python paths
a ctypes array, whose references say the same), so the end of the block can tell whether
anything still refers to it (a slice kept, a numpy array made from it) before it
publishes: once published, nobody may write into the record. On the C paths
(``q.paths``) an unlogged queue's reservation is ``_fast.Reservation``, which claims and
publishes the plain case itself and hands anything else to this class.

``Queue.reserve_many`` on the C paths is ``_fast.Reservations``: small fills claimed in
one hold of the lock, as many as fit, and published in one. Elsewhere (a logged queue,
the Python paths) it is this module's ``Reservations``, a batch of one.
"""

import ctypes
import sys
import time

from ..shm import cpaths
from ..shm.layout import FILL_MIN, REC_SIZE, record_size
from ..shm.mutex import unlock as _unlock

__all__ = ["Reservation", "Reservations"]

_getrefcount = sys.getrefcount
_wall = time.time_ns
_F_OWNERDEAD = cpaths.OWNERDEAD


def _loan(loan_class, mm, offset, size):
    """A writable window of ``size`` bytes at ``offset`` of the mapping ``mm``: a
    ``loan_class`` (the C paths' ``Loan``), or with None a ctypes array."""
    if loan_class is not None:
        return loan_class(mm, offset, size)
    return (ctypes.c_char * size).from_buffer(mm, offset)


def _still_seen(loan) -> bool:
    """Whether a view of ``loan`` is alive (its own memoryview released)."""
    if not isinstance(loan, ctypes.Array):  # (a Loan counts them)
        return loan.exports > 0
    return _getrefcount(loan) > 3  # (the caller's name, our argument, getrefcount's): more is a view


class Reservation:
    """``with q.reserve(size, headers) as buf: ...`` (``Producing.reserve``). ``id`` is
    the message id once published (None before, and after a block that raised)."""

    __slots__ = ("_q", "_size", "_hraw", "_timeout", "_at", "_arr", "_raw", "_buf", "_fill", "_paced", "id")

    def __init__(self, q, size, hraw, timeout, paced=False):
        self._q = q
        self._size = size
        self._hraw = hraw
        self._timeout = timeout
        self._at = None
        self._fill = not q._logged
        self._paced = paced  # (the C Reservation paced it before it handed the block here)
        self.id = None

    def __enter__(self) -> memoryview:
        if self._at is not None or self.id is not None:
            raise RuntimeError("a reservation is entered once")
        q, size, hraw, fill = self._q, self._size, self._hraw, self._fill
        if q._lockp is None:
            raise q._closed()
        at = None
        paths = q.paths
        if fill and size >= FILL_MIN and not self._paced:
            q._pace(record_size(len(hraw), size), self._timeout)
        if fill and paths.reserve is not None:
            r = paths.reserve(q._segp, q._base, q._cap, size, hraw, q._fill_slot())
            if r >= 0:
                at = r, q._base + r % q._cap
            elif r == _F_OWNERDEAD:
                q._repair_held_lock()
        if at is None:  # busy, full, or a pad to place: the general placement
            rec = record_size(len(hraw), size)
            at = q._until_room(q._try_reserve, ((size, hraw, rec),), self._timeout, fill or None)
        try:  # a fill's record is ours from here (else the lock is held)
            loan = _loan(paths.Loan, q._mm, at[1] + REC_SIZE + len(hraw), size)
            raw = memoryview(loan)
            buf = raw if paths.Loan is not None else raw.cast("B")
        except BaseException:
            self._abandon(at[0])
            raise
        self._at, self._arr, self._raw, self._buf = at, loan, raw, buf
        return buf

    def __exit__(self, exc_type, exc, tb) -> bool:
        q = self._q
        pos, a = self._at
        loan, raw, buf = self._arr, self._raw, self._buf
        self._arr = self._raw = self._buf = None
        try:
            buf.release()
            raw.release()
            del raw, buf
            held = _still_seen(loan)
        except BufferError:  # exported to something still alive (a numpy array)
            held = True
        if exc_type is not None or held:
            self._abandon(pos)  # nothing published
            if exc_type is None:
                raise BufferError("a view of the reserved buffer is still alive as the block ends (a slice, or "
                                  "an object made from it): nothing was published; let it go inside the block")
            return False
        if not self._fill:
            self.id = q._publish(pos, a)  # (a logged queue logs it first)
            return False
        publish = q.paths.publish
        if publish is None:
            self.id = q._finish_fill(pos)
            return False
        r = publish(q._segp, q._base, q._cap, pos, _wall(), q._ne)
        if r >= 0:  # (its end posted every consumer it woke)
            self.id = r
        else:  # busy, or taken from a dead holder: Python waits (or repairs), then ends it
            if r == _F_OWNERDEAD:
                q._repair_held_lock()
            self.id = q._finish_fill(pos)
        return False

    def _abandon(self, pos) -> None:
        """Nothing published: a fill's record becomes a PAD (else the lock is let go, the
        record past the tail never committed)."""
        if self._fill:
            self._q._finish_fill(pos, abandon=True)
        else:
            _unlock(self._q._lockp)

    def __repr__(self):
        state = ("published" if self.id is not None else "open" if getattr(self, "_buf", None) is not None
                 else "abandoned" if self._at is not None else "unused")
        return f"<Reservation {self._q.name} {self._size}B {state}>"


class Reservations:
    """``with q.reserve_many(sizes, headers) as bufs: ...`` (``Producing.reserve_many``)
    where C does not claim them together (a logged queue, the Python paths): a batch of
    one, the queue's one reservation of the first size. ``ids``: the messages' ids once
    published (None before, and after a block that raised)."""

    __slots__ = ("_sizes", "_one", "ids")

    def __init__(self, q, sizes, hraw, timeout):
        self._sizes = sizes
        self._one = q._reservation(sizes[0], hraw, timeout)
        self.ids = None

    def __enter__(self) -> list:
        return [self._one.__enter__()]

    def __exit__(self, exc_type, exc, tb) -> bool:
        one = self._one
        one.__exit__(exc_type, exc, tb)
        if one.id is not None:
            self.ids = [one.id]
        return False

    def __repr__(self):
        state = "published" if self.ids is not None else repr(self._one).rsplit(" ", 1)[-1].rstrip(">")
        return f"<Reservations {self._one._q.name} {len(self._sizes)} sizes {state}>"
