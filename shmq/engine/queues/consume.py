"""Getting messages: ``get`` (the hot path: C first, then a Python fast path at the
frontier) and the general take under the lock, which expires due leases, returns the
leases of dead processes, takes requeued messages first, and waits (spin, then sleep
slices) when nothing is ready; and the consume loop, ``messages()`` (``Messages``: each
step acks the delivery handed out last and takes the next, in C one lock hold). Part of
``Queue`` (``queue.py``).
"""

import ctypes
import threading
import time

from ...formats import dmsq
from ...errors import DeliveryExpired, LockTimeout, QueueEmpty
from ..shm import cpaths
from . import deadletter, extension, housekeeping, lifetime, scheduling
from ..shm import header, ring, takes, waits
from ..shm import layout as L
from ..shm.layout import I_DELETED, I_FRONTIER, I_HEAD, I_NEXT_DEADLINE, I_NEXT_LIVENESS, I_READY, I_SPECIAL, I_TAIL
from .delivery import Delivery, Message
from ...model.headers import decode_headers
from ...model.keepalive import _live as _kept_alive
from . import views
from .views import _viewed as _array_views
from ...model.keepalive import settling as _stop_keepalives
from ..shm.mutex import FOREVER
from ..shm.mutex import unlock as _unlock

__all__ = ["Consuming", "Messages"]

_mono = time.monotonic_ns
_wall = time.time_ns
_REC = L.REC_SIZE
_REC_UNPACK = L.REC.unpack_from
_take_next = takes.take_next
_HOT_UNPACK = L.HOT.unpack_from
_HOT_OFF = L.HOT_OFF
assert L.HOT_FIELDS == ("deleted", "tail", "next_id", "pwait", "pposted", "settings_gen", "bells", "room", "head", "frontier",
                        "ready_pos", "requeued", "in_flight", "delayed", "next_deadline", "next_liveness", "ready",
                        "cwait", "cposted"), "the plain take below unpacks the control words in this order"
_READY, _LEASED = L.READY, L.LEASED
_R_MSG_ID = L.R_MSG_ID
_expiry = extension.expiry
_CONSUMERS = waits.CONSUMERS
_encode_ack_entry = dmsq.encode_ack_entry
_lock_deadline, _seconds_ns = waits.lock_deadline, waits.seconds_ns
_F_OWNERDEAD, _F_FALLBACK, _F_BUSY, _F_EMPTY, _F_SLEEP = (cpaths.OWNERDEAD, cpaths.FALLBACK, cpaths.BUSY, cpaths.EMPTY,
                                                       cpaths.SLEEP)
_W_REGISTER = cpaths.W_REGISTER
_I_LIFE, _LIFE_SHIFT = L.I_LIFETIME, L.LIFE_EXPIRES_SHIFT
# a take's mode (bits, as _fast.c's): settled as taken (get(ack=False)); the body a view (copy=False)
_AUTOACK, _VIEW = 1, 2
_AUTOACK_LEASE_NS = 60 * 10**9  # the general take's lease of an auto-acked message, acked in the same call


def _mode(ack, copy) -> int:
    """The take mode of ``get(ack=, copy=)``; ValueError for a view of an auto-acked message
    (its bytes may be reused at once)."""
    mode = (0 if ack else _AUTOACK) | (0 if copy else _VIEW)
    if mode == _AUTOACK | _VIEW:
        raise ValueError("copy=False needs ack=True: an auto-acked message's bytes may be reused at once")
    return mode


