"""Local benchmark: shmq against multiprocessing.Queue, faster-fifo and pyzmq.

Every case runs its producer and consumer (or pinger and ponger) in separate
processes started with the "spawn" context. Run from the repository root::

    python -m bench.local                 # full run, 5 runs per case
    python -m bench.local --quick         # CI smoke test, well under a minute
    python -m bench.local --systems shmq,zmq --sizes 64,1024 --json out.json

Workloads: throughput per message size, 1 producer -> 1 consumer and 4 -> 4, in
per-message and batched (64) mode, and a 64 B ping-pong round-trip time (RTT) over two
queues. Every case warms up before its first measured run. In 4 -> 4 the consumers
share one counter: on a shared queue the one that takes message n sends a stop to each
of the others; pyzmq has no shared queue, so each producer binds its own PUSH, every
consumer's PULL connects to all of them, and a consumer stops when it finds the count
complete after an idle poll. The two processes of a 1 -> 1 case are pinned to two
distinct CPUs (``--no-pin`` to let the OS place them: on a 2-CPU box it may put both on
one core, which changes RTT ~10x).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.metadata
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import connection

SYSTEMS = ("shmq", "shmq-tcp", "mpqueue", "simplequeue", "faster-fifo", "zmq", "posix-mq", "redis")
BASELINE = "mpqueue"
OWN = ("shmq", "shmq-tcp")  # every other system is a peer
DEFAULT_SIZES = (64, 1024, 65536, 2**20)
TOPOLOGIES = (1, 4)  # producers = consumers per case
POLL_SECONDS = 0.02  # a mesh consumer's idle poll, after which it checks the shared count
MQ_SLACK = 64  # posix MQ message size above the body size
BATCH = 64
RTT_SIZE = 64
RTT_TRIPS = 10_000
WARMUP = 200
QUEUE_BYTES = 64 * 2**20
MAX_MESSAGE_BYTES = 2**20
START_TIMEOUT = 30.0
BARRIER_TIMEOUT = 10.0
REAP_TIMEOUT = 10.0
BLOCK = 3600.0  # "forever" for APIs that want a finite timeout; the parent bounds every case
N_ANCHORS = ((64, 200_000), (1024, 100_000), (65536, 20_000))

PACKAGES = {"faster-fifo": "faster-fifo", "zmq": "pyzmq", "redis": "redis", "posix-mq": "posix_ipc"}
BATCH_NOTES = {
    "shmq": "put_many / get_many(64) + ack_many",
    "mpqueue": "one list of 64 bodies per put (1 pickle), counted as 64",
    "faster-fifo": "put_many / get_many(max_messages_to_get=64)",
    "zmq": "one multipart message of 64 frames, counted as 64",
    "shmq-tcp": "put_many / get_many(64) + ack_many over TCP",
    "simplequeue": "one list of 64 bodies per put (1 pickle), counted as 64",
    "posix-mq": "no batch API: 64 single sends; receives one at a time",
    "redis": "LPUSH of 64 values / BLMPOP COUNT 64",
}


# ---------------------------------------------------------------- endpoints (child side)


class _ShmqEnd:
    """One side of a shmq queue: put/get, every delivery acked on receipt."""

    def __init__(self, spec, role):
        import shmq

        namespace, name = spec
        self._broker = shmq.connect(namespace=namespace)
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


class _MpQueueEnd:
    """One side of a multiprocessing.Queue; a batch is one pickled list."""

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


class _FasterFifoEnd:
    """One side of a faster_fifo.Queue."""

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
        from queue import Empty

        while True:
            try:
                return self._q.get_many(timeout=BLOCK, max_messages_to_get=limit)
            except Empty:
                continue

    def close(self):
        pass


class _ZmqEnd:
    """A PULL socket bound to the ipc:// address, or a PUSH socket connected to it."""

    def __init__(self, spec, role):
        import zmq

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


class _ZmqMeshEnd(_ZmqEnd):
    """P -> P without a broker: producer i binds a PUSH at ``<spec>.p<i>``; every
    consumer's PULL connects to all P of them (PUSH round-robins, PULL fair-queues)."""

    def __init__(self, spec, role, index, pairs):
        import zmq

        self._ctx = zmq.Context()
        if role == "recv":
            self._sock = self._ctx.socket(zmq.PULL)
            for i in range(pairs):
                self._sock.connect(f"{spec}.p{i}")
        else:
            self._sock = self._ctx.socket(zmq.PUSH)
            self._sock.bind(f"{spec}.p{index}")

    def poll_batch(self, batch, seconds):
        """The next message (batch: multipart message) as a list, or [] after `seconds` idle."""
        if not self._sock.poll(int(seconds * 1000)):
            return []
        return self._sock.recv_multipart() if batch else [self._sock.recv()]


class _ShmqTcpEnd(_ShmqEnd):
    """One side of a shmq queue reached through `shmq server` over TCP."""

    def __init__(self, spec, role):
        import shmq

        url, name = spec
        self._broker = shmq.connect(url)
        self._q = self._broker.queue(name)


class _SimpleQueueEnd(_MpQueueEnd):
    """One side of a multiprocessing.SimpleQueue (no feeder thread to join)."""

    def close(self):
        pass


class _PosixMqEnd:
    """One side of a POSIX message queue; a batch is 64 single sends."""

    def __init__(self, spec, role):
        import posix_ipc

        self._q = posix_ipc.MessageQueue(spec)

    def send(self, body):
        self._q.send(body)

    def send_batch(self, bodies):
        for body in bodies:
            self._q.send(body)

    def recv(self):
        return self._q.receive()[0]

    def recv_batch(self, limit):
        return [self._q.receive()[0]]

    def close(self):
        self._q.close()


