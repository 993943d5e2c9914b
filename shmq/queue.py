"""The queue engine: one named queue in shared memory. Everything revolves around this.

Strategy: a queue is one segment — a static header, a robust mutex, a control block of
64-bit words, a table of attached processes, and a ring of records — plus two POSIX
semaphores that wake sleepers (not_empty, not_full). Every operation takes the mutex,
reads the control block, changes records and control words, and releases the mutex;
semaphores only say "look again": the control block is the truth, and every wait is
timed and re-checks it.

Crash safety rests on three rules (docs/DESIGN.md walks through each crash):
  * data is written before it is published: a put writes its records past the tail,
    then stores the tail (one aligned 8-byte store: the commit);
  * a message's state lives in its record's status word, changed by one aligned store;
  * everything else in the control block (counts, cursors, waiters) can be rebuilt from
    head, tail and the records. When a process dies holding the mutex, the next
    locker gets EOWNERDEAD and rebuilds (``_repair``) before going on.
Housekeeping (expired leases, delayed requeues, leases of dead processes) is done by
whichever process touches the queue when it is due; ``shmq server`` calls it too.
"""

import ctypes
import errno
import os
import time
import weakref
from dataclasses import dataclass

import posix_ipc

from . import _layout as L
from . import dmsq
from ._headers import decode_headers, encode_headers
from ._mutex import FOREVER, RobustMutex
from ._mutex import lock_slow as _lock_slow
from ._mutex import trylock as _trylock
from ._mutex import unlock as _unlock
from ._process import current_identity, is_alive, monotonic_offset
from ._segment import open_segment, open_semaphore, segment_name
from .errors import (
    DeliveryExpired,
    LockTimeout,
    MessageTooLarge,
    QueueCorrupted,
    QueueEmpty,
    QueueFull,
    QueueNotFound,
    ShmqError,
    StorageError,
)

__all__ = ["Queue", "Delivery", "QueueStats"]

LIVENESS_PERIOD_NS = 500_000_000  # how often someone checks that lease holders live
WAIT_SLICE_S = 0.5  # longest sleep before a waiter re-reads the control block
SPIN_NS = 50_000  # how long a consumer polls the control block before sleeping
DLQ_RETRY_DELAY_S = 1.0  # when the dead-letter queue is full, retry after this

_mono = time.monotonic_ns
_sched_yield = os.sched_yield
_wall = time.time_ns
_REC_UNPACK = L.REC.unpack_from
_REC_PACK = L.REC.pack_into
_HOT_UNPACK = L.HOT.unpack_from
_HOT_OFF = L.HOT_OFF
_REC = L.REC_SIZE
_READY, _LEASED, _ACKED, _PAD, _DELAYED = L.READY, L.LEASED, L.ACKED, L.PAD, L.DELAYED
_NEVER = L.NEVER

# word indices of the control block, for single-word reads and writes through ``_mq``
_H = L.HOT_OFF >> 3
(
    I_DELETED, I_HEAD, I_TAIL, I_FRONTIER, I_READY_POS, I_REQUEUED, I_NEXT_ID, I_READY,
    I_INFLIGHT, I_DELAYED, I_NEXT_DEADLINE, I_NEXT_LIVENESS, I_CWAIT, I_CPOSTED, I_PWAIT, I_PPOSTED,
) = range(_H, _H + len(L.HOT_FIELDS))
_C = L.COUNTERS_OFF >> 3
I_ACKED_TOTAL, I_REDELIVERED_TOTAL, I_DEAD_TOTAL, I_PURGED_TOTAL, I_REPAIRS = range(_C, _C + len(L.COUNTER_FIELDS))

_ACK, _NACK = 1, 2
_W = L.WAL_WORDS_OFF >> 3
I_WAL_SIZE, I_WAL_SYNCED = _W, _W + 1
I_WAL_GEN, I_WAL_MODE = L.WALCFG_OFF >> 3, (L.WALCFG_OFF >> 3) + 1  # WALCFG's generation; mode (low half)
WAL_NEVER, WAL_ALWAYS, WAL_BATCH = 0, 1, 2
WAL_SUSPENDED = 3  # with generation 0: the data directory vanished; appends fail
_encode_put_entry = dmsq.encode_put_entry
_encode_ack_entry = dmsq.encode_ack_entry

try:  # the C hot paths (shmq/_fast.c), when they were built; else the Python ones below
    from . import _fast
except ImportError:  # pragma: no cover - depends on the build
    _fast = None
FAST = _fast is not None and os.environ.get("SHMQ_PURE_PYTHON", "") in ("", "0")
_fast_put = _fast.put if FAST else None
_fast_take = _fast.take if FAST else None
_fast_ack = _fast.ack if FAST else None
_F_OWNERDEAD = _fast.OWNERDEAD if FAST else None
_F_FALLBACK = _fast.FALLBACK if FAST else None
_F_EXPIRED = _fast.EXPIRED if FAST else None
_F_DELETED = _fast.DELETED if FAST else None
_F_WAL_MAX = _fast.WAL_MAX_PAYLOAD if FAST else 0  # larger wal puts take the Python fast path

_live_queues = weakref.WeakSet()


def _after_fork_in_child():
    for q in list(_live_queues):
        q._slot = -1  # the child is another process: it registers its own slot


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A snapshot of one queue's counters (``Queue.stats()``)."""

    ready: int
    in_flight: int
    oldest_ready_age_s: float
    bytes_used: int
    max_bytes: int
    enqueued_total: int
    acked_total: int
    redelivered_total: int
    dead_lettered_total: int
    consumers_waiting: int
    producers_waiting: int
    delayed: int = 0
    purged_total: int = 0


class Delivery:
    """One delivered message, leased to this process until settled or expired.

    Settle it exactly once: ``ack()`` deletes it, ``nack()`` makes it ready again (after
    ``delay`` seconds), ``reject()`` dead-letters it, ``extend()`` keeps the lease longer.
    Each raises :class:`DeliveryExpired` if the lease is no longer this delivery's.
    """

    __slots__ = ("id", "body", "attempt", "_q", "_pos", "_hraw")

    def __init__(self, q, pos, msg_id, attempt, body, hraw):
        self._q = q
        self._pos = pos
        self.id = msg_id
        self.attempt = attempt
        self.body = body
        self._hraw = hraw  # encoded headers, None when empty, the decoded dict once read

    @property
    def queue(self) -> str:
        return self._q.name

    @property
    def headers(self) -> dict:
        h = self._hraw
        if h is None:
            return {}
        if type(h) is bytes:
            h = self._hraw = decode_headers(h)
        return h

    def ack(self) -> None:
        self._q._ack_one(self)

    def nack(self, requeue: bool = True, delay: float = 0.0) -> None:
        if requeue:
            self._q._settle([self], _NACK, delay)
        else:
            self._q._dead_letter([self], "rejected")

    def reject(self) -> None:
        self._q._dead_letter([self], "rejected")

    def extend(self, seconds: float) -> None:
        self._q._extend(self, seconds)

    def __repr__(self):
        return f"<Delivery {self.queue}#{self.id} attempt={self.attempt} {len(self.body)}B>"


class _ClosedMutex:
    def __init__(self, name):
        self.name = name

    def acquire(self, deadline=None, wait_s=None):
        raise ShmqError(f"queue handle {self.name!r} is closed")


def _check_body(body):
    if type(body) is bytes:
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"message body must be bytes-like, not {type(body).__name__}")


