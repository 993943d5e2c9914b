"""Celery's broker on shmq: a kombu transport, registered as ``shmq://`` on import.

    import shmq.kombu                                   # registers the transport
    Celery(broker="shmq://")                            # local attach ($SHMQ_NAMESPACE, else "shmq")
    Celery(broker="shmq:///jobs")                       # local attach to namespace "jobs"
    Celery(broker="shmq://:TOKEN@127.0.0.1:7878")       # a ``shmq server`` over TCP
    Celery(broker="shmqs://:TOKEN@host:7878")           # ... over TLS (also shmq://...?ssl=true)

Strategy: a thin adapter over shmq's public API, shaped as kombu's virtual transports
are (a Channel with ``_get`` / ``_put`` / ``_purge`` / ``_size``); a kombu message is its
payload as JSON in one shmq message. What kombu's virtual transports keep per process,
shmq keeps for every process:

- exchanges and bindings are shmq's own (``engine/queues/exchange.py``): a fanout exchange is a
  shmq fanout exchange; direct and topic ones are shmq topic exchanges (a direct binding
  is its exact routing key, which matches only itself);
- a delivery the worker has not settled stays leased in shmq, not only in the worker's
  memory: ``basic_ack`` acks it, ``basic_reject`` nacks it (requeue) or dead-letters it,
  and a worker SIGKILLed holding it loses nothing (shmq hands out a dead holder's
  leases again). Each held delivery's lease is renewed in the background until it is
  settled, so a long task, or an ETA task kept in memory, is not delivered twice;
- a consumer is registered with the queue (``add_consumer``), so an auto-delete queue
  goes when its last consumer goes, whichever process or connection that was (RabbitMQ's
  rule), and ``x-expires`` counts from when the last one went.

The worker runs Celery's event loop (``asynloop``, the prefork pool's non-blocking
AsynPool), as it does on Redis or RabbitMQ, fed by ``loop.EventLoop``: on a local
attach and over TCP.

Queues are declared (made, or their live settings changed) each time a process declares
them, from the transport options (``broker_transport_options``): ``visibility_timeout``,
``max_deliveries``, ``dead_letter_queue`` (a name with ``{queue}``; None: none),
``durability``, ``max_bytes``, and from the queue's arguments (``declare.queue_settings``).
Over TCP a server's restart is ridden out by the consumers (the event loop's lines,
``drain_events``) for up to the client's ``max_outage`` (a transport option too:
``CONNECT_OPTIONS``), as the client's own long-lived consumers ride it out. A queue's
dead-letter queue is made at its first dead letter (at its declare when ``max_deliveries``
is set: the engine dead-letters then by itself).

Modules: ``declare`` (names, arguments, the declare), ``channel`` (Channel, QoS),
``loop`` (Celery's event loop fed from shmq), this one (the Transport).
"""

import os
import socket
import sys
import time
from queue import Empty

from kombu.transport import TRANSPORT_ALIASES, virtual

import shmq

from ..client.options import DEFAULT_PORT
from ..engine.broker import default_namespace
from ..errors import BrokerUnavailable, ShmqError
from .channel import Channel, QoS, QueueDeleted
from .declare import shmq_name
from .loop import EventLoop

__all__ = ["Channel", "QoS", "QueueDeleted", "Transport", "open_endpoint", "shmq_name"]

WAIT_SLICE = 0.05  # seconds a wait gives one queue when a worker consumes from several
WAIT_ONE = 0.25  # ... and its one queue: a worker told to stop (SIGTERM) hears it within this


CONNECT_OPTIONS = ("max_outage",)  # transport options that are shmq.connect's, over TCP (client/options.py)


def open_endpoint(endpoint, **options):
    """A broker for ``endpoint``: (tcp url, token, ssl) or (None, namespace, None);
    ``options``: ``shmq.connect``'s, for a tcp url (``CONNECT_OPTIONS``)."""
    url, arg, tls = endpoint
    return shmq.connect(url, token=arg, ssl=tls, **options) if url else shmq.connect(namespace=arg)


def _tls_of(scheme, value):
    """``shmq.connect``'s ``ssl=`` for kombu's ``ssl`` (its url's ``?ssl=``, Celery's
    ``broker_use_ssl``) and the url's scheme: None (plain TCP), True (``shmqs://``,
    ``ssl=true``: shmq.tls's default context), or an ``ssl.SSLContext`` (given, or made of
    a dict's ``ca_certs`` / ``certfile`` / ``keyfile``, with or without ``ssl_``)."""
    if isinstance(value, str):
        value = value.lower() not in ("", "0", "false", "no", "off")
    if isinstance(value, dict) and value:
        import ssl

        opts = {k.removeprefix("ssl_"): v for k, v in value.items()}
        ctx = ssl.create_default_context(cafile=opts.get("ca_certs"))
        if opts.get("certfile"):
            ctx.load_cert_chain(opts["certfile"], opts.get("keyfile"))
        return ctx
    if value is True or scheme == "shmqs":
        return True
    return value or None


def _stopping() -> bool:
    """Whether the Celery worker of this process was told to stop (its signal handlers
    only set a flag, which it reads between two waits for a message)."""
    state = sys.modules.get("celery.worker.state")
    return state is not None and any(flag is not None and flag is not False  # (an exit code: 0 is one)
                                     for flag in (state.should_stop, state.should_terminate))


