"""shmq by local attach: one namespace for the run, one queue per case, every delivery acked on receipt."""

from __future__ import annotations

import shmq
from bench.adapters import Adapter, End, leftover_notes, run_namespace
from bench.plan import MAX_MESSAGE_BYTES, queue_bytes


class ShmqEnd(End):
    """One side of a shmq queue; the spec is (namespace or tcp:// URL, queue name)."""

    def __init__(self, spec, role):
        where, name = spec
        self._broker = shmq.connect(where) if where.startswith("tcp://") else shmq.connect(namespace=where)
        self._q = self._broker.queue(name)

    def send(self, body):
        self._q.put(body)

    def send_batch(self, bodies):
        self._q.put_many(bodies)

    def recv(self):
        d = self._q.get()
        body = d.body
        d.ack()
        return body

    def recv_batch(self, limit):
        ds = self._q.get_many(limit)
        bodies = [d.body for d in ds]
        self._q.ack_many(ds)
        return bodies

    def close(self):
        self._q.close()
        self._broker.close()


class ShmqLocal(Adapter):
    """Queues in a namespace of this run's own; all of it removed at the end."""

    name = "shmq"
    End = ShmqEnd

    def __init__(self):
        self.namespace = run_namespace("local")
        self._broker = shmq.connect(namespace=self.namespace)
        self._count = 0

    def make(self, ctx, size):
        self._count += 1
        name = f"q{self._count}"
        self._broker.create_queue(
            name, max_bytes=queue_bytes(size), max_message_bytes=max(MAX_MESSAGE_BYTES, size), exist_ok=False
        )
        return (self.namespace, name)

    def drop(self, spec):
        self._broker.delete_queue(spec[1])

    def close(self):
        for name in self._broker.list_queues():
            self._broker.delete_queue(name)
        self._broker.close()
        shmq.destroy_namespace(self.namespace)
        return leftover_notes(self.name, self.namespace)
