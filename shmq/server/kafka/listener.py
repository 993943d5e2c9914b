"""``KafkaListener``: the socket of the Kafka port, its connections, the stream handles
its requests share (with their lines of waiting fetches), the idempotent producers'
state and the group coordinator.

Strategy: like ``tcp.TcpServer``, one protocol object per connection on the server's
loop; the handles and their lines are ``tcp.AttachedHandles`` (a fetch waits on a stream's line
as a DEADBEEF READ does, woken by the doorbell of any append, from any process); the
server's ``Limits`` (connections, frame and idle timeouts) hold here as on its port,
with a sweeper of deadlines of its own.
"""

import asyncio
import ipaddress
import logging
import uuid

from ...engine.shm.segment import check_queue_name
from ...errors import StreamExists, StreamNotFound
from ...kafka import ErrorCode
from ..limits import Limits, sweep
from ..tcp import LOCK_TIMEOUT_S, AttachedHandles, listen
from ..waiters import StreamWaiters
from . import configs, coordinator, groups, state, txns
from .connection import KafkaConnection
from .handlers import HANDLERS, VERSIONS
from .batches import Batches
from .produce import Sequences

__all__ = ["KafkaListener", "advertised"]

log = logging.getLogger("shmq.server")

_TOPIC_IDS = uuid.UUID("5d1f0c2e-8f7a-4c1b-9a53-6b6d71000000")  # the namespace of topic ids (uuid5)


def advertised(host: str) -> str:
    """The host Metadata names for a listener bound to ``host``: itself, or 127.0.0.1 for
    a wildcard (0.0.0.0, ::, empty)."""
    try:
        if not host or ipaddress.ip_address(host).is_unspecified:
            return "127.0.0.1"
    except ValueError:  # a name
        pass
    return host


