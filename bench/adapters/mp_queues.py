"""multiprocessing.Queue and SimpleQueue (spawn context); a batch is one pickled list of bodies."""

from __future__ import annotations

from bench.adapters import Adapter, End


class MpQueueEnd(End):
    """One side of a multiprocessing queue; a batch is one list, put and got whole."""

    def __init__(self, spec, role):
        self._q = spec
        self._role = role

    def send(self, body):
        self._q.put(body)

    def send_batch(self, bodies):
        self._q.put(bodies)

    def recv(self):
        return self._q.get()

    def recv_batch(self, limit):
        return self._q.get()

    def close(self):
        if self._role == "send":
            self._q.close()
            self._q.join_thread()


class SimpleQueueEnd(MpQueueEnd):
    """No feeder thread to join."""

    def close(self):
        pass


class MpQueue(Adapter):
    name = "mpqueue"
    End = MpQueueEnd

    def make(self, ctx, size):
        return ctx.Queue()

    def drop(self, spec):
        spec.close()


class SimpleQueue(MpQueue):
    name = "simplequeue"
    End = SimpleQueueEnd

    def make(self, ctx, size):
        return ctx.SimpleQueue()
