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
  settled, so a long task, or an ETA task kept in memory, is not delivered twice.

On a local attach the worker runs Celery's event loop, as it does on Redis or RabbitMQ
(``asynloop``, the prefork pool's non-blocking AsynPool), fed by ``kombu_loop.EventLoop``.
Over TCP the worker runs kombu's synchronous loop (``Transport.drain_events``).

Queues are declared (made, or their live settings changed) each time a process declares
them, from the transport options (``broker_transport_options``): ``visibility_timeout``,
``max_deliveries``, ``dead_letter_queue`` (a name with ``{queue}``; None: none),
``durability``, ``max_bytes``. Auto-delete and exclusive queues (reply queues, pidbox
queues) are memory-only and deleted when their consumer is cancelled.
"""

import atexit
import logging
import os
import sys
import re
import socket
import time
from functools import lru_cache
from hashlib import sha1
from itertools import count
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.json import dumps, loads

import shmq
from .client.options import DEFAULT_PORT
from .engine.broker import Broker, default_namespace
from .engine.queues.exchange import topic_matches
from .errors import (BrokerUnavailable, DeliveryExpired, ExchangeNotFound, QueueNotFound,
                     ShmqError)
from .kombu_loop import EventLoop

__all__ = ["Transport", "Channel", "QoS", "shmq_name"]

log = logging.getLogger("shmq.kombu")

WAIT_SLICE = 0.05  # seconds a wait gives one queue when a worker consumes from several
WAIT_ONE = 0.25  # ... and its one queue: a worker told to stop (SIGTERM) hears it within this
_VALID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$")
_tags = count(1)  # delivery tags: one count per process, next() is atomic under the GIL
_auto_delete = {}  # kombu name of an auto-delete / exclusive queue this process declared -> its endpoint
_auto_pid = os.getpid()


def _open(endpoint):
    """A broker for ``endpoint``: (tcp url, token, ssl) or (None, namespace, None)."""
    url, arg, tls = endpoint
    return shmq.connect(url, token=arg, ssl=tls) if url else shmq.connect(namespace=arg)


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


def _delete_queue(broker, name: str) -> None:
    """Delete shmq queue ``name`` (if it is there) and its bindings."""
    try:
        broker.delete_queue(name)
    except QueueNotFound:
        pass
    for exchange in broker.list_exchanges():
        try:
            broker.unbind(exchange, name)
        except ExchangeNotFound:
            pass


@atexit.register
def _delete_auto_queues():
    """A process that exits takes the auto-delete queues it declared along (reply queues
    of rpc:// and of ``celery inspect``); a child of fork() leaves its parent's."""
    if os.getpid() != _auto_pid:
        return
    by_endpoint = {}
    for queue, endpoint in list(_auto_delete.items()):
        by_endpoint.setdefault(endpoint, []).append(shmq_name(queue))
    for endpoint, names in by_endpoint.items():
        try:
            with _open(endpoint) as broker:
                for name in names:
                    _delete_queue(broker, name)
        except Exception as exc:  # noqa: BLE001 - at exit: say it, go on
            log.warning("auto-delete queues %s left behind: %s", names, exc)


def _stopping() -> bool:
    """Whether the Celery worker of this process was told to stop (its signal handlers
    only set a flag, which it reads between two waits for a message)."""
    state = sys.modules.get("celery.worker.state")
    return state is not None and any(flag is not None and flag is not False  # (an exit code: 0 is one)
                                     for flag in (state.should_stop, state.should_terminate))


@lru_cache(maxsize=1024)
def shmq_name(name: str) -> str:
    """The shmq queue or exchange name of a kombu one: itself where shmq allows it, else
    its allowed characters (others as "_") and a hash of the original, so two kombu
    names never meet ("celery@host.celery.pidbox" -> "celery_host.celery.pidbox-5f0c...")."""
    if _VALID.match(name):
        return name
    clean = re.sub(r"[^A-Za-z0-9_.:-]", "_", name).lstrip(".:-")[:100] or "q"
    return f"{clean}-{sha1(name.encode()).hexdigest()[:12]}"


def _declare(broker, name: str, **settings) -> None:
    """Make queue ``name`` with ``settings``, or change the live ones of the queue there."""
    q = broker.declare_queue(name, **settings)
    if q is not None and hasattr(q, "close"):
        q.close()


# ------------------------------------------------------------------ QoS
class QoS(virtual.QoS):
    """kombu's QoS whose acks and rejects reach shmq: the held deliveries are shmq's
    leases; restoring them (a channel that closes) nacks them."""

    def __init__(self, channel, prefetch_count=0):
        super().__init__(channel, prefetch_count)
        self._pid = os.getpid()
        self._held = {}  # delivery tag -> (Delivery, its lease renewal)

    def hold(self, tag, d) -> None:
        self._held[tag] = (d, d.keepalive())  # renewed until settled (a third of the lease each time)

    def _settle(self, tag, how: str) -> None:
        held = self._held.pop(tag, None)
        if held is None:
            return
        d, renewal = held
        renewal.stop()
        try:
            if how == "ack":
                d.ack()
            elif how == "requeue":
                d.nack()
            else:
                d.reject()
        except (DeliveryExpired, QueueNotFound) as exc:  # delivered again already, or its queue deleted
            log.warning("could not %s message %s of queue %r: %s", how, d.id, d.queue, exc)

    def ack(self, delivery_tag):
        self._settle(delivery_tag, "ack")
        super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        self._settle(delivery_tag, "requeue" if requeue else "reject")
        self._quick_ack(delivery_tag)

    def restore_unacked(self):
        """Make every delivery still held ready again; none in a child of fork()
        (they are its parent's)."""
        self._flush()
        if os.getpid() == self._pid:
            for tag in list(self._held):
                self._settle(tag, "requeue")
        self._held.clear()
        self._delivered.clear()
        return []

    def restore_unacked_once(self, stderr=None):
        if os.getpid() != self._pid:
            self._on_collect.cancel()
            return
        super().restore_unacked_once(stderr)


# ------------------------------------------------------------------ Channel
class Channel(virtual.Channel):
    """A kombu channel on shmq's queues and exchanges."""

    QoS = QoS
    supports_fanout = True
    from_transport_options = virtual.Channel.from_transport_options + (
        "visibility_timeout", "max_deliveries", "dead_letter_queue", "durability", "max_bytes")
    visibility_timeout = 30.0
    max_deliveries = None
    dead_letter_queue = "{queue}.dlq"
    durability = "snapshot"
    max_bytes = 64 * 2**20

    def __init__(self, connection, **kwargs):
        super().__init__(connection, **kwargs)
        self._pid = os.getpid()
        self._handles = {}  # shmq name -> (queue handle, its priority levels)
        self._no_ack = set()  # kombu names of the queues consumed with no_ack
        self._auto = set()  # kombu names of auto-delete queues this channel consumes

    @property
    def broker(self):
        return self.connection.broker

    def _forked(self) -> bool:
        return os.getpid() != self._pid

    # ---------------------------------------------------------------- queue handles
    def _queue(self, name: str):
        got = self._handles.get(name)
        if got is None:
            h = self.broker.queue(name)
            got = self._handles[name] = (h, h.settings()["priorities"])
        return got

    def _on_queue(self, name: str, call):
        """``call(handle, priority levels)``; a handle of a queue deleted since
        is attached again once; QueueNotFound if there is no such queue."""
        for attempt in (0, 1):
            try:
                return call(*self._queue(name))
            except QueueNotFound:
                self._handles.pop(name, None)
                if attempt:
                    raise

    # ---------------------------------------------------------------- kombu's hooks
    def _new_queue(self, queue, **kwargs):
        name = shmq_name(queue)
        args = kwargs.get("arguments") or {}
        transient = bool(kwargs.get("auto_delete") or kwargs.get("exclusive"))
        levels = args.get("x-max-priority")
        ttl = args.get("x-message-ttl")
        settings = {"visibility_timeout": self.visibility_timeout, "max_deliveries": self.max_deliveries,
                    "priorities": 1 if levels is None else int(levels) + 1,
                    "message_ttl": None if ttl is None else ttl / 1000,
                    "durability": "memory" if transient else self.durability, "max_bytes": self.max_bytes}
        dlq = self._dead_letter_queue(name, transient)
        if dlq is not None:
            _declare(self.broker, dlq, durability=self.durability, max_bytes=self.max_bytes)
            settings["dead_letter_queue"] = dlq
        _declare(self.broker, name, **settings)
        if transient:
            _auto_delete[queue] = self.connection.endpoint

    def _dead_letter_queue(self, name: str, transient: bool):
        pattern = self.dead_letter_queue
        if transient or not pattern:
            return None
        prefix, _, suffix = pattern.partition("{queue}")
        if name.startswith(prefix) and name.endswith(suffix):
            return None  # a dead-letter queue itself
        return shmq_name(pattern.format(queue=name))

    def _handle(self, queue):
        """The shmq handle of kombu queue ``queue`` (QueueNotFound when there is none)."""
        return self._queue(shmq_name(queue))[0]

    def _has_queue(self, queue, **kwargs):
        try:
            self._queue(shmq_name(queue))
        except QueueNotFound:
            return False
        return True

    def _get(self, queue, timeout=None):
        name = shmq_name(queue)
        try:
            d = self._on_queue(name, lambda h, _levels: h.get(timeout) if timeout else h.get_nowait())
        except QueueNotFound:
            raise Empty() from None
        try:
            payload = loads(d.body)
            props = payload["properties"]
        except (ValueError, TypeError, KeyError) as exc:
            log.error("message %s of queue %r is not a kombu message (%s): dead-lettered", d.id, name, exc)
            d.reject()
            raise Empty() from None
        if queue in self._no_ack:
            d.ack()
        else:
            props["delivery_tag"] = tag = next(_tags)
            self.qos.hold(tag, d)
        return payload

    def _put(self, queue, message, **kwargs):
        self._put_to([shmq_name(queue)], message)

    def _put_to(self, names, message):
        body = dumps(message).encode()
        try:
            priority = max(int(message["properties"].get("priority") or 0), 0)
        except (TypeError, ValueError):
            priority = 0
        for name in names:
            try:
                self._on_queue(name, lambda h, levels: h.put(body, priority=min(priority, levels - 1)))
            except QueueNotFound:  # as AMQP's default exchange: nobody's queue, the message goes
                log.warning("no queue %r in namespace: message dropped", name)

    def _purge(self, queue):
        try:
            return self._on_queue(shmq_name(queue), lambda h, _levels: h.purge())
        except QueueNotFound:
            return 0

    def _size(self, queue):
        try:
            return self._on_queue(shmq_name(queue), lambda h, _levels: h.stats().ready)
        except QueueNotFound:
            return 0

    def _delete(self, queue, *args, **kwargs):
        name = shmq_name(queue)
        h = self._handles.pop(name, None)
        if h is not None:
            h[0].close()
        _delete_queue(self.broker, name)
        _auto_delete.pop(queue, None)

    def queue_delete(self, queue, if_unused=False, if_empty=False, **kwargs):
        if if_empty and self._size(queue):
            return
        self._delete(queue)

    def _next_delivery_tag(self):
        return None  # each delivery gets its tag when it is taken (``_get``)

    # ---------------------------------------------------------------- consumers
    def basic_consume(self, queue, no_ack, callback, consumer_tag, **kwargs):
        if no_ack:
            self._no_ack.add(queue)
        if queue in _auto_delete:
            self._auto.add(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag):
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue not in self._active_queues:
            self._forget(queue)
        if queue in self._auto and queue not in self._active_queues and not self._forked():
            self._auto.discard(queue)
            self._delete(queue)  # an auto-delete queue goes with its last consumer

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack, **kwargs)
        if message is not None and no_ack:
            self._settle_unheld(message)
        return message

    def _forget(self, queue=None):
        """The event loop stops waiting on ``queue`` (None: on every queue of this channel)."""
        if self.connection is not None:  # (None once closed)
            self.connection.forget(self, queue)

    def _settle_unheld(self, message):
        self.qos.ack(message.delivery_tag)

    def close(self):
        if not self.closed and not self._forked() and self._qos is not None:
            self._qos.restore_unacked_once()  # before the auto-delete queues go
        if not self._forked():
            self._forget()
        super().close()
        if not self._forked():
            for h, _levels in self._handles.values():
                h.close()
        self._handles.clear()

    # ---------------------------------------------------------------- exchanges: shmq's own
    def exchange_declare(self, exchange=None, type="direct", durable=False, auto_delete=False, arguments=None,
                         nowait=False, passive=False):
        if not exchange:
            return  # the default exchange: a routing key names a queue
        name = shmq_name(exchange)
        if passive:
            if name not in self.broker.list_exchanges():
                raise ChannelError(f"NOT_FOUND - no exchange {exchange!r} in namespace", (50, 10),
                                   "Channel.exchange_declare", "404")
            return
        self.broker.create_exchange(name, "fanout" if type == "fanout" else "topic", exist_ok=True)

    def exchange_delete(self, exchange, if_unused=False, nowait=False):
        try:
            self.broker.delete_exchange(shmq_name(exchange))
        except ExchangeNotFound:
            pass

    def queue_bind(self, queue, exchange=None, routing_key="", arguments=None, **kwargs):
        if exchange:
            self.broker.bind(shmq_name(exchange), shmq_name(queue), routing_key)

    def queue_unbind(self, queue, exchange=None, routing_key="", arguments=None, **kwargs):
        if exchange:
            try:
                self.broker.unbind(shmq_name(exchange), shmq_name(queue), routing_key)
            except ExchangeNotFound:
                pass

    def get_exchanges(self):
        return self.broker.list_exchanges()

    def get_table(self, exchange):
        """(routing key, pattern, queue) of each binding of ``exchange`` to a queue."""
        info = self.broker.exchange_info(shmq_name(exchange))
        return [(b["pattern"], b["pattern"], b["target"]) for b in info["bindings"] if b["kind"] == "queue"]

    def _routes(self, exchange: str, routing_key: str) -> list[str]:
        """The queues ``exchange`` routes ``routing_key`` to (none if it does not exist)."""
        try:
            if isinstance(self.broker, Broker):  # the table in shared memory, read again only when it changed
                return [t for kind, t in self.broker.exchange_table().routes(exchange, routing_key) if kind == "q"]
            info = self.broker.exchange_info(exchange)
        except ExchangeNotFound:
            return []
        out, fanout = [], info["type"] == "fanout"
        for b in info["bindings"]:
            if b["kind"] == "queue" and b["target"] not in out and (fanout or topic_matches(b["pattern"],
                                                                                           routing_key)):
                out.append(b["target"])
        return out

    def basic_publish(self, message, exchange, routing_key, **kwargs):
        self._inplace_augment_message(message, exchange, routing_key)
        names = self._routes(shmq_name(exchange), routing_key) if exchange else [shmq_name(routing_key)]
        self._put_to(names, message)


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
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout"]), heartbeats=False)

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self._broker = None
        self._pid = os.getpid()
        self._turn = 0
        self._loop = None  # the EventLoop, once registered with Celery's
        if not self._tcp:  # a local attach runs Celery's event loop (asynloop)
            self.implements = self.implements.extend(asynchronous=True)

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
        """The shmq broker (local or TCP) of this connection, opened on first use."""
        if self._broker is None:
            self._broker = _open(self.endpoint)
        return self._broker

    def establish_connection(self):
        self.broker.ping()  # a bad url or an unreachable server fails here, not at the first message
        return super().establish_connection()

    def register_with_event_loop(self, connection, loop):
        """Deliver on ``loop`` (Celery's Hub) from now on: a local attach only."""
        if self._tcp:
            return
        if self._loop is not None:
            self._loop.close()
        self._loop = EventLoop(self, loop)

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
        socket.timeout after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = [(ch, q) for ch in self.channels if ch._consumers and ch.qos.can_consume()
                     for q in ch._active_queues]
            self._turn += 1
            n = len(ready)
            for i in range(n):
                ch, q = ready[(self._turn + i) % n]
                try:
                    return self._deliver(ch._get(q), q)
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
                return self._deliver(ch._get(q, timeout=wait), q)
            except Empty:
                pass


TRANSPORT_ALIASES["shmq"] = "shmq.kombu:Transport"
TRANSPORT_ALIASES["shmqs"] = "shmq.kombu:Transport"  # the same over TLS
