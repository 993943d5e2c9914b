"""Putting messages: ``put`` (the hot path: C first, then a Python fast path) and the
general append under the lock, which waits for room, places records across the end of
the ring and takes batches all or nothing. Part of ``Queue`` (``queue.py``).
"""

import os
import time
from collections.abc import Iterable, Sequence
from functools import partial

from ...formats import dmsq
from ...errors import MessageTooLarge, LockTimeout, QueueFull, ShmFull
from ...model import arrays
from ...model.headers import encode_headers, per_item
from ...model.messages import as_body, as_buffer, as_bytes
from ..shm import cpaths
from . import extension, housekeeping
from ..shm import dedup, ring, waits
from ..shm import layout as L
from ..shm.layout import I_DELETED, I_HEAD, I_NEXT_ID, I_TAIL
from .reserve import Reservation, Reservations
from ..shm.mutex import FOREVER
from ..shm.mutex import unlock as _unlock

__all__ = ["Producing", "as_bytes", "as_body", "batch_headers", "batch_items"]

Body = bytes | bytearray | memoryview  # what a put takes (a handle with a serializer: any object)
_mono = time.monotonic_ns
_wall = time.time_ns
_REC = L.REC_SIZE
_record_size = L.record_size
_READY, _DELAYED = L.READY, L.DELAYED
_WALK = L.FLAG_WALK
_CONSUMERS, _PRODUCERS = waits.CONSUMERS, waits.PRODUCERS
_encode_put_entry = dmsq.encode_put_entry
_write_record = ring.write_record
_commit = ring.commit
_lock_deadline, _seconds_ns = waits.lock_deadline, waits.seconds_ns
_INT = frozenset({int})
_EMPTY = b""
I_ROOM = L.I_ROOM
_GROW_DUE = L.mem_words(L.MEM_OFF)["grow_due"]
GROW_LOCK_NS = 10_000_000  # the longest a put waits for the lock to allocate ahead (then the next does)
_F_OWNERDEAD, _F_FALLBACK, _F_WAL_MAX = cpaths.OWNERDEAD, cpaths.FALLBACK, cpaths.WAL_MAX_PAYLOAD
_F_BUSY, _F_FULL, _F_SLEEP, _W_REGISTER = cpaths.BUSY, cpaths.FULL, cpaths.SLEEP, cpaths.W_REGISTER
_W_FILL, _FILL_MIN, _I_FILL, _FILLING, _PAD = cpaths.W_FILL, L.FILL_MIN, L.I_FILL, L.FILLING, L.PAD
_I_WRAP, SPILL_WAIT_NS = L.I_WRAP, L.SPILL_WAIT_NS
PACE_IDLE_NS = 1_000_000  # a pacing producer's wait ends once the consumers' head stood still this long (``_pace``)
_sched_yield = os.sched_yield
FILL_PAUSES_S = (0.00005, 0.0002, 0.001, 0.005)  # an append's sleeps while fills it may not follow are under way
SHM_PAUSE_MIN_S, SHM_PAUSE_MAX_S = 0.001, 0.05  # a put's looks for room in a full /dev/shm: growing pauses


class _FillsPending(Exception):
    """An append that may not go after the fills under way (``Producing._room``): it waits."""


def batch_headers(headers, n: int):
    """put_many's ``headers`` encoded: one bytes for a map for all, else a list of ``n``."""
    if isinstance(headers, dict):
        return encode_headers(headers)
    return [encode_headers(h) for h in per_item(headers, n)]


def batch_items(bodies, headers, maxmsg: int, name: str, ext: bytes = b"") -> list:
    """(body, header bytes, record size) of each item of a put_many with ``headers``
    (``headers.per_item``)."""
    bodies = list(bodies)
    items = []
    for body, h in zip(bodies, per_item(headers, len(bodies))):
        hraw = ext + encode_headers(h)
        body = checked_body(body, maxmsg, name)
        items.append((body, hraw, _record_size(len(hraw), len(body))))
    return items


def checked_body(body, maxmsg: int, name: str):
    """A put_many's body as the ring takes it: bytes, or another buffer as a view in one piece
    (``as_body``), of at most ``maxmsg`` bytes (else MessageTooLarge: nothing is put)."""
    if type(body) is not bytes:
        body = as_body(body)
    if len(body) > maxmsg:
        raise MessageTooLarge(f"message body is {len(body)} bytes; queue {name!r} takes at most {maxmsg}")
    return body


