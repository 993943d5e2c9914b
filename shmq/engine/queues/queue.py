"""The queue engine: the operations of one named queue in shared memory. Everything
revolves around this module.

Strategy: a queue is one segment — a static header, a robust mutex, a control block of
64-bit words, a table of attached processes, and a ring of records (``layout``) — plus
two POSIX semaphores that wake sleepers (not_empty, not_full; ``waits``). Every
operation takes the mutex, reads the control block, changes records and control words
through ``ring`` (the one writer of them: no module of the queue wing stores a word),
and releases the mutex; semaphores only say "look again": the control block
is the truth, and every wait is timed and re-checks it.

Crash safety rests on three rules (docs/DESIGN.md walks through each crash):
  * data is written before it is published: a put writes its records past the tail,
    then stores the tail (one aligned 8-byte store: the commit);
  * a message's state lives in its record's status word, changed by one aligned store;
  * everything else in the control block (counts, cursors, waiters) can be rebuilt from
    head, tail and the records. When a process dies holding the mutex, the next
    locker gets EOWNERDEAD and rebuilds (``housekeeping.repair``) before going on.
Housekeeping (expired leases, delayed requeues, leases of dead processes) is done by
whichever process touches the queue when it is due; ``shmq server`` calls it too.
The operations live in three parts of ``Queue``: ``produce`` (put), ``consume`` (get)
and ``settle`` (ack, nack, reject); the plain put, get and ack have twins in C
(``_fast.c``), tried first by a handle attached on the C paths (``paths``: each handle
binds the paths ``cpaths``' default names when it attaches).
"""

import ctypes
import os
import time
import weakref

import posix_ipc

from ...formats import dmsq
from ...errors import LockTimeout, QueueCorrupted, QueueFull, QueueNotFound, ShmqError
from ...model.messages import QueueStats
from . import extension, housekeeping, lifetime, scheduling
from ..shm import dedup, header, ring, slots, takes, waits
from ..shm import layout as L
from ..shm.memory import Memory, pinned_bytes
from ..shm.layout import (I_CWAIT, I_DELETED, I_FRONTIER, I_HEAD, I_NEXT_DEADLINE, I_NEXT_ID, I_PWAIT, I_READY,
                          I_READY_POS, I_REQUEUED, I_TAIL)
from .consume import Consuming
from ..shm.cpaths import FAST
from .delivery import Delivery
from .paths import chosen as _chosen_paths
from ..shm.mutex import Reentered, let_go
from ..shm.mutex import lock_slow as _lock_slow
from ..shm.mutex import mark_consistent as _mark_consistent
from ..shm.mutex import trylock as _trylock
from ..shm.mutex import unlock as _unlock
from ..shm.process import current_identity, monotonic_offset
from .produce import Producing
from ..shm.names import NOT_EMPTY, NOT_FULL, lane_name, queue_segment
from ..shm.segment import open_segment, open_semaphore
from .settle import Settling
from ..shm.versions import mismatch
from ..shm.wal import Log

__all__ = ["Queue", "Delivery", "QueueStats", "FAST"]

_mono = time.monotonic_ns
_wall = time.time_ns
_REC = L.REC_SIZE
_HOT_UNPACK = L.HOT.unpack_from
_READY, _LEASED, _ACKED, _DELAYED = L.READY, L.LEASED, L.ACKED, L.DELAYED
_R_MSG_ID = L.R_MSG_ID
_CONSUMERS = waits.CONSUMERS
_encode_ack_entry = dmsq.encode_ack_entry
_write_record = ring.write_record

_live_queues = weakref.WeakSet()

_W_VIS, _W_MAXDEL, _W_SETTINGS_GEN = header.W_VIS, header.W_MAXDEL, header.W_SETTINGS_GEN


def _after_fork_in_child():
    for q in list(_live_queues):
        q._slot = -1  # the child is another process: it registers its own slot
        q._unwaits = ()  # and the parent's sleeps are the parent's to uncount


os.register_at_fork(after_in_child=_after_fork_in_child)


