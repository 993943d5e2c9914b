"""Settling deliveries: ack (the hot path: C first), batches of acks, nacks with an
optional delay, rejects to the dead-letter queue, lease extension — each checks that
the lease is still the delivery's (``takes.leased_word``). Part of ``Queue`` (``queue.py``).
"""

import time
from collections.abc import Iterable

from ...formats import dmsq
from ...errors import DeliveryExpired
from ...model.keepalive import _live as _kept_alive
from . import views
from .views import _viewed as _array_views
from ...model.keepalive import settling as _stop_keepalives
from ..shm import cpaths
from . import deadletter
from ..shm import ring, takes, waits
from ..shm import layout as L
from ..shm.layout import I_DEAD_TOTAL, I_DELETED, I_HEAD, I_TAIL
from ..shm.mutex import unlock as _unlock
from .delivery import Delivery

__all__ = ["Settling"]

_mono = time.monotonic_ns
_CONSUMERS, _PRODUCERS = waits.CONSUMERS, waits.PRODUCERS
_encode_ack_entry = dmsq.encode_ack_entry
_word_leased, _ack = takes.leased_word, takes.ack
_seconds_ns = waits.seconds_ns
_F_OWNERDEAD, _F_EXPIRED, _F_DELETED = cpaths.OWNERDEAD, cpaths.EXPIRED, cpaths.DELETED
_proc_word, _P_ACKED = L.proc_word, L.P_ACKED


