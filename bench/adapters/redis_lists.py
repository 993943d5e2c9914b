"""Redis lists over loopback (LPUSH / BRPOP, batched LPUSH / BLMPOP, pipelined LPUSHes) on a
redis-server of the run's own."""

from __future__ import annotations

import shutil

import redis

from bench.adapters import Adapter, End
from bench.plan import BATCH
from bench.servers import RedisServer


class RedisEnd(End):
    """One side of a list; pipelined sends go out BATCH LPUSHes to a pipeline (no MULTI)."""

    def __init__(self, spec, role):
        port, self._key = spec
        self._r = redis.Redis(port=port)
        self._pipe = self._r.pipeline(transaction=False)

    def send(self, body):
        self._r.lpush(self._key, body)

    def send_batch(self, bodies):
        self._r.lpush(self._key, *bodies)

    def send_pipelined(self, body):
        self._pipe.lpush(self._key, body)
        if len(self._pipe) >= BATCH:
            self._pipe.execute()

    def flush(self):
        if len(self._pipe):
            self._pipe.execute()

    def recv(self):
        return self._r.brpop(self._key, 0)[1]

    def recv_batch(self, limit):
        return self._r.blmpop(0, 1, self._key, direction="RIGHT", count=limit)[1]

    def close(self):
        self._pipe.reset()
        self._r.close()


class RedisLists(Adapter):
    """One list per case, emptied before and after it."""

    name = "redis"
    End = RedisEnd

    @classmethod
    def probe(cls):
        return "redis-server not on PATH" if shutil.which("redis-server") is None else None

    def __init__(self):
        self._server = RedisServer()
        self._count = 0

    def _reset(self, key):
        with redis.Redis(port=self._server.port) as client:
            client.delete(key)

    def make(self, ctx, size):
        self._count += 1
        key = f"q{self._count}"
        self._reset(key)
        return (self._server.port, key)

    def drop(self, spec):
        self._reset(spec[1])

    def close(self):
        self._server.close()
        return []