class Consuming:
    """The get operations of ``Queue``."""

    _held = None  # with a prefetch cap: the deliveries this handle holds un-settled
    _prefetch = None
    _pending = 0  # deliveries being taken by gets under the cap

    def get(self, timeout: float | None = None, visibility_timeout: float | None = None, ack: bool = True,
            copy: bool = True) -> Delivery:
        """Lease the next ready message (the oldest, in a plain queue); blocks until one
        is ready.

        Raises QueueEmpty after ``timeout`` seconds (None: wait forever). ``ack=False``:
        settled as it is taken (auto-ack: acked, no lease, its space free at once; a
        crash after the get loses it), so the delivery cannot be acked or nacked.
        ``copy=False``: ``body`` is ``view``, a read-only memoryview into the queue, valid
        until the delivery is settled (not with ``ack=False``).
        """
        if ack is not True or copy is not True:
            take = self._fast_take
            if (copy is False and ack is True and take is not None and visibility_timeout is None and self._slot >= 0
                    and not self._general and self._held is None):  # a view: one C call, as the plain case
                r = take(self, self._segp, self._base, self._cap, self._slot, self._vis_ns, self.max_deliveries or 0,
                         _mono(), _VIEW, self._ring)
                if type(r) is not int:
                    return r
                return self._fast_wait(r, 0, timeout, None, None, _VIEW)
            mode = _mode(ack, copy)
            if self._held is not None and ack:
                return self._get_capped(1, timeout, visibility_timeout, None, mode)[0]
            d = self._take_one(visibility_timeout, timeout, mode)
            if d is None:
                d = self._get(1, timeout, visibility_timeout, None, mode)[0]
            return d
        if self._held is not None:
            return self._get_capped(1, timeout, visibility_timeout)[0]
        take = self._fast_take  # (the handle's paths': None on the Python paths; a local, as a call of an
        # instance attribute is not specialized)
        if take is not None and visibility_timeout is None and self._slot >= 0 and not self._general:
            # the plain case, one C call that builds the delivery (a closed handle has no slot)
            r = take(self, self._segp, self._base, self._cap, self._slot, self._vis_ns, self.max_deliveries or 0,
                     _mono())
            if type(r) is not int:
                return r
            return self._fast_wait(r, 0, timeout, None, None, 0)
        d = self._take_one(visibility_timeout, timeout)
        if d is None:
            d = self._get(1, timeout, visibility_timeout)[0]
        return d

    def get_nowait(self, visibility_timeout: float | None = None, ack: bool = True, copy: bool = True) -> Delivery:
        """``get`` that raises QueueEmpty at once instead of waiting."""
        if ack is not True or copy is not True:
            return Consuming.get(self, 0, visibility_timeout, ack, copy)
        if self._held is not None:
            return self._get_capped(1, 0, visibility_timeout)[0]
        d = self._take_one(visibility_timeout, 0)
        if d is None:
            d = self._get(1, 0, visibility_timeout)[0]
        return d

    def peek(self, max_messages: int = 10) -> list[Message]:
        """Up to ``max_messages`` ready messages, next to be delivered first, without
        leasing them: no attempt is counted and nothing is hidden from consumers."""
        if type(max_messages) is not int or max_messages < 1:
            raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
        if self._lockp is None:
            raise self._closed()
        self._acquire()
        try:
            if self._mq[I_DELETED]:
                raise self._gone()
            now = _mono()
            spent = []
            if now >= self._mq[I_NEXT_DEADLINE]:  # what is due is ready: a peek shows it
                housekeeping.expire(self, now, spent)
            rows = scheduling.peek(self, max_messages, _wall())
        finally:
            _unlock(self._lockp)
        housekeeping.dead_letter_spent(self, spent)
        out = []
        for msg_id, attempt, body, hraw, enq in rows:
            ext, hraw = extension.split(hraw)
            out.append(Message(msg_id, body, decode_headers(hraw) if hraw else {}, attempt, ext.priority, enq / 1e9,
                               ext.group, self.name))
        return out

    def messages(self, timeout: float | None = None, visibility_timeout: float | None = None,
                 copy: bool = True) -> "Messages":
        """The consume loop, ``for d in q.messages(): handle(d)``: each delivery is acked when
        the loop takes the next one (one lock hold, in C), unless it was settled already
        (``d.ack()``, ``d.nack()``, ``d.reject()``, ``d.process()``) or its lease lapsed. It
        ends when no message comes within ``timeout`` seconds (None: never), everything handed
        out acked. ``break`` or an exception leaves the last delivery leased to the caller
        (settle it, or it is delivered again); leaving a ``with q.messages() as loop:`` block
        without an exception acks it. ``copy=False``: bodies are views, valid until the next
        step. One thread per loop."""
        return Messages(self, timeout, visibility_timeout, copy)

    def consume(self, prefetch: int = 100, visibility_timeout: float | None = None) -> "LocalConsumer":
        """An iterator of deliveries, waiting for each, with at most ``prefetch`` of them
        un-settled (the TCP client's ``consume``, where the server pushes them; here
        every get is already a memory access). It uses a handle of its own, so this
        one's cap is untouched; ``close()`` or leaving its ``with`` ends it."""
        if type(prefetch) is not int or prefetch < 1:
            raise ValueError(f"prefetch must be a positive int, not {prefetch!r}")
        if visibility_timeout is not None:
            _seconds_ns(visibility_timeout, "visibility_timeout")
        return LocalConsumer(self._sibling(), prefetch, visibility_timeout)

    # ------------------------------------------------------------------ prefetch
    def _set_prefetch(self, n: int | None) -> None:
        """Cap the deliveries this handle holds un-settled at ``n`` (None: no cap)."""
        if n is None:
            self._held = None
            return
        self._prefetch = n
        if self._held is None:
            self._held = set()
            self._held_cv = threading.Condition()

    def _drop_held(self, deliveries):
        """Settled (or being settled): no longer counted against the prefetch cap."""
        held = self._held
        if held is not None:
            with self._held_cv:
                for d in deliveries:
                    held.discard(d)
                self._held_cv.notify_all()

    def _get_capped(self, maxn, timeout, visibility_timeout, max_bytes=None, mode=0):
        """A get under the prefetch cap: waits while the cap is reached."""
        return take_capped(self, maxn, timeout, self._drop_lapsed,
                           lambda room, left: self._get(room, left, visibility_timeout, max_bytes, mode))

    def _drop_lapsed(self) -> None:
        """Forget the held deliveries whose lease lapsed (the prefetch cap's look again)."""
        held = self._held
        self._acquire()
        try:
            for d in [d for d in held if self._leased_word(d) < 0]:
                held.discard(d)
        finally:
            _unlock(self._lockp)

    def _take_one(self, visibility_timeout, timeout, mode=0):
        """Fast path of ``get``: the next never-delivered record at the frontier, when no
        housekeeping is due and nothing was requeued. None sends the caller to ``_get``.
        ``mode``: ``_AUTOACK`` (settled as taken) and ``_VIEW`` (the body a view) bits."""
        lp = self._lockp
        slot = self._slot
        if lp is None or slot < 0 or visibility_timeout is not None or self._general:
            return None  # (the C take and the one below leave a queue with special records alone)
        take = self._fast_take
        if take is not None and not (mode and mode & _AUTOACK and self._logged):  # (a logged ack: Python's)
            r = take(self, self._segp, self._base, self._cap, slot, self._vis_ns, self.max_deliveries or 0,
                     _mono(), mode, self._ring)
            if type(r) is tuple:  # auto-acked, and a producer is owed a post
                self._nf.release()
                return r[0]
            if type(r) is not int:
                return r
            return self._fast_wait(r, 0, timeout, None, None, mode)
        mm, mq, cap = self._mm, self._mq, self._cap
        body = None
        post = False
        self._acquire(_lock_deadline(timeout), QueueEmpty)
        try:
            (deleted, tail, _nid, _pw, _pp, _x5, _x6, _x7, head, pos, _rp, requeued, inflight, _dl, next_deadline,
             next_liveness, ready, _cw, _cp) = _HOT_UNPACK(mm, _HOT_OFF)
            now = _mono()
            off = pos % cap
            if mq[_I_LIFE] >> _LIFE_SHIFT:  # a queue that expires is used now (as lifetime.used)
                lifetime.used(mq, now)
            if (pos < tail and not requeued and not deleted and cap - off >= _REC
                    and now < next_deadline and now < next_liveness and not mq[I_SPECIAL]):
                a = self._base + off
                status, length, bl, hl, flags, msg_id, enq, _d = _REC_UNPACK(mm, a)
                attempt = (status >> 32) + 1
                if (status & 0xFF == _READY and not flags
                        and (self.max_deliveries is None or attempt <= self.max_deliveries)):
                    if mode and mode & _AUTOACK:
                        if self._logged:  # logged before the commit below
                            self.wal.append(_encode_ack_entry(msg_id, attempt), grows=False)
                        _take_next(mq, a >> 3, pos + length, slot, attempt, 0, ready, inflight, next_deadline)
                        post = ring.freed_at(mq, cap, self._base, pos, head)
                    else:
                        _take_next(mq, a >> 3, pos + length, slot, attempt, now + self._vis_ns, ready, inflight,
                                   next_deadline)
                    b = a + _REC
                    body = mm[b + hl:b + hl + bl] if not mode or not mode & _VIEW else self._ring[
                        off + _REC + hl:off + _REC + hl + bl]
                    hraw = mm[b:b + hl] if hl else None
        finally:
            _unlock(lp)
        if body is None:
            return None
        if post:
            self._nf.release()
        return self.paths.Delivery(self, pos, msg_id, attempt, body, hraw, enq)

    def get_many(self, max_messages: int = 64, timeout: float | None = None, visibility_timeout: float | None = None,
                 max_bytes: int | None = None, ack: bool = True, copy: bool = True) -> list[Delivery]:
        """Lease up to ``max_messages``; returns as soon as at least one is ready.

        With ``max_bytes``, stops before the bodies and headers taken would exceed it
        (the first message is always taken). ``ack`` and ``copy`` as ``get``'s.
        """
        if type(max_messages) is not int or max_messages < 1:
            raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
        if max_bytes is not None and (type(max_bytes) is not int or max_bytes < 1):
            raise ValueError(f"max_bytes must be a positive int, not {max_bytes!r}")
        mode = 0 if ack is True and copy is True else _mode(ack, copy)
        if self._held is not None and ack:
            return self._get_capped(max_messages, timeout, visibility_timeout, max_bytes, mode)
        take_many = self.paths.take_many
        if (take_many is not None and self._slot >= 0 and not self._general and self._lockp is not None
                and not (mode & _AUTOACK and self._logged)):
            # the plain takes from the frontier, in C under one lock hold; anything else: Python
            vis_ns = self._vis_ns if visibility_timeout is None else _seconds_ns(visibility_timeout,
                                                                                 "visibility_timeout")
            r = take_many(self, self._segp, self._base, self._cap, self._slot, vis_ns,
                          self.max_deliveries or 0, _mono(), max_messages, max_bytes or 0, mode, self._ring)
            if type(r) is tuple:  # auto-acked
                if r[1]:
                    self._nf.release()
                r = r[0]
            if type(r) is list:
                return r if len(r) == max_messages or max_bytes else self._rest(r, max_messages, vis_ns,
                                                                                 visibility_timeout, mode)
            return self._fast_wait(r, max_messages, timeout, visibility_timeout, max_bytes, mode)
        return self._get(max_messages, timeout, visibility_timeout, max_bytes, mode)

    def _rest(self, got, maxn, vis_ns, visibility_timeout, mode):
        """``got``, a C take's batch of fewer than ``maxn``, with what else is ready: the C
        take stops at a record it leaves to Python (one with an extension block: a TTL, a
        dedup id) and hands back what it took before it. Past the frontier (one look, no
        lock) the C take goes on, and the general take where it stops again; neither
        waits. (Without ``max_bytes`` only: with it a batch may also end there.)"""
        mq = self._mq
        while len(got) < maxn and mq[I_FRONTIER] < mq[I_TAIL] and self._slot >= 0:
            r = self._c_take(maxn - len(got), vis_ns, None, mode, 0)
            if type(r) is list:
                got += r
                continue
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            elif r != _F_FALLBACK:
                break  # (empty by now, or the lock held long: what was taken goes out)
            try:
                got += self._get(maxn - len(got), 0, visibility_timeout, None, mode)
            except QueueEmpty:
                pass
            break
        return got

    def _poll(self, maxn, visibility_timeout=None, max_bytes=None, ack=True, copy=True):
        """A take that never waits: a delivery (``maxn`` 0) or a list of up to ``maxn``, or
        None when nothing is ready (a laned queue's look into each of its lanes)."""
        mode = 0 if ack is True and copy is True else _mode(ack, copy)
        if (self._fast_take is not None and self._slot >= 0 and not self._general
                and not (mode & _AUTOACK and self._logged)):
            vis_ns = self._vis_ns if visibility_timeout is None else _seconds_ns(visibility_timeout,
                                                                                 "visibility_timeout")
            r = self._c_take(maxn, vis_ns, max_bytes, mode, 0)
            if type(r) is list:
                return r if len(r) == maxn or max_bytes else self._rest(r, maxn, vis_ns, visibility_timeout, mode)
            if type(r) is not int:
                return r
            if r == _F_EMPTY:
                return None
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
        try:
            got = self._get(maxn or 1, 0, visibility_timeout, max_bytes, mode)
        except QueueEmpty:
            return None
        return got if maxn else got[0]

    def _fast_wait(self, r, maxn, timeout, visibility_timeout, max_bytes, mode):
        """Where a C take (``maxn``: take_many's; 0: take's) that delivered nothing goes on,
        given its result ``r``. Nothing ready (EMPTY): a spin on the control block without
        the lock, then takes that count this process as a sleeper when they still find
        nothing (SLEEP), a sleep, and a take that uncounts it: every lock hold stays in C,
        so waiting consumers never hold the lock for long. FALLBACK (requeued or special
        records, housekeeping due, a deleted queue) and BUSY (a holder that kept the lock
        past the C wait): the general take, which also uncounts a sleep still counted.
        Returns what ``get`` (a delivery) or ``get_many`` (a list) returns."""
        deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
        vis_ns = self._vis_ns if visibility_timeout is None else _seconds_ns(visibility_timeout, "visibility_timeout")
        spun = timeout == 0
        waited = 0  # a sleep this process is still counted for
        while True:
            if r == _F_EMPTY:
                if deadline is not None and _mono() >= deadline:
                    raise QueueEmpty(f"queue {self.name!r} is empty")
                if not spun:
                    spun = True
                    waits.spin(self._mq, deadline, _mono)
            elif r == _F_SLEEP:
                waited = self._sleep(self._ne, deadline, _CONSUMERS)
            elif r == _F_OWNERDEAD:
                self._repair_held_lock()
            else:
                left = None if deadline is None else max(0, deadline - _mono()) / 1e9
                got = self._get(maxn or 1, left, visibility_timeout, max_bytes, mode, waited)
                return got if maxn else got[0]
            wait = waited << 1 | (_W_REGISTER if spun and (deadline is None or _mono() < deadline) else 0)
            if self._slot < 0:  # closed meanwhile (another thread): the general take says so
                r = _F_FALLBACK
                continue
            r = self._c_take(maxn, vis_ns, max_bytes, mode, wait)
            if type(r) is list:
                return r if len(r) == maxn or max_bytes else self._rest(r, maxn, vis_ns, visibility_timeout, mode)
            if type(r) is not int:
                return r
            if r != _F_BUSY and r != _F_OWNERDEAD:
                waited = 0  # the take had the lock: it uncounted the sleep

    def _c_take(self, maxn, vis_ns, max_bytes, mode, wait):
        """One C take (``take_many`` of up to ``maxn``; 0: ``take``): what it delivered (a
        producer owed a post for an auto-acked one is posted), or its R_* code."""
        paths = self.paths  # (the C paths: only a C take's code leads here)
        if maxn:
            r = paths.take_many(self, self._segp, self._base, self._cap, self._slot, vis_ns, self.max_deliveries or 0,
                                _mono(), maxn, max_bytes or 0, mode, self._ring, wait)
        else:
            r = paths.take(self, self._segp, self._base, self._cap, self._slot, vis_ns, self.max_deliveries or 0,
                           _mono(), mode, self._ring, wait)
        if type(r) is tuple:  # auto-acked
            if r[1]:
                self._nf.release()
            return r[0]
        return r

    def _get(self, maxn, timeout, visibility_timeout, max_bytes=None, mode=0, waited=0):
        if mode & _AUTOACK:
            vis_ns = _AUTOACK_LEASE_NS  # leased only until the ack below, in this call
        elif visibility_timeout is None:
            vis_ns = self._vis_ns
        else:
            vis_ns = _seconds_ns(visibility_timeout, "visibility_timeout")
        deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
        spun = timeout == 0
        while True:
            can_wait = deadline is None or _mono() < deadline
            try:
                got = self._take(maxn, vis_ns, waited, spun and can_wait, max_bytes,
                                 FOREVER if deadline is None else deadline)
            except LockTimeout as e:
                raise QueueEmpty(str(e)) from None
            if got is None:  # some were taken only to be dead-lettered: look again at once (not registered)
                waited = 0
                continue
            if got:
                if mode:
                    self._finish(got, mode)
                return got
            if not can_wait:
                raise QueueEmpty(f"queue {self.name!r} is empty")
            if not spun:
                spun = True
                waits.spin(self._mq, deadline, _mono)
                waited = 0
                continue
            waited = self._sleep(self._ne, deadline, _CONSUMERS)

    def _finish(self, ds, mode):
        """The general take's deliveries in ``mode``: acked now (in a second lock hold: the
        fast paths settle as they take), or their bodies as views."""
        if mode & _AUTOACK:
            self._settle_acks(ds)
        elif mode & _VIEW:
            for d in ds:
                d.body = self._view_of(d)

    def _view_of(self, d) -> memoryview:
        """``d``'s body in the ring, read-only, while ``d`` holds its lease (read without
        the lock: only its holder settles a lease, and a lapsed one keeps its bytes until
        it is taken again); DeliveryExpired once it is settled or taken again."""
        b, bl = self._body_at(d)
        return self._ring[b:b + bl]

    def _body_at(self, d) -> tuple[int, int]:
        """(ring offset, length) of ``d``'s body, checked as ``_view_of`` checks it."""
        if self._lockp is None:
            raise self._closed()
        mq, cap = self._mq, self._cap
        if not mq[I_HEAD] <= d._pos < mq[I_TAIL]:  # settled and reclaimed: its memory may have been given back
            raise self._expired(d)
        off = d._pos % cap
        w = (self._base + off) >> 3
        s = mq[w]
        if s & 0xFF != _LEASED or s >> 32 != d.attempt or mq[w + _R_MSG_ID] != d.id:
            raise self._expired(d)
        _s, _length, bl, hl, _f, _id, _e, _d = _REC_UNPACK(self._mm, self._base + off)
        return off + _REC + hl, bl

    def _loan_of(self, d):
        """``d``'s body in the ring as an object of its own whose references say who still reads
        it (``views``): a read-only ``Loan`` on the C paths, a ctypes array on Python's."""
        b, bl = self._body_at(d)
        if self.paths.Loan is not None:
            return self.paths.Loan(self._mm, self._base + b, bl, True)
        return (ctypes.c_char * bl).from_buffer(self._mm, self._base + b)

    def _take(self, maxn, vis_ns, waited, register, max_bytes=None, deadline=None):
        """One locked attempt to lease up to ``maxn`` ready messages. With ``register``,
        a take that found nothing counts this process as a sleeping consumer (the caller
        sleeps, then passes ``waited``, which undoes it). Returns the deliveries; [] when
        nothing was ready; None when everything taken was dead-lettered (expired, or past
        ``max_deliveries``): nothing registered, the caller looks again."""
        mm, mq, cap, base = self._mm, self._mq, self._cap, self._base
        out = []
        dead = None
        spent = []  # leased to us only to be dead-lettered: delivered as often as max_deliveries allows
        reap = False
        self._acquire_to_unwait(deadline, _CONSUMERS, waited)
        try:
            if waited:  # first: whatever happens next, this sleep is over
                waits.unregister(mq, self._slot, _CONSUMERS, waited)
            if mq[I_DELETED]:
                raise self._gone()
            now = _mono()
            if mq[_I_LIFE] >> _LIFE_SHIFT:  # a queue that expires is used now
                lifetime.used(mq, now)
            if now >= mq[I_NEXT_DEADLINE]:
                housekeeping.expire(self, now, spent)
            if now >= mq[I_NEXT_LIVENESS]:
                header.liveness_due(mq, now + housekeeping.LIVENESS_PERIOD_NS)
                reap = True
            ready = mq[I_READY]
            if self._levels > 1 or mq[I_SPECIAL]:
                ready = 0  # not the plain FIFO below
                take = scheduling.take if mq[I_SPECIAL] else scheduling.take_leveled
                out, expired = take(self, maxn, self._my_slot(), now + vis_ns, now, _wall(), max_bytes)
                if expired:
                    dead = expired
            if ready:
                out, dead = takes.take_batch(mm, mq, cap, base, ready, maxn, self._my_slot(), now + vis_ns,
                                             self.max_deliveries, max_bytes, self._ttl_ns, _wall(), _expiry)
            if out and self.max_deliveries is not None:
                out = self._past_max_deliveries(out, spent, now)
            if not out and not dead and not spent and register:  # nothing taken at all: this process sleeps next
                waits.register(mq, self._my_slot(), _CONSUMERS)
        finally:
            _unlock(self._lockp)
        # Deliveries are built outside the lock: the leased bytes are ours until settled.
        build = self.paths.Delivery
        expired = [build(self, *t) for t in dead] if dead else None
        if out:
            out = [build(self, *t) for t in out]
        if reap:
            housekeeping.reap_dead(self, now)
            housekeeping.return_memory(self)
        housekeeping.dead_letter_spent(self, spent)
        if expired:
            deadletter.dead_letter(self, expired, "expired")
        if not out and (spent or expired):
            return None
        return out

    def _past_max_deliveries(self, taken, spent, now):
        """``taken`` (Delivery tuples) less those past ``max_deliveries`` (ready with all
        their deliveries had: restored so from a snapshot), which go to ``spent`` with
        their attempt as it was: leased only to be dead-lettered (as ``housekeeping.expire``
        leases them), not delivered, nor counted as redelivered. Lock held."""
        maxdel = self.max_deliveries
        if all(t[2] <= maxdel for t in taken):
            return taken
        mq, slot = self._mq, self._my_slot()
        keep = []
        for t in taken:
            if t[2] <= maxdel:
                keep.append(t)
                continue
            takes.spent(mq, (self._base + t[0] % self._cap) >> 3, slot, now + housekeeping.MOVE_LEASE_NS, t[2] - 1)
            spent.append((t[0], t[1], t[2] - 1, *t[3:]))
        return keep

    def _ready_hint(self) -> bool:
        """Whether a message looks ready, read without the lock (a hint: re-check by taking)."""
        if self._lockp is None:
            raise self._closed()
        mq = self._mq
        if mq[I_DELETED]:
            raise self._gone()
        return mq[I_READY] > 0 or _mono() >= mq[I_NEXT_DEADLINE]


