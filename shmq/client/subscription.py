"""``q.consume(prefetch=N)`` over a connection, written once (sans-IO): ``SubscriptionCalls``,
the iteration of the deliveries the server pushes (SUBSCRIBE, docs/PROTOCOL.md).

Strategy: the first step subscribes; the server then pushes deliveries while fewer than
``prefetch`` are un-acked, and the core keeps them in the subscription's buffer, whoever
read them off the socket. Each step hands out the next buffered one, or waits for a push
(``Receive``). ``ack(wait=False)`` of a delivery handed out here is kept and sent with
the acks beside it in one ACK (``Post``, no reply awaited): once a quarter of the prefetch
has gathered, when the iteration is about to wait (the server pushes no more until acks
come), when the oldest has waited ACK_LINGER_S at a step, and at close. So the server
sees one ACK per batch, not one per message. Closing sends the gathered acks and a CANCEL
saying how many pushed messages were handed out: the server gives the rest back, those
still on the wire included, and the core drops them as they come. A subscription is
bound to its connection: once that is lost (the server gave back what it held, acks not
sent included: they come again), the step that finds it subscribes again on the broker
handle's new connection, with the same prefetch (``core.resumable``; the transports'
iterations step again after a step the loss broke: ``core.Resuming``); without
reconnecting, every step raises why (BrokerUnavailable).
"""

import time
import weakref

from ..protocol import MsgType
from ..protocol.payloads import ms
from .core import Post, Receive, Resuming, Send, resumable

__all__ = ["SubscriptionCalls", "ACK_LINGER_S"]

ACK_LINGER_S = 0.05  # the longest an ack(wait=False) waits at a step for its batch
_MESSAGE_TYPES = (list, dict)  # a pushed message: a row or a map (else an end, an exception)


class SubscriptionCalls(Resuming):
    """The deliveries pushed for one subscription of queue handle ``q``, as an iterator
    (the transport's subclass makes it one)."""

    closed = True  # until __init__ has checked its arguments

    def __init__(self, q, prefetch, visibility_timeout=None):
        if type(prefetch) is not int or prefetch < 1:
            raise ValueError(f"prefetch must be a positive int, not {prefetch!r}")
        self._q = q
        self._core = q._broker._core
        self._fields = {"queue": q.name, "prefetch": prefetch}
        if visibility_timeout is not None:
            self._fields["visibility_ms"] = ms(visibility_timeout, "visibility_timeout")
        self.prefetch = prefetch
        self.id = None  # the server's, once subscribed
        self._buffer = None
        self._handed = 0  # pushed messages handed out
        self._acks = []  # tags acked without waiting, not sent yet
        self._acks_since = 0.0
        self._flush_at = max(1, prefetch // 4)
        self.closed = False

    def __repr__(self):
        return f"<{type(self).__name__} {self._q.name} prefetch={self.prefetch}>"

    def _broker_handle(self):
        return self._q._broker

    def _is_closed(self) -> bool:
        return self.closed

    def _next(self):
        """A call: the next delivery (None once closed); the server's end of the
        subscription (its queue deleted...) is raised once the ones before it are out."""
        if self.closed:
            return None
        broker = self._q._broker
        if self.id is not None and self._core.failed and broker._core is not self._core \
                and resumable(self._core, broker):  # the broker reconnected: subscribe there
            self.id, self._buffer, self._acks, self._handed = None, None, [], 0
        if self.id is None:
            self._core = broker._core  # the connection now (reconnected, maybe)
        core = self._core
        if core.failed:  # the subscription ended with it, and the server gave back its deliveries
            self._acks = []
            raise core.ended_error()
        core.raise_deferred()
        if self.id is None:
            fields = {**self._fields, "rows": True} if core.compact else self._fields  # (rows: payloads.ROW_ITEMS)
            self.id = (yield Send(MsgType.SUBSCRIBE, fields))["subscription"]
            self._buffer = core.pushes(self.id)
        buf = self._buffer
        if self._acks and (not buf or time.monotonic() - self._acks_since > ACK_LINGER_S):
            yield self._flush()
        while not buf:
            yield Receive(self.id, core)
        item = buf.popleft()
        if isinstance(item, BaseException):
            self.closed = True  # the server closed it: nothing to cancel
            self._acks = []
            core.unsubscribe(self.id)
            raise item
        self._handed += 1
        d = (yield from self._q._deliveries([item]))[0]
        d._sub = weakref.ref(self)
        return d

    def _ready(self):
        """The next delivery when it needs no request (one is buffered, no acks are due, no
        earlier error waits to be raised), else None: the transports' fast path."""
        buf = self._buffer
        if (not buf or self.closed or self._core._deferred is not None or type(buf[0]) not in _MESSAGE_TYPES
                or self._core.failed
                or self._q.serializer is not None
                or (self._acks and time.monotonic() - self._acks_since > ACK_LINGER_S)):
            return None
        self._handed += 1
        d = self._q._delivery_class(self._q, buf.popleft())
        d._sub = weakref.ref(self)
        return d

    def _keep_ack(self, tag) -> bool:
        """Keep an ack(wait=False) for the batch if that sends nothing now (the fast path)."""
        if self.closed or len(self._acks) + 1 >= self._flush_at or self._core.failed:
            return False
        if not self._acks:
            self._acks_since = time.monotonic()
        self._acks.append(tag)
        return True

    def _flush(self) -> Post:
        tags, self._acks = self._acks, []
        return Post(MsgType.ACK, {"queue": self._q.name, "deliveries": tags})

    def _ack_later(self, tag):
        """``ack(wait=False)`` of a delivery handed out here: the ACK to post now, or None
        (kept for the batch)."""
        self._acks.append(tag)
        if self.closed or len(self._acks) >= self._flush_at:
            return self._flush()
        if len(self._acks) == 1:
            self._acks_since = time.monotonic()
        return None

    def _close(self, post):
        """Send the gathered acks and the CANCEL with ``post(msg_type, payload)``; forget the
        buffer (the server gives back what it holds)."""
        if self.closed:
            return
        self.closed = True
        if self.id is None or self._core.failed:  # never subscribed, or ended with its connection
            return
        if self._acks:
            flush = self._flush()
            post(flush.msg_type, flush.payload)
        post(MsgType.CANCEL, {"subscription": self.id, "delivered": self._handed})
        self._core.unsubscribe(self.id)
