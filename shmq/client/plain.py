"""The plain calls' fast path, for both transports: a get, put, get_many, put_many and
ack_many with no options, headers or serializer (the calls of every message) sent as
frames made from bytes packed once per queue (``protocol/shapes.py``) and read back
without the generator machinery of ``core``; anything else takes the general path.
``PlainQueueCalls`` says which calls are plain and builds their frames; each transport's
broker drives them (``_get_plain``, ``_put_plain``, ``_put_many_plain``).
"""

from operator import attrgetter

from ..model import keepalive
from ..protocol.shapes import ack_shape, acks_shape, consume_many_shape, consume_shape, leased, produce_batch_shape
from ..protocol.cwire import tags as _c_tags
from ..protocol.shapes import produce_shape
from .core import QueueCalls

__all__ = ["PlainQueueCalls", "RAW_REPLIES"]

# whether a plain get's CONSUME reply is read by the C codec straight into deliveries (``shapes.leased``):
# its payload then comes as its bytes (``ClientCore.send_shaped(raw=True)``)
RAW_REPLIES = leased is not None

_BYTES = {bytes}
_q_attr, _conn_attr, _tag_attr = attrgetter("_q"), attrgetter("_conn"), attrgetter("_tag")


class PlainQueueCalls(QueueCalls):
    """``QueueCalls`` whose plain get, get_many and put_many (no options, headers or
    serializer) take the transport's fast path, its broker's ``_get_plain`` and
    ``_put_many_plain``; anything else takes the general one."""

    def __init__(self, broker, name: str, serializer=None):
        super().__init__(broker, name, serializer)
        # the frames of a plain get, put and ack(wait=False), made from bytes packed once
        self._get_shape, self._put_shape, self._ack_shape = consume_shape(name), produce_shape(name), ack_shape(name)
        self._batch_shapes = None  # (put_many's, ack_many's shapes, {most: get_many's}), made on first use

    def _shapes(self):
        """The batch calls' shapes (``_batch_shapes``), made on first use."""
        if self._batch_shapes is None:
            self._batch_shapes = (produce_batch_shape(self.name), acks_shape(self.name), {})
        return self._batch_shapes

    def _consume_plan(self, most, rows: bool):
        """(the CONSUME shape, what reads its reply) of a plain get (``most`` None) or
        get_many of ``most``; ``rows``: the server takes compact forms."""
        if most is None:
            return self._get_shape, self._taken
        return self._get_many_shape(most, rows), self._taken_all

    def _get_many_shape(self, most: int, rows: bool):
        """The CONSUME shape of a plain get_many of ``most`` (``rows``: its messages asked
        for as rows, from a server that says ``compact``)."""
        by_most = self._shapes()[2]
        shape = by_most.get((most, rows))
        if shape is None:
            if len(by_most) >= 16:  # a few sizes are kept, not one per size ever asked
                by_most.clear()
            shape = by_most[most, rows] = consume_many_shape(self.name, most, rows)
        return shape

    def _plain_get(self, visibility_timeout, ack) -> bool:
        """Whether a get with these arguments is a plain one, for a transport's fast path
        (the CONSUME of ``_get_shape``, a slice at a time, and ``_taken`` of its reply):
        leased, no serializer, this handle open."""
        return visibility_timeout is None and ack is True and self.serializer is None and not self.closed

    def _taken(self, reply, until, clock):
        """The delivery of a plain get's CONSUME ``reply`` (its payload, or its bytes:
        ``RAW_REPLIES``); None: ask again (a slice ended before ``until``); QueueEmpty once
        it has passed."""
        if type(reply) is bytes:
            ds = self._leased(reply)
            if type(ds) is list:
                if ds:
                    return ds[0]
                messages = ()
            else:
                messages = ds["messages"]
        else:
            messages = reply["messages"]
        if messages:
            return self._delivery_class(self, messages[0])
        if until is not None and clock() >= until:
            raise self._empty()
        return None

    def _taken_all(self, reply, until, clock):
        """``_taken`` of a plain get_many: the deliveries, or None (ask again)."""
        messages = reply if type(reply) is not bytes else self._leased(reply)
        if type(messages) is list:  # read by the C codec
            if messages:
                return messages
        else:
            messages = messages["messages"]
            if messages:
                return list(map(self._delivery_class, [self] * len(messages), messages))
        if until is not None and clock() >= until:
            raise self._empty()
        return None

    def _leased(self, payload):
        """A plain CONSUME reply's bytes as this handle's deliveries (the C codec), or, where
        it does not read them whole (headers, older fields), the payload decoded."""
        core = self._broker._core
        ds = leased(payload, self._delivery_class, self, core)
        return ds if ds is not None else core.decode(payload)

    def _plain_get_many(self, most, visibility_timeout, max_bytes, ack) -> bool:
        """Whether a get_many is a plain one, for a transport's fast path (the CONSUME of
        ``_get_many_shape(most)``): a plain get's (``_plain_get``) of ``most`` messages,
        no ``max_bytes``."""
        return type(most) is int and most >= 1 and max_bytes is None and self._plain_get(visibility_timeout, ack)

    def _plain_put_many(self, bodies, timeout, headers, options) -> bool:
        """Whether a blocking put_many is a plain one, for a transport's fast path (the
        PRODUCE_BATCH of ``_shapes()[0]`` with ``plain_messages``): a non-empty list of
        bytes bodies (checked in one C pass), no headers, no options (``options``: whether
        any is given), room waited for for ever, no serializer, this handle open."""
        return (type(bodies) is list and bool(bodies) and headers is None and timeout is None and not options
                and self.serializer is None and not self.closed and set(map(type, bodies)) == _BYTES)

    def _plain_tags(self, deliveries, core):
        """The tags of ``deliveries`` for a transport's fast ack_many, checked in C passes
        (in one, ``cwire.tags``, where the codec's C half is built): a non-empty list of
        this handle's own deliveries (``_delivery_class``) leased on ``core``, the
        connection in use, and this handle open; else None (the general ack_many checks
        each and says which is wrong)."""
        if _c_tags is not None:
            tags = None if self.closed else _c_tags(deliveries, self._delivery_class, self, core)
            if tags is not None:
                keepalive.settling(deliveries)
            return tags
        if (type(deliveries) is not list or not deliveries or self.closed
                or set(map(type, deliveries)) != {self._delivery_class} or set(map(_q_attr, deliveries)) != {self}
                or set(map(_conn_attr, deliveries)) != {core}):
            return None
        keepalive.settling(deliveries)
        return list(map(_tag_attr, deliveries))

    def _plain_put(self, body, headers, timeout, options) -> bool:
        """Whether a blocking put is a plain one, for a transport's fast path (the PRODUCE
        of ``_put_shape``): a bytes body, no headers, no options (``options``: whether any
        is given, ``_options_given``), no serializer, this handle open, room waited for for
        ever."""
        return (type(body) is bytes and headers is None and timeout is None and not options
                and self.serializer is None and not self.closed)

    @staticmethod
    def _options_given(priority, delay, ttl, group, dedup_id) -> bool:
        """Whether a put was given any option (else it is a plain one, for the fast paths)."""
        return bool(priority or delay or ttl is not None or group is not None or dedup_id is not None)


    def get(self, timeout=None, visibility_timeout=None, ack=True, copy=True):
        if self._plain_get(visibility_timeout, ack):
            return self._broker._get_plain(self, timeout)
        return QueueCalls.get(self, timeout, visibility_timeout, ack, copy)

    get.__doc__ = QueueCalls.get.__doc__

    def put_many(self, bodies, timeout=None, *, priority=0, delay=0.0, ttl=None, headers=None, wait=True):
        if wait and self._plain_put_many(bodies, timeout, headers, priority or delay or ttl is not None):
            return self._broker._put_many_plain(self, bodies)
        return QueueCalls.put_many(self, bodies, timeout, priority=priority, delay=delay, ttl=ttl, headers=headers,
                                   wait=wait)

    put_many.__doc__ = QueueCalls.put_many.__doc__

    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None, max_bytes=None, ack=True, copy=True):
        if self._plain_get_many(max_messages, visibility_timeout, max_bytes, ack):
            return self._broker._get_plain(self, timeout, max_messages)
        return QueueCalls.get_many(self, max_messages, timeout, visibility_timeout, max_bytes, ack, copy)

    get_many.__doc__ = QueueCalls.get_many.__doc__