class _RedisEnd:
    """One side of a Redis list: LPUSH / BRPOP, batched LPUSH / BLMPOP."""

    def __init__(self, spec, role):
        import redis

        self._port, self._key = spec
        self._r = redis.Redis(port=self._port)

    def send(self, body):
        self._r.lpush(self._key, body)

    def send_batch(self, bodies):
        self._r.lpush(self._key, *bodies)

    def recv(self):
        return self._r.brpop(self._key, 0)[1]

    def recv_batch(self, limit):
        return self._r.blmpop(0, 1, self._key, direction="RIGHT", count=limit)[1]

    def close(self):
        self._r.close()


ENDPOINTS = {
    "shmq": _ShmqEnd,
    "shmq-tcp": _ShmqTcpEnd,
    "mpqueue": _MpQueueEnd,
    "simplequeue": _SimpleQueueEnd,
    "faster-fifo": _FasterFifoEnd,
    "zmq": _ZmqEnd,
    "posix-mq": _PosixMqEnd,
    "redis": _RedisEnd,
}
MESH_ENDPOINTS = {"zmq": _ZmqMeshEnd}  # P -> P without a shared queue: consumers poll, no stop messages


# ---------------------------------------------------------------- channels (parent side)


def queue_bytes(size):
    """Capacity of the bounded queues (shmq, faster-fifo): 64 MiB, or two batches if larger."""
    return max(QUEUE_BYTES, 2 * BATCH * size)


class _ShmqChannels:
    """Creates queues in a namespace unique to this run; deletes them all at the end."""

    def __init__(self):
        import shmq

        self.namespace = f"bench{os.getpid()}"
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
        """Delete every queue of the namespace; return notes on anything left behind."""
        for item in self._broker.list_queues():
            self._broker.delete_queue(getattr(item, "name", item))
        self._broker.close()
        notes = []
        helper = _namespace_helper()
        if helper is not None:
            helper(self.namespace)
        left = _shm_leftovers(self.namespace)
        if left:
            why = "" if helper else " (shmq has no namespace-removal helper yet)"
            notes.append(f"shmq left {len(left)} object(s) of namespace {self.namespace!r} "
                         f"in /dev/shm{why}: {', '.join(left)}")
        return notes


NAMESPACE_HELPERS = ("shmq.destroy_namespace", "shmq._segment.destroy_namespace")


def _namespace_helper():
    """shmq's whole-namespace removal function (public if exported, else the internal one)."""
    import importlib

    for dotted in NAMESPACE_HELPERS:
        module, _, attr = dotted.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except ImportError:
            continue
        if callable(fn):
            return fn
    return None


def _shm_leftovers(namespace):
    """Names in /dev/shm that carry `namespace` as a dot-separated component."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return sorted(n for n in names if namespace in n.split("."))


class _MpQueueChannels:
    """multiprocessing.Queue from the spawn context."""

    def make(self, ctx, size):
        return ctx.Queue()

    def drop(self, spec):
        spec.close()

    def close(self):
        return []


class _FasterFifoChannels:
    """faster_fifo.Queue with the same byte capacity as the shmq queues."""

    def make(self, ctx, size):
        import faster_fifo

        return faster_fifo.Queue(max_size_bytes=queue_bytes(size))

    def drop(self, spec):
        pass

    def close(self):
        return []


class _ZmqChannels:
    """Unique ipc:// addresses in a private temporary directory."""

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


class _ShmqTcpChannels:
    """A `shmq server --port 0` for the whole run (bench/tcp.py); queues made over TCP."""

    def __init__(self):
        from bench.tcp import ShmqSystem

        self._server = ShmqSystem()
        self.max_frame_bytes = _default_frame_bytes()
        self._count = 0

    def make(self, ctx, size):
        import shmq

        self._count += 1
        name = f"q{self._count}"
        with shmq.connect(self._server.url) as broker:
            broker.create_queue(name, max_bytes=queue_bytes(size), max_message_bytes=max(MAX_MESSAGE_BYTES, size))
        return (self._server.url, name)

    def drop(self, spec):
        import shmq

        with shmq.connect(spec[0]) as broker:
            broker.delete_queue(spec[1])

    def close(self):
        self._server.close()
        left = _shm_leftovers(self._server.namespace)
        return [f"shmq-tcp left {', '.join(left)} in /dev/shm"] if left else []


def _default_frame_bytes():
    """The largest frame `shmq server` accepts by default (16 MiB if shmq does not say)."""
    try:
        from shmq.protocol import DEFAULT_MAX_FRAME_BYTES
    except ImportError:
        return 16 * 2**20
    return DEFAULT_MAX_FRAME_BYTES


class _SimpleQueueChannels(_MpQueueChannels):
    """multiprocessing.SimpleQueue from the spawn context."""

    def make(self, ctx, size):
        return ctx.SimpleQueue()


def _mq_limit(name, default):
    try:
        with open(f"/proc/sys/fs/mqueue/{name}") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return default


class _PosixMqChannels:
    """Named POSIX message queues (O_CREX), unlinked when the case ends."""

    def __init__(self):
        self.msgsize_max = _mq_limit("msgsize_max", 8192)
        self._depth = _mq_limit("msg_max", 10)
        self._count = 0

    def make(self, ctx, size):
        import posix_ipc

        self._count += 1
        name = f"/shmq-bench-{os.getpid()}-{self._count}"
        q = posix_ipc.MessageQueue(name, posix_ipc.O_CREX, max_messages=self._depth,
                                   max_message_size=min(size + MQ_SLACK, self.msgsize_max))
        q.close()
        return name

    def drop(self, spec):
        import posix_ipc

        try:
            posix_ipc.unlink_message_queue(spec)
        except posix_ipc.ExistentialError:
            pass

    def close(self):
        return []


class _RedisChannels:
    """A private redis-server on a free loopback port (bench/tcp.py); one list per case."""

    def __init__(self):
        from bench.tcp import RedisSystem

        self._server = RedisSystem()
        self.version = self._server.version
        self._count = 0

    def make(self, ctx, size):
        self._count += 1
        key = f"q{self._count}"
        self._server.reset(key)
        return (self._server.port, key)

    def drop(self, spec):
        self._server.reset(spec[1])

    def close(self):
        self._server.close()
        return []


