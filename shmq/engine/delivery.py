"""What a queue hands out: a ``Delivery`` (one leased message) and ``QueueStats``."""

import logging
from dataclasses import dataclass

from . import cpaths, extension, keepalive
from .headers import decode_headers

__all__ = ["Delivery", "Message", "QueueStats", "Processing", "raw_body"]

_log = logging.getLogger("shmq")


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
    expired_total: int = 0
    ready_by_priority: tuple = ()  # ready messages per priority level, level 0 first
    groups_in_flight: int = 0  # message groups with a message leased or delayed
    dead_letter_depth: int | None = None  # ready messages in the dead-letter queue (None: no DLQ)


@dataclass(frozen=True, slots=True)
class Message:
    """A message looked at without leasing it (``Queue.peek``)."""

    id: int
    body: bytes
    headers: dict
    attempt: int
    priority: int
    enqueued_at: float
    group: str | None
    queue: str


class _Fields:
    """A delivery's fields: the pure-Python twin of ``_fast.DeliveryBase``, which the C
    takes build without calling ``__init__`` (the base ``Delivery`` has when they are built)."""

    __slots__ = ("id", "body", "attempt", "_q", "_pos", "_hraw", "_enq", "_ext", "_raw")

    def __init__(self, q, pos, msg_id, attempt, body, hraw, enq_ns=0):
        self._q = q
        self._pos = pos
        self.id = msg_id
        self.attempt = attempt
        self.body = body
        self._enq = enq_ns
        # the record's header bytes (an extension block, then msgpack headers), None when
        # empty; split and decoded on first use (``_ext`` is None until then)
        self._hraw = hraw
        self._ext = self._raw = None


class Delivery(cpaths.DeliveryBase or _Fields):
    """One delivered message, leased to this process until settled or expired.

    Settle it exactly once: ``ack()`` deletes it, ``nack()`` makes it ready again (after
    ``delay`` seconds), ``reject()`` dead-letters it, ``extend()`` keeps the lease longer.
    Each raises :class:`DeliveryExpired` if the lease is no longer this delivery's.
    """

    __slots__ = ()

    @property
    def queue(self) -> str:
        return self._q.name

    def _split(self):
        """The extension block; ``_hraw`` becomes the headers' bytes (or None)."""
        ext, self._hraw = extension.split(self._hraw)
        self._ext = ext
        return ext

    @property
    def has_options(self) -> bool:
        """Whether it carries a priority or a group (its record has an extension block)."""
        ext = self._ext
        if ext is None:
            h = self._hraw
            return h is not None and type(h) is bytes and h[0] == extension.L.EXT_MAGIC
        return ext is not extension.NONE

    @property
    def priority(self) -> int:
        ext = self._ext
        return (self._split() if ext is None else ext).priority

    @property
    def group(self) -> str | None:
        ext = self._ext
        return (self._split() if ext is None else ext).group

    @property
    def view(self) -> memoryview:
        """The body as a read-only memoryview into the queue's memory, no copy (``body``
        itself with ``get(copy=False)``). Valid until the delivery is settled or its lease
        lapses: after that its bytes may be reused by other messages (copy what you keep:
        ``bytes(d.view)``). DeliveryExpired when it is no longer leased."""
        b = raw_body(self)
        if type(b) is memoryview:
            return b
        return self._q._view_of(self)

    @property
    def enqueued_at(self) -> float:
        """When it was put (seconds since the epoch)."""
        return self._enq / 1e9

    @property
    def headers(self) -> dict:
        h = self._hraw
        if h is None:
            return {}
        if type(h) is bytes:
            if self._ext is None:
                self._split()
                h = self._hraw
                if h is None:
                    return {}
            h = self._hraw = decode_headers(h)
        return h

    def ack(self, wait: bool = True) -> None:
        """Done with it: the message is gone. (``wait`` is for the TCP client's pipelined
        acks; a local ack is one memory access, always confirmed.)"""
        self._q._ack_one(self)

    def nack(self, requeue: bool = True, delay: float | None = None) -> None:
        """Make it ready again after ``delay`` seconds (None: the queue's retry policy,
        ``retry_delay`` and ``retry_backoff``; immediately by default), or reject it
        (``requeue=False``)."""
        if requeue:
            self._q.nack_many([self], delay)
        else:
            self._q.reject_many([self])

    def reject(self) -> None:
        self._q.reject_many([self])

    def extend(self, seconds: float) -> None:
        self._q._extend(self, seconds)

    def keepalive(self, every: float | None = None) -> "keepalive.Keepalive":
        """Renew the lease in the background (this process's renewer thread) every
        ``every`` seconds (None: a third of the queue's visibility timeout), each time to
        ``3 * every`` from now, until ``stop()`` or the delivery is settled. ``with
        d.keepalive(): ...`` stops it at the end of the block."""
        return keepalive.in_thread(self, every, self._q._visibility_now)

    def process(self, requeue: bool = True, renew: bool = False) -> "Processing":
        """``with d.process(): ...`` acks when the block succeeds; when it raises, nacks
        (``requeue``) or rejects (``requeue=False``), and the exception goes on.
        ``renew``: the lease is renewed while the block runs (``keepalive``)."""
        return Processing(self, requeue, renew)

    def reply(self, body: bytes, headers: dict | None = None) -> bool:
        """Answer a request (``Broker.request``) this delivery carries. False when the
        requester is gone (its reply queue was removed)."""
        from .rpc import reply

        return reply(self, body, headers)

    def __repr__(self):
        return f"<Delivery {self.queue}#{self.id} attempt={self.attempt} {len(raw_body(self))}B>"


if cpaths.DeliveryBase is not None:
    cpaths._fast.set_delivery_class(Delivery)  # what the C takes build


def raw_body(d) -> bytes:
    """A delivery's body as bytes, also when a serializer loaded ``d.body``."""
    try:
        raw = d._raw
    except AttributeError:  # a TCP client's delivery with no serializer
        return d.body
    return d.body if raw is None else raw


class Processing:
    """``Delivery.process()``: settles the delivery as its block ends (aio-pika's
    ``message.process``). ``with`` for the local and blocking deliveries, ``async with``
    for the asyncio client's. If the settling fails after the block raised (a lost
    connection), the block's exception goes on and the lease lapses: nothing is lost.
    With ``renew``, the delivery's ``keepalive()`` runs while the block does."""

    __slots__ = ("_d", "_requeue", "_renew", "_kept")

    def __init__(self, d, requeue: bool, renew: bool = False):
        self._d = d
        self._requeue = requeue
        self._renew = renew
        self._kept = None

    def _keep(self):
        if self._renew:
            self._kept = self._d.keepalive()
        return self._d

    def _unkeep(self):
        if self._kept is not None:
            self._kept.stop()  # (the settle stopped it already, unless it raised first)

    def _settle(self, failed: bool):
        d = self._d
        if not failed:
            return d.ack()
        return d.nack() if self._requeue else d.reject()

    def __enter__(self):
        return self._keep()

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self._settle(False)
                return False
            try:
                self._settle(True)
            except Exception as e:  # the block's exception matters more; the lease will lapse
                _log.warning("could not give back %r after its block raised: %s", self._d, e)
            return False
        finally:
            self._unkeep()

    async def __aenter__(self):
        return self._keep()

    async def __aexit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                await self._settle(False)
                return False
            try:
                await self._settle(True)
            except Exception as e:
                _log.warning("could not give back %r after its block raised: %s", self._d, e)
            return False
        finally:
            self._unkeep()
