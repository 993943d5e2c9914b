"""A local queue handle with a serializer (``broker.queue(name, serializer=...)``): puts
take objects, deliveries carry them in ``body``. The plain ``Queue`` stays as it is, so
a queue without one keeps its hot path untouched.
"""

import dataclasses

from ...serializers import Serializer, dump, load
from ...errors import SerializationError
from .consume import _mode
from .queue import Queue

__all__ = ["SerializedQueue", "load_deliveries"]


_READS_VIEWS = ("pickle", "msgpack")  # loads that take a memoryview (``get(copy=False)``); others get bytes


def load_deliveries(ser: Serializer, queue: str, ds: list) -> list:
    """Load the bodies of deliveries ``ds`` in place (the bytes stay in ``_raw``: dead
    letters copy them); SerializationError at the first that does not load, the
    deliveries untouched from there on."""
    for d in ds:
        raw = d.body
        d.body = load(ser, queue, d.id, raw if type(raw) is bytes or ser.name in _READS_VIEWS else bytes(raw))
        d._raw = raw
    return ds


class SerializedQueue(Queue):
    """A ``Queue`` whose bodies go through ``serializer`` (``shmq.serializers``)."""

    def __init__(self, namespace: str, name: str, serializer: Serializer, lane: int = 0, opener=None):
        super().__init__(namespace, name, lane, opener)
        self.serializer = serializer

    def __reduce__(self):
        return (SerializedQueue, (self.namespace, self.name, self.serializer, self._lane, self._opener))

    def __repr__(self):
        return f"<shmq.Queue {self.namespace}/{self.name} serializer={self.serializer.name}>"

    def put(self, obj, headers=None, timeout=None, priority=0, delay=0.0, ttl=None, group=None, dedup_id=None,
            wait=True) -> int:
        return Queue.put(self, dump(self.serializer, obj), headers, timeout, priority, delay, ttl, group, dedup_id)

    def put_nowait(self, obj, headers=None) -> int:
        return Queue.put(self, dump(self.serializer, obj), headers, 0)

    def put_many(self, objs, timeout=None, priority=0, delay=0.0, ttl=None, headers=None, wait=True) -> list[int]:
        ser = self.serializer
        return Queue.put_many(self, [dump(ser, o) for o in objs], timeout, priority, delay, ttl, headers)

    # ack=False: taken leased, loaded, then acked -- a body that does not load is given back, never lost
    def get(self, timeout=None, visibility_timeout=None, ack=True, copy=True):
        _mode(ack, copy)
        return self._loaded([Queue.get(self, timeout, visibility_timeout, True, copy)], ack)[0]

    def get_nowait(self, visibility_timeout=None, ack=True, copy=True):
        return self.get(0, visibility_timeout, ack, copy)

    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None, max_bytes=None, ack=True, copy=True):
        _mode(ack, copy)
        return self._loaded(Queue.get_many(self, max_messages, timeout, visibility_timeout, max_bytes, True, copy),
                            ack)

    def peek(self, max_messages=10):
        ser = self.serializer
        return [dataclasses.replace(m, body=load(ser, self.name, m.id, m.body)) for m in Queue.peek(self, max_messages)]

    def _sibling(self):
        return SerializedQueue(self.namespace, self.name, self.serializer, self._lane, self._opener)

    def _poll(self, maxn, visibility_timeout=None, max_bytes=None, ack=True, copy=True):
        got = Queue._poll(self, maxn, visibility_timeout, max_bytes, True, copy)
        if got is None:
            return None
        return self._loaded(got, ack) if maxn else self._loaded([got], ack)[0]

    def _loaded(self, ds, ack=True):
        try:
            load_deliveries(self.serializer, self.name, ds)
        except SerializationError:
            self.nack_many(ds)  # all of them back: the caller gets none
            raise
        if not ack:
            self.ack_many(ds)
        return ds

    for _name in ("put", "put_nowait", "put_many", "get", "get_nowait", "get_many", "peek"):
        locals()[_name].__doc__ = getattr(Queue, _name).__doc__ + "\n\n(Bodies through the handle's serializer.)"
    del _name
