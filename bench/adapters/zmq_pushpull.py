"""pyzmq PUSH/PULL over ipc:// sockets in a private directory; no shared queue, so several consumers are a mesh."""

from __future__ import annotations

import os
import shutil
import tempfile

import zmq

from bench.adapters import Adapter, End


class ZmqEnd(End):
    """A PULL socket bound to the ipc:// address, or a PUSH socket connected to it."""

    def __init__(self, spec, role):
        self._ctx = zmq.Context()
        if role == "recv":
            self._sock = self._ctx.socket(zmq.PULL)
            self._sock.bind(spec)
        else:
            self._sock = self._ctx.socket(zmq.PUSH)
            self._sock.connect(spec)

    def send(self, body):
        self._sock.send(body)

    def send_batch(self, bodies):
        self._sock.send_multipart(bodies)

    def recv(self):
        return self._sock.recv()

    def recv_batch(self, limit):
        return self._sock.recv_multipart()

    def close(self):
        self._sock.close(linger=1000)
        self._ctx.term()


class ZmqMeshEnd(ZmqEnd):
    """Several consumers without a broker (P -> P, 1 -> P): producer i binds a PUSH at
    ``<spec>.p<i>``; every consumer's PULL connects to all of them (PUSH round-robins,
    PULL fair-queues)."""

    def __init__(self, spec, role, index, producers):
        self._ctx = zmq.Context()
        if role == "recv":
            self._sock = self._ctx.socket(zmq.PULL)
            for i in range(producers):
                self._sock.connect(f"{spec}.p{i}")
        else:
            self._sock = self._ctx.socket(zmq.PUSH)
            self._sock.bind(f"{spec}.p{index}")

    def poll_batch(self, batch, seconds):
        """The next message (batch: multipart message) as a list, or [] after ``seconds`` idle."""
        if not self._sock.poll(int(seconds * 1000)):
            return []
        return self._sock.recv_multipart() if batch else [self._sock.recv()]


class ZmqPushPull(Adapter):
    """Unique ipc:// addresses in a private temporary directory."""

    name = "zmq"
    End = ZmqEnd
    MeshEnd = ZmqMeshEnd

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="shmq-bench-")
        self._count = 0

    def make(self, ctx, size):
        self._count += 1
        return f"ipc://{self._dir}/c{self._count}.sock"

    def drop(self, spec):
        path = spec[len("ipc://"):]
        for name in os.listdir(self._dir):
            full = os.path.join(self._dir, name)
            if full == path or full.startswith(path + ".p"):
                os.unlink(full)

    def close(self):
        shutil.rmtree(self._dir, ignore_errors=True)
        return []
