"""NATS JetStream over loopback with nats-py, on a ``nats-server -js`` of the run's own.

One JetStream stream per case, in memory (``StorageType.MEMORY``: like Redis without
persistence and shmq's rings, nothing is written to disk), on one subject. An appender
calls ``js.publish`` (per record: it waits for the server's PubAck) or 64
``js.publish_async`` and then waits for their 64 PubAcks (batched). The reader reads
through a durable pull consumer made with the stream (``fetch(n)``, then an ack of the
last record read, which with ``AckPolicy.ALL`` acknowledges every one before it; nats-py
sends acks without waiting for a reply), or through an ephemeral pull consumer of its
own that acknowledges nothing (``AckPolicy.NONE``: a plain read from the start).

nats-py is asyncio-only: each End runs its own event loop and drives one call at a time.
"""

from __future__ import annotations

import asyncio
import shutil

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from bench.adapters import Adapter, End
from bench.servers import NatsServer

DURABLE = "bench"
FETCH_S = 1.0  # a fetch's wait for records, before it asks again
IDLE_S = 3600.0  # an ephemeral consumer outlives any pause between runs
_TIMEOUTS = (asyncio.TimeoutError, nats.errors.TimeoutError)


class NatsEnd(End):
    """An appender or a reader; the spec is (server URL, stream, subject, read)."""

    def __init__(self, spec, role):
        url, self._stream, self._subject, read = spec
        self._loop = asyncio.new_event_loop()
        self._run = self._loop.run_until_complete
        self._nc = self._run(nats.connect(url))
        self._js = self._nc.jetstream()
        self._ack = False
        if role == "recv":
            if read == "group":
                self._sub = self._run(self._js.pull_subscribe_bind(durable=DURABLE, stream=self._stream))
                self._ack = True
            else:
                config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
                                        inactive_threshold=IDLE_S)
                self._sub = self._run(self._js.pull_subscribe(self._subject, stream=self._stream, config=config))

    def send(self, body):
        self._run(self._js.publish(self._subject, body))

    async def _publish_many(self, bodies):
        futures = [await self._js.publish_async(self._subject, body) for body in bodies]
        await asyncio.gather(*futures)

    def send_batch(self, bodies):
        self._run(self._publish_many(bodies))

    async def _fetch(self, limit):
        while True:
            try:
                msgs = await self._sub.fetch(limit, timeout=FETCH_S)
            except _TIMEOUTS:
                continue
            if msgs:
                if self._ack:
                    await msgs[-1].ack()
                return [m.data for m in msgs]

    def recv_batch(self, limit):
        return self._run(self._fetch(limit))

    def recv(self):
        return self.recv_batch(1)[0]

    def close(self):
        try:
            self._run(self._nc.close())
        finally:
            self._loop.close()


class NatsJetStream(Adapter):
    """One memory stream (with its durable consumer) per case, deleted after it."""

    name = "nats-js"
    End = NatsEnd

    @classmethod
    def probe(cls):
        return "nats-server not on PATH" if shutil.which("nats-server") is None else None

    def __init__(self):
        self._server = NatsServer()
        self._loop = asyncio.new_event_loop()
        try:
            self._nc = self._loop.run_until_complete(nats.connect(self._server.url))
        except BaseException:
            self._loop.close()
            self._server.close()
            raise
        self._jsm = self._nc.jsm()
        self._count = 0

    def make_case(self, ctx, job):
        self._count += 1
        name, subject = f"S{self._count}", f"s{self._count}"
        run = self._loop.run_until_complete
        run(self._jsm.add_stream(StreamConfig(name=name, subjects=[subject], storage=StorageType.MEMORY)))
        if job.read == "group":
            run(self._jsm.add_consumer(name, ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.ALL,
                                                            deliver_policy=DeliverPolicy.ALL)))
        return (self._server.url, name, subject, job.read)

    def drop(self, spec):
        self._loop.run_until_complete(self._jsm.delete_stream(spec[1]))

    def close(self):
        try:
            self._loop.run_until_complete(self._nc.close())
        finally:
            self._loop.close()
            self._server.close()
        return []