CHANNELS = {
    "shmq": _ShmqChannels,
    "shmq-tcp": _ShmqTcpChannels,
    "mpqueue": _MpQueueChannels,
    "simplequeue": _SimpleQueueChannels,
    "faster-fifo": _FasterFifoChannels,
    "zmq": _ZmqChannels,
    "posix-mq": _PosixMqChannels,
    "redis": _RedisChannels,
}


# ---------------------------------------------------------------- jobs and child processes


@dataclass(frozen=True)
class Job:
    """One benchmark case, as handed to both of its processes."""

    system: str
    kind: str  # "tput" or "rtt"
    size: int
    mode: str  # "msg" or "batch"
    n: int
    runs: int
    warmup: int = WARMUP
    wait: float = START_TIMEOUT + 30.0  # children's own bound on a barrier wait
    cpus: tuple = ()  # one CPU per role when pinning, else empty
    pairs: int = 1  # producers = consumers (tput only)

    @property
    def label(self):
        if self.kind == "rtt":
            return f"{self.system} rtt {self.size}B"
        return f"{self.system} tput {self.size}B {self.mode} {self.pairs}->{self.pairs}"

    @property
    def roles(self):
        if self.kind == "rtt":
            return ("pinger", "ponger")
        if self.pairs == 1:
            return ("producer", "consumer")
        return tuple(f"{r}{i}" for r in ("producer", "consumer") for i in range(self.pairs))

    @property
    def share(self):
        """Messages per producer."""
        return self.n // self.pairs


def _open_ends(role, job, specs):
    """Open the endpoints a role uses: [sender] / [receiver] / [sender, receiver]."""
    if job.pairs > 1 and job.system in MESH_ENDPOINTS:
        kind = role.rstrip("0123456789")
        index = int(role[len(kind):])
        return [MESH_ENDPOINTS[job.system](specs[0], "send" if kind == "producer" else "recv", index, job.pairs)]
    end = ENDPOINTS[job.system]
    if role.startswith("producer"):
        return [end(specs[0], "send")]
    if role.startswith("consumer"):
        return [end(specs[0], "recv")] + ([end(specs[0], "send")] if job.pairs > 1 else [])
    if role == "pinger":
        return [end(specs[0], "send"), end(specs[1], "recv")]
    return [end(specs[0], "recv"), end(specs[1], "send")]


def _batches(n):
    """Sizes of the batches that make up n messages."""
    full, rest = divmod(n, BATCH)
    return [BATCH] * full + ([rest] if rest else [])


def _produce(job, ends):
    """Send job.n messages, one per call or in batches of 64."""
    tx = ends[0]
    if job.mode == "batch":
        # distinct objects: one pickle of 64 references to one bytes object would hold one body
        full = [bytes([i]) * job.size for i in range(BATCH)]
        for count in _batches(job.share):
            tx.send_batch(full if count == BATCH else full[:count])
    else:
        body = b"x" * job.size
        for _ in range(job.share):
            tx.send(body)
    return {}


def _stop(job, tx, count):
    """Send `count` empty stop messages, one per call (a batch of one in batch mode)."""
    for _ in range(count):
        if job.mode == "batch":
            tx.send_batch([b""])
        else:
            tx.send(b"")


def _bodies(job, rx):
    """The next message(s) of a consumer, as a list (empty bytes = stop)."""
    if job.mode == "batch":
        return list(rx.recv_batch(BATCH))
    return [rx.recv()]


def _consume_shared(job, ends, total):
    """One of several consumers: stop at the shared total; the one reaching it stops the others.

    A consumer that took more than one stop puts the extras back, so each takes exactly one.
    """
    rx, tx = ends
    got = nbytes = 0
    t0 = time.perf_counter()
    while True:
        bodies = _bodies(job, rx)
        data = [b for b in bodies if b]
        stops = len(bodies) - len(data)
        got += len(data)
        nbytes += sum(map(len, data))
        if data:
            with total.get_lock():
                before = total.value
                after = total.value = before + len(data)
            if before < job.n <= after:  # exactly one consumer crosses n (both ends read under the lock)
                _stop(job, tx, job.pairs - 1)
                break
        if stops:
            _stop(job, tx, stops - 1)
            break
    if nbytes != got * job.size:
        raise AssertionError(f"received {nbytes} B in {got} msgs of {job.size} B")
    return {"seconds": time.perf_counter() - t0, "got": got}


def _consume_polled(job, ends, total):
    """One of several mesh consumers: receive until the shared total reaches n.

    Its time is that of its last message, so the idle poll that ends it is not counted.
    """
    rx = ends[0]
    got = nbytes = 0
    t0 = last = time.perf_counter()
    while True:
        bodies = rx.poll_batch(job.mode == "batch", POLL_SECONDS)
        if bodies:
            last = time.perf_counter()
            got += len(bodies)
            nbytes += sum(map(len, bodies))
            with total.get_lock():
                total.value += len(bodies)
        elif total.value >= job.n:  # every message has reached some consumer: none is in flight
            break
    if nbytes != got * job.size:
        raise AssertionError(f"received {nbytes} B in {got} msgs of {job.size} B")
    return {"seconds": last - t0, "got": got}


def _consume(job, ends, total=None):
    """Receive exactly job.n messages; time from release until the last one."""
    if job.pairs > 1:
        polled = job.system in MESH_ENDPOINTS
        return (_consume_polled if polled else _consume_shared)(job, ends, total)
    rx = ends[0]
    got = nbytes = 0
    t0 = time.perf_counter()
    if job.mode == "batch":
        while got < job.n:
            bodies = rx.recv_batch(min(BATCH, job.n - got))
            got += len(bodies)
            nbytes += sum(map(len, bodies))
    else:
        while got < job.n:
            nbytes += len(rx.recv())
            got += 1
    seconds = time.perf_counter() - t0
    if got != job.n or nbytes != job.n * job.size:
        raise AssertionError(f"received {got} msgs / {nbytes} B, expected {job.n} / {job.n * job.size}")
    return {"seconds": seconds}