class Settling:
    """The settle operations of ``Queue`` and its deliveries."""

    def _leased_word(self, d, head=None, tail=None, now=None):
        """Word index of the delivery's record if its lease is still d's, else -1. Lock held."""
        mq = self._mq
        return takes.leased_word(mq, self._base, self._cap, d._pos, d.attempt, d.id,
                                 mq[I_HEAD] if head is None else head, mq[I_TAIL] if tail is None else tail,
                                 _mono() if now is None else now)

    def _expired(self, d):
        return DeliveryExpired(f"delivery {self.name}#{d.id} attempt {d.attempt} is no longer leased")

    def _ack_one(self, d):
        lp = self._lockp
        if lp is None:
            raise self._closed()
        if _array_views:  # (an array on its body: let go of first, or BufferError)
            views.release((d,))
        if self._held is not None:
            self._drop_held((d,))
        fast_ack = self._fast_ack  # (the handle's paths': None on the Python paths)
        if fast_ack is not None and self._slot >= 0 and (not self._logged or self.wal.fd is not None):
            gen, fd = self.wal.fd if self._logged else (0, -1)
            try:
                r = fast_ack(self._segp, self._base, self._cap, d._pos, d.attempt, d.id, _mono(), fd, gen, self._slot)
            except OSError as e:
                raise self.wal.failed(e) from None
            if r >= 0:
                if r:
                    self._nf.release()
                return
            if r == _F_EXPIRED:
                raise self._expired(d)
            if r == _F_DELETED:
                raise self._gone()
            if r == _F_OWNERDEAD:
                self._repair_held_lock()
            # busy, or a log the C path does not append to: the Python path below
        mq, cap = self._mq, self._cap
        pos = d._pos
        post = False
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            head = mq[I_HEAD]
            w = _word_leased(mq, self._base, cap, pos, d.attempt, d.id, head, mq[I_TAIL], _mono())
            if w < 0:
                raise self._expired(d)
            if self._logged:
                self.wal.append(_encode_ack_entry(d.id, d.attempt), grows=False)
            slot = self._slot
            _ack(mq, w, slot if slot >= 0 else self._my_slot())
            post = (pos == head or pos % cap == 0) and ring.freed_at(mq, cap, self._base, pos, head)
        finally:
            _unlock(lp)
        if post:
            self._nf.release()

    def ack_many(self, deliveries: Iterable[Delivery], wait: bool = True) -> int:
        """Ack a batch under one lock. Raises DeliveryExpired naming those no longer
        leased (the others are acked). Returns how many were acked. (``wait`` is for the
        TCP client's pipelined acks: a local ack is always confirmed.)"""
        ds = self._own(deliveries)
        fast_ack_many = self.paths.ack_many
        if fast_ack_many is not None and not self._logged and ds and self._lockp is not None:
            r = self._batch_in_c(fast_ack_many, ds)
            if r is not None:
                done, post, bad = r
                if post:
                    self._nf.release()
                self._raise_expired([ds[i] for i in bad])
                return done
        return self._settle_acks(ds)

    def _batch_in_c(self, fast, ds):
        """Run the C batch settle ``fast`` (``_fast.ack_many`` or ``nack_many``) over
        ``ds``: (settled, posts owed, indices no longer leased), or None when the Python
        path must do it (the lock was busy, or was repaired after a dead holder)."""
        if self._slot < 0:
            return None
        flat = []
        for d in ds:
            flat += (d._pos, d.attempt, d.id)
        r = fast(self._segp, self._base, self._cap, flat, _mono(), self._slot)
        if type(r) is tuple:
            return r
        if r == _F_DELETED:
            raise self._gone()
        if r == _F_OWNERDEAD:
            self._repair_held_lock()
        return None

    def _retry_delay_ns(self, attempt: int) -> int:
        """The queue's retry policy: how long a message nacked without a delay (or whose
        lease lapsed) after ``attempt`` deliveries waits before it is ready again."""
        if not self._retry_ns:
            return 0
        d = self._retry_ns * self._backoff ** max(0, attempt - 1)
        if self._retry_max_ns and d > self._retry_max_ns:
            return self._retry_max_ns
        return int(min(d, 2**62))

    def nack_many(self, deliveries: Iterable[Delivery], delay: float | None = None) -> int:
        """Make a batch ready again under one lock (after ``delay`` seconds; None: the
        queue's retry policy), keeping their attempt counts; a delivery that was its
        message's last (its attempt is ``max_deliveries``) is dead-lettered instead, now.
        Raises DeliveryExpired naming those no longer leased (the others are settled).
        Returns how many were settled."""
        if delay is not None:
            _seconds_ns(delay, "delay")  # (checked even when all of them are dead-lettered)
        self._settings_due()  # (max_deliveries, the retry policy: changed by ``update_queue``?)
        ds = self._own(deliveries)
        if not ds:
            return 0
        maxdel = self.max_deliveries
        done, stale = 0, []
        if maxdel is not None and any(d.attempt >= maxdel for d in ds):
            last = [d for d in ds if d.attempt >= maxdel]
            ds = [d for d in ds if d.attempt < maxdel]
            stale = deadletter.dead_letter(self, last, "max-deliveries")
            done = len(last) - len(stale)
        if ds:
            n, expired = self._nack(ds, delay)
            done += n
            stale += expired
        self._raise_expired(stale)
        return done

    def _nack(self, ds, delay):
        """``nack_many``'s requeue of ``ds``: (how many, [those no longer leased])."""
        fast_nack_many = self.paths.nack_many
        if (fast_nack_many is not None and self._lockp is not None
                and (not self._retry_ns if delay is None else type(delay) in (int, float) and delay == 0)):
            r = self._batch_in_c(fast_nack_many, ds)  # at once, in C under one lock hold
            if r is not None:
                done, post, bad = r
                for _ in range(post):
                    self._ne.release()
                return done, [ds[i] for i in bad]
        return self._requeue(ds, delay)  # (the Python path waits for a busy lock)

    def _release_many(self, deliveries) -> int:
        """Give back deliveries no consumer saw (pushed by the server, never handed out):
        ready again at once, and the delivery they were leased for does not count as an
        attempt. Otherwise as ``nack_many``."""
        done, expired = self._requeue(self._own(deliveries), 0.0, unseen=True)
        self._raise_expired(expired)
        return done

    def _requeue(self, deliveries, delay, unseen=False):
        """Ready again (after ``delay`` seconds; None: the retry policy), or DELAYED, under
        one lock: (how many, [those no longer leased])."""
        policy = delay is None
        delay_ns = 0 if policy else _seconds_ns(delay, "delay")
        mq = self._mq
        woke = 0
        self._acquire()
        try:
            now = _mono()
            live, expired = self._leased(deliveries, now)
            for d, w in live:
                if policy:
                    delay_ns = self._retry_delay_ns(d.attempt)
                # unseen: the attempt it was leased with never happened
                woke += takes.unlease(mq, w, d._pos, now + delay_ns if delay_ns else 0,
                                      max(0, (mq[w] >> 32) - 1) if unseen else None)
            done = len(live)
            post = waits.owed_posts(mq, _CONSUMERS, woke)
        finally:
            _unlock(self._lockp)
        for _ in range(post):
            self._ne.release()
        return done, expired

    def reject_many(self, deliveries: Iterable[Delivery]) -> None:
        """Dead-letter a batch (to ``dead_letter_queue``, or drop it when there is none).
        Raises DeliveryExpired if one is no longer leased (then none is touched)."""
        self._settings_due()  # (the dead-letter queue: changed by ``update_queue``?)
        deadletter.dead_letter(self, self._own(deliveries), "rejected")

    def _leased(self, deliveries, now):
        """([(delivery, word index)] still leased to them, [those no longer]). Lock held;
        QueueNotFound if the queue was deleted."""
        mq = self._mq
        if mq[I_DELETED]:
            raise self._gone()
        head, tail = mq[I_HEAD], mq[I_TAIL]
        live, expired = [], []
        seen = set()
        for d in deliveries:
            w = self._leased_word(d, head, tail, now)
            if w < 0 or w in seen:  # a delivery named twice is settled once, as two calls would
                expired.append(d)
            else:
                seen.add(w)
                live.append((d, w))
        return live, expired

    def _own(self, deliveries):
        deliveries = list(deliveries)
        for d in deliveries:
            if getattr(d, "_q", None) is not self:
                raise TypeError(f"expected deliveries of queue {self.name!r}, got {d!r}")
        if self._held is not None:
            self._drop_held(deliveries)
        if _kept_alive:  # (a dict: empty unless some keepalive runs in this process)
            _stop_keepalives(deliveries)
        if _array_views:  # (arrays on their bodies: let go of first, or BufferError)
            views.release(deliveries)
        return deliveries

    def _raise_expired(self, expired):
        if len(expired) == 1:
            raise self._expired(expired[0])
        if expired:
            ids = ", ".join(f"#{d.id}" for d in expired[:10])
            raise DeliveryExpired(f"{len(expired)} deliveries of {self.name!r} are no longer leased: {ids}")

    def _settle_acks(self, deliveries, dead_lettered=False, counted=True) -> int:
        """Ack (or drop as dead-lettered) a batch under one lock. ``counted=False``: they
        were counted already (expired)."""
        mq, cap = self._mq, self._cap
        freed = False
        post = 0
        self._acquire()
        try:
            live, expired = self._leased(deliveries, _mono())
            head = mq[I_HEAD]
            if self._logged and live:
                self.wal.append(b"".join(_encode_ack_entry(d.id, d.attempt) for d, _w in live), grows=False)
            for d, _w in live:
                pos = d._pos
                if pos == head or (pos % cap == 0 and pos - head < cap):  # first after head (or a pad)
                    freed = True
                    break
            done = len(live)
            takes.ack_many(mq, [w for _d, w in live], None if not counted else I_DEAD_TOTAL if dead_lettered
                           else _proc_word(self._my_slot(), _P_ACKED))
            if freed and ring.advance_head(mq, cap, self._base):
                post = waits.owed_posts(mq, _PRODUCERS, 1)
        finally:
            _unlock(self._lockp)
        for _ in range(post):
            self._nf.release()
        self._raise_expired(expired)
        return done

    def _extend(self, d, seconds):
        until = _mono() + _seconds_ns(seconds, "seconds")
        mq = self._mq
        self._acquire()
        try:
            if mq[I_DELETED]:
                raise self._gone()
            w = self._leased_word(d)
            if w < 0:
                raise self._expired(d)
            takes.extend(mq, w, until)
        finally:
            _unlock(self._lockp)