class Producing:
    """The put operations of ``Queue``."""

    # (the options are not keyword-only: CPython fills missing keyword-only arguments from a
    # dict, a lookup each, which the plain put would pay on every call)
    def put(self, body: Body, headers: dict | None = None, timeout: float | None = None, priority: int = 0,
            delay: float = 0.0, ttl: float | None = None, group: str | None = None,
            dedup_id: str | bytes | None = None, wait: bool = True) -> int:
        """Append one message; blocks while the queue is full (and a large body a moment
        while the consumers catch up: ``_pace``).

        Returns the message id. Raises QueueFull after ``timeout`` seconds (None: wait
        forever), MessageTooLarge / TypeError / ValueError on bad input (nothing enqueued).
        ``priority``: a level of a queue created with ``priorities``, higher first;
        ``delay``: seconds before it can be delivered; ``ttl``: seconds it may wait to be
        delivered before it expires; ``group``: a FIFO group (delivered in put order, one
        at a time); ``dedup_id``: a put with an id seen within the queue's
        ``dedup_window`` enqueues nothing and returns the first put's message id.
        """
        if priority or delay or ttl is not None or group is not None or dedup_id is not None:
            return self._put_with(body, headers, timeout, priority, delay, ttl, group, dedup_id)
        if type(body) is not bytes:  # any buffer in one piece is copied once, into the ring (a view of it here)
            body = as_buffer(body)
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
        mq, cap = self._mq, self._cap  # (the record's size: computed where a branch needs it, not on C's)
        msg_id = post = 0
        if bl >= _FILL_MIN and not self._logged:
            self._pace(_record_size(len(hraw), bl), timeout)
        now = _wall()
        fast_put = self._fast_put  # (the handle's paths': None on the Python paths)
        if fast_put is not None and (not self._logged or (self.wal.fd is not None and len(hraw) + bl <= _F_WAL_MAX)):
            gen, fd = self.wal.fd if self._logged else (0, -1)
            if bl >= _FILL_MIN and not self._logged:
                return self._put_fill(body, hraw, _record_size(len(hraw), bl), now, timeout)
            try:
                r = fast_put(self._segp, self._base, cap, body, hraw, now, fd, gen)
                if r == _F_FULL:
                    size = _record_size(len(hraw), bl)
                    r, waited, left = self._wait_room_fast(  # (a partial: a lambda here would make put's locals cells)
                        r, partial(fast_put, self._segp, self._base, cap, body, hraw, now, fd, gen), size, timeout)
                    if r <= 0:  # the general append (uncounting a sleep still counted)
                        return self._append(((body, hraw, size),), left, waited=waited)[0]
            except OSError as e:
                raise self.wal.failed(e) from None
            if r > 0:
                if r & 1:
                    self._ne.release()
                return r >> 1
            if r == _F_FALLBACK:
                return self._append(((body, hraw, _record_size(len(hraw), bl)),), timeout)[0]
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            # busy: the Python path below waits for the lock
        size = _record_size(len(hraw), bl)
        self._acquire(FOREVER if timeout is None else _lock_deadline(timeout), QueueFull)  # (a call less: no timeout)
        try:
            if mq[I_DELETED]:
                raise self._gone()
            tail, head = mq[I_TAIL], mq[I_HEAD]
            off = tail % cap
            a = self._base + off
            if size <= cap - off and tail + size - head <= cap and tail + size <= mq[I_ROOM] \
                    and (tail != head or off < self._reuse) and mq[_I_FILL] <= tail and bl < _FILL_MIN:
                msg_id = mq[I_NEXT_ID]
                if self._logged:  # logged (and fsynced, by policy) before the commit below
                    self.wal.append(_encode_put_entry(msg_id, now, hraw, body))
                _write_record(self._mm, a, _READY, size, body, hraw, msg_id, now)
                post = _commit(mq, tail + size, msg_id + self._id_step, 1)
        finally:
            _unlock(lp)
        if msg_id:
            if post:
                self._ne.release()
            return msg_id
        return self._append(((body, hraw, size),), timeout)[0]

    def put_array(self, a, headers: dict | None = None, timeout: float | None = None, **options) -> int:
        """Put numpy array ``a``: its bytes, copied once into the queue (a C- or Fortran-
        contiguous array as it lies; another as a C-ordered copy first), its dtype, shape
        and strides in a header (``model.arrays``), so ``d.array()`` gives it back where it
        lies. ``headers``, ``timeout`` and the options as ``put``'s."""
        body, headers = arrays.to_message(a, headers)
        return self.put(body, headers, timeout, **options)

    def flush(self) -> None:
        """Nothing to wait for: a local put is confirmed when it returns (``wait`` is for
        the TCP client's pipelined puts, which ``flush`` waits for there)."""

    def put_nowait(self, body: Body, headers: dict | None = None) -> int:
        """``put`` that raises QueueFull at once instead of waiting."""
        return self.put(body, headers, timeout=0)

    def put_many(self, bodies: Iterable[Body], timeout: float | None = None, priority: int = 0, delay: float = 0.0,
                 ttl: float | None = None, headers: dict | Sequence[dict | None] | None = None,
                 wait: bool = True) -> list[int]:
        """Append a batch under one lock, all or nothing; returns the ids in order.

        Items are bodies (bytes-like). ``headers``: one map for every item, or a list of
        maps (or None) item by item. ``priority``, ``delay`` and ``ttl`` (as ``put``'s)
        apply to every item.
        """
        ext = b""
        flags = delay_ns = waited = 0  # (waited: a sleep of the C path still counted, uncounted by the append)
        if priority or delay or ttl is not None:
            ext, flags, delay_ns = self._extension(priority, delay, ttl, None, 0)
        elif self.paths.put_many is not None and not self._logged and self._lockp is not None:
            fast_put_many = self.paths.put_many
            # plain bodies (and headers) in C under one lock hold; anything else below
            if type(bodies) is not list:
                bodies = list(bodies)
            hraws = _EMPTY if headers is None else batch_headers(headers, len(bodies))
            now = _wall()
            r = fast_put_many(self._segp, self._base, self._cap, bodies, hraws, self.max_message_bytes, now)
            if r == _F_FULL:
                total = sum(_record_size(len(h), len(b))
                            for b, h in zip(bodies, [hraws] * len(bodies) if type(hraws) is bytes else hraws))
                r, waited, timeout = self._wait_room_fast(
                    r, partial(fast_put_many, self._segp, self._base, self._cap, bodies, hraws, self.max_message_bytes,
                               now), total, timeout)
            if type(r) is tuple:
                first, post = r
                for _ in range(post):
                    self._ne.release()
                step = self._id_step
                return list(range(first, first + len(bodies) * step, step))
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            # anything else (a busy lock, a pad to place): the general append below
        if headers is not None:
            return self._append_items(batch_items(bodies, headers, self.max_message_bytes, self.name, ext),
                                      timeout, ext, flags, delay_ns, waited)
        if type(bodies) is not list:
            bodies = list(bodies)
        maxmsg = self.max_message_bytes
        for body in bodies:
            if type(body) is not bytes or len(body) > maxmsg:  # another buffer (a view of it), or one too large
                bodies = [checked_body(b, maxmsg, self.name) for b in bodies]
                break
        items = L.sized(bodies, ext)
        return self._append_items(items, timeout, ext, flags, delay_ns, waited)

    def _append_items(self, items, timeout, ext, flags, delay_ns, waited=0):
        if not items:
            return []
        return self._append(items, timeout, (flags, delay_ns, 0) if ext else None, waited)

    def _extension(self, priority, delay, ttl, group, dh):
        """(extension block, record flags, delay in ns) for these options; ValueError /
        TypeError naming the option that is out of range."""
        if type(priority) is not int:
            raise TypeError(f"priority must be an int, not {type(priority).__name__}")
        if not 0 <= priority < self._levels:
            if self._levels == 1:
                raise ValueError(f"queue {self.name!r} has no priority levels (create it with priorities=N); "
                                 f"priority must be 0, not {priority}")
            raise ValueError(f"priority must be in 0..{self._levels - 1} for queue {self.name!r}, not {priority}")
        delay_ns = _seconds_ns(delay, "delay") if delay else 0
        ttl_ns = 0
        if ttl is not None:
            ttl_ns = _seconds_ns(ttl, "ttl")
            if ttl_ns <= 0:
                raise ValueError(f"ttl must be > 0 seconds, not {ttl!r}")
        if group is not None:
            extension.check_group(group)
        wall = _wall()
        ext = extension.encode(priority, wall + delay_ns if delay_ns else 0, wall + ttl_ns if ttl_ns else 0, dh,
                               group)
        return ext, extension.flags_of(ext), delay_ns

    def _put_with(self, body, headers, timeout, priority, delay, ttl, group, dedup_id):
        """``put`` with options: an extension block, and the general append."""
        if type(body) is not bytes:
            body = as_bytes(body)
        dh = 0 if dedup_id is None else extension.dedup_hash(dedup_id)
        ext, flags, delay_ns = self._extension(priority, delay, ttl, group, dh)
        hraw = ext + (b"" if headers is None else encode_headers(headers))
        if len(body) > self.max_message_bytes:
            raise MessageTooLarge(
                f"message body is {len(body)} bytes; queue {self.name!r} takes at most {self.max_message_bytes}"
            )
        return self._append(((body, hraw, _record_size(len(hraw), len(body))),), timeout,
                            (flags, delay_ns, dh))[0]

    def reserve(self, size: int, headers: dict | None = None, timeout: float | None = None) -> "Reservation":
        """Room for one message of ``size`` bytes, filled in place (no copy):
        ``with q.reserve(n) as buf: buf[:] = ...`` — ``buf`` is a writable memoryview of
        exactly ``size`` bytes in the queue's memory. The message is published when the
        block exits normally (its id is then the reservation's ``id``), and nothing is
        when it raises, or when the process dies inside it.

        Waits for room as ``put`` does (QueueFull after ``timeout``); the block runs with
        the queue's lock let go, so other callers go on, and what is put meanwhile is seen
        after this message, once it is published (a logged queue holds its lock while the
        block runs: a call on it from inside the block raises RuntimeError). ``buf`` is
        released as the block ends (a later use raises
        ValueError); a buffer still exported from it then (a numpy array made from it)
        publishes nothing and raises BufferError. MessageTooLarge when ``size`` exceeds
        ``max_message_bytes``.
        """
        if type(size) is not int or size < 0:
            raise ValueError(f"size must be an int >= 0, not {size!r}")
        if size > self.max_message_bytes:
            raise MessageTooLarge(
                f"message body is {size} bytes; queue {self.name!r} takes at most {self.max_message_bytes}")
        if self._lockp is None:
            raise self._closed()
        hraw = b"" if headers is None else encode_headers(headers)
        return self._reservation(size, hraw, timeout)

    def _reservation(self, size, hraw, timeout):
        fast = self.paths.Reservation  # (on an unlogged queue: claimed and published in C)
        if fast is not None and not self._logged:
            return fast(self, size, hraw, timeout, Reservation)
        return Reservation(self, size, hraw, timeout)

    def reserve_many(self, sizes, headers: dict | None = None, timeout: float | None = None) -> "Reservations":
        """Room for a batch of messages filled in place, ``reserve``'s ``put_many``:
        ``with q.reserve_many([n] * 64) as bufs: ...`` — ``bufs`` is a list of writable
        memoryviews, one per size from the first, as many as have room now (at least one:
        for the first it waits as ``reserve`` does), each with ``headers``; the caller
        fills them and reserves the rest of its sizes again. They are published together
        as the block exits normally (their ids then in the object's ``ids``), none when it
        raises or a view of one is still alive (BufferError), as for ``reserve``.

        Bodies under 32 KiB are claimed together in one hold of the queue's lock and
        published in one; a larger one, a logged queue, or a handle on the Python paths
        gets a batch of one.
        """
        sizes = list(sizes)
        if not sizes:
            raise ValueError("sizes is empty")
        if not set(map(type, sizes)) <= _INT or min(sizes) < 0:  # (checked at C's speed: a batch is re-reserved)
            bad = next(size for size in sizes if type(size) is not int or size < 0)
            raise ValueError(f"size must be an int >= 0, not {bad!r}")
        if max(sizes) > self.max_message_bytes:
            raise MessageTooLarge(
                f"message body is {max(sizes)} bytes; queue {self.name!r} takes at most {self.max_message_bytes}")
        if self._lockp is None:
            raise self._closed()
        hraw = b"" if headers is None else encode_headers(headers)
        fast = self.paths.Reservations  # (on an unlogged queue: claimed and published together in C)
        if fast is not None and not self._logged:
            return fast(self, sizes, hraw, timeout)
        return Reservations(self, sizes, hraw, timeout)

    def _append(self, items, timeout, options=None, waited=0):
        """Append ``(body, encoded headers, record size)`` items, waiting for room.
        ``options``: (record flags, delay ns, dedup hash) for every item, or None;
        ``waited``: a sleep of a C put this process is still counted for. One plain item
        of ``FILL_MIN`` body bytes or more on an unlogged queue is a fill: its body copied
        with the lock let go (``layout.FILL_OFF``)."""
        if options is None and len(items) == 1 and len(items[0][0]) >= _FILL_MIN and not self._logged:
            body, hraw, size = items[0]
            pos, a = self._until_room(self._try_reserve, ((len(body), hraw, size),), timeout, True, waited)
            at = a + _REC + len(hraw)
            try:
                self._mm[at:at + len(body)] = body
            except BaseException:
                self._finish_fill(pos, abandon=True)
                raise
            ids = [self._finish_fill(pos)]
        else:
            ids = self._until_room(self._try_append, items, timeout, options, waited)
        if self._mq[_GROW_DUE]:
            self._grow_ahead()
        return ids

    def _put_fill(self, body, hraw, size, now, timeout) -> int:
        """``put`` of a large body on an unlogged queue, by the C paths: a fill (``layout.
        FILL_OFF``), its body copied with the lock and the GIL let go (the mapping held
        meanwhile: a ``close`` by another thread leaves it to the copy); anything but the
        plain case to the general append, which fills too. Returns the message id."""
        fast_put, segp, base, cap, mm, ne = self._fast_put, self._segp, self._base, self._cap, self._mm, self._ne
        bits = _W_FILL | self._fill_slot() << 3
        r = fast_put(segp, base, cap, body, hraw, now, -1, 0, bits, mm, ne)
        waited, left = 0, timeout
        if r == _F_FULL:
            r, waited, left = self._wait_room_fast(
                r, lambda wait: fast_put(segp, base, cap, body, hraw, now, -1, 0, wait, mm, ne), size, timeout, bits)
        if type(r) is tuple:  # copied, the lock then busy (or taken from a dead holder: held, repaired first)
            if r[0] & 1:
                self._repair_held_lock()
            return self._finish_fill(r[0] >> 1)
        if r > 0:  # (its end posted every consumer it woke)
            return r >> 1
        if r == _F_OWNERDEAD:
            self._repair_held_lock()
        return self._append(((body, hraw, size),), left, waited=waited)[0]

    def _pace(self, size, timeout) -> None:
        """Keep large bodies in the CPU's caches: a producer that finds a window of records of
        ``size`` bytes (``ring.window``: 2 of them, 4 MiB at least) ahead of the consumers waits
        while they drain it, so that the bodies it writes next and they read stay in cache
        (a deeper queue goes round memory the caches cannot hold: at 1 MiB a message, 3.7-9 k
        msgs/s against 23-27 k). At most ``SPILL_WAIT_NS`` (and half ``timeout``). A head that
        stands still for ``PACE_IDLE_NS`` ends the wait (no consumer, a slow one, or one this
        thread runs between puts): no put waits again until the head moves, and the next
        1, 3, 7, ... 1023 puts (doubling with each such wait in a row) go at once; a put that
        finds less than a window ahead starts that count again."""
        mq = self._mq
        head = mq[I_HEAD]
        window = ring.window(size, self._cap)
        if not window:
            return
        if mq[I_TAIL] - head < window:
            if self._pace_idle:
                self._pace_idle = self._pace_skip = 0
            return
        if head == self._paced or timeout is not None and timeout <= 0:
            return
        if self._pace_skip:
            self._pace_skip -= 1
            return
        now = moved = _mono()
        end = now + (SPILL_WAIT_NS if timeout is None else min(SPILL_WAIT_NS, int(timeout * 5e8)))
        while now < end:
            _sched_yield()
            now, h = _mono(), mq[I_HEAD]
            if mq[I_TAIL] - h < window:
                self._pace_idle = 0
                return
            if h != head:
                head, moved = h, now
            elif now - moved >= PACE_IDLE_NS:
                self._paced = h
                self._pace_idle = min(self._pace_idle + 1, 10)
                self._pace_skip = (1 << self._pace_idle) - 1
                return

    def _fill_slot(self) -> int:
        """This process's slot, registered first (once): a fill's record names its holder,
        so that a dead one's is found."""
        slot = self._slot
        if slot < 0:
            self._acquire()
            try:
                slot = self._my_slot()
            finally:
                _unlock(self._lockp)
        return slot

    def _finish_fill(self, pos, abandon=False) -> int:
        """End this process's fill at ``pos``: its record done (READY; a PAD with
        ``abandon``), the tail moved over it and the done records after it, their
        consumers woken. Waits for the lock however long it takes (the record is this
        process's to end). Returns its message id."""
        mq, cap, base = self._mq, self._cap, self._base
        w = (base + pos % cap) >> 3
        while True:
            try:
                self._acquire()
                break
            except LockTimeout:  # (a holder stopped a while: SIGSTOP, a debugger)
                continue
        post = 0
        try:
            msg_id = mq[w + L.R_MSG_ID]
            if mq[w] & 0xFF == _FILLING:
                if abandon:
                    ring.void_fill(mq, w, pos)
                else:
                    ring.end_fill(mq, w, _wall())
                post = waits.owed_posts(mq, _CONSUMERS, ring.commit_fills(mq, cap, base))
        finally:
            _unlock(self._lockp)
        for _ in range(post):
            self._ne.release()
        return msg_id

    def _wait_room_fast(self, r, again, total, timeout, bits=0):
        """Where a C put (or put_many) that found no room (FULL) goes on: ``again(wait)`` is
        that call made again, told to count this process as a producer waiting for room
        when there is still none (SLEEP), then a sleep on not_full, then the call again,
        which uncounts it first: every lock hold stays in C, as a waiting get's
        (``Consuming._fast_wait``); ``bits`` go with each call's (``W_FILL``). QueueFull past
        ``timeout``; MessageTooLarge for records
        (``total`` bytes) that can never fit. Returns (what ``again`` returned: a success,
        or FALLBACK / BUSY / DELETED, for the general append; the sleep still counted then;
        the seconds left)."""
        if total > self._cap:
            raise MessageTooLarge(f"{total} bytes of records can never fit in queue {self.name!r} "
                                  f"(max_bytes={self._cap})")
        deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
        waited = 0  # a sleep this process is still counted for
        while True:
            if r == _F_FULL:
                if deadline is not None and _mono() >= deadline:
                    raise QueueFull(f"queue {self.name!r} is full")
            elif r == _F_SLEEP:
                waited = self._sleep(self._nf, deadline, _PRODUCERS)
            elif r == _F_OWNERDEAD:
                self._repair_held_lock()
            elif type(r) is tuple or r > 0:
                return r, 0, None
            else:
                return r, waited, None if deadline is None else max(0, deadline - _mono()) / 1e9
            if self._slot < 0:  # not in the process table yet (or closed): the general append registers it
                r = _F_FALLBACK
                continue
            r = again(bits | self._slot << 3 | waited << 1 |
                      (_W_REGISTER if deadline is None or _mono() < deadline else 0))
            if type(r) is int and r != _F_BUSY and r != _F_OWNERDEAD:
                waited = 0  # the call had the lock: it uncounted the sleep

    def _until_room(self, attempt, items, timeout, options=None, waited=0):
        """``attempt(items, waited, deadline, options, spill)`` until it returns something, sleeping
        for room between tries; QueueFull after ``timeout``. ``waited``: a sleep still
        counted, uncounted by the first attempt. /dev/shm full (ShmFull, nothing written)
        is waited out too when there is a timeout, within it (with none it is raised at
        once: /dev/shm may never have room again): no process posts room there, so it is
        looked for again after a pause that grows to ``SHM_PAUSE_MAX_S``."""
        deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
        total = sum(item[2] for item in items)
        if total > self._cap:
            raise MessageTooLarge(
                f"{total} bytes of records can never fit in queue {self.name!r} (max_bytes={self._cap})"
            )
        pause = 0
        # a producer that caught up with the head in a ring's window waits for it a while before it spills
        # (``layout.SPILL_WAIT_NS``), unless its timeout is shorter
        spill_at = _mono() + SPILL_WAIT_NS
        spill = deadline is not None and deadline <= spill_at
        shm_pause = SHM_PAUSE_MIN_S
        while True:
            if not spill and _mono() >= spill_at:
                spill = True
            try:
                ids, post = attempt(items, waited, deadline, options, spill)
            except LockTimeout as e:
                raise QueueFull(str(e)) from None
            except ShmFull:  # waited out only within a timeout: /dev/shm may never have room again
                now = _mono()
                if deadline is None or now >= deadline:
                    raise
                waited = 0
                time.sleep(min(shm_pause, (deadline - now) / 1e9))
                shm_pause = min(shm_pause * 2, SHM_PAUSE_MAX_S)
                continue
            except _FillsPending:  # (the attempt uncounted the sleep)
                waited = 0
                pause = self._await_fills(deadline, pause)
                continue
            for _ in range(post):
                self._ne.release()
            if ids is not None:
                return ids
            until = deadline if spill else spill_at if deadline is None else min(deadline, spill_at)
            waited = self._sleep(self._nf, until, _PRODUCERS)  # registered by ``_room``

    def _await_fills(self, deadline, pause):
        """A short sleep while fills are under way (an append that may not go after them:
        ``_room``), longer each time (``FILL_PAUSES_S``); about every half second, a look
        for fills whose holder died (``housekeeping.end_dead_fills``). QueueFull past
        ``deadline``. Returns the next pause's index."""
        if deadline is not None and _mono() >= deadline:
            raise QueueFull(f"queue {self.name!r} is full")
        if pause >= len(FILL_PAUSES_S) - 1 and (pause - len(FILL_PAUSES_S)) % 100 == 0:
            self._acquire()
            try:
                posts = housekeeping.end_dead_fills(self)
            finally:
                _unlock(self._lockp)
            for _ in range(posts):
                self._ne.release()
        time.sleep(FILL_PAUSES_S[min(pause, len(FILL_PAUSES_S) - 1)])
        return pause + 1

    def _placement_end(self, items, tail):
        """Where the tail would be after appending ``items`` at ``tail`` (pads included)."""
        cap = self._cap
        for item in items:
            tail = L.place(tail, item[2], cap)[1]
        return tail

    def _room(self, items, deadline, plain=True, spill=True):
        """Where ``items`` go: the tail (past the records still being filled, which
        ``plain`` items may follow; any other append waits for them: _FillsPending), or the
        next lap's start (an early wrap: ``layout.WINDOW_MIN``; the pad to the lap's end
        written), or past an early wrap's pad (a spill, when ``spill`` says it may), their memory
        allocated; or None when they do not fit now (then registered as a producer waiting
        for room: the caller sleeps next); QueueFull past ``deadline`` (decided here, under
        the lock, so no registration outlives a call); StorageError when /dev/shm cannot
        hold them. Lock held."""
        mq, cap, base = self._mq, self._cap, self._base
        head, tail, fill = mq[I_HEAD], mq[I_TAIL], mq[_I_FILL]
        if fill > tail and ring.suspect_fill(mq, self._mm, cap, base, tail, _wall()):  # its holder may be dead
            for _ in range(housekeeping.end_dead_fills(self)):
                self._ne.release()
            tail, fill = mq[I_TAIL], mq[_I_FILL]
        if fill > tail:
            if not plain or self._logged:
                raise _FillsPending
            tail = fill
        start = tail
        end = self._placement_end(items, tail)
        wrap = 0
        if head == tail and (tail % cap >= self._reuse or tail >= L.POS_LIMIT or (end - head > cap and tail % cap)):
            # empty: start the next lap, where the memory just freed is (and any batch <= capacity fits)
            start = tail = head = self._new_lap(tail)
            end = self._placement_end(items, tail)
        elif len(items) == 1 and ring.early_wrap(head, tail, items[0][2], cap):
            start = wrap = tail + cap - tail % cap
            end = start + items[0][2]
        elif not ring.fits(head, tail, end, cap, mq[_I_WRAP]):
            wrap = mq[_I_WRAP]
            past = ring.spill_start(head, tail, cap, wrap) if spill else 0
            if past:
                start, end = past, self._placement_end(items, past)
            if not ring.fits(head, start, end, cap, wrap):
                if deadline is not None and _mono() >= deadline:
                    raise QueueFull(f"queue {self.name!r} is full")
                waits.register(mq, self._my_slot(), _PRODUCERS)
                return None
            wrap = 0
        if end > mq[I_ROOM]:  # memory to allocate first (StorageError: nothing written)
            mem = self._memory
            if start != tail:  # the pad's header; not the stretch it skips
                mem.ensure_arc(base, cap, tail, min(tail + _REC, tail - tail % cap + cap))
            mem.ensure_arc(base, cap, start, end)
            self._set_room(head, start, end)
        if start != tail:
            ring.write_pad(self._mm, base, cap, tail, start)
            if wrap:
                ring.wrap_at(mq, tail)
        return start

    def _set_room(self, head, tail, end):
        """The fast paths' one compare (``room``): as far from ``tail`` as the chunks are
        allocated (a few MiB at most: a bounded look), not bounded by the free space, which
        is checked apart (a full queue's every put would come here again). While the queue
        fills toward the end of its chunks, halfway there, with ``grow_due`` set: the append
        that comes back allocates the next ones ahead, outside the lock (``_grow_ahead``),
        before the puts reach them. A queue that reuses what it holds grows nothing. Lock held."""
        cap = self._cap
        limit = min(end + L.ROOM_LOOK, tail - tail % cap + cap)
        room = self._memory.allocated_to(self._base, cap, tail, limit)
        if room < limit and room < head + cap and room - end < max(L.CHUNK, (end - head) >> 2):
            ring.set_room(self._mq, max(end, (end + room) >> 1), grow_due=True)
        else:
            ring.set_room(self._mq, room)

    def _grow_ahead(self) -> None:
        """A step of chunks past the room allocated outside the lock (claimed under it first,
        so no round gives them back meanwhile, then marked), so the puts that follow find
        their memory there: the other processes of the queue never wait on a producer's
        allocation. A lock that cannot be had in time leaves it to the next put."""
        mem, mq, cap, base = self._memory, self._mq, self._cap, self._base
        try:
            self._acquire(_mono() + GROW_LOCK_NS)
        except LockTimeout:
            return
        try:
            tail = ring.append_end(mq)
            claim = None if mq[I_DELETED] else mem.claim_ahead(base, cap, tail, mq[I_HEAD] + cap, self._my_slot())
        finally:
            _unlock(self._lockp)
        if claim is None:
            return
        filled = mem.fill_claim(*claim)
        try:
            self._acquire()
        except LockTimeout:  # (the claim stands while this process lives; puts allocate under the lock meanwhile)
            return
        try:
            mem.settle_claim(self._my_slot(), filled)
            if filled and not mq[I_DELETED]:
                tail = ring.append_end(mq)
                self._set_room(mq[I_HEAD], tail, max(tail, min(mq[I_ROOM], tail - tail % cap + cap)))
        finally:
            _unlock(self._lockp)

    def _new_lap(self, tail):
        """Move the empty queue's cursors from ``tail`` to the start of the next lap, or to 0
        past ``POS_LIMIT`` (every delivery of before is then past the tail: expired).
        Returns the new tail (``ring.new_lap``). Lock held."""
        return ring.new_lap(self._mq, tail, self._cap)

    def _try_reserve(self, items, waited, deadline, fill=None, spill=True):
        """One locked attempt to place ``items``' one record: ((its position, its byte
        address), 0) with the record written but for its body and put time, past the
        tail; or (None, 0), the lock released. With ``fill``, a fill (``layout.FILL_OFF``):
        its record FILLING, held by this process, the lock let go (``_finish_fill`` ends
        it); else the lock stays held and the record is invisible until ``_publish``."""
        mm, mq = self._mm, self._mq
        self._acquire_to_unwait(FOREVER if deadline is None else deadline, _PRODUCERS, waited)
        held = False
        try:
            if waited:  # first: whatever happens next, this sleep is over
                waits.unregister(mq, self._slot, _PRODUCERS, waited)
            if mq[I_DELETED]:
                raise self._gone()
            tail = self._room(items, deadline, bool(fill), spill)
            if tail is None:
                return None, 0
            size, hraw, rec = items[0]
            pos, a = ring.place(mm, self._base, self._cap, tail, rec)
            if fill:
                msg_id = mq[I_NEXT_ID]
                L.REC.pack_into(mm, a, _FILLING | self._my_slot() << 8, rec, size, len(hraw), 0, msg_id, _wall(), 0)
                if hraw:
                    mm[a + _REC:a + _REC + len(hraw)] = hraw
                ring.placed_fills(mq, msg_id + self._id_step, pos + rec)  # past the tail, after the fills before it
                return (pos, a), 0
            L.REC.pack_into(mm, a, _READY, rec, size, len(hraw), 0, mq[I_NEXT_ID], 0, 0)
            if hraw:
                mm[a + _REC:a + _REC + len(hraw)] = hraw
            held = True
            return (pos, a), 0
        finally:
            if not held:
                _unlock(self._lockp)

    def _publish(self, pos, a):
        """Commit the record ``_try_reserve`` placed at ``pos`` (lock held; released here,
        whatever happens). Returns its message id."""
        mm, mq = self._mm, self._mq
        post = 0
        try:
            _s, rec, size, hl, _f, msg_id, _e, _d = L.REC.unpack_from(mm, a)
            now = _wall()
            if self._logged:  # logged (and fsynced, by policy) before the commit below
                b = a + _REC
                self.wal.append(_encode_put_entry(msg_id, now, mm[b:b + hl], mm[b + hl:b + hl + size]))
            ring.stamp(mq, a >> 3, now)
            post = _commit(mq, pos + rec, msg_id + self._id_step, 1)
        finally:
            _unlock(self._lockp)
        if post:
            self._ne.release()
        return msg_id

    def _try_append(self, items, waited, deadline, options=None, spill=True):
        """One locked attempt (``spill``: whether it may spill, ``_room``). Returns (ids or
        None, semaphore posts owed)."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        flags = delay_ns = dh = 0
        if options is not None:
            flags, delay_ns, dh = options
        self._acquire_to_unwait(FOREVER if deadline is None else deadline, _PRODUCERS, waited)
        try:
            if waited:  # first: whatever happens next, this sleep is over
                waits.unregister(mq, self._slot, _PRODUCERS, waited)
            if mq[I_DELETED]:
                raise self._gone()
            if dh:
                known = dedup.lookup(mq, self._dedup_off, dh, _wall())
                if known:
                    return [known], 0
            tail = self._room(items, deadline, options is None, spill)
            if tail is None:
                return None, 0
            # write the records past the tail, then publish them with one store
            now = _wall()
            pos = tail
            first_id = next_id = mq[I_NEXT_ID]
            step = self._id_step
            if self._logged:  # logged (and fsynced, by policy) before the commit below
                self.wal.append(b"".join(
                    _encode_put_entry(first_id + i * step, now, item[1], item[0]) for i, item in enumerate(items)))
            if options is None:
                for body, hraw, size in items:
                    pos, a = ring.place(mm, base, cap, pos, size)
                    _write_record(mm, a, _READY, size, body, hraw, next_id, now)
                    next_id += step
                    pos += size
            else:
                state, due = _READY, 0
                if delay_ns:
                    state, due = _DELAYED, _mono() + delay_ns
                for body, hraw, size in items:
                    pos, a = ring.place(mm, base, cap, pos, size)
                    _write_record(mm, a, state, size, body, hraw, next_id, now, flags, due)
                    next_id += step
                    pos += size
                if dh:  # remembered before the commit; a repair forgets it if the commit never comes
                    dedup.remember(mq, self._dedup_off, dh, first_id, now + self._dedup_window_ns)
                ring.mark_special(mq, (3 if delay_ns else 1) if flags & _WALK else 0,  # 2: a due time (the walk
                                  extension.decode(items[0][1])[0].expires_ns)  # orders by it)
            n = len(items)
            if mq[_I_FILL] > mq[I_TAIL]:  # after fills not yet done (plain items): seen once they are
                ring.placed_fills(mq, next_id, pos)
                return list(range(first_id, next_id, step)), waits.owed_posts(
                    mq, _CONSUMERS, ring.commit_fills(mq, cap, base))
            if delay_ns:
                ring.commit_delayed(mq, pos, next_id, n, due)
                return list(range(first_id, next_id, step)), 0
            return list(range(first_id, next_id, step)), _commit(mq, pos, next_id, n)
        finally:
            _unlock(self._lockp)