def take_capped(h, maxn, timeout, drop_lapsed, take):
    """A take under handle ``h``'s prefetch cap (``_set_prefetch``): wait while it holds its
    prefetch of un-settled deliveries (woken by a settle; when the cap is reached,
    ``drop_lapsed()`` forgets those whose lease lapsed), reserve the room left for this call
    against other threads, then ``take(room, seconds left)``, a list; what it took is held.
    QueueEmpty when the cap stays reached past ``timeout``."""
    deadline = None if timeout is None else _mono() + _seconds_ns(timeout, "timeout")
    cv, held = h._held_cv, h._held
    with cv:
        while True:
            if len(held) >= h._prefetch:  # some may have lapsed: look again
                drop_lapsed()
            room = h._prefetch - len(held) - h._pending
            if room > 0:
                room = min(maxn, room)
                h._pending += room  # reserved while this take runs, for other threads
                break
            left = None if deadline is None else (deadline - _mono()) / 1e9
            if left is not None and left <= 0:
                raise QueueEmpty(f"queue {h.name!r}: this handle holds its prefetch of {h._prefetch} "
                                 "un-settled deliveries")
            # woken by a settle; a lapsing lease is seen by the next look
            cv.wait(0.1 if left is None else min(left, 0.1))
    left = None if deadline is None else max(0.0, (deadline - _mono()) / 1e9)
    got = ()
    try:
        got = take(room, left)
    finally:
        with cv:
            h._pending -= room
            held.update(got)
            cv.notify_all()
    return got