def percentile(ordered, q):
    """Nearest-rank percentile of an ascending list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _ping(job, ends):
    """job.warmup + job.n round trips; summarize the last job.n in microseconds."""
    tx, rx = ends
    body = b"p" * job.size
    clock = time.perf_counter_ns
    samples = []
    for i in range(job.warmup + job.n):
        t0 = clock()
        tx.send(body)
        reply = rx.recv()
        t1 = clock()
        if len(reply) != job.size:
            raise AssertionError(f"reply of {len(reply)} B, expected {job.size}")
        if i >= job.warmup:
            samples.append(t1 - t0)
    samples.sort()
    return {
        "p50_us": percentile(samples, 0.50) / 1e3,
        "p99_us": percentile(samples, 0.99) / 1e3,
        "p999_us": percentile(samples, 0.999) / 1e3,
        "mean_us": statistics.fmean(samples) / 1e3,
        "max_us": samples[-1] / 1e3,
    }


def _pong(job, ends):
    """Echo every message of a run back to the pinger."""
    rx, tx = ends
    for _ in range(job.warmup + job.n):
        tx.send(rx.recv())
    return {}


def _warm_producer(job, ends, total):
    """Before the first run: connect and warm both sides up with job.warmup messages."""
    for _ in range(job.warmup):
        ends[0].send(b"w" * job.size)


def _warm_consumer(job, ends, total):
    """Drain the producers' warm-up messages (P -> P: as a run of warmup x P messages)."""
    if job.pairs > 1:
        _consume(replace(job, n=job.warmup * job.pairs, mode="msg"), ends, total)
        return
    for _ in range(job.warmup):
        ends[0].recv()


ROLES = {"producer": _produce, "consumer": _consume, "pinger": _ping, "ponger": _pong}
WARMUPS = {"producer": _warm_producer, "consumer": _warm_consumer}


def _trace_on_terminate(path):
    """On SIGTERM, write every thread's Python stack to `path`, then die as usual."""
    fh = open(path, "w")
    faulthandler.register(signal.SIGTERM, file=fh, all_threads=True, chain=True)
    return fh


def _child(role, job, specs, barrier, conn, trace_path, total):
    """Process entry: open, warm up, report ready, then one result per barrier release."""
    trace = _trace_on_terminate(trace_path)  # noqa: F841  (kept open for the handler)
    kind = role.rstrip("0123456789")
    try:
        if job.cpus:
            os.sched_setaffinity(0, {job.cpus[job.roles.index(role)]})
        ends = _open_ends(role, job, specs)
        try:
            WARMUPS.get(kind, lambda j, e, t: None)(job, ends, total)
            conn.send(("ready", None))
            for run in range(job.runs):
                barrier.wait(timeout=job.wait)
                args = (total,) if kind == "consumer" else ()
                conn.send((f"run{run}", ROLES[kind](job, ends, *args)))
            barrier.wait(timeout=job.wait)  # nobody closes while the peer may still be reading
        finally:
            for end in ends:
                end.close()
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        conn.close()


# ---------------------------------------------------------------- driving a case (parent side)


class CaseFailed(Exception):
    """A case ended early; status is "timeout" or "error"."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class CaseResult:
    """Raw outcome of one case: per-run results from the measuring process."""

    system: str
    kind: str
    size: int
    mode: str
    n: int
    pairs: int = 1
    status: str = "ok"
    detail: str = ""
    runs: list = field(default_factory=list)
    seconds: float = 0.0


def _take(role, conn, tag):
    """Read one reply from a child; raise CaseFailed on an error or an unexpected tag."""
    try:
        got, payload = conn.recv()
    except (EOFError, OSError):
        raise CaseFailed("error", f"{role} exited without replying") from None
    if got == "error":
        raise CaseFailed("error", f"{role} failed:\n{payload}")
    if got != tag:
        raise CaseFailed("error", f"{role} replied {got!r}, expected {tag!r}")
    return payload


def _collect(tag, conns, procs, timeout):
    """Wait for reply `tag` from every child, watching for crashes; bounded by timeout."""
    deadline = time.monotonic() + timeout
    pending = dict(conns)
    replies = {}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CaseFailed("timeout", f"no {tag!r} from {', '.join(pending)} within {timeout:.0f}s")
        waitables = list(pending.values()) + [procs[r].sentinel for r in pending]
        ready = connection.wait(waitables, timeout=left)
        for role in list(pending):
            conn, proc = pending[role], procs[role]
            if conn in ready or conn.poll():
                replies[role] = _take(role, conn, tag)
                del pending[role]
            elif proc.sentinel in ready:
                raise CaseFailed("error", f"{role} exited with code {proc.exitcode} before {tag!r}")
    return replies


def _release(barrier, conns):
    """Start a run; on a broken barrier report the child error if there is one."""
    try:
        barrier.wait(timeout=BARRIER_TIMEOUT)
    except threading.BrokenBarrierError:
        for role, conn in conns.items():
            if conn.poll():
                try:
                    got, payload = conn.recv()
                except (EOFError, OSError):
                    raise CaseFailed("error", f"{role} exited before the start barrier") from None
                if got == "error":
                    raise CaseFailed("error", f"{role} failed:\n{payload}") from None
        raise CaseFailed("timeout", "children did not reach the start barrier") from None


def _reap(procs, grace):
    """Join every process within `grace` seconds; terminate (then kill) the rest."""
    deadline = time.monotonic() + grace
    stuck = []
    for role, proc in procs.items():
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            stuck.append(role)
            proc.terminate()
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return stuck


def _is_bootstrap(line):
    """Frames of multiprocessing's own start-up code, common to every child."""
    return "multiprocessing" + os.sep in line or '"<string>"' in line