# ------------------------------------------------------------------ Transport
class Transport(virtual.Transport):
    """kombu's transport "shmq": local attach (``shmq://``, ``shmq:///NAMESPACE``) or a
    ``shmq server`` over TCP (``shmq://HOST:PORT``, ``shmq://:TOKEN@HOST:PORT``). A bare
    "localhost" (kombu's default host, as the dotted path gets it) is a local attach."""

    Channel = Channel
    driver_type = driver_name = "shmq"
    default_port = DEFAULT_PORT
    connection_errors = virtual.Transport.connection_errors + (BrokerUnavailable, ConnectionError)
    channel_errors = virtual.Transport.channel_errors + (ShmqError,)
    implements = virtual.Transport.implements.extend(  # asynchronous: Celery's event loop (``loop``)
        asynchronous=True, exchange_type=frozenset(["direct", "topic", "fanout"]), heartbeats=False)

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self._broker = None
        self._pid = os.getpid()
        self._turn = 0
        self._loop = None  # the EventLoop, once registered with Celery's
        self.declared = {}  # kombu name of a queue declared here -> its declaration (``consumed_handle``)
        self.bound = {}  # kombu name of a queue -> {(exchange, routing key)} bound here

    @property
    def _tcp(self) -> bool:
        c = self.client
        return bool(c.hostname and (c.port or c.password or c.hostname != "localhost"))  # (kombu's default host: local)

    @property
    def endpoint(self):
        """(tcp url, token, ssl) or (None, namespace, None): where this connection's broker is."""
        c = self.client
        tls = _tls_of(c.transport_cls, c.ssl)
        if self._tcp:
            return f"tcp://{c.hostname}:{c.port or DEFAULT_PORT}", c.password or None, tls
        if tls is not None:
            raise ValueError("TLS (shmqs://, ssl=) is for a shmq server: give its HOST:PORT")
        return None, default_namespace() if c.virtual_host in (None, "", "/") else c.virtual_host, None

    @property
    def broker(self):
        """The shmq broker (local or TCP) of this connection, opened on first use; over TCP
        with the transport options that are ``shmq.connect``'s (``max_outage``)."""
        if self._broker is None:
            given = self.client.transport_options or {}
            options = {k: given[k] for k in CONNECT_OPTIONS if k in given} if self._tcp else {}
            self._broker = open_endpoint(self.endpoint, **options)
        return self._broker

    def establish_connection(self):
        self.broker.ping()  # a bad url or an unreachable server fails here, not at the first message
        return super().establish_connection()

    def register_with_event_loop(self, connection, loop):
        """Deliver on ``loop`` (Celery's Hub) from now on."""
        if self._loop is not None:
            self._loop.close()
        self._loop = EventLoop(self, loop, remote=self._tcp)

    def forget(self, channel, queue=None) -> None:
        """``channel`` stops consuming ``queue`` (None: everything)."""
        if self._loop is not None:
            self._loop.forget(channel, queue)

    def close_connection(self, connection):
        if self._loop is not None and os.getpid() == self._pid:  # (a forked child: its parent's loop)
            self._loop.close()
        self._loop = None
        super().close_connection(connection)
        if self._broker is not None and os.getpid() == self._pid:  # (a forked child: its parent's)
            self._broker.close()
        self._broker = None

    def driver_version(self):
        return shmq.__version__

    @property
    def default_connection_params(self):
        return {"hostname": None, "port": None}  # no host: local attach

    def drain_events(self, connection, timeout=None):
        """Deliver one message from the queues consumed: each is tried without waiting,
        then one is waited on (for ``WAIT_SLICE`` when there are several, in turn);
        socket.timeout after ``timeout`` seconds. (kombu's ``Connection.drain_events``: a
        program's own consumer; Celery's worker runs the event loop, whatever its pool.)
        Over TCP a lost connection is ridden out (``_ride_out``): a server's restart is
        a wait like any other, and its BrokerUnavailable (a connection error) comes only
        once the outage has lasted the client's ``max_outage``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._away():
                self._ride_out(deadline)
            try:
                message, queue = self._take(deadline)
            except BrokerUnavailable:
                if not self._away():
                    raise
                continue
            return self._deliver(message, queue)

    def _take(self, deadline):
        """(kombu's message, its queue): the next one ``drain_events`` delivers."""
        while True:
            ready = [(ch, q) for ch in self.channels if ch._consumers and ch.qos.can_consume()
                     for q in ch._active_queues]
            self._turn += 1
            n = len(ready)
            for i in range(n):
                ch, q = ready[(self._turn + i) % n]
                try:
                    return ch._get(q), q
                except Empty:
                    pass
            left = WAIT_ONE if deadline is None else deadline - time.monotonic()
            if left <= 0 or _stopping():
                raise socket.timeout()
            wait = min(left, WAIT_ONE if n == 1 else WAIT_SLICE)
            if n == 0:
                time.sleep(wait)  # nothing consumed, or prefetch full: an ack frees it
                continue
            ch, q = ready[self._turn % n]
            try:
                return ch._get(q, timeout=wait), q
            except Empty:
                pass

    def _away(self) -> bool:
        """Over TCP, whether the connection is known lost and a reconnect brings it back."""
        lost = getattr(self._broker, "_lost", None)  # (a local attach has no connection to lose)
        return lost is not None and lost()

    def _ride_out(self, deadline) -> None:
        """Reconnect while the connection is lost, as the client's long-lived consumers do
        (``RemoteBroker._outlast``: up to its ``max_outage``, logged once), until it is
        back; socket.timeout at ``deadline``, or once the worker is told to stop (looked
        at every WAIT_ONE)."""
        while True:
            now = time.monotonic()
            until = now + WAIT_ONE if deadline is None else min(deadline, now + WAIT_ONE)
            if self._broker._outlast(until):
                return
            if _stopping() or (deadline is not None and time.monotonic() >= deadline):
                raise socket.timeout()


TRANSPORT_ALIASES["shmq"] = "shmq.kombu:Transport"
TRANSPORT_ALIASES["shmqs"] = "shmq.kombu:Transport"  # the same over TLS
