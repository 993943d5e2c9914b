"""Redis Streams over loopback, on a redis-server of the run's own (no persistence).

An appender sends ``XADD key * v BODY`` (per record) or 64 of them in one pipeline
(batched; redis-py answers once all 64 ids are back). The reader reads through a
consumer group (``XREADGROUP GROUP bench c COUNT n BLOCK 0 STREAMS key >`` then one
``XACK`` of the ids read, before the records are handed on) or by id (``XREAD COUNT n
BLOCK 0 STREAMS key LAST``, nothing acknowledged). One stream key per case, deleted after it.
"""

from __future__ import annotations

import shutil

import redis

from bench.adapters import Adapter, End
from bench.servers import RedisServer

GROUP = b"bench"
FIELD = b"v"


class RedisStreamEnd(End):
    def __init__(self, spec, role):
        port, self._key, read = spec
        self._r = redis.Redis(port=port)
        self._last = b"0-0"
        if role == "recv":
            self.recv_batch = self._group_read if read == "group" else self._read

    def send(self, body):
        self._r.xadd(self._key, {FIELD: body})

    def send_batch(self, bodies):
        pipe = self._r.pipeline(transaction=False)
        for body in bodies:
            pipe.xadd(self._key, {FIELD: body})
        pipe.execute()

    def _group_read(self, limit):
        while True:
            reply = self._r.xreadgroup(GROUP, b"c", {self._key: b">"}, count=limit, block=0)
            if reply and reply[0][1]:
                entries = reply[0][1]
                self._r.xack(self._key, GROUP, *[i for i, _ in entries])
                return [fields[FIELD] for _, fields in entries]

    def _read(self, limit):
        while True:
            reply = self._r.xread({self._key: self._last}, count=limit, block=0)
            if reply and reply[0][1]:
                entries = reply[0][1]
                self._last = entries[-1][0]
                return [fields[FIELD] for _, fields in entries]

    def recv(self):
        return self.recv_batch(1)[0]

    def close(self):
        self._r.close()


class RedisStreams(Adapter):
    """One stream key (with its group) per case."""

    name = "redis-streams"
    End = RedisStreamEnd

    @classmethod
    def probe(cls):
        return "redis-server not on PATH" if shutil.which("redis-server") is None else None

    def __init__(self):
        self._server = RedisServer()
        self._count = 0

    def make_case(self, ctx, job):
        self._count += 1
        key = f"s{self._count}".encode()
        with redis.Redis(port=self._server.port) as client:
            client.delete(key)
            client.xgroup_create(key, GROUP, id="0", mkstream=True)
        return (self._server.port, key, job.read)

    def drop(self, spec):
        with redis.Redis(port=self._server.port) as client:
            client.delete(spec[1])

    def close(self):
        self._server.close()
        return []