class KafkaListener:
    """Serves one namespace's streams to Kafka clients on ``host:port`` until ``stop``.

    ``token``: SASL/PLAIN with it as the password is wanted first (None: open).
    ``advertised_host`` / ``advertised_port``: the address Metadata names (default: the
    bound one, ``advertised``). ``auto_create``: a Metadata or Produce naming an unknown
    topic creates it with ``auto_create_partitions`` partitions, as Kafka's
    ``auto.create.topics.enable``. ``topic_max_bytes``: the ring of each partition of a
    topic it makes. ``max_replication_factor``: the most a CreateTopics may ask for (each
    topic is one copy on this node whatever it asks). ``initial_rebalance_delay_ms``: Kafka's
    ``group.initial.rebalance.delay.ms`` (``coordinator.Coordinator``). ``transactions``:
    the server's transaction coordinator (``server/transactions``), which its
    transactional producers use and whose producer ids its idempotent ones share.
    ``limits``: the server's (``max_connections``, ``frame_timeout``, ``idle_timeout``
    apply to this port on its own).
    """

    node_id = 0
    port_setting = "--kafka-port"  # what chose the port, for a port in use (``tcp.listen_error``)

    def __init__(self, broker, host="127.0.0.1", port=9092, token=None, max_frame_bytes=16 * 2**20,
                 advertised_host=None, advertised_port=None, auto_create=True, auto_create_partitions=1,
                 limits: Limits | None = None, on_create=None, tls=None, initial_rebalance_delay_ms=3000,
                 topic_max_bytes=64 * 2**20, max_replication_factor=1, transactions=None):
        if auto_create_partitions < 1:
            raise ValueError(f"auto_create_partitions must be at least 1, not {auto_create_partitions}")
        self.broker = broker
        self.host = host
        self.port = port
        self.advertised_host = advertised_host or advertised(host)
        self.advertised_port = advertised_port  # None: the bound port (a proxy in front says its own)
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.auto_create = auto_create
        self.auto_create_partitions = auto_create_partitions
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.topic_max_bytes = topic_max_bytes
        self.max_replication_factor = max_replication_factor  # CreateTopics takes up to this (one copy all the same)
        self.limits = limits if limits is not None else Limits()
        self.on_create = on_create  # called with each stream this listener creates
        self.state_dir = None  # the server's data dir: producers' sequences and commit metadata kept there (state)
        self.tls = tls  # an ssl.SSLContext: Kafka's SSL (SASL_SSL with a token); None: PLAINTEXT (SASL_PLAINTEXT)
        self.versions = {**VERSIONS, **groups.VERSIONS, **configs.VERSIONS, **txns.VERSIONS}
        self.handlers = {**HANDLERS, **groups.HANDLERS, **configs.HANDLERS, **txns.HANDLERS}
        self.txns = transactions  # the server's transaction coordinator (``server/transactions``)
        self.sequences = Sequences(transactions.ids)
        self.batches = Batches()  # producers' batches as they came, for the fetches of their offsets
        self.connections = set()
        self.cluster_id = f"shmq-{broker.namespace}"
        self.loop = None
        self.coordinator = None
        self.streams = None
        self._server = None
        self._sweeper = None

    # ------------------------------------------------------------------ topics
    def topic(self, name, create=False):
        """(stream handle or None, error code) of topic ``name``; ``create``: made if
        missing and auto-creation is on."""
        try:
            check_queue_name(name)
        except (ValueError, TypeError):
            return None, ErrorCode.invalid_topic_exception
        try:
            return self.streams.get(name), ErrorCode.none
        except StreamNotFound:
            if not (create and self.auto_create):
                return None, ErrorCode.unknown_topic_or_partition
        try:
            self.create_topic(name, self.auto_create_partitions)
            log.info("topic %s auto-created with %d partition(s)", name, self.auto_create_partitions,
                     extra={"event": "kafka_topic_created", "topic": name,
                            "partitions": self.auto_create_partitions})
        except StreamExists:  # made meanwhile, by someone else
            pass
        try:
            return self.streams.get(name), ErrorCode.none
        except StreamNotFound:
            return None, ErrorCode.unknown_topic_or_partition

    def create_topic(self, name, partitions, **settings):
        s = self.broker.create_stream(name, partitions=partitions, **{"max_bytes": self.topic_max_bytes, **settings})
        try:
            if self.on_create is not None:
                self.on_create(s)  # a wal stream's logs are open before the first append
        finally:
            s.close()

    def delete_topic(self, name):
        self.streams.forget(name)
        self.broker.delete_stream(name)
        self.txns.forget(name)
        if self.coordinator is not None:
            self.coordinator.forget_topic(name)

    def topic_id(self, s) -> uuid.UUID:
        """A stream's topic id: the same while it lives, another once made again."""
        return uuid.uuid5(_TOPIC_IDS, f"{s.namespace}/{s.name}/{s.created_at!r}")

    def notify(self, name):
        """Records were just appended by this loop: serve the fetches waiting on ``name``."""
        self.streams.notify(name)

    # ------------------------------------------------------------------ connections
    def admit(self, conn) -> bool:
        if self._server is None or len(self.connections) >= self.limits.max_connections:
            return False
        self.connections.add(conn)
        return True

    def connection_gone(self, conn):
        self.connections.discard(conn)

    _sweep = sweep  # the connections past a deadline closed, every so often

    # ------------------------------------------------------------------ life
    async def bind(self):
        """Listen, accepting no connection yet (``start``); ShmqError in one line when the
        address cannot be had."""
        self.loop = asyncio.get_running_loop()
        self.streams = AttachedHandles(self, self._attach, StreamWaiters, StreamNotFound, "stream")
        self.coordinator = coordinator.Coordinator(self.broker, self.loop, self.initial_rebalance_delay_ms)
        self._server = await listen(self, KafkaConnection)
        return self

    async def start(self):
        if self._server is None:
            await self.bind()
        if self.state_dir is not None:
            state.restore(self, self.state_dir)
        await self._server.start_serving()
        self._sweeper = self.loop.create_task(self._sweep())
        return self

    def unbind(self):
        if self._server is not None:
            self._server.close()
            self._server = None

    async def stop(self):
        """Stop accepting; waiting fetches get what is there; close every connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self.streams is not None:
            self.streams.answer_all()
        for conn in list(self.connections):
            conn.close("the server stops")
        if self.state_dir is not None and self.coordinator is not None:
            state.keep(self, self.state_dir)
        if self.coordinator is not None:
            self.coordinator.close()
        if server is not None:
            await server.wait_closed()
        if self.streams is not None:
            self.streams.forget_all()

    def _attach(self, name):
        s = self.broker.stream(name)
        s.lock_timeout = LOCK_TIMEOUT_S
        return s