def _stack_report(role, path, keep=14):
    """The innermost frames a terminated child was in, from its SIGTERM dump."""
    try:
        with open(path) as fh:
            lines = [ln.rstrip() for ln in fh if ln.strip() and not _is_bootstrap(ln)]
    except OSError:
        return f"\n{role} was terminated (no stack dump)"
    if not lines:
        return f"\n{role} was terminated (empty stack dump)"
    return f"\n{role} was terminated; its stacks, innermost first:\n" + "\n".join(lines[:keep])


def _spawn(ctx, job, specs, barrier, trace_dir, total):
    """Start both processes of a case; return ({role: proc}, {role: reader})."""
    procs, conns = {}, {}
    for role in job.roles:
        reader, writer = ctx.Pipe(duplex=False)
        trace_path = os.path.join(trace_dir, f"{role}.txt")
        proc = ctx.Process(
            target=_child, args=(role, job, specs, barrier, writer, trace_path, total),
            name=f"bench-{role}", daemon=True,
        )
        proc.start()
        writer.close()
        procs[role], conns[role] = proc, reader
    return procs, conns


def _merge_consumers(job, replies):
    """One run's result: the slowest consumer's time; the consumers' counts must add up to n."""
    parts = [v for k, v in replies.items() if k.startswith("consumer")]
    got = sum(p.get("got", job.n) for p in parts)
    if got != job.n:
        raise CaseFailed("error", f"consumers received {got} messages, expected {job.n}")
    return {"seconds": max(p["seconds"] for p in parts)}


def _drive(job, barrier, procs, conns, run_timeout, progress, runs, total):
    """Run the case's runs, appending the measured result of each to `runs`."""
    _collect("ready", conns, procs, START_TIMEOUT)
    for run in range(job.runs):
        progress(run)
        total.value = 0
        _release(barrier, conns)
        replies = _collect(f"run{run}", conns, procs, run_timeout)
        runs.append(replies["pinger"] if job.kind == "rtt" else _merge_consumers(job, replies))
    _release(barrier, conns)


def run_case(job, channels, ctx, run_timeout, progress):
    """Run one case end to end; never raises for failures inside the case."""
    result = CaseResult(job.system, job.kind, job.size, job.mode, job.n, pairs=job.pairs)
    started = time.monotonic()
    specs, procs = [], {}
    trace_dir = tempfile.TemporaryDirectory(prefix="shmq-bench-trace-")
    try:
        specs = [channels.make(ctx, job.size) for _ in range(1 if job.kind == "tput" else 2)]
        barrier, total = ctx.Barrier(len(job.roles) + 1), ctx.Value("q", 0)
        procs, conns = _spawn(ctx, job, specs, barrier, trace_dir.name, total)
        _drive(job, barrier, procs, conns, run_timeout, progress, result.runs, total)
    except CaseFailed as exc:
        result.status, result.detail = exc.status, exc.detail
        result.detail += f"\n({len(result.runs)} of {job.runs} runs had completed)"
    except Exception:
        result.status, result.detail = "error", traceback.format_exc()
    finally:
        grace = REAP_TIMEOUT if result.status == "ok" else 0.5
        stuck = _reap(procs, grace) if procs else []
        if stuck and result.status == "ok":
            result.status, result.detail = "error", "processes did not exit after the last run"
        for role in stuck:
            result.detail += _stack_report(role, os.path.join(trace_dir.name, f"{role}.txt"))
        trace_dir.cleanup()
        for spec in specs:
            try:
                channels.drop(spec)
            except Exception:
                result.detail += f"\ncleanup of {spec!r} failed:\n{traceback.format_exc()}"
    result.seconds = time.monotonic() - started
    return result


# ---------------------------------------------------------------- planning


def messages_for(size):
    """Messages per throughput run: anchors at 64 B / 1 KiB / 64 KiB, log-interpolated."""
    (s0, n0), *_ , (s_last, n_last) = N_ANCHORS
    if size <= s0:
        return n0
    if size >= s_last:
        return max(1000, int(n_last * s_last / size))
    for (a, na), (b, nb) in zip(N_ANCHORS, N_ANCHORS[1:]):
        if a <= size <= b:
            t = math.log(size / a) / math.log(b / a)
            return int(round(math.exp(math.log(na) + t * math.log(nb / na))))
    raise AssertionError(size)


def pin_cpus(enabled):
    """Two distinct CPUs for a case's two processes, or () if not pinning / not possible."""
    if not enabled or not hasattr(os, "sched_getaffinity"):
        return ()
    usable = sorted(os.sched_getaffinity(0))
    return tuple(usable[-2:]) if len(usable) >= 2 else ()


QUICK_MULTI = ("shmq", "mpqueue", "faster-fifo", "zmq")  # the systems run 4 -> 4 with --quick (shared queue and mesh)
ROUND_TRIP_SCALE = {"shmq-tcp": 20, "redis": 10}  # one network round trip per message: fewer messages


