"""Laned queues (``create_queue(..., lanes=K)``): one queue made of K rings, each with a
lock of its own, so that producers and consumers on many cores stop queueing for one lock.

Strategy: a lane is a whole queue segment (a ``Queue``: ring, lock, process table,
leases, housekeeping, dead letters, log), made and deleted with the queue and named
after it (``names.lane_name``: lane 0 is the segment every queue has). Lane j's
message ids are j + 1, j + 1 + K, j + 1 + 2K, ..., so ids stay unique in the queue and
say their lane. A ``LanedQueue`` handle only routes: a put goes to the handle's own lane
(a message with a group or a dedup id to the lane of a hash of it, so that the group's
order and the dedup window hold as on one ring; a full lane spills into the others
before a put waits), a get takes from the handle's home lane first, then from the others
in turn. A delivery belongs to the lane that leased it, so acks, nacks, lease lapses,
redelivery of a dead process's messages and dead letters are each lane's own business,
and every lane is as crash-safe as a queue. Handles take lanes in turn (a producer's and
a consumer's turn each count in lane 0), so P producers and P consumers of a K = P queue
pair up one lane each. Sleepers: a get that finds every lane empty counts itself in lane
0 and sleeps on lane 0's semaphore; a put into another lane that sees sleepers counted
there wakes one. Order is FIFO per lane, not across lanes (SQS standard queues'
best-effort ordering).
"""

import os
import threading
import time
import weakref
import zlib
from functools import partial

from ...model import arrays
from ...errors import DeliveryExpired, LockTimeout, QueueEmpty, QueueFull
from ...model.messages import QueueStats
from ..shm import layout as L
from ..shm import header, waits
from .consume import LocalConsumer, Messages, take_capped
from .queue import Queue
from ..shm.mutex import unlock as _unlock

__all__ = ["LanedQueue", "attach", "MAX_LANES"]

MAX_LANES = 64
_mono = time.monotonic_ns
_CONSUMERS = waits.CONSUMERS
_I_READY, _I_DELETED, _I_NEXT_DEADLINE, _I_NEXT_LIVENESS = L.I_READY, L.I_DELETED, L.I_NEXT_DEADLINE, L.I_NEXT_LIVENESS
_I_SLEEPERS = L.I_LANE_SLEEPERS


def attach(namespace: str, name: str, lane_class=Queue, **extra):
    """A handle on queue ``name``: a ``Queue``, or a ``LanedQueue`` when it has lanes.
    ``lane_class(namespace, name, lane=, opener=, **extra)`` opens one lane (the
    serialized queue's class, for one); each lane is handed this function to open other
    queues with (its dead-letter queue, reply queues)."""
    first = lane_class(namespace, name, lane=0, opener=attach, **extra)
    if first._nlanes <= 1:
        return first
    try:
        return LanedQueue(first, lane_class, extra)
    except BaseException:
        first.close()
        raise


_live = weakref.WeakSet()


def _after_fork_in_child():
    for q in list(_live):
        q._put_lane = q._order = None  # the child is another producer and consumer: it takes its own turns


os.register_at_fork(after_in_child=_after_fork_in_child)


def _reattach(namespace, name, lane_class, extra):
    return attach(namespace, name, lane_class, **extra)


def _turn(q, word) -> int:
    """Take the next turn of counter ``word`` in lane 0 (its lock held for it)."""
    q._acquire()
    try:
        return header.turn(q._mq, word)
    finally:
        _unlock(q._lockp)


def _put_one(body, headers, priority, delay, ttl, group, dedup_id, q, timeout):
    """``LanedQueue.put``'s call of one lane's put (``_put_into``'s ``call``)."""
    return q.put(body, headers, timeout, priority, delay, ttl, group, dedup_id)