class Queue(Producing, Consuming, Settling):
    """A handle on a named queue, attached in this process (``Broker.queue``).

    Handles pickle by name: a child process (fork or spawn) re-attaches on unpickling.
    ``lock_timeout``: how long a call with no timeout of its own waits for the queue's
    lock before LockTimeout (None: ``shmq.engine.shm.mutex.LOCK_TIMEOUT_S``). ``paths``:
    the hot paths it runs, bound as it attached (``paths.kind``: "c" or "python").
    """

    lock_timeout = None
    _unwaits = ()  # sleeps still counted that a lock timeout kept from being uncounted (``_unwait_later``)

    def __init__(self, namespace: str, name: str, lane: int = 0, opener=None):
        """``lane``: one lane of a laned queue (``lanes.py``; 0 is the queue's first, the
        segment every queue has). ``opener(namespace, name)``: a handle on another queue
        (its dead-letter queue, a reply queue), handed in by the layer that attaches
        (``lanes.attach``); without one, such a queue is opened by its lane 0."""
        self.namespace = namespace
        self.name = name
        self._slot = -1
        self._dlq = None
        self._held = None  # with a prefetch cap (``_set_prefetch``): the deliveries held un-settled
        try:
            seg = open_segment(queue_segment(namespace, name, lane))
        except (FileNotFoundError, ValueError):
            raise QueueNotFound(f"no queue {name!r} in namespace {namespace!r}") from None
        try:
            self._attach(seg, opener)
            if self._lane != lane:
                raise QueueCorrupted(f"segment of lane {lane} of queue {name!r} says it is lane {self._lane}")
        except BaseException:
            seg.close()
            raise
        _live_queues.add(self)

    def _attach(self, seg, opener):
        mm = seg._mmap
        if seg.size < L.PROCS_OFF:
            raise QueueNotFound(f"no queue {self.name!r} in namespace {self.namespace!r} (being created)")
        (magic, version, flags, cap, maxmsg, vis_ns, maxdel, nslots, created, data_off,
         _nl, _n, dl, dlq) = L.STATIC.unpack_from(mm, L.STATIC_OFF)
        if magic != L.MAGIC:
            if magic == b"\0\0\0\0":
                raise QueueNotFound(f"no queue {self.name!r} in namespace {self.namespace!r} (being created)")
            raise QueueCorrupted(f"segment of queue {self.name!r} is not a shmq queue")
        if version != L.LAYOUT_VERSION:  # another shmq's memory: LayoutMismatch, a QueueCorrupted
            raise mismatch("queue", self.name, self.namespace, version)
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
        self._ring = memoryview(mm)[data_off:data_off + cap].toreadonly()  # what deliveries' views slice
        self._cap = cap
        self._base = data_off
        self.max_message_bytes = maxmsg
        # what it was attached to and with, in one attribute (as ``_opts`` below): created_at, durability,
        # the process slots, the opener of other queues (``__init__``), and the ring's memory, taken chunk
        # by chunk before a record is written there (``memory.py``). (A handle has at most 30 attributes:
        # CPython 3.11 keeps more in a dict of its own, and every attribute read then costs more.)
        self._made = (created / 1e9, L.DURABILITY_NAMES.get(flags & 0xFF, "memory"), nslots, opener,
                      Memory(seg, self._mq, L.MEM_OFF, pinned_bytes(data_off, seg.size), f"queue {self.name!r}"))
        self._logged = self.durability == "wal"
        # the hot paths this handle runs, C's or Python's (``paths.QueuePaths``), and the per-message C calls
        # bound here too, so that put, get and ack read one attribute for them (None: the Python path)
        paths = self.paths = _chosen_paths()
        self._fast_put, self._fast_take, self._fast_ack = paths.put, paths.take, paths.ack
        self._read_settings()
        # the write-ahead log (durability "wal"), and this process's descriptor
        self.wal = Log(self, lane_name(self.name, self._lane))
        # the robust mutex at a fixed address of the mapping, valid until close(): the hot paths lock through it
        # (29 instance attributes: a 30th made put and get 5-10 % slower, docs/DESIGN.md "A signal's exception")
        self._lockp = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(mm, L.MUTEX_OFF)))
        self._segp = self._lockp.value - L.MUTEX_OFF  # the mapping's address, for the C hot paths
        base = queue_segment(self.namespace, self.name, self._lane)
        try:
            ne = open_semaphore(base + NOT_EMPTY)
            try:
                nf = open_semaphore(base + NOT_FULL)
            except BaseException:
                ne.close()
                raise
        except BaseException as e:  # deleted as it was attached, or out of descriptors: let go of what it took
            self._lockp = None
            self.wal.close()
            self._mq.release()
            self._ring.release()
            self._seg.close()
            self._seg = None
            if isinstance(e, posix_ipc.ExistentialError):
                raise QueueNotFound(f"queue {self.name!r} in namespace {self.namespace!r} was deleted") from None
            raise
        self._ne, self._nf = ne, nf

    def _read_settings(self):
        """Take the settings a live queue can change (``Broker.update_queue``) from its
        header into this handle (the hot paths read the handle's copies)."""
        mm = self._mm
        vis_ns, maxdel = self._mq[_W_VIS], self._mq[_W_MAXDEL]
        dlq = header.dead_letter_queue(mm)
        (levels, aging_ms, ttl_ns, window_ns, retry_ns, backoff, retry_max_ns, lanes, lane) = L.OPTS.unpack_from(
            mm, L.OPTS_OFF)
        self._vis_ns = vis_ns
        self.visibility_timeout = vis_ns / 1e9
        self.max_deliveries = maxdel or None
        if dlq != getattr(self, "dead_letter_queue", dlq) and self._dlq is not None:
            self._dlq.close()  # (attached on the next dead letter)
            self._dlq = None
        self.dead_letter_queue = dlq
        # one attribute for the options (the properties below): CPython 3.11 keeps an
        # instance's attributes in a shared-keys table, and the hot paths' attribute
        # loads are fast, only while a class's instances have at most 30 of them
        # (and the settings' generation they were read at: ``_settings_due``; then the lifetime word: ``lifetime``)
        self._opts = (levels or 1, aging_ms * 1_000_000, ttl_ns, window_ns, retry_ns, backoff or 1.0, retry_max_ns,
                      L.dedup_offset(self._nslots), lanes or 1, lane, self._mq[_W_SETTINGS_GEN],
                      self._mq[L.I_LIFETIME])
        # never the plain FIFO take: the leveled take (levels), or a check of every expiry (a queue TTL)
        self._general = (levels or 1) > 1 or bool(ttl_ns)

    def _refresh_settings(self):
        """``_read_settings`` under the queue's lock (an update writes under it); a lock
        that stays busy past its timeout leaves the copy as it was, for the next look."""
        if self._lockp is None:
            return
        try:
            self._acquire()
        except LockTimeout:
            return
        try:
            self._read_settings()
        finally:
            _unlock(self._lockp)

    def _settings_due(self):
        """Read the settings again if they changed since this handle last did (one word
        read: the slow paths call this, as sleeps, nacks, rejects, housekeeping, stats)."""
        if self._lockp is not None and self._mq[_W_SETTINGS_GEN] != self._opts[10]:
            self._refresh_settings()

    def _write_settings(self, vis_ns, maxdel, dlq, aging_ms, ttl_ns, window_ns, retry_ns, backoff, retry_max_ns,
                        expires_ms=None):
        """Store changed settings in the header (``Broker.update_queue``): each word one
        aligned store, the dead-letter queue's name under the lock as every reader of it.
        ``expires_ms``: lane 0's (``lifetime.set_expires``: a declare renews it too)."""
        mq = self._mq
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            header.store_settings(self._mm, mq, vis_ns, maxdel, dlq, aging_ms, ttl_ns, window_ns, retry_ns, backoff,
                                  retry_max_ns)
            if expires_ms is not None:
                lifetime.set_expires(self, expires_ms)
            header.settings_moved(mq)
            for q in list(_live_queues):  # this process's handles on the queue see them at once
                if (q is self or q._lockp is not None and q._lane == self._lane and q.name == self.name
                        and q.namespace == self.namespace):
                    q._read_settings()
        finally:
            _unlock(self._lockp)

    def _visibility_now(self) -> float:
        """The visibility timeout, looked up again if this handle's copy may be stale."""
        self._settings_due()
        return self.visibility_timeout

    _levels = property(lambda self: self._opts[0])  # priority levels
    _aging_ns = property(lambda self: self._opts[1])  # priority aging (0: strict)
    _ttl_ns = property(lambda self: self._opts[2])  # message_ttl (0: none)
    _dedup_window_ns = property(lambda self: self._opts[3])
    _retry_ns = property(lambda self: self._opts[4])  # retry_delay
    _backoff = property(lambda self: self._opts[5])  # retry_backoff
    _retry_max_ns = property(lambda self: self._opts[6])  # retry_delay_max (0: none)
    _dedup_off = property(lambda self: self._opts[7])  # the dedup table's byte offset
    _nlanes = property(lambda self: self._opts[8])  # the queue's lanes (``lanes.py``); 1: one ring
    _lane = property(lambda self: self._opts[9])  # which of them this handle's segment is
    _id_step = _nlanes  # how far apart this segment's consecutive message ids are
    max_bytes = property(lambda self: self._cap, doc="The ring's size in bytes.")
    created_at = property(lambda self: self._made[0], doc="When the queue was made (seconds since the epoch).")
    durability = property(lambda self: self._made[1], doc='"memory", "snapshot" or "wal".')
    _nslots = property(lambda self: self._made[2])  # rows of the process table
    _opener = property(lambda self: self._made[3])  # opener(namespace, name) of other queues, or None
    _memory = property(lambda self: self._made[4])  # the ring's chunks (``memory.Memory``)
    # a large put's pacing (``Producing._pace``): the head at which it last found the consumers idle, how many
    # such waits in a row, and how many puts go before the next wait
    _paced, _pace_idle, _pace_skip = -1, 0, 0
    _reuse = property(lambda self: L.reuse_after(self._cap))  # how far into a lap an empty queue starts the next

    def __reduce__(self):
        return (_reattach, (self.namespace, self.name, self._lane, self._opener))

    def _sibling(self):
        """Another handle on this queue, as this one was opened."""
        return Queue(self.namespace, self.name, self._lane, self._opener)

    def _open_queue(self, name: str):
        """A handle on queue ``name`` of this namespace (through the opener handed in);
        QueueNotFound when there is none."""
        opener = self._opener
        return Queue(self.namespace, name) if opener is None else opener(self.namespace, name)

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
        if self._lockp is None:
            return
        if self._unwaits:  # sleeps still counted: uncounted now, if the lock comes within its grace
            try:
                self._acquire(0)
                _unlock(self._lockp)
            except LockTimeout:
                pass  # (the reaper uncounts them when this process dies)
        self._lockp = None
        self._slot = -1  # (the plain get checks only this before its C call)
        self.wal.close()
        self._mq.release()
        self._ring.release()  # (views sliced from it stay valid: the mapping goes with the last of them)
        self._ne.close()
        self._nf.close()
        self._seg.close()
        if self._dlq is not None:
            self._dlq.close()
        _live_queues.discard(self)

    # ------------------------------------------------------------------ locking
    def _acquire(self, deadline=None, timeout_error=LockTimeout):
        """Take the lock, repairing after a dead holder. ``deadline``: see ``mutex.lock_slow``;
        past it, ``timeout_error``. An exception that leaves it leaves the lock free."""
        lp = self._lockp
        if lp is None:
            raise self._closed()
        try:
            rc = _trylock(lp)
            if rc:
                self._lock_contended(rc, deadline, timeout_error)
            if self._unwaits:
                owed, self._unwaits = self._unwaits, ()
                mq = self._mq
                for side, waited in owed:
                    waits.unregister(mq, self._slot, side, waited)
                waits.lane_sleepers(mq)  # (a laned queue's sleepers, in its lane 0, as the reaper sets it)
        except Reentered:
            raise
        except BaseException:
            let_go(lp)
            raise

    def _unwait_later(self, side, waited):
        """A sleep on ``side`` is over, but the lock that uncounts it could not be had by
        the caller's deadline (a live holder kept it: SIGSTOP, a debugger): it is uncounted
        at this handle's next ``_acquire`` (or by the reaper, should this process die)."""
        if waited:
            self._unwaits = (*self._unwaits, (side, waited))

    def _acquire_to_unwait(self, deadline, side, waited):
        """``_acquire`` by a call that uncounts its sleep on ``side`` (``waited``) next,
        under this lock; should the lock not come by ``deadline`` (LockTimeout), the sleep
        is left to ``_unwait_later``."""
        try:
            self._acquire(deadline)
        except LockTimeout:
            self._unwait_later(side, waited)
            raise

    def _repair_held_lock(self):
        """A C hot path took the lock from a dead holder: repair, then let it go."""
        try:
            self._repair()
        finally:
            _mark_consistent(self._lockp)
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
                _mark_consistent(self._lockp)

    def _closed(self):
        return ShmqError(f"queue handle {self.name!r} is closed")

    def _gone(self):
        return QueueNotFound(f"queue {self.name!r} in namespace {self.namespace!r} was deleted")

    def _repair(self):
        housekeeping.repair(self)

    def _my_slot(self):
        """This process's row in the process table (registered on first need). Lock held."""
        slot = self._slot
        if slot >= 0:
            return slot
        slot = slots.claim(self._mm, self._nslots, *current_identity())
        if slot < 0:
            raise ShmqError(f"queue {self.name!r}: all {self._nslots} process slots are taken")
        self._slot = slot
        return slot

    def _procs_sum(self, field) -> int:
        """The sum of word ``field`` over the process table (the totals' shares)."""
        return slots.total(self._mq, self._nslots, field)

    def _sleep(self, sem, deadline, side):
        """Sleep one slice on ``sem`` as a registered waiter of ``side``. Returns 2 if woken
        by a post, 1 if not. If the sleep is interrupted (KeyboardInterrupt from a
        signal), the registration is undone before the exception propagates."""
        try:
            woke = waits.sleep_slice(sem, deadline, _mono(), self._mq[I_NEXT_DEADLINE])
        except BaseException:
            try:
                self._acquire()
            except LockTimeout:
                self._unwait_later(side, 1)
            else:
                try:
                    waits.unregister(self._mq, self._slot, side, 1)
                finally:
                    _unlock(self._lockp)
            raise
        self._settings_due()
        return woke

    def _dead_letter_target(self):
        if self._dlq is None:
            self._refresh_settings()  # (the name is read under the lock that its writer holds)
            if self.dead_letter_queue is None:  # taken away meanwhile (``update_queue``)
                raise QueueNotFound(f"queue {self.name!r} has no dead-letter queue")
            self._dlq = self._open_queue(self.dead_letter_queue)
        return self._dlq

    def _housekeep(self) -> int:
        """Do the due work now: expire leases, wake delayed messages, return the leases
        of dead processes. Returns how many messages became ready again."""
        return housekeeping.housekeep(self, _mono())

    # ------------------------------------------------------------------ consumers (``lifetime``)
    def add_consumer(self) -> int:
        """Register this process as a consumer of the queue (RabbitMQ's basic.consume); returns
        the queue's consumer count, every process's. A process that dies gives its consumers
        back when housekeeping reaps it. QueueNotFound if the queue was deleted."""
        return lifetime.add_consumer(self)

    def remove_consumer(self) -> int:
        """Unregister one consumer of this process; returns the count left, every process's.
        An ``auto_delete`` queue that this leaves with none is deleted, with its bindings.
        ValueError if this process has none registered."""
        return lifetime.remove_consumer(self)

    # ------------------------------------------------------------------ admin
    def purge(self, delayed: bool = False) -> int:
        """Drop every ready message; with ``delayed``, every delayed one too (those put
        with a delay, or waiting out a retry delay, not due yet). Leased ones stay with
        their consumers. Returns how many were dropped."""
        mq, cap, base = self._mq, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            tail = mq[I_TAIL]
            if delayed:  # delayed records lie anywhere behind the frontier: the whole ring is walked
                ready = [(pos, w) for pos, w in ring.records(mq, cap, base, mq[I_HEAD], tail)
                         if mq[w] & 0xFF in (_READY, _DELAYED)]
            else:
                start = mq[I_READY_POS] if mq[I_REQUEUED] else mq[I_FRONTIER]
                ready = [(pos, w) for pos, w in ring.records(mq, cap, base, start, tail) if mq[w] & 0xFF == _READY]
            if self._logged and ready:  # log the drops first
                self.wal.append(b"".join(_encode_ack_entry(mq[w + _R_MSG_ID], 0) for _pos, w in ready),
                                grows=False)
            n = len(ready)
            post = takes.purge(mq, cap, base, [w for _pos, w in ready], tail)
        finally:
            _unlock(self._lockp)
        if post:
            self._nf.release()
        return n

    def stats(self) -> QueueStats:
        """A consistent snapshot of the queue's counters."""
        self._settings_due()
        mq, mm = self._mq, self._mm
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            hot = dict(zip(L.HOT_FIELDS, _HOT_UNPACK(mm, L.HOT_OFF)))
            wrap, voided = mq[L.I_WRAP], mq[L.I_VOIDED]
            counters = dict(zip(L.COUNTER_FIELDS, L.COUNTERS.unpack_from(mm, L.COUNTERS_OFF)))
            counters["acked_total"] += self._procs_sum(L.P_ACKED)
            counters["redelivered_total"] += self._procs_sum(L.P_REDELIVERED)
            age = 0.0
            by_level = (hot["ready"],)
            groups = 0
            if self._general or mq[L.I_SPECIAL]:
                ready, _expired, busy, _end, _s, _c = scheduling._walk(self, _wall())
                levels = [0] * self._levels
                for rec in ready:
                    levels[min(rec[2], self._levels - 1)] += 1
                by_level = tuple(levels)
                groups = len(busy)
            if hot["ready"]:
                start = hot["ready_pos"] if hot["requeued"] else hot["frontier"]
                for _pos, w in ring.records(mq, self._cap, self._base, start, hot["tail"]):
                    if mq[w] & 0xFF == _READY:
                        age = max(0.0, (_wall() - mq[w + L.R_ENQ]) / 1e9)
                        break
        finally:
            _unlock(self._lockp)
        return QueueStats(
            ready=hot["ready"],
            in_flight=hot["in_flight"],
            oldest_ready_age_s=age,
            bytes_used=ring.bytes_used(hot["head"], hot["tail"], self._cap, wrap),
            max_bytes=self._cap,
            enqueued_total=(hot["next_id"] - 1 - self._lane) // self._id_step - voided,
            acked_total=counters["acked_total"],
            redelivered_total=counters["redelivered_total"],
            dead_lettered_total=counters["dead_lettered_total"],
            consumers_waiting=hot["cwait"],
            producers_waiting=hot["pwait"],
            delayed=hot["delayed"],
            purged_total=counters["purged_total"],
            expired_total=mq[L.I_EXPIRED_TOTAL],
            ready_by_priority=by_level,
            groups_in_flight=groups,
            dead_letter_depth=self._dead_letter_depth(),
            bytes_held=self._memory.held(),
            consumers=lifetime.consumers(self),
        )

    def _dead_letter_depth(self):
        """Ready messages in the dead-letter queue (None without one, or when it is gone)."""
        if not self.dead_letter_queue:
            return None
        try:
            dlq = self._dead_letter_target()
            if dlq.deleted:
                self._dlq = None
                return None
            return sum(lane._mq[I_READY] for lane in getattr(dlq, "_lanes", (dlq,)))
        except QueueNotFound:
            return None

    # ------------------------------------------------------------------ snapshots
    def settings(self) -> dict:
        """The queue's settings, as ``create_queue`` takes them."""
        self._settings_due()
        return {
            "max_bytes": self.max_bytes, "max_message_bytes": self.max_message_bytes,
            "visibility_timeout": self.visibility_timeout, "max_deliveries": self.max_deliveries,
            "dead_letter_queue": self.dead_letter_queue, "durability": self.durability,
            "priorities": self._levels, "priority_aging": self._aging_ns / 1e9 if self._aging_ns else None,
            "message_ttl": self._ttl_ns / 1e9 if self._ttl_ns else None,
            "dedup_window": self._dedup_window_ns / 1e9, "retry_delay": self._retry_ns / 1e9,
            "retry_backoff": self._backoff, "retry_delay_max": self._retry_max_ns / 1e9 if self._retry_max_ns else None,
            "lanes": self._nlanes, **lifetime.settings(self),
        }

    def _export_messages(self, rotate_wal: bool = False) -> list[tuple[int, int, int, bytes, bytes]]:
        """Every message not yet settled, as (id, attempt, enqueued_ns, encoded headers,
        body), oldest first. Leased and delayed ones are included with their attempt
        count (restored as ready, they are delivered again). The lock is held only to
        copy the used part of the ring (and, with ``rotate_wal``, to start the next log
        generation, so the older logs hold nothing the copy does not); records are
        parsed from the copy."""
        mq, mm, cap, base = self._mq, self._mm, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            head, tail = mq[I_HEAD], mq[I_TAIL]
            if rotate_wal:
                self.wal.rotate()
            if tail - head == 0:
                return []
            copy = ring.copy_used(mm, base, cap, head, tail)
        finally:
            _unlock(self._lockp)
        out = []
        for o, (status, _length, bl, hl, _f, msg_id, enq, _d) in ring.copied_records(copy, cap, head, tail):
            if status & 0xFF in (_READY, _LEASED, _DELAYED):
                b = o + _REC
                out.append((msg_id, status >> 32, enq, bytes(copy[b:b + hl]), bytes(copy[b + hl:b + hl + bl])))
        return out

    def _import_messages(self, messages, once: int = 0, skip_present: bool = False) -> int:
        """Append messages keeping their (id, attempt, enqueued_ns, headers, body) — for
        restoring a snapshot. All or nothing; QueueFull if they do not fit now. Returns
        how many were appended.

        ``once``: a dedup hash (``extension.dedup_hash``): if the table knows it, nothing
        is appended (returns 0); else it is remembered with the append, under the same
        repair rule as a put's (a token past the next id, taken by the commit).
        ``skip_present``: a message whose id the queue holds (ready, leased or delayed),
        seen under the same lock hold as the append, is not appended."""
        items = [(body, hraw, L.record_size(len(hraw), len(body)), msg_id, attempt, enq)
                 for msg_id, attempt, enq, hraw, body in messages]
        if not items:
            return 0
        pause = 0
        while True:
            n = self._try_import(items, once, skip_present)
            if n is not None:
                return n
            pause = self._await_fills(None, pause)

    def _try_import(self, items, once, skip_present):
        """``_import_messages``' locked attempt: how many were appended, or None while fills
        are under way (``layout.FILL_OFF``: restored messages do not go after them)."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            if mq[L.I_FILL] > mq[I_TAIL]:
                return None
            if once and dedup.lookup(mq, self._dedup_off, once, _wall()):
                return 0
            if skip_present:
                held = {mq[w + _R_MSG_ID] for _pos, w in ring.records(mq, cap, base, mq[I_HEAD], mq[I_TAIL])
                        if mq[w] & 0xFF in (_READY, _LEASED, _DELAYED)}
                items = [item for item in items if item[3] not in held]
                if not items:
                    return 0
            head, tail = mq[I_HEAD], mq[I_TAIL]
            if head == tail and (tail % cap or tail >= L.POS_LIMIT):
                tail = head = self._new_lap(tail)
            end = self._placement_end(items, tail)
            if not ring.fits(head, tail, end, cap, mq[L.I_WRAP]):
                raise QueueFull(f"queue {self.name!r} has no room for {len(items)} restored messages")
            self._memory.ensure_arc(base, cap, tail, end)  # StorageError: nothing written
            pos = tail
            top = 0
            wall, mono = _wall(), _mono()
            ready = delayed = special = 0
            first_due = L.NEVER
            for body, hraw, size, msg_id, attempt, enq in items:
                pos, a = ring.place(mm, base, cap, pos, size)
                flags = extension.flags_of(hraw)
                state, due = _READY, 0
                if flags & L.FLAG_WALK:
                    special |= 3 if extension.decode(hraw)[0].due_ns else 1
                if flags:
                    ext = extension.decode(hraw)[0]
                    if ext.due_ns > wall and attempt == 0:  # a delayed put not yet due
                        state, due = _DELAYED, mono + (ext.due_ns - wall)
                        first_due = min(first_due, due)
                _write_record(mm, a, L.status_word(state, L.NO_HOLDER, attempt), size, body, hraw, msg_id, enq,
                              flags, due)
                if state == _READY:
                    ready += 1
                else:
                    delayed += 1
                top = max(top, msg_id)
                pos += size
            step = self._id_step
            next_id = max(mq[I_NEXT_ID], top + step)  # (a laned queue imports into lane (id - 1) % lanes)
            if once:  # the token is the next id, which the commit below takes
                dedup.remember(mq, self._dedup_off, once, next_id, wall + self._dedup_window_ns)
                next_id += step
            post = ring.commit_import(mq, pos, next_id, ready, delayed, special, first_due)
        finally:
            _unlock(self._lockp)
        for _ in range(post):
            self._ne.release()
        return len(items)

    def _mark_deleted(self):
        """Flag the queue deleted (for ``Broker.delete_queue``) and wake every sleeper."""
        self._acquire()
        try:
            header.set_deleted(self._mq)
            waiters = self._mq[I_CWAIT] + self._mq[I_PWAIT]
        finally:
            _unlock(self._lockp)
        for _ in range(waiters + 1):
            self._ne.release()
            self._nf.release()


def _reattach(namespace, name, lane=0, opener=None):
    return Queue(namespace, name, lane, opener)