class Queue:
    """A handle on a named queue, attached in this process (``Broker.queue``).

    Handles pickle by name: a child process (fork or spawn) re-attaches on unpickling.
    ``lock_timeout``: how long a call with no timeout of its own waits for the queue's
    lock before LockTimeout (None: ``shmq._mutex.LOCK_TIMEOUT_S``).
    """

    lock_timeout = None

    def __init__(self, namespace: str, name: str):
        self.namespace = namespace
        self.name = name
        self._slot = -1
        self._dlq = None
        try:
            seg = open_segment(segment_name(namespace, "q", name))
        except (FileNotFoundError, ValueError):
            raise QueueNotFound(f"no queue {name!r} in namespace {namespace!r}") from None
        try:
            self._attach(seg)
        except BaseException:
            seg.close()
            raise
        _live_queues.add(self)

    def _attach(self, seg):
        mm = seg._mmap
        if seg.size < L.PROCS_OFF:
            raise QueueNotFound(f"no queue {self.name!r} in namespace {self.namespace!r} (being created)")
        (magic, version, flags, cap, maxmsg, vis_ns, maxdel, slots, created, data_off,
         _nl, _n, dl, dlq) = L.STATIC.unpack_from(mm, L.STATIC_OFF)
        if magic != L.MAGIC:
            if magic == b"\0\0\0\0":
                raise QueueNotFound(f"no queue {self.name!r} in namespace {self.namespace!r} (being created)")
            raise QueueCorrupted(f"segment of queue {self.name!r} is not a shmq queue")
        if version != L.LAYOUT_VERSION:
            raise QueueCorrupted(f"queue {self.name!r} has layout version {version}, expected {L.LAYOUT_VERSION}")
        if seg.size < data_off + cap:
            raise QueueCorrupted(f"segment of queue {self.name!r} is truncated")
        offset = L.WORD.unpack_from(mm, L.TIMENS_OFF)[0]
        if offset != monotonic_offset():
            raise ShmqError(f"queue {self.name!r} was created in another time namespace (its CLOCK_MONOTONIC is "
                            f"{(offset - monotonic_offset()) / 1e9:+.3f}s from ours): lease deadlines need one "
                            "clock; use the queue from one time namespace (docs/DESIGN.md, Clocks)")
        self._seg = seg
        self._mm = mm
        self._mq = memoryview(mm).cast("Q")
        self._cap = cap
        self._base = data_off
        self.max_bytes = cap
        self.max_message_bytes = maxmsg
        self.visibility_timeout = vis_ns / 1e9
        self._vis_ns = vis_ns
        self.max_deliveries = maxdel or None
        self._nslots = slots
        self.created_at = created / 1e9
        self.dead_letter_queue = dlq[:dl].decode() or None
        self.durability = L.DURABILITY_NAMES.get(flags & 0xFF, "memory")
        self._wal = self.durability == "wal"
        self._wal_fd = None  # (generation, fd) of the log this process appends to
        # The mutex lives at a fixed address of the mapping, valid until close().
        self._mutex = RobustMutex(ctypes.addressof(ctypes.c_char.from_buffer(mm, L.MUTEX_OFF)))
        self._lockp = self._mutex.ptr  # the hot paths lock through this directly
        self._segp = self._lockp.value - L.MUTEX_OFF  # the mapping's address, for the C hot paths
        base = segment_name(self.namespace, "q", self.name)
        try:
            self._ne = open_semaphore(base + ".ne")
            self._nf = open_semaphore(base + ".nf")
        except posix_ipc.ExistentialError:
            raise QueueNotFound(f"queue {self.name!r} in namespace {self.namespace!r} was deleted") from None

    def __reduce__(self):
        return (_reattach, (self.namespace, self.name))

    @property
    def deleted(self) -> bool:
        """True once the queue was deleted (this handle then only raises QueueNotFound)."""
        return self._lockp is None or bool(self._mq[I_DELETED])

    def __repr__(self):
        return f"<shmq.Queue {self.namespace}/{self.name}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_seg", None) is not None:
            self.close()

    def close(self) -> None:
        """Detach from the queue in this process. The queue itself stays."""
        if isinstance(self._mutex, _ClosedMutex):
            return
        self._mutex = _ClosedMutex(self.name)
        self._lockp = None
        if self._wal_fd is not None:
            os.close(self._wal_fd[1])
            self._wal_fd = None
        self._mq.release()
        self._ne.close()
        self._nf.close()
        self._seg.close()
        if self._dlq is not None:
            self._dlq.close()
        _live_queues.discard(self)

    # ------------------------------------------------------------------ locking
    def _acquire(self, deadline=None):
        """Take the lock, repairing after a dead holder. ``deadline``: see ``_mutex.lock_slow``."""
        try:
            dead = self._mutex.acquire(deadline, self.lock_timeout)
        except LockTimeout as e:
            raise LockTimeout(f"queue {self.name!r}: {e}") from None
        if dead:
            try:
                self._repair()
            finally:
                self._mutex.mark_consistent()

    def _release(self):
        self._mutex.release()

    def _repair_held_lock(self):
        """A C hot path took the lock from a dead holder: repair, then let it go."""
        try:
            self._repair()
        finally:
            self._mutex.mark_consistent()
            _unlock(self._lockp)

    def _lock_contended(self, rc, deadline=None, timeout_error=LockTimeout):
        """The hot paths' lock, after ``trylock`` returned ``rc``: wait (until ``deadline``,
        else ``timeout_error``), or repair."""
        try:
            dead = _lock_slow(self._lockp, rc, deadline, self.lock_timeout)
        except LockTimeout as e:
            raise timeout_error(f"queue {self.name!r}: {e}") from None
        if dead:
            try:
                self._repair()
            finally:
                self._mutex.mark_consistent()

    def _closed(self):
        return ShmqError(f"queue handle {self.name!r} is closed")

    def _gone(self):
        return QueueNotFound(f"queue {self.name!r} in namespace {self.namespace!r} was deleted")

    def _repair(self):
        """Rebuild every derived control word from head, tail and the records.

        Called with the lock held after its previous holder died inside an update.
        """
        mq, mm, cap, base = self._mq, self._mm, self._cap, self._base
        head, tail = mq[I_HEAD], mq[I_TAIL]
        ready = inflight = delayed = requeued = ready_run = 0
        first_ready = None
        frontier = head
        next_deadline = _NEVER
        max_id = 0
        pos = head
        while pos < tail:
            pos = L.skip_gap(pos, cap)
            if pos >= tail:
                break
            a = base + pos % cap
            status, length, _b, _h, _f, msg_id, _e, deadline = _REC_UNPACK(mm, a)
            state = status & 0xFF
            if length < _REC or length % 8 or pos % cap + length > cap or pos + length > tail:
                tail = pos  # a record the dead writer never finished: drop it
                break
            if state == _PAD:
                pos += length
                continue
            max_id = max(max_id, msg_id)
            if state == _READY:
                ready += 1
                ready_run += 1
                if first_ready is None:
                    first_ready = pos
            else:
                requeued += ready_run
                ready_run = 0
                frontier = pos + length
                if state == _LEASED:
                    inflight += 1
                    next_deadline = min(next_deadline, deadline)
                elif state == _DELAYED:
                    delayed += 1
                    next_deadline = min(next_deadline, deadline)
            pos += length
        cwait = pwait = 0
        for i in range(self._nslots):
            pid, _s, cw, pw = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)
            if pid:
                cwait += cw
                pwait += pw
        mq[I_TAIL] = tail
        mq[I_NEXT_ID] = max(mq[I_NEXT_ID], max_id + 1)
        mq[I_FRONTIER] = frontier
        mq[I_READY_POS] = first_ready if requeued else frontier
        mq[I_REQUEUED] = requeued
        mq[I_READY] = ready
        mq[I_INFLIGHT] = inflight
        mq[I_DELAYED] = delayed
        mq[I_NEXT_DEADLINE] = next_deadline
        mq[I_NEXT_LIVENESS] = 0
        mq[I_CWAIT] = cwait
        mq[I_CPOSTED] = 0
        mq[I_PWAIT] = pwait
        mq[I_PPOSTED] = 0
        mq[I_REPAIRS] += 1
        self._advance_head()
        self._repair_wal()

    def _repair_wal(self):
        """A log append the dead holder left half-written is cut off (lock held): the log
        ends where the last complete append ended, so later entries stay readable."""
        if not self._wal:
            return
        gen, _mode, _ms, directory = self.wal_config()
        if not gen:
            return
        path = dmsq.wal_path(directory, self.name, gen)
        try:
            if os.path.getsize(path) > self._mq[I_WAL_SIZE]:
                os.truncate(path, self._mq[I_WAL_SIZE])
        except FileNotFoundError:
            pass

    def _advance_head(self):
        """Reclaim settled records and pads at the head. Lock held. Returns True if it moved."""
        mq, cap, base = self._mq, self._cap, self._base
        head = start = mq[I_HEAD]
        tail = mq[I_TAIL]
        while head < tail:
            pos = L.skip_gap(head, cap)
            if pos >= tail:
                head = tail
                break
            a = base + pos % cap
            state = mq[a >> 3] & 0xFF
            if state != _ACKED and state != _PAD:
                break
            head = pos + (mq[(a + 8) >> 3] & 0xFFFFFFFF)
        if head == start:
            return False
        mq[I_HEAD] = head
        # only settled records and pads lay behind the new head: cursors follow it
        if mq[I_FRONTIER] < head:
            mq[I_FRONTIER] = head
        if mq[I_READY_POS] < head:
            mq[I_READY_POS] = head
        return True

    def _my_slot(self):
        """This process's row in the process table (registered on first need). Lock held."""
        slot = self._slot
        if slot >= 0:
            return slot
        pid, start = current_identity()
        mm, free = self._mm, -1
        for i in range(self._nslots):
            p, s, _cw, _pw = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)
            if p == pid and s == start:
                self._slot = i
                return i
            if p == 0 and free < 0:
                free = i
        if free < 0:
            raise ShmqError(f"queue {self.name!r}: all {self._nslots} process slots are taken")
        L.PROC.pack_into(mm, L.PROCS_OFF + free * L.PROC_SIZE, pid, start, 0, 0)
        self._slot = free
        return free

    def _slot_word(self, slot, field):
        return ((L.PROCS_OFF + slot * L.PROC_SIZE) >> 3) + field

    # ------------------------------------------------------------------ put
    def put(self, body, headers=None, timeout=None) -> int:
        """Append one message; blocks while the queue is full.

        Returns the message id. Raises QueueFull after ``timeout`` seconds (None: wait
        forever), MessageTooLarge / TypeError on bad input (nothing enqueued).
        """
        if type(body) is not bytes:
            body = _check_body(body)
        hraw = b"" if headers is None else encode_headers(headers)
        bl = len(body)
        if bl > self.max_message_bytes:
            raise MessageTooLarge(
                f"message body is {bl} bytes; queue {self.name!r} takes at most {self.max_message_bytes}"
            )
        # Fast path: room at the tail without a pad. Anything else goes to _append.
        lp = self._lockp
        if lp is None:
            raise self._closed()
        mm, mq, cap = self._mm, self._mq, self._cap
        hl = len(hraw)
        size = (_REC + 7 + hl + bl) & -8
        msg_id = post = 0
        now = _wall()
        if _fast_put is not None and (not self._wal or (self._wal_fd is not None and hl + bl <= _F_WAL_MAX)):
            gen, fd = self._wal_fd if self._wal else (0, -1)
            try:
                r = _fast_put(self._segp, self._base, cap, body, hraw, now, fd, gen)
            except OSError as e:
                raise self._fast_failed(e) from None
            if r > 0:
                if r & 1:
                    self._ne.release()
                return r >> 1
            if r == _F_FALLBACK:
                return self._append(((body, hraw, size),), timeout)[0]
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            # busy: the Python path below waits for the lock
        rc = _trylock(lp)
        if rc:
            self._lock_contended(rc, _lock_deadline(timeout), QueueFull)
        try:
            if mq[I_DELETED]:
                raise self._gone()
            tail = mq[I_TAIL]
            off = tail % cap
            if size <= cap - off and tail + size - mq[I_HEAD] <= cap:
                a = self._base + off
                msg_id = mq[I_NEXT_ID]
                if self._wal:  # logged (and fsynced, by policy) before the commit below
                    self._wal_append(_encode_put_entry(msg_id, now, hraw, body))
                _REC_PACK(mm, a, _READY, size, bl, hl, 0, msg_id, now, 0)
                b = a + _REC
                if hl:
                    mm[b:b + hl] = hraw
                    b += hl
                mm[b:b + bl] = body
                mq[I_TAIL] = tail + size  # commit
                mq[I_NEXT_ID] = msg_id + 1
                mq[I_READY] += 1
                cw = mq[I_CWAIT]
                if cw and cw > mq[I_CPOSTED]:
                    mq[I_CPOSTED] += 1
                    post = 1
        finally:
            _unlock(lp)
        if msg_id:
            if post:
                self._ne.release()
            return msg_id
        return self._append(((body, hraw, size),), timeout)[0]

    def put_nowait(self, body, headers=None) -> int:
        """``put`` that raises QueueFull at once instead of waiting."""
        return self.put(body, headers, timeout=0)

    def put_many(self, bodies, timeout=None) -> list[int]:
        """Append a batch under one lock, all or nothing; returns the ids in order.

        Items are bodies or ``(body, headers)`` pairs.
        """
        items = []
        append = items.append
        maxmsg = self.max_message_bytes
        for body in bodies:
            if type(body) is bytes:
                hraw = b""
            elif type(body) is tuple:
                body, headers = body
                hraw = b"" if headers is None else encode_headers(headers)
                if type(body) is not bytes:
                    body = _check_body(body)
            else:
                body, hraw = _check_body(body), b""
            if len(body) > maxmsg:
                raise MessageTooLarge(
                    f"message body is {len(body)} bytes; queue {self.name!r} takes at most {maxmsg}"
                )
            append((body, hraw, (_REC + 7 + len(hraw) + len(body)) & -8))
        if not items:
            return []
        return self._append(items, timeout)

    def _append(self, items, timeout):
        """Append ``(body, encoded headers, record size)`` items, waiting for room."""
        deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
        total = sum(item[2] for item in items)
        if total > self._cap:
            raise MessageTooLarge(
                f"{total} bytes of records can never fit in queue {self.name!r} (max_bytes={self._cap})"
            )
        waited = 0
        while True:
            try:
                ids, post = self._try_append(items, waited, deadline)
            except LockTimeout as e:
                raise QueueFull(str(e)) from None
            for _ in range(post):
                self._ne.release()
            if ids is not None:
                return ids
            if deadline is not None and _mono() >= deadline:
                raise QueueFull(f"queue {self.name!r} is full")
            waited = self._sleep(self._nf, deadline, I_PWAIT, I_PPOSTED, 3)

    def _placement_end(self, items, tail):
        """Where the tail would be after appending ``items`` at ``tail`` (pads included)."""
        cap = self._cap
        for item in items:
            tail = L.place(tail, item[2], cap)[1]
        return tail

    def _try_append(self, items, waited, deadline):
        """One locked attempt. Returns (ids or None, semaphore posts owed)."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        self._acquire(FOREVER if deadline is None else deadline)
        try:
            if mq[I_DELETED]:
                raise self._gone()
            if waited:
                self._unregister_wait(I_PWAIT, I_PPOSTED, 3, waited)
            head, tail = mq[I_HEAD], mq[I_TAIL]
            end = self._placement_end(items, tail)
            if end - head > cap and head == tail and tail % cap:
                # empty but badly placed: start the next lap, so any batch <= capacity fits
                tail = head = tail + cap - tail % cap
                mq[I_HEAD] = mq[I_FRONTIER] = mq[I_READY_POS] = mq[I_TAIL] = tail
                end = self._placement_end(items, tail)
            if end - head > cap:
                if deadline is None or _mono() < deadline:
                    self._register_wait(I_PWAIT, 3)
                return None, 0
            # write the records past the tail, then publish them with one store
            now = _wall()
            pos = tail
            first_id = next_id = mq[I_NEXT_ID]
            if self._wal:  # logged (and fsynced, by policy) before the commit below
                self._wal_append(b"".join(
                    _encode_put_entry(first_id + i, now, item[1], item[0]) for i, item in enumerate(items)))
            for body, hraw, size in items:
                off = pos % cap
                rem = cap - off
                if size > rem:
                    if rem >= _REC:
                        _REC_PACK(mm, base + off, _PAD, rem, 0, 0, 0, 0, 0, 0)
                    pos += rem
                    off = 0
                a = base + off
                hl = len(hraw)
                bl = len(body)
                _REC_PACK(mm, a, _READY, size, bl, hl, 0, next_id, now, 0)
                a += _REC
                if hl:
                    mm[a:a + hl] = hraw
                    a += hl
                mm[a:a + bl] = body
                next_id += 1
                pos += size
            mq[I_TAIL] = pos  # commit
            mq[I_NEXT_ID] = next_id
            n = next_id - first_id
            mq[I_READY] += n
            return list(range(first_id, next_id)), self._owed_posts(I_CWAIT, I_CPOSTED, n)
        finally:
            self._release()

    def _register_wait(self, i_wait, field):
        """Count this process as sleeping (consumers: field 2, producers: 3). Lock held."""
        mq = self._mq
        slot = self._my_slot()
        mq[i_wait] += 1
        mq[self._slot_word(slot, field)] += 1

    def _unregister_wait(self, i_wait, i_posted, field, waited):
        """Undo ``_register_wait`` after a sleep; ``waited == 2`` consumed a post. Lock held."""
        mq = self._mq
        n = mq[i_wait] - 1
        mq[i_wait] = n
        mq[self._slot_word(self._slot, field)] -= 1
        posted = mq[i_posted]
        if waited == 2 and posted:
            posted -= 1
        mq[i_posted] = posted if n else 0

    def _owed_posts(self, i_wait, i_posted, n):
        """How many of ``n`` new messages (or freed slots) to post to sleepers. Lock held."""
        mq = self._mq
        w = mq[i_wait]
        if not w:
            return 0
        p = mq[i_posted]
        post = min(w - p, n)
        if post <= 0:
            return 0
        mq[i_posted] = p + post
        return post

    # ------------------------------------------------------------------ get
    def get(self, timeout=None, visibility_timeout=None) -> Delivery:
        """Lease the oldest ready message; blocks until one is ready.

        Raises QueueEmpty after ``timeout`` seconds (None: wait forever).
        """
        d = self._take_one(visibility_timeout, timeout)
        if d is None:
            d = self._get(1, timeout, visibility_timeout)[0]
        return d

    def get_nowait(self, visibility_timeout=None) -> Delivery:
        """``get`` that raises QueueEmpty at once instead of waiting."""
        d = self._take_one(visibility_timeout, 0)
        if d is None:
            d = self._get(1, 0, visibility_timeout)[0]
        return d

    def _take_one(self, visibility_timeout, timeout):
        """Fast path of ``get``: the next never-delivered record at the frontier, when no
        housekeeping is due and nothing was requeued. None sends the caller to ``_get``."""
        lp = self._lockp
        slot = self._slot
        if lp is None or slot < 0 or visibility_timeout is not None:
            return None
        if _fast_take is not None:
            r = _fast_take(self._segp, self._base, self._cap, slot, self._vis_ns, self.max_deliveries or 0, _mono())
            if type(r) is tuple:
                return Delivery(self, *r)
            if r == _F_FALLBACK:
                return None
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            # busy: the Python path below waits for the lock
        mm, mq, cap = self._mm, self._mq, self._cap
        body = None
        rc = _trylock(lp)
        if rc:
            self._lock_contended(rc, _lock_deadline(timeout), QueueEmpty)
        try:
            (deleted, _head, tail, pos, _rp, requeued, _nid, ready, inflight, _dl, next_deadline, next_liveness,
             _cw, _cp, _pw, _pp) = _HOT_UNPACK(mm, _HOT_OFF)
            now = _mono()
            off = pos % cap
            if (pos < tail and not requeued and not deleted and cap - off >= _REC
                    and now < next_deadline and now < next_liveness):
                a = self._base + off
                status, length, bl, hl, _f, msg_id, _e, _d = _REC_UNPACK(mm, a)
                attempt = (status >> 32) + 1
                if status & 0xFF == _READY and (self.max_deliveries is None or attempt <= self.max_deliveries):
                    until = now + self._vis_ns
                    mq[(a + 40) >> 3] = until
                    mq[a >> 3] = _LEASED | (slot << 8) | (attempt << 32)  # commit
                    mq[I_FRONTIER] = pos + length  # (ready_pos means nothing while requeued == 0)
                    mq[I_READY] = ready - 1
                    mq[I_INFLIGHT] = inflight + 1
                    if until < next_deadline:
                        mq[I_NEXT_DEADLINE] = until
                    if attempt > 1:
                        mq[I_REDELIVERED_TOTAL] += 1
                    b = a + _REC
                    body = mm[b + hl:b + hl + bl]
                    hraw = mm[b:b + hl] if hl else None
        finally:
            _unlock(lp)
        if body is None:
            return None
        return Delivery(self, pos, msg_id, attempt, body, hraw)

    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None, max_bytes=None) -> list[Delivery]:
        """Lease up to ``max_messages``; returns as soon as at least one is ready.

        With ``max_bytes``, stops before the bodies and headers taken would exceed it
        (the first message is always taken).
        """
        if type(max_messages) is not int or max_messages < 1:
            raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
        return self._get(max_messages, timeout, visibility_timeout, max_bytes)

    def _get(self, maxn, timeout, visibility_timeout, max_bytes=None):
        if visibility_timeout is None:
            vis_ns = self._vis_ns
        else:
            vis_ns = _seconds_ns(visibility_timeout, "visibility_timeout")
        deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
        waited = 0
        spun = timeout == 0
        while True:
            can_wait = deadline is None or _mono() < deadline
            try:
                got = self._take(maxn, vis_ns, waited, spun and can_wait, max_bytes,
                                 FOREVER if deadline is None else deadline)
            except LockTimeout as e:
                raise QueueEmpty(str(e)) from None
            if got:
                return got
            if not can_wait:
                raise QueueEmpty(f"queue {self.name!r} is empty")
            if not spun:
                spun = True
                self._spin(deadline)
                waited = 0
                continue
            waited = self._sleep(self._ne, deadline, I_CWAIT, I_CPOSTED, 2)

    def _spin(self, deadline):
        """Poll the control block briefly before sleeping: spin, then yield the core
        (a partner process may be runnable on it), as Aeron's backoff idle strategy."""
        mq = self._mq
        now = _mono()
        yield_at = now + SPIN_NS // 5
        end = now + SPIN_NS
        if deadline is not None and deadline < end:
            end = deadline
        while now < end:
            if mq[I_READY] or mq[I_DELETED]:
                return
            if now > yield_at:
                _sched_yield()
            now = _mono()

    def _sleep(self, sem, deadline, i_wait, i_posted, field):
        """Sleep on a semaphore for at most one slice. Returns 2 if woken by a post, 1 if not.

        The caller registered as a sleeper; if the sleep is interrupted (KeyboardInterrupt
        from a signal), the registration is undone before the exception propagates.
        """
        try:
            return self._sleep_slice(sem, deadline)
        except BaseException:
            self._acquire()
            try:
                self._unregister_wait(i_wait, i_posted, field, 1)
            finally:
                self._release()
            raise

    def _sleep_slice(self, sem, deadline):
        now = _mono()
        slice_ns = int(WAIT_SLICE_S * 1e9)
        if deadline is not None:
            slice_ns = min(slice_ns, deadline - now)
        next_due = self._mq[I_NEXT_DEADLINE]
        if next_due != _NEVER:
            slice_ns = min(slice_ns, max(next_due - now, 0) + 1_000_000)
        try:
            sem.acquire(max(slice_ns, 0) / 1e9)
            return 2
        except posix_ipc.BusyError:
            return 1
        except posix_ipc.SignalError:
            return 1

    def _take(self, maxn, vis_ns, waited, register, max_bytes=None, deadline=None):
        """One locked attempt to lease up to ``maxn`` ready messages."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        out = []
        dead = None
        reap = False
        self._acquire(deadline)
        try:
            if mq[I_DELETED]:
                raise self._gone()
            now = _mono()
            if waited:
                self._unregister_wait(I_CWAIT, I_CPOSTED, 2, waited)
            if now >= mq[I_NEXT_DEADLINE]:
                self._expire(now)
            if now >= mq[I_NEXT_LIVENESS]:
                mq[I_NEXT_LIVENESS] = now + LIVENESS_PERIOD_NS
                reap = True
            ready = mq[I_READY]
            if ready:
                lease = _LEASED | (self._my_slot() << 8)
                until = now + vis_ns
                maxdel = self.max_deliveries
                requeued, frontier, tail = mq[I_REQUEUED], mq[I_FRONTIER], mq[I_TAIL]
                taken = redelivered = 0
                append = out.append
                ndead = 0
                budget = max_bytes
                while ready and len(out) - ndead < maxn:
                    if requeued:
                        pos = self._next_requeued(frontier)
                        if pos < 0:  # the count was stale: none left below the frontier
                            requeued = 0
                            mq[I_READY_POS] = frontier
                            continue
                        requeued -= 1
                        a = base + pos % cap
                        status, length, bl, hl, _f, msg_id, _e, _d = _REC_UNPACK(mm, a)
                        mq[I_READY_POS] = pos + length if requeued else frontier
                    else:
                        if frontier >= tail:
                            break
                        pos = frontier
                        off = pos % cap
                        if cap - off < _REC:  # implicit pad to the end of the lap
                            frontier += cap - off
                            continue
                        a = base + off
                        status, length, bl, hl, _f, msg_id, _e, _d = _REC_UNPACK(mm, a)
                        frontier = pos + length
                        if status & 0xFF == _PAD:
                            continue
                    if budget is not None:
                        if out and bl + hl > budget:
                            if pos < frontier:  # a requeued one: leave it for the next take, as it was
                                requeued += 1
                                mq[I_READY_POS] = pos
                            else:
                                frontier = pos
                            break
                        budget -= bl + hl
                    attempt = (status >> 32) + 1
                    mq[(a + 40) >> 3] = until
                    mq[a >> 3] = lease | (attempt << 32)  # commit
                    ready -= 1
                    taken += 1
                    if attempt > 1:
                        redelivered += 1
                        if maxdel is not None and attempt > maxdel:
                            ndead += 1  # leased to us only to be dead-lettered below
                    a += _REC
                    append((pos, msg_id, attempt, mm[a + hl:a + hl + bl], mm[a:a + hl] if hl else None))
                mq[I_FRONTIER] = frontier
                if not requeued:
                    mq[I_READY_POS] = frontier
                mq[I_REQUEUED] = requeued
                mq[I_READY] = ready
                mq[I_INFLIGHT] += taken
                if redelivered:
                    mq[I_REDELIVERED_TOTAL] += redelivered
                if taken and until < mq[I_NEXT_DEADLINE]:
                    mq[I_NEXT_DEADLINE] = until
            if not out and register:
                self._register_wait(I_CWAIT, 2)
        finally:
            self._release()
        # Deliveries are built outside the lock: the leased bytes are ours until settled.
        if out:
            maxdel = self.max_deliveries
            if maxdel is None:
                out = [Delivery(self, *t) for t in out]
            else:
                dead = [Delivery(self, *t) for t in out if t[2] > maxdel]
                out = [Delivery(self, *t) for t in out if t[2] <= maxdel]
        if reap:
            self._reap_dead()
        if dead:
            self._dead_letter(dead, "max-deliveries")
        return out

    def _next_requeued(self, frontier):
        """Position of the lowest READY record below the frontier, or -1. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        pos = mq[I_READY_POS]
        while pos < frontier:
            pos = L.skip_gap(pos, cap)
            a = base + pos % cap
            if mq[a >> 3] & 0xFF == _READY:
                return pos
            pos += mq[(a + 8) >> 3] & 0xFFFFFFFF
        return -1

    def ready_hint(self) -> bool:
        """Whether a message looks ready, read without the lock (a hint: re-check by taking)."""
        if self._lockp is None:
            raise self._closed()
        mq = self._mq
        if mq[I_DELETED]:
            raise self._gone()
        return mq[I_READY] > 0 or _mono() >= mq[I_NEXT_DEADLINE]

    # ------------------------------------------------------------------ settle
    def _check_lease(self, d, head=None, tail=None, now=None):
        """Address of the delivery's record if its lease is still d's, else None. Lock held."""
        mq = self._mq
        pos = d._pos
        if pos < (mq[I_HEAD] if head is None else head) or pos >= (mq[I_TAIL] if tail is None else tail):
            return None
        a = self._base + pos % self._cap
        w = mq[a >> 3]
        if w & 0xFF != _LEASED or w >> 32 != d.attempt or mq[(a + 24) >> 3] != d.id:
            return None
        if mq[(a + 40) >> 3] <= (_mono() if now is None else now):
            return None  # lapsed, even if no one has made it ready again yet
        return a

    def _ack_one(self, d):
        lp = self._lockp
        if lp is None:
            raise self._closed()
        if _fast_ack is not None and (not self._wal or self._wal_fd is not None):
            gen, fd = self._wal_fd if self._wal else (0, -1)
            try:
                r = _fast_ack(self._segp, self._base, self._cap, d._pos, d.attempt, d.id, _mono(), fd, gen)
            except OSError as e:
                raise self._fast_failed(e) from None
            if r >= 0:
                if r:
                    self._nf.release()
                return
            if r == _F_EXPIRED:
                raise DeliveryExpired(f"delivery {self.name}#{d.id} attempt {d.attempt} is no longer leased")
            if r == _F_DELETED:
                raise self._gone()
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            # busy, or a log the C path does not append to: the Python path below
        mq, cap = self._mq, self._cap
        pos = d._pos
        a = self._base + pos % cap
        post = False
        rc = _trylock(lp)
        if rc:
            self._lock_contended(rc)
        try:
            if mq[I_DELETED]:
                raise self._gone()
            head = mq[I_HEAD]
            w = mq[a >> 3]
            if (pos < head or pos >= mq[I_TAIL] or w & 0xFF != _LEASED or w >> 32 != d.attempt
                    or mq[(a + 24) >> 3] != d.id or mq[(a + 40) >> 3] <= _mono()):
                raise DeliveryExpired(f"delivery {self.name}#{d.id} attempt {d.attempt} is no longer leased")
            if self._wal:
                self._wal_append(_encode_ack_entry(d.id, d.attempt))
            mq[a >> 3] = (w & ~0xFF) | _ACKED  # commit
            mq[I_INFLIGHT] -= 1
            mq[I_ACKED_TOTAL] += 1
            # the first record after the head (or after a pad at the head) frees space
            if (pos == head or (pos % cap == 0 and pos - head < cap)) and self._advance_head():
                pw = mq[I_PWAIT]
                if pw and pw > mq[I_PPOSTED]:
                    mq[I_PPOSTED] += 1
                    post = True
        finally:
            _unlock(lp)
        if post:
            self._nf.release()

    def ack_many(self, deliveries) -> int:
        """Ack a batch under one lock. Raises DeliveryExpired naming those no longer
        leased (the others are acked). Returns how many were acked."""
        return self._settle(deliveries, _ACK, 0.0)

    def _settle(self, deliveries, action, delay, dead_lettered=False):
        """Ack (or drop as dead-lettered) or nack a batch under one lock."""
        mq, cap, base = self._mq, self._cap, self._base
        deliveries = list(deliveries)
        for d in deliveries:
            if getattr(d, "_q", None) is not self:
                raise TypeError(f"expected deliveries of queue {self.name!r}, got {d!r}")
        delay_ns = _seconds_ns(delay, "delay") if action == _NACK else 0
        expired = []
        done = 0
        freed = False
        post_nf = post_ne = 0
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            now = _mono()
            head, tail = mq[I_HEAD], mq[I_TAIL]
            if action == _NACK:
                woke = 0
                for d in deliveries:
                    a = self._check_lease(d, head, tail, now)
                    if a is None:
                        expired.append(d)
                        continue
                    w = mq[a >> 3]
                    if delay_ns:
                        mq[(a + 40) >> 3] = now + delay_ns
                        mq[a >> 3] = L.status_word(_DELAYED, L.NO_HOLDER, w >> 32)  # commit
                        mq[I_DELAYED] += 1
                        if now + delay_ns < mq[I_NEXT_DEADLINE]:
                            mq[I_NEXT_DEADLINE] = now + delay_ns
                    else:
                        self._make_ready(a, d._pos, w)
                        woke += 1
                    done += 1
                mq[I_INFLIGHT] -= done
                post_ne = self._owed_posts(I_CWAIT, I_CPOSTED, woke)
            else:
                if self._wal:
                    live = [d for d in deliveries if self._check_lease(d, head, tail, now) is not None]
                    if live:
                        self._wal_append(b"".join(_encode_ack_entry(d.id, d.attempt) for d in live))
                for d in deliveries:
                    pos = d._pos
                    a = base + pos % cap
                    w = mq[a >> 3]
                    if (pos < head or pos >= tail or w & 0xFF != _LEASED or w >> 32 != d.attempt
                            or mq[(a + 24) >> 3] != d.id or mq[(a + 40) >> 3] <= now):
                        expired.append(d)
                        continue
                    mq[a >> 3] = (w & ~0xFF) | _ACKED  # commit
                    done += 1
                    if pos == head or (pos % cap == 0 and pos - head < cap):  # first after head (or a pad)
                        freed = True
                mq[I_INFLIGHT] -= done
                mq[I_DEAD_TOTAL if dead_lettered else I_ACKED_TOTAL] += done
                if freed and self._advance_head():
                    post_nf = self._owed_posts(I_PWAIT, I_PPOSTED, 1)
        finally:
            self._release()
        for _ in range(post_nf):
            self._nf.release()
        for _ in range(post_ne):
            self._ne.release()
        if expired:
            ids = ", ".join(f"#{d.id}" for d in expired[:10])
            raise DeliveryExpired(f"{len(expired)} deliveries of {self.name!r} are no longer leased: {ids}")
        return done

    def _make_ready(self, a, pos, w):
        """A delivered record becomes ready again, keeping its attempt count. Lock held."""
        mq = self._mq
        mq[a >> 3] = L.status_word(_READY, L.NO_HOLDER, w >> 32)  # commit
        mq[I_READY] += 1
        requeued = mq[I_REQUEUED]
        mq[I_REQUEUED] = requeued + 1
        if not requeued or pos < mq[I_READY_POS]:  # ready_pos is only kept while requeued > 0
            mq[I_READY_POS] = pos

    def _extend(self, d, seconds):
        until = _mono() + _seconds_ns(seconds, "seconds")
        mq = self._mq
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            a = self._check_lease(d)
            if a is None:
                raise DeliveryExpired(f"delivery {self.name}#{d.id} attempt {d.attempt} is no longer leased")
            mq[(a + 40) >> 3] = until
            if until < mq[I_NEXT_DEADLINE]:
                mq[I_NEXT_DEADLINE] = until
        finally:
            self._release()

    # ------------------------------------------------------------------ dead letters
    def _dead_letter(self, deliveries, reason):
        """Move leased deliveries to the dead-letter queue (or drop them), then settle.

        The copy goes first: a crash in between duplicates the message, never loses it.
        """
        keep = []
        self._acquire()
        try:
            for d in deliveries:
                if self._check_lease(d) is None:
                    if reason == "rejected":
                        raise DeliveryExpired(
                            f"delivery {self.name}#{d.id} attempt {d.attempt} is no longer leased"
                        )
                    continue
                keep.append(d)
        finally:
            self._release()
        if self.dead_letter_queue:
            full = []
            for d in keep:
                headers = dict(d.headers)
                headers.update({
                    "x-death-reason": reason,
                    "x-death-queue": self.name,
                    "x-death-id": d.id,
                    "x-death-attempts": d.attempt,
                })
                try:
                    self._dead_letter_target().put_nowait(d.body, headers)
                except QueueFull:
                    full.append(d)
                except QueueNotFound:
                    self._dlq = None  # deleted: the message is dropped, as with no DLQ
            if full:
                self._settle(full, _NACK, DLQ_RETRY_DELAY_S)
                keep = [d for d in keep if d not in full]
        if keep:
            try:
                self._settle(keep, _ACK, 0.0, dead_lettered=True)
            except DeliveryExpired:
                pass  # expired meanwhile: it is redelivered (and was copied): at least once

    def _dead_letter_target(self):
        if self._dlq is None:
            self._dlq = Queue(self.namespace, self.dead_letter_queue)
        return self._dlq

    # ------------------------------------------------------------------ housekeeping
    def _expire(self, now):
        """Expired leases and due delayed messages become ready. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        pos, end = mq[I_HEAD], mq[I_FRONTIER]
        next_deadline = _NEVER
        woke = 0
        while pos < end:
            pos = L.skip_gap(pos, cap)
            if pos >= end:
                break
            a = base + pos % cap
            w = mq[a >> 3]
            state = w & 0xFF
            if state == _LEASED or state == _DELAYED:
                due = mq[(a + 40) >> 3]
                if due <= now:
                    mq[I_INFLIGHT if state == _LEASED else I_DELAYED] -= 1
                    self._make_ready(a, pos, w)
                    woke += 1
                elif due < next_deadline:
                    next_deadline = due
            pos += mq[(a + 8) >> 3] & 0xFFFFFFFF
        mq[I_NEXT_DEADLINE] = next_deadline
        if woke:
            for _ in range(self._owed_posts(I_CWAIT, I_CPOSTED, woke)):
                self._ne.release()
        return woke

    def _reap_dead(self):
        """Give back the leases of processes that died, and forget them."""
        mm, mq = self._mm, self._mq
        me = os.getpid()
        suspects = []
        for i in range(self._nslots):
            pid, start, _cw, _pw = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)
            if pid and pid != me and not is_alive(pid, start):
                suspects.append((i, pid, start))
        if not suspects:
            return 0
        returned = 0
        self._acquire()
        try:
            for i, pid, start in suspects:
                p, s, cw, pw = L.PROC.unpack_from(mm, L.PROCS_OFF + i * L.PROC_SIZE)
                if (p, s) != (pid, start):
                    continue  # reused meanwhile
                returned += self._release_holder(i)
                mq[I_CWAIT] -= cw
                mq[I_PWAIT] -= pw
                L.PROC.pack_into(mm, L.PROCS_OFF + i * L.PROC_SIZE, 0, 0, 0, 0)
            posts = self._owed_posts(I_CWAIT, I_CPOSTED, returned) if returned else 0
        finally:
            self._release()
        for _ in range(posts):
            self._ne.release()
        return returned

    def _release_holder(self, slot):
        """Every lease held by process ``slot`` becomes ready again. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        pos, end = mq[I_HEAD], mq[I_FRONTIER]
        n = 0
        while pos < end:
            pos = L.skip_gap(pos, cap)
            if pos >= end:
                break
            a = base + pos % cap
            w = mq[a >> 3]
            if w & 0xFF == _LEASED and (w >> 8) & 0xFFFF == slot:
                mq[I_INFLIGHT] -= 1
                self._make_ready(a, pos, w)
                n += 1
            pos += mq[(a + 8) >> 3] & 0xFFFFFFFF
        return n

    def housekeep(self) -> int:
        """Do the due work now: expire leases, wake delayed messages, return the leases
        of dead processes. Returns how many messages became ready again."""
        mq = self._mq
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            woke = self._expire(_mono())
            mq[I_NEXT_LIVENESS] = _mono() + LIVENESS_PERIOD_NS
        finally:
            self._release()
        return woke + self._reap_dead()

    # ------------------------------------------------------------------ admin
    def purge(self) -> int:
        """Drop every ready message (leased and delayed ones stay). Returns how many."""
        mq, cap, base = self._mq, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            pos, tail = mq[I_READY_POS] if mq[I_REQUEUED] else mq[I_FRONTIER], mq[I_TAIL]
            n = 0
            start = pos
            if self._wal:  # log the drops first
                ids = []
                while pos < tail:
                    pos = L.skip_gap(pos, cap)
                    if pos >= tail:
                        break
                    a = base + pos % cap
                    if mq[a >> 3] & 0xFF == _READY:
                        ids.append(mq[(a + 24) >> 3])
                    pos += mq[(a + 8) >> 3] & 0xFFFFFFFF
                if ids:
                    self._wal_append(b"".join(_encode_ack_entry(i, 0) for i in ids))
                pos = start
            while pos < tail:
                pos = L.skip_gap(pos, cap)
                if pos >= tail:
                    break
                a = base + pos % cap
                w = mq[a >> 3]
                if w & 0xFF == _READY:
                    mq[a >> 3] = (w & ~0xFF) | _ACKED
                    n += 1
                pos += mq[(a + 8) >> 3] & 0xFFFFFFFF
            mq[I_READY] = 0
            mq[I_REQUEUED] = 0
            mq[I_FRONTIER] = mq[I_READY_POS] = tail
            mq[I_PURGED_TOTAL] += n
            freed = self._advance_head()
            post = freed and mq[I_PWAIT] > mq[I_PPOSTED]
            if post:
                mq[I_PPOSTED] += 1
        finally:
            self._release()
        if post:
            self._nf.release()
        return n

    def stats(self) -> QueueStats:
        """A consistent snapshot of the queue's counters."""
        mq, mm, cap, base = self._mq, self._mm, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            hot = dict(zip(L.HOT_FIELDS, _HOT_UNPACK(mm, L.HOT_OFF)))
            counters = dict(zip(L.COUNTER_FIELDS, L.COUNTERS.unpack_from(mm, L.COUNTERS_OFF)))
            age = 0.0
            if hot["ready"]:
                pos = hot["ready_pos"] if hot["requeued"] else hot["frontier"]
                while pos < hot["tail"]:
                    pos = L.skip_gap(pos, cap)
                    a = base + pos % cap
                    if mq[a >> 3] & 0xFF == _READY:
                        age = max(0.0, (_wall() - mq[(a + 32) >> 3]) / 1e9)
                        break
                    pos += mq[(a + 8) >> 3] & 0xFFFFFFFF
        finally:
            self._release()
        return QueueStats(
            ready=hot["ready"],
            in_flight=hot["in_flight"],
            oldest_ready_age_s=age,
            bytes_used=hot["tail"] - hot["head"],
            max_bytes=cap,
            enqueued_total=hot["next_id"] - 1,
            acked_total=counters["acked_total"],
            redelivered_total=counters["redelivered_total"],
            dead_lettered_total=counters["dead_lettered_total"],
            consumers_waiting=hot["cwait"],
            producers_waiting=hot["pwait"],
            delayed=hot["delayed"],
            purged_total=counters["purged_total"],
        )

    # ------------------------------------------------------------------ write-ahead log
    def wal_config(self) -> tuple[int, int, int, str]:
        """(generation, fsync mode, batch ms, directory) of the queue's log; generation 0
        means no broker has opened a log for it yet."""
        gen, mode, ms, n, raw = L.WALCFG.unpack_from(self._mm, L.WALCFG_OFF)
        return gen, mode, ms, raw[:n].decode()

    def configure_wal(self, directory: str, mode: int, batch_ms: int, generation: int | None = None) -> int:
        """Point the queue's log at ``directory`` (the broker does this). Keeps the
        current generation unless ``generation`` is given. Returns the generation."""
        raw = os.path.abspath(directory).encode()
        if len(raw) > 150:
            raise ValueError(f"data dir path is longer than 150 bytes: {directory!r}")
        self._acquire()
        try:
            gen = L.WALCFG.unpack_from(self._mm, L.WALCFG_OFF)[0]
            if generation is not None or not gen:
                gen = generation or 1
                self._mq[I_WAL_SIZE] = self._mq[I_WAL_SYNCED] = 0
            L.WALCFG.pack_into(self._mm, L.WALCFG_OFF, gen, mode, batch_ms, len(raw), raw)
        finally:
            self._release()
        return gen

    def wal_pending(self) -> tuple[int, int] | None:
        """(generation, logged bytes) when the log holds entries not yet fsynced, else None."""
        mq = self._mq
        gen, size = mq[I_WAL_GEN], mq[I_WAL_SIZE]
        if not gen or size == mq[I_WAL_SYNCED]:
            return None
        return gen, size

    def mark_wal_synced(self, generation: int, size: int) -> None:
        """Record an fsync that covered the first ``size`` bytes of log ``generation``."""
        mq = self._mq
        self._acquire()
        try:
            if mq[I_WAL_GEN] == generation and mq[I_WAL_SYNCED] < size <= mq[I_WAL_SIZE]:
                mq[I_WAL_SYNCED] = size
        finally:
            self._release()

    def wal_path(self, generation: int) -> str:
        return dmsq.wal_path(self.wal_config()[3], self.name, generation)

    def _wal_append(self, data: bytes) -> None:
        """Append log entries (lock held), fsync by policy; before the caller commits.

        All or nothing: when the disk is full (or the log is gone) the log is cut back to
        where this append began and StorageError is raised, so the caller commits nothing
        and later appends stay readable."""
        mq = self._mq
        gen = mq[I_WAL_GEN]
        fd_gen = self._wal_fd
        start = mq[I_WAL_SIZE]
        n = len(data)
        try:
            fd = fd_gen[1] if fd_gen is not None and fd_gen[0] == gen else self._open_wal(gen)
            written = os.write(fd, data)
            if written != n:  # a short write: finish it
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view):]
            if mq[I_WAL_MODE] & 0xFFFFFFFF == WAL_ALWAYS:
                os.fsync(fd)
                if os.fstat(fd).st_nlink == 0:  # synced into a file no one can find again
                    self._suspend_wal()
                    raise FileNotFoundError(errno.ENOENT, "the log file was deleted (is the data directory gone?)")
        except OSError as e:
            if mq[I_WAL_GEN] == gen and self._wal_fd is not None and self._wal_fd[0] == gen:
                self._wal_cut(self._wal_fd[1], start)
            raise StorageError(f"queue {self.name!r}: cannot append to its write-ahead log "
                               f"{self.wal_path(gen)}: {e.strerror or e}; nothing was changed") from None
        size = start + n
        mq[I_WAL_SIZE] = size
        if mq[I_WAL_MODE] & 0xFFFFFFFF == WAL_ALWAYS:
            mq[I_WAL_SYNCED] = size
        # batch: the broker fsyncs every log each batch interval (``Snapshotter.sync_logs``)

    def _wal_cut(self, fd, size):
        """Cut the log back to ``size`` bytes after a failed append (lock held). If even
        that fails, later appends go to the next generation, so none lands after the
        damage (recovery reads this log up to it, then the next)."""
        try:
            if os.fstat(fd).st_size > size:
                os.ftruncate(fd, size)
        except OSError:
            mq = self._mq
            mq[I_WAL_GEN] += 1
            mq[I_WAL_SIZE] = mq[I_WAL_SYNCED] = 0

    def _fast_failed(self, e):
        """A C hot path's log append failed (it cut the log back): StorageError."""
        gen = self._wal_fd[0] if self._wal_fd is not None else 0
        return StorageError(f"queue {self.name!r}: cannot append to its write-ahead log {self.wal_path(gen)}: "
                            f"{e.strerror or e}; nothing was changed")

    def _open_wal(self, gen: int) -> int:
        """This process's descriptor for log generation ``gen`` (lock held)."""
        if not gen:
            directory = self.wal_config()[3]
            if self._mq[I_WAL_MODE] & 0xFFFFFFFF == WAL_SUSPENDED:
                raise StorageError(f"queue {self.name!r}: its data directory {directory} is gone; write-ahead "
                                   "logged puts and acks fail until it is back")
            raise ShmqError(f"queue {self.name!r} is durability='wal' but no shmq server with a --data-dir "
                            "has opened its write-ahead log yet")
        if self._wal_fd is not None:
            os.close(self._wal_fd[1])
            self._wal_fd = None
        path = self.wal_path(gen)
        try:  # the first appender creates the log, and makes its name durable
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        else:
            dmsq.fsync_dir(path)
        self._wal_fd = (gen, fd)
        return fd

    def suspend_wal(self) -> None:
        """The log or its data directory is gone (the broker found out): every logged put
        and ack fails with StorageError until ``configure_wal`` opens a log again."""
        self._acquire()
        try:
            self._suspend_wal()
        finally:
            self._release()

    def _suspend_wal(self):
        _gen, _mode, _ms, n, raw = L.WALCFG.unpack_from(self._mm, L.WALCFG_OFF)
        L.WALCFG.pack_into(self._mm, L.WALCFG_OFF, 0, WAL_SUSPENDED, 0, n, raw)

    # ------------------------------------------------------------------ snapshots
    def settings(self) -> dict:
        """The queue's settings, as ``create_queue`` takes them."""
        return {
            "max_bytes": self.max_bytes, "max_message_bytes": self.max_message_bytes,
            "visibility_timeout": self.visibility_timeout, "max_deliveries": self.max_deliveries,
            "dead_letter_queue": self.dead_letter_queue, "durability": self.durability,
        }

    def export_messages(self, rotate_wal: bool = False) -> list[tuple[int, int, int, bytes, bytes]]:
        """Every message not yet settled, as (id, attempt, enqueued_ns, encoded headers,
        body), oldest first. Leased and delayed ones are included with their attempt
        count (restored as ready, they are delivered again). The lock is held only to
        copy the used part of the ring; records are parsed from the copy."""
        mq, mm, cap, base = self._mq, self._mm, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            head, tail = mq[I_HEAD], mq[I_TAIL]
            if rotate_wal:
                self._rotate_wal()
            if tail - head == 0:
                return []
            start = head % cap
            if start + (tail - head) <= cap:
                ring = mm[base + start:base + start + (tail - head)]
            else:  # the used part wraps: copy it as one lap-relative run
                ring = mm[base + start:base + cap] + mm[base:base + (tail - head) - (cap - start)]
        finally:
            self._release()
        out = []
        pos = head
        while pos < tail:
            pos = L.skip_gap(pos, cap)
            if pos >= tail:
                break
            o = pos - head  # the copy starts at the head and runs on across the lap end
            status, length, bl, hl, _f, msg_id, enq, _d = L.REC.unpack_from(ring, o)
            state = status & 0xFF
            if state in (_READY, _LEASED, _DELAYED):
                b = o + _REC
                out.append((msg_id, status >> 32, enq, bytes(ring[b:b + hl]), bytes(ring[b + hl:b + hl + bl])))
            pos += length
        return out

    def _rotate_wal(self):
        """Start a new log generation (lock held): the old log is fsynced first, so every
        put that returned is durable either in it or in the snapshot being taken."""
        gen, mode, ms, directory = self.wal_config()
        if not gen:
            return
        old = dmsq.wal_path(directory, self.name, gen)
        try:
            fd = os.open(old, os.O_WRONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        raw = directory.encode()
        L.WALCFG.pack_into(self._mm, L.WALCFG_OFF, gen + 1, mode, ms, len(raw), raw)
        self._mq[I_WAL_SIZE] = self._mq[I_WAL_SYNCED] = 0

    def import_messages(self, messages) -> int:
        """Append messages keeping their (id, attempt, enqueued_ns, headers, body) — for
        restoring a snapshot. All or nothing; QueueFull if they do not fit now."""
        items = [(body, hraw, (_REC + 7 + len(hraw) + len(body)) & -8, msg_id, attempt, enq)
                 for msg_id, attempt, enq, hraw, body in messages]
        if not items:
            return 0
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            head, tail = mq[I_HEAD], mq[I_TAIL]
            if head == tail and tail % cap:
                tail = head = tail + cap - tail % cap
                mq[I_HEAD] = mq[I_FRONTIER] = mq[I_READY_POS] = mq[I_TAIL] = tail
            if self._placement_end(items, tail) - head > cap:
                raise QueueFull(f"queue {self.name!r} has no room for {len(items)} restored messages")
            pos = tail
            top = 0
            for body, hraw, size, msg_id, attempt, enq in items:
                off = pos % cap
                if size > cap - off:
                    if cap - off >= _REC:
                        _REC_PACK(mm, base + off, _PAD, cap - off, 0, 0, 0, 0, 0, 0)
                    pos += cap - off
                    off = 0
                a = base + off
                _REC_PACK(mm, a, L.status_word(_READY, L.NO_HOLDER, attempt), size, len(body), len(hraw), 0,
                          msg_id, enq, 0)
                mm[a + _REC:a + _REC + len(hraw)] = hraw
                mm[a + _REC + len(hraw):a + _REC + len(hraw) + len(body)] = body
                top = max(top, msg_id)
                pos += size
            mq[I_TAIL] = pos  # commit
            mq[I_NEXT_ID] = max(mq[I_NEXT_ID], top + 1)
            mq[I_READY] += len(items)
            post = self._owed_posts(I_CWAIT, I_CPOSTED, len(items))
        finally:
            self._release()
        for _ in range(post):
            self._ne.release()
        return len(items)

    def _mark_deleted(self):
        """Flag the queue deleted (for ``Broker.delete_queue``) and wake every sleeper."""
        self._acquire()
        try:
            self._mq[I_DELETED] = 1
            waiters = self._mq[I_CWAIT] + self._mq[I_PWAIT]
        finally:
            self._release()
        for _ in range(waiters + 1):
            self._ne.release()
            self._nf.release()


def _lock_deadline(timeout):
    """The lock deadline of a call that may wait ``timeout`` seconds (None: for ever)."""
    return FOREVER if timeout is None else _mono() + _seconds_ns(timeout, "timeout")


def _seconds_ns(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if value != value or value < 0:
        raise ValueError(f"{what} must be >= 0, not {value!r}")
    return int(value * 1e9)


def _reattach(namespace, name):
    return Queue(namespace, name)
