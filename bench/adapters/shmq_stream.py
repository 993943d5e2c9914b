"""shmq streams, by local attach and over TCP: one stream per case, one partition per producer.

An appender calls ``append`` (per record) or ``append_many`` (batched), key-less, so the
stream spreads its calls over the partitions. The reader either joins a consumer group
(``consumer(group).poll(n)`` then ``commit()``, before the records are handed on) or reads
every partition by offset (``read(p, offset, n)``, nothing committed). Each partition's
ring holds a whole run, so retention never drops a record before it is read.
"""

from __future__ import annotations

import shmq
from bench.adapters import Adapter, End, leftover_notes, run_namespace
from bench.servers import ShmqServer

GROUP = "bench"
WAIT_S = 1.0  # a read's wait at the end of a partition, before it looks again
WAIT_ANY_S = 0.001  # the same, with several partitions: the wait watches one, records may come to another
RING_SLACK = 1.25


def _broker(where):
    return shmq.connect(where) if where.startswith("tcp://") else shmq.connect(namespace=where)


class ShmqStreamEnd(End):
    """An appender or a reader of one stream; the spec is (namespace or tcp:// URL, stream, read)."""

    def __init__(self, spec, role):
        where, name, read = spec
        self._broker = _broker(where)
        self._s = self._broker.stream(name)
        self._consumer = None
        if role == "recv":
            parts = self._s.partitions
            self._pos = [0] * parts
            self._turn = 0
            self._wait = WAIT_S if parts == 1 else WAIT_ANY_S
            if read == "group":
                self._consumer = self._s.consumer(GROUP)
                self.recv_batch = self._poll
            else:
                self.recv_batch = self._read

    def send(self, body):
        self._s.append(body)

    def send_batch(self, bodies):
        self._s.append_many(bodies)

    def _poll(self, limit):
        c = self._consumer
        while True:
            records = c.poll(limit, WAIT_S)
            if records:
                c.commit()
                return [r.value for r in records]

    def _read(self, limit):
        s, pos, parts = self._s, self._pos, len(self._pos)
        while True:
            for k in range(parts):
                p = (self._turn + k) % parts
                records = s.read(p, pos[p], limit)
                if records:
                    pos[p] = records[-1].offset + 1
                    self._turn = p + 1
                    return [r.value for r in records]
            p = self._turn % parts  # every partition at its end: wait on one of them a little
            records = s.read(p, pos[p], limit, timeout=self._wait)
            self._turn += 1
            if records:
                pos[p] = records[-1].offset + 1
                return [r.value for r in records]

    def recv(self):
        return self.recv_batch(1)[0]

    def close(self):
        if self._consumer is not None:
            self._consumer.close()
        self._s.close()
        self._broker.close()


def ring_bytes(job):
    """Each partition's ring: a run's records and the warm-up, with some slack (at least 1 MiB)."""
    per_partition = (job.n + job.warmup * job.pairs) // job.partitions + 1
    record = (48 + 7 + job.size) & -8  # a record's header, its value, padded to 8 bytes
    return max(2**20, int(per_partition * record * RING_SLACK) + 2**16)


class ShmqStreamLocal(Adapter):
    """Streams in a namespace of this run's own; all of it removed at the end."""

    name = "shmq-stream"
    End = ShmqStreamEnd
    part = "streams"  # of the namespace

    def __init__(self):
        self.namespace = run_namespace(self.part)
        self.where = self.namespace
        self._count = 0

    def make_case(self, ctx, job):
        self._count += 1
        name = f"s{self._count}"
        with _broker(self.where) as broker:
            broker.create_stream(name, partitions=job.partitions, max_bytes=ring_bytes(job),
                                 max_message_bytes=max(2**16, job.size), exist_ok=False)
        return (self.where, name, job.read)

    def drop(self, spec):
        with _broker(self.where) as broker:
            broker.delete_stream(spec[1])

    def close(self):
        try:
            with _broker(self.where) as broker:
                for name in broker.list_streams():
                    broker.delete_stream(name)
        finally:
            self._release()
        return leftover_notes(self.name, self.namespace)

    def _release(self):
        shmq.destroy_namespace(self.namespace)


def _remote_streams():
    """Why the TCP client has no streams (yet), or None."""
    try:
        from shmq.client.remote import RemoteBroker
    except ImportError as exc:
        return f"shmq's TCP client is not importable ({exc})"
    missing = [m for m in ("create_stream", "stream", "delete_stream") if not hasattr(RemoteBroker, m)]
    if missing:
        return f"shmq's TCP client has no streams yet (RemoteBroker lacks {', '.join(missing)})"
    return None


class ShmqStreamTcp(ShmqStreamLocal):
    """A ``shmq server`` of the run's own; its streams made and used over TCP."""

    name = "shmq-stream-tcp"
    part = "streams-tcp"

    @classmethod
    def probe(cls):
        return _remote_streams()

    def __init__(self):
        super().__init__()
        try:
            self._server = ShmqServer(self.namespace)
        except BaseException:
            super()._release()
            raise
        self.where = self._server.url
        try:
            with _broker(self.where) as broker:  # the client may have streams before the server does
                broker.create_stream("probe", partitions=1, exist_ok=True)
                broker.delete_stream("probe")
        except Exception:
            self._release()
            raise

    def _release(self):
        try:
            self._server.close()
        finally:
            super()._release()
