"""The kombu channel on shmq (``Channel``) and its QoS, whose acks and rejects reach shmq:
a delivery the worker has not settled stays leased in shmq, its lease renewed in the
background until it is settled; a consumer is registered with its queue
(``add_consumer``), so an auto-delete queue goes with its last consumer, whichever
process or connection that was; exchanges and bindings are shmq's own."""

import atexit
import logging
import os
import weakref
from collections import Counter
from itertools import count
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.transport.virtual.base import queue_declare_ok_t
from kombu.utils.json import dumps, loads

from ..engine.broker import Broker
from ..engine.queues.exchange import topic_matches
from ..errors import BrokerUnavailable, DeliveryExpired, ExchangeNotFound, QueueNotFound, ShmqError
from .declare import declare, delete_queue, expiration_ttl, queue_settings, shmq_name

__all__ = ["Channel", "QoS", "QueueDeleted"]

log = logging.getLogger("shmq.kombu")

_tags = count(1)  # delivery tags: one count per process, next() is atomic under the GIL
_consuming = weakref.WeakSet()  # channels of this process with consumers registered (``_unregister_at_exit``)


class QueueDeleted(ConnectionError):
    """A queue this channel consumes was deleted and cannot be declared again here (it
    was consumed without being declared on this connection). A connection error to
    kombu and Celery: the consumer connects again and declares its queues."""