def plan(systems, sizes, runs, quick, run_timeout, cpus, topologies=TOPOLOGIES):
    """Every job, interleaving systems so drift hits them alike."""
    scale = 20 if quick else 1
    common = dict(wait=START_TIMEOUT + run_timeout)
    jobs = []
    for pairs in topologies:
        for size in sizes[:1] if quick and pairs > 1 else sizes:
            for mode in ("msg", "batch"):
                for system in systems:
                    if quick and pairs > 1 and system not in QUICK_MULTI:
                        continue
                    slow = ROUND_TRIP_SCALE.get(system, 1) if mode == "msg" else 1
                    n = max(BATCH, messages_for(size) // scale // slow) // pairs * pairs
                    jobs.append(Job(system, "tput", size, mode, n, runs, pairs=pairs,
                                    cpus=cpus if pairs == 1 else (), **common))
    common["cpus"] = cpus
    for system in systems:
        jobs.append(Job(system, "rtt", RTT_SIZE, "msg", RTT_TRIPS // scale, runs, **common))
    return jobs


# ---------------------------------------------------------------- availability and machine info


def unsupported(job, channels):
    """Why a planned case cannot run on this system here, or None."""
    frame = getattr(channels, "max_frame_bytes", None)
    if frame is not None and job.mode == "batch" and BATCH * job.size > frame // 2:
        return f"a batch of {BATCH} x {_size_label(job.size)} exceeds the server's {_size_label(frame)} frames"
    limit = getattr(channels, "msgsize_max", None)
    if limit is not None and job.size + MQ_SLACK > limit:
        return f"msgsize_max: /proc/sys/fs/mqueue/msgsize_max is {limit} B"
    return None


def _dist_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe(system):
    """Return None if the system can run here, else the reason it is skipped."""
    try:
        if system == "shmq":
            import shmq

            if not callable(getattr(shmq, "connect", None)):
                return "shmq does not expose connect() yet"
        elif system == "faster-fifo":
            import faster_fifo  # noqa: F401
        elif system == "zmq":
            import zmq  # noqa: F401
        elif system == "posix-mq":
            import posix_ipc  # noqa: F401
        elif system == "redis":
            import redis  # noqa: F401

            if shutil.which("redis-server") is None:
                return "redis-server not on PATH"
    except ImportError as exc:
        if system == "shmq":
            return f"shmq not importable ({exc})"
        return f"{PACKAGES[system]} not installed"
    return None


def _shmq_version():
    try:
        import shmq
    except ImportError:
        return None
    version = getattr(shmq, "__version__", None) or _dist_version("shmq") or "source tree"
    fast = getattr(importlib.import_module("shmq.queue"), "FAST", None)
    return version if fast is None else f"{version} ({'C hot paths' if fast else 'pure Python'})"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info():
    """CPU, cores, OS, Python and package versions."""
    try:
        import zmq

        zmq_version = f"{zmq.__version__} (libzmq {zmq.zmq_version()})"
    except ImportError:
        zmq_version = None
    physical = None
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
    except ImportError:
        pass
    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": physical,
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "shmq": _shmq_version(),
        "faster-fifo": _dist_version("faster-fifo"),
        "pyzmq": zmq_version,
        "redis-py": _dist_version("redis"),
        "posix_ipc": _dist_version("posix_ipc"),
        "redis-server": _redis_server_version(),
    }


def _redis_server_version():
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    import subprocess

    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip() or None)


# ---------------------------------------------------------------- summary and report


def summarize(result):
    """Median and spread of one case's runs (empty dict unless status is ok)."""
    if result.status != "ok" or not result.runs:
        return {}
    if result.kind == "rtt":
        p50 = [r["p50_us"] for r in result.runs]
        p99 = [r["p99_us"] for r in result.runs]
        p999 = [r.get("p999_us", r["max_us"]) for r in result.runs]
        return {
            "p50_us": statistics.median(p50),
            "p99_us": statistics.median(p99),
            "p999_us": statistics.median(p999),
            "p50_min_us": min(p50),
            "p50_max_us": max(p50),
        }
    rates = [result.n / r["seconds"] for r in result.runs]
    median = statistics.median(rates)
    return {
        "msgs_per_s": median,
        "msgs_per_s_min": min(rates),
        "msgs_per_s_max": max(rates),
        "mb_per_s": median * result.size / 1e6,
    }


def _si(x):
    """1234567 -> '1.23M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def _size_label(size):
    if size % 2**20 == 0:
        return f"{size // 2**20} MiB"
    if size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} B"


VERSIONED = ("shmq", "faster-fifo", "pyzmq", "posix_ipc", "redis-py", "redis-server")


def _case_key(r):
    return (r.kind, r.size, r.mode, r.pairs)


def _better(r, s):
    """A figure where larger is better: msgs/s, or 1 / RTT p50."""
    if r.kind == "rtt":
        return 1 / s["p50_us"] if s.get("p50_us") else None
    return s.get("msgs_per_s")


def relative(results):
    """{id(result): (vs mpqueue, vs the best peer)}: how many times better (> 1 = better).

    Peers are the systems other than shmq's own two, so shmq's rows say by how much it
    leads or trails the best of the others.
    """
    groups = {}
    for r, s in results:
        if r.status == "ok" and _better(r, s):
            groups.setdefault(_case_key(r), {})[r.system] = _better(r, s)
    out = {}
    for r, s in results:
        mine, group = _better(r, s) if r.status == "ok" else None, groups.get(_case_key(r), {})
        best = max((v for k, v in group.items() if k not in OWN), default=None)
        out[id(r)] = (_ratio(mine, group.get(BASELINE)), _ratio(mine, best))
    return out


def _print_header(info, args, skipped, out):
    print("shmq local benchmark", file=out)
    cores = f"{info['logical_cpus']} logical CPUs"
    if info["physical_cores"]:
        cores += f", {info['physical_cores']} physical cores"
    if info["usable_cpus"] is not None:
        cores += f", {info['usable_cpus']} usable"
    print(f"machine : {info['cpu']}; {cores}; {info['os']}", file=out)
    print(f"python  : {info['python']}", file=out)
    versions = ", ".join(f"{k} {info.get(k) or 'not installed'}" for k in VERSIONED)
    print(f"packages: {versions}", file=out)
    pinned = f"CPUs {args.cpus[0]} and {args.cpus[1]}" if args.cpus else "no (OS placement)"
    print(f"settings: runs={args.runs}, quick={args.quick}, start method=spawn, batch={BATCH}, "
          f"pinned: {pinned}", file=out)
    for reason in skipped.values():
        print(f"skipped: {reason}", file=out)
    print(file=out)


def _print_tput(results, runs, out):
    rows = [(r, s) for r, s in results if r.kind == "tput"]
    if not rows:
        return
    rel = relative(results)
    print(f"Throughput, P producers -> P consumers (separate processes), median of {runs} runs", file=out)
    print("  msg = one message per call; batch = 64 per call (see notes); MB/s = payload, 10^6 B/s;", file=out)
    print(f"  vs mpq / vs best peer = msgs/s over {BASELINE}'s / over the fastest peer's (any system but "
          "shmq's own) in the same case", file=out)
    head = (f"{'size':>7}  {'mode':<5}  {'P':>4}  {'system':<11}  {'N':>7}  {'msgs/s':>8}  {'(min .. max)':<19}  "
            f"{'MB/s':>8}  {'vs mpq':>7}  {'vs best peer':>12}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r, s in rows:
        lead = f"{_size_label(r.size):>7}  {r.mode:<5}  {f'{r.pairs}->{r.pairs}':>4}  {r.system:<11}  {r.n:>7}"
        if r.status != "ok":
            print(f"{lead}  {r.status}" + (f": {r.detail}" if r.status == "skipped" else ""), file=out)
            continue
        spread = f"({_si(s['msgs_per_s_min'])} .. {_si(s['msgs_per_s_max'])})"
        vs_base, vs_best = rel[id(r)]
        print(f"{lead}  {_si(s['msgs_per_s']):>8}  {spread:<19}  {s['mb_per_s']:>8.1f}  {vs_base:>7}  {vs_best:>12}",
              file=out)
    print("  batch notes:", file=out)
    for system in dict.fromkeys(r.system for r, _ in rows):
        print(f"    {system:<11} {BATCH_NOTES[system]}", file=out)
    print(file=out)


def _print_rtt(results, runs, out):
    rows = [(r, s) for r, s in results if r.kind == "rtt"]
    if not rows:
        return
    n = rows[0][0].n
    print(f"RTT, {RTT_SIZE} B ping-pong over two queues (a->b, b->a), {n} round trips "
          f"after {WARMUP} warm-up, median of {runs} runs, microseconds", file=out)
    print(f"  vs mpq / vs best peer = {BASELINE}'s / the lowest peer p50 over this system's p50 "
          "(> 1 = lower latency)", file=out)
    rel = relative(results)
    head = (f"{'system':<11}  {'RTT p50':>9}  {'RTT p99':>9}  {'RTT p99.9':>9}  {'p50 (min .. max)':<20}  "
            f"{'vs mpq':>7}  {'vs best peer':>12}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r, s in rows:
        if r.status != "ok":
            print(f"{r.system:<11}  {r.status}" + (f": {r.detail}" if r.status == "skipped" else ""), file=out)
            continue
        spread = f"({s['p50_min_us']:.1f} .. {s['p50_max_us']:.1f})"
        vs_base, vs_best = rel[id(r)]
        print(f"{r.system:<11}  {s['p50_us']:>9.1f}  {s['p99_us']:>9.1f}  {s['p999_us']:>9.1f}  {spread:<20}  "
              f"{vs_base:>7}  {vs_best:>12}", file=out)
    print(file=out)


def _ratio(num, den):
    return f"{num / den:.2f}x" if num and den else "n/a"


def _ratio_cell(by_key, mine, peer, stat, invert=False):
    """shmq / peer for one stat (peer / shmq if invert), or the status of a failed side."""
    a, b = by_key.get(mine), by_key.get(peer)
    for side in (a, b):
        if side is not None and side[0].status != "ok":
            who = "shmq" if side is a else "peer"
            return f"{who} {side[0].status}"
    if a is None or b is None:
        return "n/a"
    x, y = a[1].get(stat), b[1].get(stat)
    return _ratio(y, x) if invert else _ratio(x, y)


def _print_ratios(results, out):
    """One table per topology: shmq / peer per throughput row (1 -> 1: then peer / shmq RTT)."""
    for pairs in dict.fromkeys(r.pairs for r, _ in results):
        _print_ratio_table([(r, s) for r, s in results if r.pairs == pairs], pairs, out)


def _print_ratio_table(results, pairs, out):
    by_key = {(r.system, r.kind, r.size, r.mode): (r, s) for r, s in results}
    peers = list(dict.fromkeys(r.system for r, _ in results if r.system != "shmq"))
    if not any(r.system == "shmq" for r, _ in results) or not peers:
        return
    print(f"Ratios shmq / peer, {pairs} -> {pairs} (median msgs/s; > 1 means shmq is faster)", file=out)
    head = f"{'size':>7}  {'mode':<5}  " + "  ".join(f"{'vs ' + p:>14}" for p in peers)
    print(head, file=out)
    print("-" * len(head), file=out)
    keys = dict.fromkeys((r.size, r.mode) for r, _ in results if r.kind == "tput")
    for size, mode in keys:
        cells = [_ratio_cell(by_key, ("shmq", "tput", size, mode), (p, "tput", size, mode), "msgs_per_s")
                 for p in peers]
        print(f"{_size_label(size):>7}  {mode:<5}  " + "  ".join(f"{c:>14}" for c in cells), file=out)
    mine = ("shmq", "rtt", RTT_SIZE, "msg")
    if any(r.kind == "rtt" for r, _ in results):
        for stat in ("p50_us", "p99_us"):
            cells = [_ratio_cell(by_key, mine, (p, "rtt", RTT_SIZE, "msg"), stat, invert=True) for p in peers]
            label = f"RTT {stat[:3]}"
            print(f"{label:>14}  " + "  ".join(f"{c:>14}" for c in cells), file=out)
        print("  RTT rows are peer RTT / shmq RTT (> 1 means shmq has lower latency)", file=out)
    print(file=out)


def _print_failures(results, out):
    failed = [r for r, _ in results if r.status != "skipped" and (r.status != "ok" or r.detail)]
    if not failed:
        return
    print("Problems", file=out)
    for r in failed:
        mode = f" {r.mode}" if r.kind == "tput" else ""
        print(f"- {r.system} {r.kind} {_size_label(r.size)}{mode} {r.pairs}->{r.pairs}: {r.status}", file=out)
        for line in r.detail.strip().splitlines():
            print(f"    {line}", file=out)
    print(file=out)


def report(info, args, skipped, results, notes, out=sys.stdout):
    """Print the header, the tables, the ratios, any problems and cleanup notes."""
    _print_header(info, args, skipped, out)
    _print_tput(results, args.runs, out)
    _print_rtt(results, args.runs, out)
    _print_ratios(results, out)
    _print_failures(results, out)
    for note in notes:
        print(f"note: {note}", file=out)


def write_json(path, info, args, skipped, results, notes):
    """All raw runs and summaries as JSON."""
    doc = {
        "machine": info,
        "settings": {"runs": args.runs, "quick": args.quick, "batch": BATCH, "warmup": WARMUP,
                     "start_method": "spawn", "queue_bytes": QUEUE_BYTES, "run_timeout": args.run_timeout,
                     "pinned_cpus": list(args.cpus)},
        "skipped": skipped,
        "notes": notes,
        "cases": [dict(asdict(r), summary=s) for r, s in results],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


def read_json(path):
    """A document written by write_json, as (info, settings namespace, skipped, results, notes, doc)."""
    with open(path) as fh:
        doc = json.load(fh)
    st = doc["settings"]
    settings = argparse.Namespace(runs=st["runs"], quick=st["quick"], cpus=tuple(st["pinned_cpus"]),
                                  run_timeout=st["run_timeout"])
    fields = {f for f in CaseResult.__dataclass_fields__}
    results = [(CaseResult(**{k: v for k, v in case.items() if k in fields}), case.get("summary", {}))
               for case in doc["cases"]]
    return doc["machine"], settings, doc["skipped"], results, doc["notes"], doc


# ---------------------------------------------------------------- main


class Progress:
    """Progress lines on stderr: case index, label, run k/R."""

    def __init__(self, total, stream=sys.stderr):
        self._total = total
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.monotonic()

    def case(self, index, job):
        def on_run(run):
            elapsed = time.monotonic() - self._started
            text = f"[{index}/{self._total}] {job.label}: run {run + 1}/{job.runs} ({elapsed:.0f}s)"
            if self._tty:
                self._stream.write("\r\033[K" + text)
            else:
                self._stream.write(text + "\n")
            self._stream.flush()

        return on_run

    def done(self, result):
        if result.status != "ok":
            line = f"  -> {result.system} {result.kind} {result.size}B {result.mode}: {result.status}"
            self._stream.write(("\n" if self._tty else "") + line + "\n")
        self._stream.flush()

    def finish(self):
        if self._tty:
            self._stream.write("\n")
        self._stream.write(f"done in {time.monotonic() - self._started:.1f}s\n")
        self._stream.flush()


def _csv(text, allowed=None):
    items = [x.strip() for x in text.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def _parse_size(text):
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = {"k": 1024, "m": 2**20}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.local", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs per case (default 5)")
    p.add_argument("--quick", action="store_true", help="N / 10 for a fast smoke test")
    p.add_argument("--systems", type=lambda t: _csv(t, SYSTEMS), default=list(SYSTEMS),
                   help=f"comma list from {','.join(SYSTEMS)}")
    p.add_argument("--sizes", type=lambda t: [_parse_size(x) for x in _csv(t)], default=list(DEFAULT_SIZES),
                   help="comma list of message sizes in bytes (1k, 64k accepted)")
    p.add_argument("--no-rtt", action="store_true", help="skip the ping-pong latency cases")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds allowed per run before the case is a timeout (default 30; 10 with --quick)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="let the OS place the two processes (default: pin them to two distinct CPUs)")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    args = p.parse_args(argv)
    if args.run_timeout is None:
        args.run_timeout = 10.0 if args.quick else 30.0
    if args.runs < 1 or any(s < 1 for s in args.sizes):
        p.error("--runs and --sizes must be positive")
    return args


def _open_channels(systems, skipped):
    """Parent-side channel factories; a system whose factory fails is skipped."""
    opened = {}
    for system in systems:
        try:
            opened[system] = CHANNELS[system]()
        except Exception as exc:
            skipped[system] = f"{system} setup failed: {exc!r}"
    return opened


def run_matrix(args, ctx):
    """Run every planned case; return (info, skipped systems, [(result, summary)], notes)."""
    skipped = {s: r for s in args.systems if (r := probe(s))}
    channels = _open_channels([s for s in args.systems if s not in skipped], skipped)
    args.cpus = pin_cpus(args.pin)
    jobs = [j for j in plan(list(channels), args.sizes, args.runs, args.quick, args.run_timeout, args.cpus)
            if not (args.no_rtt and j.kind == "rtt")]
    progress = Progress(len(jobs))
    results, notes = [], []
    try:
        for index, job in enumerate(jobs, 1):
            reason = unsupported(job, channels[job.system])
            if reason:
                result = CaseResult(job.system, job.kind, job.size, job.mode, job.n, job.pairs, "skipped", reason)
                results.append((result, {}))
                continue
            result = run_case(job, channels[job.system], ctx, args.run_timeout, progress.case(index, job))
            progress.done(result)
            results.append((result, summarize(result)))
    finally:
        for system, ch in channels.items():
            try:
                notes += ch.close()
            except Exception:
                notes.append(f"cleanup of {system} failed:\n{traceback.format_exc()}")
        progress.finish()
    return machine_info(), skipped, results, notes


def main(argv=None):
    args = parse_args(argv)
    info, skipped, results, notes = run_matrix(args, mp.get_context("spawn"))
    report(info, args, skipped, results, notes)
    if args.json:
        write_json(args.json, info, args, skipped, results, notes)
        print(f"wrote {args.json}")
    return 0 if all(r.status in ("ok", "skipped") for r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
