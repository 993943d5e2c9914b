"""The one shape every system under test takes (Adapter + End), and the table of systems.

Strategy: a system is two small classes in its own module here. Its ``Adapter`` lives in
the parent for the whole run: it starts what the system needs (a server, a directory),
makes one channel per case (``make`` returns a spec the children can unpickle), drops it
afterwards, names the cases it cannot run (``unsupported``) and, at ``close``, reports
what it left behind. Its ``End`` is opened from that spec inside a case's processes: one
sender or one receiver with ``send`` / ``send_batch`` / ``send_pipelined`` / ``flush`` /
``recv`` / ``recv_batch`` / ``release`` / ``close``. The harness and the roles know nothing
else of a system.
"""

from __future__ import annotations

import importlib
import os
from typing import NamedTuple


class Entry(NamedTuple):
    """What is known of a system without importing it (a saved run is reported where its package is missing)."""

    module: str  # in bench/adapters
    cls: str
    package: str | None  # the distribution to install when the module cannot be imported
    batch_note: str  # what "batch" means for this system, printed under the throughput table
    acks: str = ""  # what its consumer acknowledges: "each" message, or "none" (a received message is gone)


REGISTRY = {
    "shmq": Entry("shmq_local", "ShmqLocal", None, "put_many / get_many(64) + ack_many", "each"),
    "shmq-loop": Entry("shmq_local", "ShmqLoop", None,
                       "q.messages() per message; batches as shmq's (get_many + ack_many)", "each"),
    "shmq-noack": Entry("shmq_local", "ShmqNoAck", None, "put_many / get_many(64, ack=False): settled as taken",
                        "none"),
    "shmq-zc": Entry("shmq_local", "ShmqZeroCopy", None,
                     "reserve_many (64 sizes; reserve each from 32 KiB) + fill in place / "
                     "get_many(64, copy=False) + ack_many", "each"),
    "shmq-lanes": Entry("shmq_local", "ShmqLanes", None,
                        "put_many / get_many(64) + ack_many, on a queue of K lanes (K = P)", "each"),
    "shmq-tcp": Entry("shmq_tcp", "ShmqTcp", None, "put_many / get_many(64) + ack_many over TCP", "each"),
    "mpqueue": Entry("mp_queues", "MpQueue", None, "one list of 64 bodies per put (1 pickle), counted as 64", "none"),
    "simplequeue": Entry("mp_queues", "SimpleQueue", None, "one list of 64 bodies per put (1 pickle), counted as 64",
                         "none"),
    "faster-fifo": Entry("fasterfifo", "FasterFifo", "faster-fifo", "put_many / get_many(max_messages_to_get=64)",
                         "none"),
    "zmq": Entry("zmq_pushpull", "ZmqPushPull", "pyzmq", "one multipart message of 64 frames, counted as 64", "none"),
    "posix-mq": Entry("posix_mq", "PosixMq", "posix_ipc", "no batch API: 64 single sends; receives one at a time",
                      "none"),
    "iceoryx2": Entry("iceoryx2_pubsub", "Iceoryx2", "iceoryx2",
                      "no batch API: 64 loan + send, then one notify / up to 64 receives, then a wait", "none"),
    "iceoryx2-poll": Entry("iceoryx2_pubsub", "Iceoryx2Poll", "iceoryx2",
                           "no batch API: 64 loan + send / up to 64 receives; the receiver busy-polls", "none"),
    "redis": Entry("redis_lists", "RedisLists", "redis", "LPUSH of 64 values / BLMPOP COUNT 64", "none"),
    "rabbitmq": Entry("rabbitmq", "RabbitMq", "pika",
                      "64 basic_publish (no confirms) / up to 64 deliveries + one basic_ack(multiple)", "each"),
    "nats-core": Entry("nats_core", "NatsCore", "nats-py",
                       "64 publish per event-loop turn / every message the loop has, up to 64", "none"),
}
SYSTEMS = tuple(REGISTRY)
# streams (python -m bench.streams): append-only logs read through a consumer group or by offset
STREAM_REGISTRY = {
    "shmq-stream": Entry("shmq_stream", "ShmqStreamLocal", None,
                         "append_many(64) / poll(64) + commit, read(p, offset, 64)"),
    "shmq-stream-tcp": Entry("shmq_stream", "ShmqStreamTcp", None,
                             "append_many(64) / poll(64) + commit, read(p, offset, 64) over TCP"),
    "redis-streams": Entry("redis_streams", "RedisStreams", "redis",
                           "64 XADD in one pipeline / XREADGROUP COUNT 64 + one XACK of 64 ids, XREAD COUNT 64"),
    "nats-js": Entry("nats_jetstream", "NatsJetStream", "nats-py",
                     "64 publish_async, then their 64 acks / fetch(64) + ack of the last (AckPolicy.ALL)"),
}
STREAM_SYSTEMS = tuple(STREAM_REGISTRY)
SHM_DIR = "/dev/shm"