@atexit.register
def _unregister_at_exit():
    """A process that exits with consumers still registered (a client of rpc:// results,
    which never cancels its reply queue's) takes them along at once, so the auto-delete
    queues it alone consumed go now. (Housekeeping would give back a dead process's, a
    TCP server a closed connection's, later; a child of fork() has the parent's
    channels, and leaves them.)"""
    for ch in list(_consuming):
        if not ch._forked() and ch.connection is not None and not ch.connection._tcp:
            ch._unregister_all()


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
        conn = getattr(d, "_conn", None)  # over TCP, the connection its lease is bound to
        if conn is not None and conn.failed:  # lost (a server's restart): the server gave it back
            if how != "requeue":
                log.warning("could not %s message %s of queue %r: the connection that held it was lost, so it "
                            "comes again", how, d.id, d.queue)
            return
        try:
            if how == "ack":
                d.ack()
            elif how == "requeue":
                d.nack()
            else:
                self.channel._dead_letter(d)
        except (DeliveryExpired, QueueNotFound) as exc:  # delivered again already, or its queue deleted
            log.warning("could not %s message %s of queue %r: %s", how, d.id, d.queue, exc)
        except BrokerUnavailable as exc:  # lost as it went (whether it was settled is unknown): it may come again
            if how != "requeue":
                log.warning("could not %s message %s of queue %r: %s", how, d.id, d.queue, exc)

    def drop_queue(self, name: str) -> None:
        """Forget the held deliveries of shmq queue ``name``: it was deleted, with them."""
        for tag, (d, renewal) in list(self._held.items()):
            if d.queue == name:
                renewal.stop()
                del self._held[tag]

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
                try:
                    self._settle(tag, "requeue")
                except BrokerUnavailable as exc:  # the connection is lost: its server gave them back
                    log.info("messages held not requeued, the server has them: %s", exc)
                    for _d, renewal in self._held.values():
                        renewal.stop()
                    break
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
        self._registered = Counter()  # kombu name -> consumers this channel registered with the queue
        self._with_dlq = set()  # shmq names of queues known to have a dead-letter queue

    @property
    def broker(self):
        return self.connection.broker

    def _forked(self) -> bool:
        return os.getpid() != self._pid

    def prepare_queue_arguments(self, arguments, **kwargs):
        """kombu's ``Queue(max_priority=, message_ttl=, expires=, ...)`` as RabbitMQ's
        ``x-`` arguments, as the AMQP and Redis channels take them (``_new_queue`` reads them)."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

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

    def consumed_handle(self, queue, had: bool = False):
        """The handle of kombu queue ``queue``, which this channel consumes. A queue gone
        is declared again as this connection last declared it (settings, bindings), with
        this channel's consumers registered again; one never declared here raises
        QueueDeleted if it was there before (``had``), else QueueNotFound."""
        name = shmq_name(queue)
        try:
            return self._queue(name)[0]
        except QueueNotFound:
            self._handles.pop(name, None)
            declared = self.connection.declared.get(queue)
            if declared is None or self._forked():
                if had:
                    raise QueueDeleted(f"queue {queue!r} consumed here was deleted") from None
                raise
        log.warning("queue %r was deleted while consumed here: declared again", queue)
        self._new_queue(queue, **declared)
        for exchange, routing_key in list(self.connection.bound.get(queue, ())):
            self.queue_bind(queue, exchange, routing_key)
        h = self._queue(name)[0]
        for _ in range(self._registered[queue]):
            h.add_consumer()
        return h

    # ---------------------------------------------------------------- kombu's hooks
    def queue_declare(self, queue=None, passive=False, **kwargs):
        if not passive:
            return super().queue_declare(queue, **kwargs)
        if not queue or not self._has_queue(queue):  # a passive declare only looks (AMQP's): it changes nothing
            raise ChannelError(f"NOT_FOUND - no queue {queue!r} in namespace", (50, 10), "Channel.queue_declare", "404")
        return queue_declare_ok_t(queue, self._size(queue), 0)

    def _new_queue(self, queue, **kwargs):
        name = shmq_name(queue)
        transient = bool(kwargs.get("auto_delete") or kwargs.get("exclusive"))
        settings = {"visibility_timeout": self.visibility_timeout, "max_deliveries": self.max_deliveries,
                    "priorities": 1, "message_ttl": None, "expires": None,
                    "durability": "memory" if transient else self.durability, "max_bytes": self.max_bytes,
                    **queue_settings(kwargs.get("arguments"))}
        if transient:
            settings["auto_delete"] = True
        dlq = settings.get("dead_letter_queue")
        if dlq is None and self.max_deliveries is not None:  # the engine dead-letters by itself: made now
            dlq = self._dead_letter_queue(name, transient)
        if dlq is not None:
            declare(self.broker, dlq, durability=self.durability, max_bytes=self.max_bytes)
            settings["dead_letter_queue"] = dlq
            self._with_dlq.add(name)
        declare(self.broker, name, **settings)
        self.connection.declared[queue] = kwargs

    def _dead_letter_queue(self, name: str, transient: bool):
        """The dead-letter queue of shmq queue ``name`` by the transport option (None: none)."""
        pattern = self.dead_letter_queue
        if transient or not pattern:
            return None
        prefix, _, suffix = pattern.partition("{queue}")
        if name.startswith(prefix) and name.endswith(suffix):
            return None  # a dead-letter queue itself
        return shmq_name(pattern.format(queue=name))

    def _dead_letter(self, d) -> None:
        """Reject delivery ``d`` into its queue's dead-letter queue, which is made (and set
        as the queue's) now if the queue has none yet and the transport option names one."""
        name = d.queue
        if name not in self._with_dlq:
            try:
                settings = self._on_queue(name, lambda h, _levels: h.settings())
            except QueueNotFound:
                settings = None  # (the reject finds out)
            if settings is not None:
                dlq = settings["dead_letter_queue"]
                if dlq is None:
                    dlq = self._dead_letter_queue(name, settings["auto_delete"])
                    if dlq is not None:
                        declare(self.broker, dlq, durability=self.durability, max_bytes=self.max_bytes)
                        self.broker.update_queue(name, dead_letter_queue=dlq)
                        log.info("queue %r: dead-letter queue %r made at its first dead letter", name, dlq)
                if dlq is not None:
                    self._with_dlq.add(name)
        d.reject()

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
        take = (lambda h, _levels: h.get(timeout)) if timeout else (lambda h, _levels: h.get_nowait())
        had = name in self._handles
        try:
            d = self._on_queue(name, take)
        except QueueNotFound:
            if queue in self._active_queues:
                try:
                    self.consumed_handle(queue, had)  # declared again: empty
                except QueueNotFound:
                    pass
            raise Empty() from None
        return self.received(queue, d)

    def received(self, queue, d):
        """The kombu message of delivery ``d`` of ``queue``, held (or acked: no_ack) until
        settled; Empty (dead-lettered) if it is not one."""
        try:
            payload = loads(d.body)
            props = payload["properties"]
            props.setdefault("delivery_info", {})["redelivered"] = d.attempt > 1  # nacked, or its holder gone
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("message %s of queue %r is not a kombu message (%s): dead-lettered", d.id, d.queue, exc)
            self._dead_letter(d)
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
        props = message["properties"]
        try:
            priority = max(int(props.get("priority") or 0), 0)
        except (TypeError, ValueError):
            priority = 0
        ttl = expiration_ttl(props)
        for name in names:
            try:
                self._on_queue(name, lambda h, levels: h.put(body, priority=min(priority, levels - 1), ttl=ttl))
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
        self.connection.declared.pop(queue, None)
        self.connection.bound.pop(queue, None)
        self._registered.pop(queue, None)  # (they went with it)
        if self._qos is not None:
            self._qos.drop_queue(name)  # its messages went with it: nothing to settle at close
        h = self._handles.pop(name, None)
        if h is not None:
            h[0].close()
        delete_queue(self.broker, name)

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
        if not self._forked():
            try:
                self.consumed_handle(queue).add_consumer()
            except (QueueNotFound, QueueDeleted):  # never declared (a take finds nothing), or deleted again
                pass
            else:
                self._registered[queue] += 1
                _consuming.add(self)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag):
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue not in self._active_queues:
            self._forget(queue)
        if self._registered[queue] and not self._forked():
            self._unregister(queue)

    def _unregister(self, queue) -> None:
        """One consumer of ``queue`` this channel registered goes (an auto-delete queue
        left with none is deleted by the engine, with its bindings)."""
        self._registered[queue] -= 1
        name = shmq_name(queue)
        try:
            left = self._on_queue(name, lambda h, _levels: h.remove_consumer())
        except (QueueNotFound, ValueError):  # deleted already, or not registered (a connection since lost)
            left = 0
        except BrokerUnavailable as exc:  # the connection is lost: its server unregistered them all
            log.info("consumers of this channel not unregistered, the server did: %s", exc)
            self._registered.clear()
            return
        except ShmqError as exc:  # (kombu's cancel and close go on)
            log.warning("could not unregister the consumer of queue %r: %s", queue, exc)
            return
        if not left and queue in self.connection.declared and self.connection.declared[queue].get("auto_delete"):
            self.connection.declared.pop(queue, None)  # gone with its last consumer: not declared again
            self.connection.bound.pop(queue, None)

    def _unregister_all(self) -> None:
        for queue, n in list(self._registered.items()):
            for _ in range(n):
                self._unregister(queue)

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
        super().close()  # (cancels the consumers: ``basic_cancel``)
        _consuming.discard(self)
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
            self.connection.bound.setdefault(queue, set()).add((exchange, routing_key))

    def queue_unbind(self, queue, exchange=None, routing_key="", arguments=None, **kwargs):
        if exchange:
            self.connection.bound.get(queue, set()).discard((exchange, routing_key))
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
