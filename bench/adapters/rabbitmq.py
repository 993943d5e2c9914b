"""RabbitMQ over loopback with pika, on a node of the run's own (``rabbitmq-server`` from the
system packages, started and stopped by bench/servers.py): manual acks, prefetch 100.

A case is one classic queue, non-durable, its messages transient (like shmq's queues in
memory). A sender calls ``basic_publish`` on the default exchange, without publisher
confirms (pika writes the frame and returns: the broker's answer is not awaited, unlike
a shmq put). A receiver consumes with ``basic_qos(prefetch_count=100)`` and manual acks:
``basic_ack`` of each delivery as it is taken (per message), or one
``basic_ack(multiple=True)`` for up to 64 deliveries that pika already holds (batched).
AMQP 0-9-1 has no batch publish: a batch is 64 ``basic_publish``.

P -> P consumers share the queue. A consumer that leaves a run cancels its consumer
(``release``), which hands the deliveries prefetched for it back to the queue, so the
other consumers' stop messages reach them (a consumer that goes away does the same).
"""

from __future__ import annotations

import pika

from bench.adapters import Adapter, End
from bench.servers import RabbitServer, rabbitmq_missing

PREFETCH = 100


def connect(port):
    """A blocking connection without heartbeats (a process waits at the harness's barrier
    without calling pika, and pika answers heartbeats only inside its calls)."""
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))


class RabbitEnd(End):
    """A publisher or a consumer of one queue; the spec is (port, queue)."""

    takes_ahead = True  # prefetch 100

    def __init__(self, spec, role):
        port, self._queue = spec
        self._conn = connect(port)
        self._ch = self._conn.channel()
        self._deliveries = None
        if role == "recv":
            self._ch.basic_qos(prefetch_count=PREFETCH)

    def send(self, body):
        self._ch.basic_publish("", self._queue, body)

    def _next(self):
        if self._deliveries is None:
            self._deliveries = self._ch.consume(self._queue, auto_ack=False)
        return next(self._deliveries)

    def recv(self):
        method, _props, body = self._next()
        self._ch.basic_ack(method.delivery_tag)
        return body

    def recv_batch(self, limit):
        taken = [self._next()]
        for _ in range(min(limit - 1, self._ch.get_waiting_message_count())):
            taken.append(self._next())
        self._ch.basic_ack(taken[-1][0].delivery_tag, multiple=True)
        return [body for _, _, body in taken]

    def release(self):
        """Cancel the consumer: what was prefetched for it goes back to the queue (nacked with
        requeue); the next receive consumes anew."""
        if self._deliveries is not None:
            self._ch.cancel()
            self._deliveries = None

    def close(self):
        self.release()
        self._conn.close()


class RabbitMq(Adapter):
    """A RabbitMQ node for the run; one queue per case, deleted after it."""

    name = "rabbitmq"
    End = RabbitEnd

    @classmethod
    def probe(cls):
        return rabbitmq_missing()

    def __init__(self):
        self._server = RabbitServer()
        self._count = 0

    def _channel_call(self, method, name):
        conn = connect(self._server.port)
        try:
            getattr(conn.channel(), method)(name)
        finally:
            conn.close()

    def make(self, ctx, size):
        self._count += 1
        name = f"q{self._count}"
        self._channel_call("queue_declare", name)
        return (self._server.port, name)

    def drop(self, spec):
        self._channel_call("queue_delete", spec[1])

    def close(self):
        self._server.close()
        return []
