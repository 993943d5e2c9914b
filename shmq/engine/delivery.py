"""What a queue hands out: a ``Delivery`` (one leased message) and ``QueueStats``."""

from dataclasses import dataclass

from .headers import decode_headers

__all__ = ["Delivery", "QueueStats"]


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
            self._q.nack_many([self], delay)
        else:
            self._q.reject_many([self])

    def reject(self) -> None:
        self._q.reject_many([self])

    def extend(self, seconds: float) -> None:
        self._q._extend(self, seconds)

    def __repr__(self):
        return f"<Delivery {self.queue}#{self.id} attempt={self.attempt} {len(self.body)}B>"