class LocalConsumer:
    """``Queue.consume``'s iterator: gets under a prefetch cap, on a handle of its own
    (which stays open while deliveries from it are alive, so they can be settled)."""

    def __init__(self, q, prefetch, visibility_timeout):
        q._set_prefetch(prefetch)
        self._q = q
        self._vis = visibility_timeout
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        return self._q.get(visibility_timeout=self._vis)

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_NO_LOG = (0, -1)  # (generation, descriptor) of a queue without a log, as take_next takes them


class Messages:
    """``Queue.messages()``: a consume loop whose step acks the delivery it handed out last
    and takes the next. With the C paths that is one ``take_next`` (one lock hold); the
    Python twin (and a handle whose ``get`` is its own: a serializer's, lanes) acks, then
    gets. Either way an ack is made only while the delivery is still leased as it was
    delivered (``takes.leased_word``'s checks), so the application's own settle wins."""

    __slots__ = ("_q", "_timeout", "_vis", "_vis_ns", "_copy", "_mode", "_step", "_last", "_done")

    def __init__(self, q, timeout, visibility_timeout, copy):
        if timeout is not None:
            _seconds_ns(timeout, "timeout")
        self._vis_ns = None if visibility_timeout is None else _seconds_ns(visibility_timeout, "visibility_timeout")
        self._mode = _mode(True, copy)
        self._q = q
        self._timeout = timeout
        self._vis = visibility_timeout
        self._copy = copy
        # the C step, where the handle runs the C paths (its paths' take_next) and its get is the plain one
        # (the C step builds plain deliveries only); None: the Python step
        self._step = q.paths.take_next if type(q).get is Consuming.get else None
        self._last = None  # the delivery handed out last, acked by the next step
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        prev = self._last
        if prev is None:
            return self._take()
        self._last = None
        q = self._q
        take_next = self._step
        if take_next is not None and q._slot >= 0 and q._held is None and not q._general:
            wal = q.wal.fd if q._logged else _NO_LOG
            if wal is not None:
                if _kept_alive:  # (a dict: empty unless some keepalive runs in this process)
                    _stop_keepalives((prev,))
                if _array_views:  # (an array on its body: let go of first, or BufferError)
                    try:
                        views.release((prev,))
                    except BufferError:
                        self._last = prev  # (still the loop's: settled by its next step, once let go)
                        raise
                try:
                    r = take_next(q, q._segp, q._base, q._cap, q._slot,
                                  q._vis_ns if self._vis_ns is None else self._vis_ns, q.max_deliveries or 0,
                                  _mono(), self._mode, q._ring, prev, wal[1], wal[0])
                except OSError as e:
                    raise q.wal.failed(e) from None
                if type(r) is tuple:  # the ack freed room a producer waits for
                    q._nf.release()
                    r = r[0]
                if type(r) is not int:
                    self._last = r
                    return r
                if r == _F_EMPTY:  # prev was looked at (acked if still leased): wait for the next
                    try:
                        d = q._fast_wait(r, 0, self._timeout, self._vis, None, self._mode)
                    except QueueEmpty:
                        self._done = True
                        raise StopIteration from None
                    self._last = d
                    return d
                if r == _F_OWNERDEAD:
                    q._repair_held_lock()
                # else the general take's case, or a busy lock: below (an ack made already is not made twice)
        try:
            self._ack(prev)
        except BufferError:  # (an array on its body still alive: still the loop's, acked by a later step)
            self._last = prev
            raise
        return self._take()

    def _take(self):
        """The next delivery by the handle's own ``get``; StopIteration past the timeout."""
        if self._done:
            raise StopIteration
        try:
            d = self._q.get(self._timeout, self._vis, True, self._copy)
        except QueueEmpty:
            self._done = True
            raise StopIteration from None
        self._last = d
        return d

    @staticmethod
    def _ack(d):
        try:
            d.ack()
        except DeliveryExpired:
            pass  # settled by the application, or its lease lapsed: not the loop's to ack

    def close(self) -> None:
        """End the loop, acking the last delivery if it is still leased and unsettled."""
        self._done = True
        d, self._last = self._last, None
        if d is not None:
            self._ack(d)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # the last delivery stays leased: delivered again once its lease lapses
            self._done = True
            self._last = None
