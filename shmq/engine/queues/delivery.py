"""What a queue hands out: a ``Delivery`` (one leased message), in the two builds a
handle's paths make (``paths.QueuePaths.Delivery``): ``CDelivery``, whose fields are
``_fast.DeliveryBase``'s (the C takes build it without calling ``__init__``), and
``PythonDelivery``, whose fields are slots; both are ``Delivery``s, with its methods.
``Message``, ``QueueStats``, ``Processing`` and ``raw_body`` live in ``shmq.model``
(every transport shares them); they are imported here under their old names."""

from itertools import repeat
from operator import attrgetter, truediv

from ...errors import QueueNotFound
from ...model import keepalive
from ...model.headers import CORRELATION_ID, decode_headers, reply_headers
from ...model.messages import Message, QueueStats, raw_body
from ...model.processing import Processing
from ..shm import cpaths
from . import extension, views

__all__ = ["Delivery", "PythonDelivery", "CDelivery", "Message", "QueueStats", "Processing", "raw_body",
           "plain_columns"]


class Delivery:
    """One delivered message, leased to this process until settled or expired.

    Settle it exactly once: ``ack()`` deletes it, ``nack()`` makes it ready again (after
    ``delay`` seconds), ``reject()`` dead-letters it, ``extend()`` keeps the lease longer.
    Each raises :class:`DeliveryExpired` if the lease is no longer this delivery's.
    (The methods of both builds: the fields, ``id``, ``body``, ``attempt``, ``_q``,
    ``_pos``, ``_hraw``, ``_enq``, ``_ext`` and ``_raw``, are a subclass's.)
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

    def array(self, copy: bool = False):
        """The numpy array ``put_array`` sent, as a read-only view of the body where it lies
        in the queue's memory: no copy. It is valid until the delivery is settled, and the
        settle (``ack``, ``nack``, ``reject``) raises BufferError, settling nothing, while the
        array (or anything made from it) is still alive: let it go first, or take ``copy=True``
        (an array of its own, which outlives the delivery). A lease that lapses while the
        array is used ends its validity too (``keepalive()`` keeps it). TypeError for a
        message sent otherwise; DeliveryExpired once it is no longer leased."""
        return views.array_of(self, self.headers, copy)

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
        requester is gone (its reply queue was removed). ValueError if it asked for no
        reply."""
        reply_to, corr = reply_headers(self)
        try:
            q = self._q._open_queue(reply_to)
        except QueueNotFound:
            return False
        try:
            q.put_nowait(body, {**(headers or {}), CORRELATION_ID: corr})
        except QueueNotFound:
            return False
        finally:
            q.close()
        return True

    def __repr__(self):
        return f"<Delivery {self.queue}#{self.id} attempt={self.attempt} {len(raw_body(self))}B>"



class PythonDelivery(Delivery):
    """A ``Delivery`` built by the Python paths: the pure-Python twin of ``CDelivery``."""

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


if cpaths.C is not None:
    class CDelivery(cpaths.C.DeliveryBase, Delivery):
        """A ``Delivery`` whose fields live in C (``_fast.DeliveryBase``): what the C takes
        build, and what the Python paths of a handle on the C paths build (the same
        ``__init__`` arguments as ``PythonDelivery``'s)."""

        __slots__ = ()

    cpaths.C.set_delivery_class(CDelivery)  # what the C takes build
else:
    CDelivery = None


_ID, _BODY, _ATTEMPT, _HRAW, _EXT, _ENQ = map(attrgetter, ("id", "body", "attempt", "_hraw", "_ext", "_enq"))


def plain_columns(ds):
    """(ids, bodies, attempts, enqueued_ats) of deliveries ``ds``, each an iterator made in
    C passes (no Python frame per delivery), when none carries headers or options: the
    usual batch, which the server turns into wire rows; None when one does."""
    if any(map(_HRAW, ds)) or any(map(_EXT, ds)):
        return None
    return map(_ID, ds), map(_BODY, ds), map(_ATTEMPT, ds), map(truediv, map(_ENQ, ds), repeat(1e9))
