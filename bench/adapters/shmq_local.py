"""shmq by local attach: one namespace for the run, one queue per case, every delivery acked
on receipt (``shmq``); or acked by the consume loop as it takes the next (``shmq-loop``:
``q.messages()``, one lock hold per message); or settled as taken (``shmq-noack``: ``get(ack=False)``, at most once,
to compare like for like with peers that acknowledge nothing); or zero-copy
(``shmq-zc``: ``reserve`` fills the ring in place, ``get(copy=False)`` reads the body where it
is, then acks); or a laned queue (``shmq-lanes``: ``create_queue(..., lanes=K)``, acked as
``shmq``), skipped, saying so, where shmq has no lanes."""

from __future__ import annotations

import inspect

import shmq
from shmq.engine.shm.layout import FILL_MIN
from bench.adapters import Adapter, End, leftover_notes, run_namespace
from bench.plan import MAX_MESSAGE_BYTES, queue_bytes


class ShmqEnd(End):
    """One side of a shmq queue; the spec is (namespace or tcp:// URL, queue name)."""

    connect_options = {}  # a TCP end's keywords for shmq.connect (ShmqTcpEnd)

    def __init__(self, spec, role):
        where, name = spec
        self._broker = (shmq.connect(where, **self.connect_options) if where.startswith(("tcp://", "tcps://"))
                        else shmq.connect(namespace=where))
        self._q = self._broker.queue(name)

    def send(self, body):
        self._q.put(body)

    def send_batch(self, bodies):
        self._q.put_many(bodies)

    def send_pipelined(self, body):
        self._q.put(body, wait=False)

    def flush(self):
        self._q.flush()  # over TCP: every put(wait=False) confirmed (locally there is nothing to wait for)

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


class ShmqNoAckEnd(ShmqEnd):
    """Receives with ``get(ack=False)``: settled as taken, in one lock hold."""

    def recv(self):
        return self._q.get(None, None, False).body

    def recv_batch(self, limit):
        return [d.body for d in self._q.get_many(limit, None, None, None, False)]


class ShmqLoopEnd(ShmqEnd):
    """Receives through the consume loop, ``q.messages()``: each delivery is acked as the
    next is taken, in one lock hold; the last one when the loop closes (``release``,
    ``close``)."""

    def __init__(self, spec, role):
        super().__init__(spec, role)
        self._loop = self._q.messages()

    def recv(self):
        return next(self._loop).body

    def recv_batch(self, limit):
        """As ``shmq``'s (get_many + ack_many): the loop takes one message per step."""
        self.release()
        return super().recv_batch(limit)

    def release(self):
        self._loop.close()  # the last delivery acked: this receiver holds nothing
        self._loop = self._q.messages()

    def close(self):
        self._loop.close()
        super().close()


class ShmqZeroCopyEnd(ShmqEnd):
    """Sends by ``reserve`` (the body written into the ring once), receives with
    ``get(copy=False)`` (the body read where it lies), then acks. A body of 4 KiB or more is
    handed to the roles as a stand-in of its length (``_Sized``): the roles only count
    bytes, and copying it out would measure a copy, not the queue."""

    def send(self, body):
        n = len(body)
        if not n:
            self._q.put(b"")  # a stop message
            return
        with self._q.reserve(n) as buf:
            if type(body) is not _Sized:  # an echoed stand-in was never copied out: nothing to write
                buf[:] = body

    def send_batch(self, bodies):
        """``reserve_many``: the batch's bodies claimed together (as many as have room),
        filled in place, published together; again for the rest. From 32 KiB, where it
        gives batches of one (a large body is paced one at a time), ``reserve`` each."""
        if not all(map(len, bodies)) or len(bodies[0]) >= FILL_MIN:  # (or a stop message among them)
            for body in bodies:
                self.send(body)
            return
        while bodies:
            with self._q.reserve_many([len(b) for b in bodies]) as bufs:
                for buf, body in zip(bufs, bodies):
                    if type(body) is not _Sized:
                        buf[:] = body
            bodies = bodies[len(bufs):]

    def recv(self):
        d = self._q.get(None, None, True, False)
        out = _out(d.body)
        d.ack()
        return out

    def recv_batch(self, limit):
        ds = self._q.get_many(limit, None, None, None, True, False)
        out = [_out(d.body) for d in ds]
        self._q.ack_many(ds)
        return out


def _out(view):
    n = len(view)
    if n < 4096:
        return view.tobytes()
    s = _SIZED.get(n)
    if s is None:
        s = _SIZED[n] = _Sized(n)
    return s


class _Sized(bytes):
    """A received body's stand-in of its length, for a zero-copy receiver that kept no copy
    (one a length, made once: the roles only count and compare lengths)."""

    def __new__(cls, n):
        obj = super().__new__(cls, b"\x01")  # not empty: an empty body is a stop message
        obj.n = n
        return obj

    def __len__(self):
        return self.n


_SIZED = {}


class ShmqLocal(Adapter):
    """Queues in a namespace of this run's own; all of it removed at the end."""

    name = "shmq"
    End = ShmqEnd

    def __init__(self):
        self.namespace = run_namespace("local")
        self._broker = shmq.connect(namespace=self.namespace)
        self._count = 0

    def make(self, ctx, size):
        return self._create(size, queue_bytes(size))

    def make_case(self, ctx, job):
        return self._create(job.size, job.queue_bytes or queue_bytes(job.size))

    def _create(self, size, max_bytes, **options):
        self._count += 1
        name = f"q{self._count}"
        self._broker.create_queue(name, max_bytes=max_bytes, max_message_bytes=max(MAX_MESSAGE_BYTES, size),
                                  exist_ok=False, **options)
        return (self.namespace, name)

    def drop(self, spec):
        self._broker.delete_queue(spec[1])

    def close(self):
        for name in self._broker.list_queues():
            self._broker.delete_queue(name)
        self._broker.close()
        shmq.destroy_namespace(self.namespace)
        return leftover_notes(self.name, self.namespace)


class ShmqNoAck(ShmqLocal):
    name = "shmq-noack"
    End = ShmqNoAckEnd


class ShmqLoop(ShmqLocal):
    """Consumers in the consume loop (batches as ``shmq``'s: the loop takes one per step)."""

    name = "shmq-loop"
    End = ShmqLoopEnd


class ShmqZeroCopy(ShmqLocal):
    name = "shmq-zc"
    End = ShmqZeroCopyEnd


class ShmqLanes(ShmqLocal):
    """A queue of K lanes per case: K = the case's P (a lane per worker on its wider side),
    or ``lanes`` when a front end sets it (``python -m bench.scale --lanes K``)."""

    name = "shmq-lanes"
    lanes = None

    @classmethod
    def probe(cls):
        params = inspect.signature(shmq.Broker.create_queue).parameters
        if "lanes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return None
        return "shmq-lanes: this shmq's create_queue has no lanes= (laned queues are not built yet)"

    def make_case(self, ctx, job):
        lanes = self.lanes or max(job.producers, job.consumers)
        return self._create(job.size, job.queue_bytes or queue_bytes(job.size), lanes=lanes)