class End:
    """One process's sender (``role`` "send") or receiver ("recv") on a channel made by its Adapter."""

    # its consumers take messages ahead of their receives (a broker's prefetch, handed back when
    # they leave), so a stop message can be taken before messages put ahead of it: their run
    # ends at a shared count instead (bench/roles.py)
    takes_ahead = False

    def __init__(self, spec, role):
        raise NotImplementedError

    def send(self, body):
        raise NotImplementedError

    def send_batch(self, bodies):
        """Several messages in one call; a system without a batch API sends them one by one."""
        for body in bodies:
            self.send(body)

    def send_pipelined(self, body):
        """One message, not waiting for the system to confirm it (``flush`` does); a system
        without pipelining sends it as ``send`` does."""
        self.send(body)

    def flush(self):
        """Make sure everything sent has left this process, and what was sent pipelined is
        confirmed; a sender calls it at the end of a run (a client that writes from its event
        loop may still hold some)."""

    def recv(self):
        """The next message's body; blocks until there is one."""
        raise NotImplementedError

    def recv_batch(self, limit):
        """At least one and at most ``limit`` bodies, as a list; by default one receive."""
        return [self.recv()]

    def release(self):
        """This receiver takes nothing more for now: hand back what the system delivered to it
        ahead of time (a prefetch), so the other receivers of a shared queue get it."""

    def close(self):
        pass


class Adapter:
    """One system under test, on the parent's side, for a whole run."""

    name = ""
    End = End
    # several consumers without a shared queue: MeshEnd(spec, role, index, producers), with poll_batch(batch, seconds)
    MeshEnd = None

    @classmethod
    def probe(cls):
        """Why this system cannot run here (a missing program, say), or None."""
        return None

    def make(self, ctx, size):
        """A new channel for messages of ``size`` bytes; returns its spec for the Ends."""
        raise NotImplementedError

    def make_case(self, ctx, job):
        """The channel of one case (a plan.Job); by default ``make`` for its message size."""
        return self.make(ctx, job.size)

    def drop(self, spec):
        """Remove a channel once its case is over."""

    def unsupported(self, job):
        """Why this system cannot run ``job`` (a plan.Job), or None."""
        return None

    def close(self):
        """Stop what the adapter started; returns notes on anything it left behind."""
        return []


def entry(system):
    """The Entry of a queue or a stream system."""
    return REGISTRY[system] if system in REGISTRY else STREAM_REGISTRY[system]


def acks(system):
    """What ``system``'s consumer acknowledges ("each" / "none"), or "?" if the registry does not say."""
    found = REGISTRY.get(system)
    return found.acks if found and found.acks else "?"


def adapter_class(system):
    """The Adapter subclass of ``system``; ImportError if its package is missing."""
    found = entry(system)
    return getattr(importlib.import_module(f"bench.adapters.{found.module}"), found.cls)


def probe(system):
    """None if ``system`` can run here, else why not."""
    package = entry(system).package
    try:
        cls = adapter_class(system)
    except ImportError as exc:
        return f"{package} not installed" if package else f"{system} not importable ({exc})"
    return cls.probe()


def run_namespace(part):
    """A shmq namespace of this run: ``bench-<pid>-<part>``. Only what carries this
    run's prefix is the bench's to remove or to count as leaked."""
    return f"bench-{os.getpid()}-{part}"


def leftover_notes(system, namespace):
    """Notes on the entries of ``namespace`` still in /dev/shm (segments and semaphores)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    left = sorted(n for n in names if namespace in n.split("."))
    if not left:
        return []
    return [f"{system} left {len(left)} object(s) of namespace {namespace!r} in /dev/shm: {', '.join(left)}"]
