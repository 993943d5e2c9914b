"""shmq over TCP: a ``shmq server --port 0`` of the run's own; its queues made and used over TCP.
A consumer acks every delivery with ``ack(wait=False)`` (``ack_many`` likewise): the ack
goes in the same write as the next get, the one-exchange settle (issue 28); an ack the
server never saw is a redelivery, as always."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import shmq
from bench.adapters import Adapter, leftover_notes, run_namespace
from bench.adapters.shmq_local import ShmqEnd
from bench.plan import BATCH, MAX_MESSAGE_BYTES, queue_bytes, size_label
from bench.servers import ShmqServer


def default_frame_bytes():
    """The largest frame `shmq server` accepts by default (16 MiB if shmq does not say)."""
    try:
        from shmq.protocol import DEFAULT_MAX_FRAME_BYTES
    except ImportError:
        return 16 * 2**20
    return DEFAULT_MAX_FRAME_BYTES


TLS_ENV = "SHMQ_BENCH_TLS"  # set: the server speaks TLS (bench.tcp --tls)
BUSY_POLL_ENV = "SHMQ_BENCH_BUSY_POLL_US"  # set: the server's and the clients' busy polling (bench.tcp --busy-poll-us)


def busy_poll_options() -> dict:
    """The clients' ``busy_poll_us`` that bench.tcp --busy-poll-us asks for (none: their default)."""
    value = os.environ.get(BUSY_POLL_ENV)
    return {} if value is None else {"busy_poll_us": int(value)}


def self_signed(d):
    """A self-signed certificate for 127.0.0.1 and its key, in ``d`` (the openssl command)."""
    cert, key = os.path.join(d, "server.pem"), os.path.join(d, "server.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    return cert, key


class ShmqTcpEnd(ShmqEnd):
    """A client end over TCP: every delivery acked, in one exchange with the next get."""

    @property
    def connect_options(self):
        return busy_poll_options()

    def recv(self):
        d = self._q.get()
        d.ack(wait=False)
        return d.body

    def recv_batch(self, limit):
        ds = self._q.get_many(limit)
        try:
            self._q.ack_many(ds, wait=False)
        except TypeError:  # a shmq older than ack_many(wait=): measured as it was
            self._q.ack_many(ds)
        return [d.body for d in ds]


class ShmqTcp(Adapter):
    """A server on its own namespace for the whole run; one queue per case."""

    name = "shmq-tcp"
    End = ShmqTcpEnd
    part = "tcp"  # of the namespace

    def __init__(self, *server_options):
        self.namespace = run_namespace(self.part)
        self._tls_dir = None
        if os.environ.get(TLS_ENV):  # python -m bench.tcp --tls: the server over TLS, a certificate of the run's own
            self._tls_dir = tempfile.mkdtemp(prefix="bench-tls-")
            cert, key = self_signed(self._tls_dir)
            os.environ["SHMQ_TLS_CA"] = cert  # the roles' processes inherit it: clients trust this server
            server_options = (*server_options, "--tls-cert", cert, "--tls-key", key)
        if os.environ.get(BUSY_POLL_ENV) is not None:  # python -m bench.tcp --busy-poll-us N: both ends
            server_options = (*server_options, "--busy-poll-us", os.environ[BUSY_POLL_ENV])
        self._server = ShmqServer(self.namespace, *server_options)
        self.url = self._server.url.replace("tcp://", "tcps://") if self._tls_dir else self._server.url
        self.max_frame_bytes = default_frame_bytes()
        self._count = 0

    def create(self, broker, name, size, max_bytes):
        broker.create_queue(name, max_bytes=max_bytes, max_message_bytes=max(MAX_MESSAGE_BYTES, size))

    def spec(self, name):
        return (self.url, name)

    def make(self, ctx, size):
        return self._make(size, queue_bytes(size))

    def make_case(self, ctx, job):
        return self._make(job.size, job.queue_bytes or queue_bytes(job.size))

    def _make(self, size, max_bytes):
        self._count += 1
        name = f"q{self._count}"
        with shmq.connect(self.url) as broker:
            self.create(broker, name, size, max_bytes)
        return self.spec(name)

    def drop(self, spec):
        with shmq.connect(self.url) as broker:
            broker.delete_queue(spec[1])

    def unsupported(self, job):
        if job.mode == "batch" and BATCH * job.size > self.max_frame_bytes // 2:
            return (f"a batch of {BATCH} x {size_label(job.size)} exceeds the server's "
                    f"{size_label(self.max_frame_bytes)} frames")
        return None

    def close(self):
        self._server.close()
        if self._tls_dir:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
        shmq.destroy_namespace(self.namespace)
        return leftover_notes(self.name, self.namespace)
