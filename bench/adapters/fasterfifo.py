"""faster-fifo: a faster_fifo.Queue with the byte capacity of the shmq queues (a case's own, when it has one)."""

from __future__ import annotations

from queue import Empty

import faster_fifo

from bench.adapters import Adapter, End
from bench.plan import queue_bytes

BLOCK = 3600.0  # "forever" for an API that wants a finite timeout; the harness bounds every case


class FasterFifoEnd(End):
    def __init__(self, spec, role):
        self._q = spec

    def send(self, body):
        self._q.put(body, timeout=BLOCK)

    def send_batch(self, bodies):
        self._q.put_many(bodies, timeout=BLOCK)

    def recv(self):
        return self.recv_batch(1)[0]

    def recv_batch(self, limit):
        # faster-fifo 1.5.2: when its read buffer is too small for the next message it grows
        # the buffer and retries with get_many_nowait, which raises Empty if another consumer
        # took that message meanwhile; a blocking receive must then simply wait again
        while True:
            try:
                return self._q.get_many(timeout=BLOCK, max_messages_to_get=limit)
            except Empty:
                continue


class FasterFifo(Adapter):
    name = "faster-fifo"
    End = FasterFifoEnd

    def make(self, ctx, size):
        return faster_fifo.Queue(max_size_bytes=queue_bytes(size))

    def make_case(self, ctx, job):
        return faster_fifo.Queue(max_size_bytes=job.queue_bytes or queue_bytes(job.size))