class LanedQueue:
    """A handle on a queue with lanes: the ``Queue`` API over its K lanes (see the module's
    docstring). Pickles by name, as a ``Queue`` does."""

    def __init__(self, first: Queue, lane_class=Queue, extra=None):
        self._class, self._extra = lane_class, extra or {}
        k = first._nlanes
        self._nlanes = k
        self._lanes = [first]
        try:
            for j in range(1, k):
                self._lanes.append(lane_class(first.namespace, first.name, lane=j, opener=first._opener, **self._extra))
        except BaseException:
            for q in self._lanes[1:]:
                q.close()
            raise
        self._put_lane = None  # this handle's own lane: taken at its first put
        self._pending = 0  # with a prefetch cap: deliveries being taken by gets under it (consume.take_capped)
        self._order = None  # its home lane first, then the others: taken at its first get
        self._held = None
        _live.add(self)

    # ------------------------------------------------------------------ what it is
    def __getattr__(self, attr):
        # the queue's settings, as every lane has them: name, namespace, durability, ...
        if attr in ("namespace", "name", "max_message_bytes", "visibility_timeout", "max_deliveries",
                    "dead_letter_queue", "durability", "created_at", "_levels", "serializer", "paths"):
            return getattr(self.__dict__["_lanes"][0], attr)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    @property
    def lock_timeout(self):
        """How long a call with no timeout of its own waits for a lane's lock (as ``Queue``'s)."""
        return self._lanes[0].lock_timeout

    @lock_timeout.setter
    def lock_timeout(self, value):
        for q in self._lanes:
            q.lock_timeout = value

    @property
    def max_bytes(self) -> int:
        return sum(q.max_bytes for q in self._lanes)

    @property
    def deleted(self) -> bool:
        return self._lanes[0].deleted

    def __repr__(self):
        return f"<shmq.Queue {self.namespace}/{self.name} lanes={self._nlanes}>"

    def __reduce__(self):
        first = self._lanes[0]
        return (_reattach, (first.namespace, first.name, self._class, self._extra))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Detach from every lane in this process. The queue itself stays."""
        for q in self._lanes:
            q.close()

    def settings(self) -> dict:
        """The queue's settings, as ``create_queue`` takes them."""
        return {**self._lanes[0].settings(), "max_bytes": self.max_bytes}

    # ------------------------------------------------------------------ routing
    def _own_lane(self) -> Queue:
        if self._put_lane is None:
            self._put_lane = _turn(self._lanes[0], L.I_PRODUCER_TURNS) % self._nlanes
        return self._lanes[self._put_lane]

    def _lane_of(self, key) -> Queue:
        """The lane of a group or a dedup id: the same lane for the same key, everywhere."""
        raw = key if isinstance(key, (bytes, bytearray)) else str(key).encode()
        return self._lanes[zlib.crc32(raw) % self._nlanes]

    def _lane_order(self) -> list:
        if self._order is None:
            home = _turn(self._lanes[0], L.I_CONSUMER_TURNS) % self._nlanes
            self._order = self._lanes[home:] + self._lanes[:home]
        return self._order

    def _woken(self, q: Queue, n: int) -> None:
        """A put of ``n`` ready messages into lane ``q`` is done: wake the sleepers counted in
        lane 0 (lane 0's own puts already did)."""
        first = self._lanes[0]
        if q is not first and first._mq[_I_SLEEPERS]:  # (a word on a quiet line: no bounce per put)
            first._acquire()
            try:
                post = waits.owed_posts(first._mq, _CONSUMERS, n)
            finally:
                _unlock(first._lockp)
            for _ in range(post):
                first._ne.release()

    # ------------------------------------------------------------------ put
    def _put_into(self, call, pinned: Queue | None, timeout):
        """``call(lane, timeout)`` into the pinned lane, or into this handle's own lane, then
        (it being full) into the others without waiting, then into its own, waiting."""
        if pinned is not None:
            return pinned, call(pinned, timeout)
        own = self._own_lane()
        if timeout == 0 or len(self._lanes) == 1:
            order = [own] + [q for q in self._lanes if q is not own]
        else:
            try:
                return own, call(own, 0)
            except QueueFull:
                order = [q for q in self._lanes if q is not own]
        for q in order:
            try:
                return q, call(q, 0)
            except QueueFull:
                pass
        if timeout == 0:
            raise QueueFull(f"queue {self.name!r} is full")
        return own, call(own, timeout)

    def put(self, body, headers=None, timeout=None, priority=0, delay=0.0, ttl=None, group=None, dedup_id=None,
            wait=True) -> int:
        pinned = None
        if group is not None or dedup_id is not None:
            pinned = self._lane_of(group if group is not None else dedup_id)
        elif timeout != 0:  # the plain case: one call into the own lane, the spill only when it is full
            own = self._put_lane
            own = self._lanes[own] if own is not None else self._own_lane()
            try:
                msg_id = own.put(body, headers, 0, priority, delay, ttl)
            except QueueFull:
                pass
            else:
                if not delay:
                    self._woken(own, 1)
                return msg_id
        q, msg_id = self._put_into(  # (a partial: a lambda here would make put's locals cells)
            partial(_put_one, body, headers, priority, delay, ttl, group, dedup_id), pinned, timeout)
        if not delay:
            self._woken(q, 1)
        return msg_id

    def put_nowait(self, body, headers=None) -> int:
        return self.put(body, headers, 0)

    def put_array(self, a, headers=None, timeout=None, **options) -> int:
        """``Queue.put_array`` (the array into a lane as ``put`` puts a body)."""
        body, headers = arrays.to_message(a, headers)
        return self.put(body, headers, timeout, **options)

    def put_many(self, bodies, timeout=None, priority=0, delay=0.0, ttl=None, headers=None, wait=True) -> list[int]:
        """All of them into one lane, all or nothing (the own lane, or another with room)."""
        if type(bodies) is not list:
            bodies = list(bodies)
        q, ids = self._put_into(lambda q, t: q.put_many(bodies, t, priority, delay, ttl, headers), None, timeout)
        if ids and not delay:
            self._woken(q, len(ids))
        return ids

    def reserve(self, size, headers=None, timeout=None):
        """``Queue.reserve`` in this handle's own lane (its sleepers woken as the block ends)."""
        own = self._own_lane()
        return _LanedReservation(own.reserve(size, headers, timeout), lambda: self._woken(own, 1))

    def flush(self) -> None:
        """Nothing to wait for: a local put is confirmed when it returns."""

    def _append(self, items, timeout, options=None):
        own = self._own_lane()
        ids = own._append(items, timeout, options)
        self._woken(own, len(ids))
        return ids

    # ------------------------------------------------------------------ get
    def get(self, timeout=None, visibility_timeout=None, ack=True, copy=True):
        return self._take(0, timeout, visibility_timeout, None, ack, copy)

    def get_nowait(self, visibility_timeout=None, ack=True, copy=True):
        return self._take(0, 0, visibility_timeout, None, ack, copy)

    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None, max_bytes=None, ack=True, copy=True):
        if type(max_messages) is not int or max_messages < 1:
            raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
        return self._take(max_messages, timeout, visibility_timeout, max_bytes, ack, copy)

    def _take(self, maxn, timeout, visibility_timeout, max_bytes, ack, copy):
        """The home lane; then each other that looks ready; then a spin on the home lane
        (looking at the others now and then); then each lane that looks ready; then a
        sleep counted in lane 0, looked again at before it starts. A lane is taken from
        (its lock taken) only when its words, read without the lock, say it may have
        something: a ready message, a deadline or a liveness check due (``_look``)."""
        if self._held is not None and ack:
            return self._take_capped(maxn, timeout, visibility_timeout, max_bytes, copy)
        return self._take_free(maxn, timeout, visibility_timeout, max_bytes, ack, copy)

    def _take_free(self, maxn, timeout, visibility_timeout, max_bytes, ack, copy, listed=False):
        """``_take`` without the prefetch cap (``listed``: ``maxn`` at most, as a list, even one)."""
        if listed and maxn == 1:
            return [self._take_free(0, timeout, visibility_timeout, max_bytes, ack, copy)]
        order = self._order or self._lane_order()
        got = order[0]._poll(maxn, visibility_timeout, max_bytes, ack, copy)
        if got is None:  # the home lane is empty: another that looks ready (fan-in: the producers' lanes)
            got = self._look(order, maxn, visibility_timeout, max_bytes, ack, copy, 1)
        if got is not None:
            return got
        deadline = None if timeout is None else _mono() + waits.seconds_ns(timeout, "timeout")
        first = self._lanes[0]
        spun = timeout == 0
        while True:
            if not spun:
                spun = True
                self._spin(order, deadline)
            elif deadline is None or _mono() < deadline:
                waited = 0
                first._acquire()
                try:
                    if first._mq[_I_DELETED]:
                        raise first._gone()
                    waits.register(first._mq, first._my_slot(), _CONSUMERS)
                    waits.lane_sleepers(first._mq)  # (lane 0's sleepers are all gets like this)
                finally:
                    _unlock(first._lockp)
                try:
                    got = self._look(order, maxn, visibility_timeout, max_bytes, ack, copy)
                    if got is not None:  # (counted in first: a put from now on wakes this sleep)
                        return got
                    waited = waits.sleep_slice(first._ne, deadline, _mono(),
                                               min(q._mq[L.I_NEXT_DEADLINE] for q in order))
                finally:
                    try:
                        first._acquire()
                    except LockTimeout:  # a holder kept lane 0's lock: uncounted at its next lock hold
                        first._unwait_later(_CONSUMERS, waited or 1)
                    else:
                        try:
                            waits.unregister(first._mq, first._slot, _CONSUMERS, waited)
                            waits.lane_sleepers(first._mq)
                        finally:
                            _unlock(first._lockp)
            got = self._look(order, maxn, visibility_timeout, max_bytes, ack, copy)
            if got is not None:
                return got
            if deadline is not None and _mono() >= deadline:
                raise QueueEmpty(f"queue {self.name!r} is empty")

    def _look(self, order, maxn, visibility_timeout, max_bytes, ack, copy, start=0):
        """One take from each lane, in order (from ``start``), that looks ready; None if none gave any."""
        now = _mono()
        for q in order[start:]:
            mq = q._mq
            if mq[_I_READY] or now >= mq[_I_NEXT_DEADLINE] or now >= mq[_I_NEXT_LIVENESS] or mq[_I_DELETED]:
                got = q._poll(maxn, visibility_timeout, max_bytes, ack, copy)
                if got is not None:
                    return got
        return None

    def _spin(self, order, deadline) -> None:
        """Poll the home lane's ready count briefly before sleeping (``waits.spin``'s
        backoff), the others' only every 32nd look: a spinner reads a line that its own
        producer writes, not every producer's."""
        home, mqs = order[0]._mq, [q._mq for q in order[1:]]
        now = _mono()
        yield_at = now + waits.SPIN_NS // 5
        end = now + waits.SPIN_NS
        if deadline is not None and deadline < end:
            end = deadline
        looks = 0
        while now < end:
            if home[_I_READY] or home[_I_DELETED]:
                return
            looks += 1
            if not looks & 31:
                for mq in mqs:
                    if mq[_I_READY]:
                        return
            if now > yield_at:
                waits._sched_yield()
            now = _mono()

    # prefetch (``consume``): one cap over every lane, the lanes counting their settles in it
    def _set_prefetch(self, n: int | None) -> None:
        if n is None:
            self._held = None
        else:
            self._prefetch = n
            if self._held is None:
                self._held, self._held_cv = set(), threading.Condition()
        for q in self._lanes:
            q._held = self._held
            if n is not None:
                q._held_cv = self._held_cv
                q._prefetch = n

    def _take_capped(self, maxn, timeout, visibility_timeout, max_bytes, copy):
        got = take_capped(self, maxn or 1, timeout, self._drop_lapsed,
                          lambda room, left: self._take_free(room, left, visibility_timeout, max_bytes, True, copy,
                                                             listed=True))
        return got if maxn else got[0]

    def _drop_lapsed(self) -> None:
        held = self._held
        for q, ds in self._by_lane(list(held)).items():
            q._acquire()
            try:
                held.difference_update(d for d in ds if q._leased_word(d) < 0)
            finally:
                _unlock(q._lockp)

    def messages(self, timeout: float | None = None, visibility_timeout: float | None = None, copy: bool = True):
        """``Queue.messages`` over every lane: each step acks, then ``get``s (the Python step)."""
        return Messages(self, timeout, visibility_timeout, copy)

    def consume(self, prefetch: int = 100, visibility_timeout: float | None = None):
        """``Queue.consume`` over every lane."""
        if type(prefetch) is not int or prefetch < 1:
            raise ValueError(f"prefetch must be a positive int, not {prefetch!r}")
        if visibility_timeout is not None:
            waits.seconds_ns(visibility_timeout, "visibility_timeout")
        return LocalConsumer(self._sibling(), prefetch, visibility_timeout)

    def _sibling(self):
        first = self._lanes[0]
        return attach(first.namespace, first.name, self._class, **self._extra)

    def peek(self, max_messages: int = 10) -> list:
        """Up to ``max_messages`` ready messages, oldest first across the lanes."""
        out = []
        for q in self._lanes:
            out += q.peek(max_messages)
        out.sort(key=lambda m: (m.enqueued_at, m.id))
        return out[:max_messages]

    # ------------------------------------------------------------------ settle
    def _by_lane(self, deliveries) -> dict:
        lanes = {}
        for d in deliveries:
            q = getattr(d, "_q", None)
            if q is None or q not in self._lanes:
                raise TypeError(f"expected deliveries of queue {self.name!r}, got {d!r}")
            lanes.setdefault(q, []).append(d)
        return lanes

    def _each_lane(self, call, deliveries):
        """``call(lane, its deliveries)`` for each lane; DeliveryExpired (naming every one no
        longer leased) after all lanes were settled."""
        total, expired = 0, None
        for q, ds in self._by_lane(deliveries).items():
            try:
                total += call(q, ds) or 0
            except DeliveryExpired as e:
                expired = e
        if expired is not None:
            raise expired
        return total

    def ack_many(self, deliveries, wait: bool = True) -> int:
        return self._each_lane(lambda q, ds: q.ack_many(ds), deliveries)

    def nack_many(self, deliveries, delay: float | None = None) -> int:
        return self._each_lane(lambda q, ds: q.nack_many(ds, delay), deliveries)

    def reject_many(self, deliveries) -> None:
        self._each_lane(lambda q, ds: q.reject_many(ds), deliveries)

    def _release_many(self, deliveries) -> int:
        return self._each_lane(lambda q, ds: q._release_many(ds), deliveries)

    # ------------------------------------------------------------------ admin
    def purge(self, delayed: bool = False) -> int:
        return sum(q.purge(delayed) for q in self._lanes)

    def stats(self) -> QueueStats:
        """The lanes' counters added up (each lane's a consistent snapshot of its own)."""
        each = [q.stats() for q in self._lanes]
        total = {f: sum(getattr(s, f) for s in each) for f in (
            "ready", "in_flight", "bytes_used", "max_bytes", "enqueued_total", "acked_total", "redelivered_total",
            "dead_lettered_total", "consumers_waiting", "producers_waiting", "delayed", "purged_total",
            "expired_total", "groups_in_flight", "bytes_held")}
        return QueueStats(oldest_ready_age_s=max(s.oldest_ready_age_s for s in each),
                          ready_by_priority=tuple(map(sum, zip(*(s.ready_by_priority for s in each)))),
                          dead_letter_depth=each[0].dead_letter_depth, consumers=each[0].consumers, **total)

    def _housekeep(self) -> int:
        return sum(q._housekeep() for q in self._lanes)

    def add_consumer(self) -> int:
        """As ``Queue.add_consumer``: counted in lane 0."""
        return self._lanes[0].add_consumer()

    def remove_consumer(self) -> int:
        """As ``Queue.remove_consumer``: counted in lane 0."""
        return self._lanes[0].remove_consumer()

    def _ready_hint(self) -> bool:
        return any(q._ready_hint() for q in self._lanes)

    def _export_messages(self, rotate_wal: bool = False) -> list:
        out = []
        for q in self._lanes:
            out += q._export_messages(rotate_wal=rotate_wal)
        out.sort(key=lambda m: (m[2], m[0]))  # oldest first, across the lanes
        return out

    def _import_messages(self, messages, once: int = 0, skip_present: bool = False) -> int:
        """Each message into the lane its id says ((id - 1) % lanes), all or nothing per lane
        (``skip_present``: as a lane's, in the lane the id says)."""
        by_lane = {}
        for m in messages:
            by_lane.setdefault((m[0] - 1) % self._nlanes, []).append(m)
        if once:  # one token, remembered in one lane: the messages must be that lane's
            if len(by_lane) != 1:
                raise ValueError("a once-only import into a laned queue takes messages of one lane")
            (j, ms), = by_lane.items()
            n = self._lanes[j]._import_messages(ms, once)
            self._woken(self._lanes[j], n)
            return n
        n = 0
        for j, ms in sorted(by_lane.items()):
            got = self._lanes[j]._import_messages(ms, skip_present=skip_present)
            self._woken(self._lanes[j], got)
            n += got
        return n

    @property
    def _mq(self):  # lane 0's words (the redrive's next id, the dead-letter depth): a queue's own facts
        return self._lanes[0]._mq

    def _mark_deleted(self):
        for q in self._lanes:
            q._mark_deleted()


class _LanedReservation:
    """A lane's ``Reservation``, which wakes the queue's sleepers once it published."""

    __slots__ = ("_r", "_woken")

    def __init__(self, reservation, woken):
        self._r, self._woken = reservation, woken

    id = property(lambda self: self._r.id)

    def __enter__(self):
        return self._r.__enter__()

    def __exit__(self, *exc):
        out = self._r.__exit__(*exc)
        if self._r.id is not None:
            self._woken()
        return out

    def __repr__(self):
        return repr(self._r)
