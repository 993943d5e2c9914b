"""Dramatiq's broker on shmq: ``dramatiq.set_broker(ShmqBroker())``.

Strategy: one shmq queue per Dramatiq queue, with a dead-letter queue ``NAME.dlq``
beside it, declared by each process the first time it puts to or consumes from it
(created, or its live settings changed: queue settings are code). A delivery handed to
Dramatiq stays leased until it is settled, its lease renewed in the background
(``Delivery.keepalive``), so a long job is never delivered twice, while a worker process that
dies (even by SIGKILL) renews nothing and its messages are delivered again: locally
when the next housekeeping sees the holder dead, over TCP when its connection closes.

Delays (``send_with_options(delay=)``, the Retries middleware's backoff) use shmq's
delayed messages: the message goes into the queue itself with ``delay=`` and stays
invisible, in shared memory (persisted with the queue), until due. Dramatiq's other
brokers put it in a ``NAME.DQ`` delay queue whose consumer holds it in the worker's
memory until its ``eta`` and then enqueues a copy: a worker that dies meanwhile gives
it back only through its broker's lease, and each held message costs worker memory
and a lease for the whole delay. So this broker declares no delay queues and the
messages it stores carry no ``eta``; one that arrives with an ``eta`` all the same is
held by Dramatiq's worker as usual, under a renewed lease, and loses nothing either.

Dramatiq's nack (retries exhausted, ``max_age`` passed, an unknown actor) rejects the
delivery into ``NAME.dlq``: ``shmq stats`` shows it under its queue, ``shmq redrive
NAME.dlq`` sends it back. Priorities: an actor's ``priority`` orders the messages one
worker holds, as on every broker; ``ShmqBroker(priorities=N)`` also makes queues of N
levels served higher first, a message's level given by its ``broker_priority`` option
(an actor option too), as RabbitMQ's ``max_priority`` / ``broker_priority``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name
from dramatiq.errors import ActorNotFound, ConnectionClosed, QueueJoinTimeout, QueueNotFound
from dramatiq.message import Message

from ..errors import BrokerUnavailable, DeliveryExpired, QueueEmpty, ShmqError
from ..errors import QueueNotFound as NoSuchQueue

__all__ = ["ShmqBroker", "DEAD_LETTER_SUFFIX", "PRIORITY_OPTION", "open_broker"]

log = logging.getLogger(__name__)

DEAD_LETTER_SUFFIX = ".dlq"
PRIORITY_OPTION = "broker_priority"
_FIXED = ("max_bytes", "durability")  # settings the dead-letter queue takes from its queue's


def open_broker(url, namespace, token, options):
    """A shmq broker handle: local attach (``namespace``, else $SHMQ_NAMESPACE) or ``url``."""
    import shmq

    if url is None:
        return shmq.connect(namespace=namespace)
    return shmq.connect(url, token=token, **options)


@contextlib.contextmanager
def _translated():
    """A lost connection as Dramatiq's ConnectionClosed (its worker restarts the consumer)."""
    try:
        yield
    except BrokerUnavailable as e:
        raise ConnectionClosed(e) from e


class ShmqBroker(dramatiq.Broker):
    """Dramatiq's broker on shmq. No url: attach locally to ``namespace`` (else
    $SHMQ_NAMESPACE, else "shmq"); ``url="tcp://host:port"`` (``tcps://``: over TLS): a
    ``shmq server``, its token ``token`` or the url's or the client's usual ones,
    ``connect_options`` for ``shmq.connect`` (``ssl``, ``max_outage``: how long a
    consumer rides out a server's restart...). Nothing connects until the first put or
    consume.

    Every queue is declared with ``visibility_timeout`` (renewed while a job runs, so it
    is how soon a dead worker's messages come back), ``max_deliveries`` (None: a message
    whose workers keep dying is delivered for ever, as on Dramatiq's Redis broker), a
    dead-letter queue ``NAME.dlq`` unless ``dead_letters=False`` (then nacked messages
    are dropped), and ``queue_settings``: other ``create_queue`` keywords (``max_bytes``,
    ``durability``, ``priorities``, ``message_ttl``...). ``confirm_delivery=False``: over
    TCP, ``enqueue`` returns without waiting for the server's answer (pipelined puts; a
    refused one raises at a later call), as RabbitmqBroker's option of that name.
    """

    def __init__(self, url: str | None = None, *, namespace: str | None = None, token: str | None = None,
                 middleware=None, visibility_timeout: float = 30.0, max_deliveries: int | None = None,
                 dead_letters: bool = True, confirm_delivery: bool = True, connect_options: dict | None = None,
                 **queue_settings):
        if url is not None and namespace is not None:
            raise ValueError("namespace is for a local attach: a tcp:// url reaches its server's namespace")
        super().__init__(middleware=middleware)
        self.url, self.namespace, self.token = url, namespace, token
        self.connect_options = dict(connect_options or {})
        self.queue_settings = {"visibility_timeout": visibility_timeout, "max_deliveries": max_deliveries,
                               **queue_settings}
        self.dead_letters = dead_letters
        self.confirm_delivery = confirm_delivery
        self.queues: set[str] = set()
        self.actor_options.add(PRIORITY_OPTION)
        self._lock = threading.RLock()
        self._client = None
        self._declared: dict[str, float] = {}  # queue -> its visibility timeout, declared by this process
        self._producers: dict = {}

    def __repr__(self):
        where = self.url if self.url is not None else f"namespace={self.namespace or '$SHMQ_NAMESPACE'}"
        return f"<ShmqBroker {where}>"

    @property
    def client(self):
        """The shmq broker handle (fork-safe: a child's first call makes its own)."""
        with self._lock:
            if self._client is None:
                self._client = open_broker(self.url, self.namespace, self.token, self.connect_options)
            return self._client

    def _ensure(self, name: str) -> float:
        """Declare ``name`` (once per process) and its dead-letter queue; its visibility timeout."""
        vt = self._declared.get(name)
        if vt is not None:
            return vt
        with self._lock, _translated():
            client = self.client
            settings = dict(self.queue_settings)
            if self.dead_letters:
                dlq = name + DEAD_LETTER_SUFFIX
                client.declare_queue(dlq, **{k: settings[k] for k in _FIXED if k in settings})
                settings["dead_letter_queue"] = dlq
            client.declare_queue(name, **settings)
            q = self._producers[name] = client.queue(name)
            vt = self._declared[name] = q.settings()["visibility_timeout"]
        return vt

    def declare_queue(self, queue_name: str) -> None:
        """Declare a queue to Dramatiq (its shmq queue is declared at first use)."""
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def get_declared_queues(self) -> set[str]:
        return self.queues.copy()

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 30000) -> _Consumer:
        """A consumer of ``queue_name`` holding at most ``prefetch`` deliveries; its
        ``next()`` gives None after ``timeout`` ms without a message."""
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        return _Consumer(self, queue_name, prefetch, timeout)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Put ``message`` in its queue, invisible for ``delay`` ms (shmq's delayed messages)."""
        queue_name = q_name(message.queue_name)
        if queue_name != message.queue_name:
            message = message.copy(queue_name=queue_name)
        self.emit_before("enqueue", message, delay)
        self._ensure(queue_name)
        with _translated():
            self._producers[queue_name].put(message.encode(), delay=(delay or 0) / 1000,
                                            priority=self._priority(message), wait=self.confirm_delivery)
        self.emit_after("enqueue", message, delay)
        return message

    def _priority(self, message) -> int:
        level = message.options.get(PRIORITY_OPTION)
        if level is None:
            actor = self.actors.get(message.actor_name)
            level = actor.options.get(PRIORITY_OPTION, 0) if actor is not None else 0
        return level

    def flush(self, queue_name: str) -> None:
        """Drop the messages of the queue and of its dead-letter queue that are ready or
        delayed (not due yet: ``purge(delayed=True)``), as Dramatiq's Redis and RabbitMQ
        brokers empty their delay and dead-letter queues too. Messages in flight stay
        with the workers that hold them (acked, or delivered again if their worker dies)."""
        self._ensure(queue_name)
        with _translated():
            self._producers[queue_name].purge(delayed=True)
            if self.dead_letters:
                with self.client.queue(queue_name + DEAD_LETTER_SUFFIX) as dlq:
                    dlq.purge(delayed=True)

    def flush_all(self) -> None:
        for name in self.queues:
            self.flush(name)

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until the queue has no message ready, delayed or in flight (tests);
        QueueJoinTimeout after ``timeout`` ms. A queue neither declared to this broker nor
        in shmq raises Dramatiq's QueueNotFound, as its StubBroker does (nothing is
        created); one declared but never used is empty."""
        q, attached = self._producers.get(queue_name), None
        if q is None:
            with _translated():
                try:
                    q = attached = self.client.queue(queue_name)
                except NoSuchQueue:
                    if queue_name in self.queues:
                        return
                    raise QueueNotFound(queue_name) from None
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        try:
            while True:
                with _translated():
                    s = q.stats()
                if s.ready + s.delayed + s.in_flight == 0:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise QueueJoinTimeout(queue_name)
                time.sleep(interval / 1000)
        finally:
            if attached is not None:
                attached.close()

    def close(self) -> None:
        with self._lock:
            for q in self._producers.values():
                q.close()
            self._producers.clear()
            self._declared.clear()
            if self._client is not None:
                self._client.close()
                self._client = None


class _Proxy(MessageProxy):
    def __init__(self, message, delivery):
        super().__init__(message)
        self._delivery = delivery


class _Consumer(dramatiq.Consumer):
    """Deliveries of one queue: at most ``prefetch`` held (taken and not settled), each
    under a renewed lease from the moment it is taken. Over TCP a lost connection is
    ridden out (``_take``): a server's restart is a wait like any other, and Dramatiq's
    worker hears of it (ConnectionClosed: it restarts the consumer) only once the outage
    has lasted the client's ``max_outage`` (``connect_options``)."""

    def __init__(self, broker: ShmqBroker, queue_name: str, prefetch: int, timeout: int):
        self.queue_name = queue_name
        self.visibility_timeout = broker._ensure(queue_name)
        with _translated():
            self._client = broker.client
            self.q = self._client.queue(queue_name)
        self.prefetch = max(1, prefetch)
        self.timeout = timeout / 1000
        self._cond = threading.Condition()
        self._held: dict[int, tuple] = {}  # id(delivery) -> (delivery, its renewal)
        self._taken: deque = deque()  # held, not handed out yet

    def __next__(self):
        while True:
            with self._cond:
                if self._taken:
                    d = self._taken.popleft()
                else:
                    if not self._cond.wait_for(lambda: len(self._held) < self.prefetch, self.timeout):
                        return None
                    d = None
                    room = self.prefetch - len(self._held)
            if d is None:
                try:
                    ds = self._take(room)
                except QueueEmpty:
                    return None
                if ds is None:
                    return None  # (a wait of an outage ridden out)
                with self._cond:
                    for x in ds:
                        self._held[id(x)] = (x, x.keepalive(self.visibility_timeout / 3))
                    self._taken.extend(ds[1:])
                d = ds[0]
            try:
                return _Proxy(Message.decode(d.body), d)
            except Exception as e:  # noqa: BLE001 - not a Dramatiq message: it goes to the DLQ
                log.error("message %s of queue %r is no Dramatiq message (%s): dead-lettered",
                          d.id, self.queue_name, e)
                self._settle(d, lambda x: x.reject())

    def _take(self, room: int):
        """Up to ``room`` deliveries, waiting up to the timeout for the first (QueueEmpty).
        None while the connection is lost: the outage is ridden out here, a timeout at a
        time (``RemoteBroker._outlast``, logged once), until the client's ``max_outage``
        (then ConnectionClosed)."""
        lost = getattr(self._client, "_lost", None)  # (a local attach has no connection to lose)
        with _translated():
            if lost is None or not lost():
                try:
                    return self.q.get_many(room, timeout=self.timeout)
                except BrokerUnavailable:
                    if lost is None or not lost():
                        raise
            self._client._outlast(time.monotonic() + self.timeout)
        return None

    def _settle(self, d, how, requeue: bool = False) -> None:
        with self._cond:
            entry = self._held.pop(id(d), None)
            self._cond.notify_all()
        if entry is None:
            return  # settled already
        entry[1].stop()
        conn = getattr(d, "_conn", None)  # over TCP, the connection its lease is bound to
        if conn is not None and conn.failed:  # lost (a server's restart): the server gave it back
            if not requeue:
                log.warning("settling message %s of queue %r: the connection that held it was lost, so it comes "
                            "again", d.id, self.queue_name)
            return
        try:
            how(d)
        except (DeliveryExpired, BrokerUnavailable) as e:  # its lease is gone: it is delivered again
            log.warning("settling message %s of queue %r: %s", d.id, self.queue_name, e)

    def ack(self, message) -> None:
        self._settle(message._delivery, lambda d: d.ack())

    def nack(self, message) -> None:
        """To the dead-letter queue (dropped if there is none)."""
        self._settle(message._delivery, lambda d: d.reject())

    def requeue(self, messages) -> None:
        """Ready again at once (held by a worker that stops; each counts a delivery)."""
        for message in messages:
            self._settle(message._delivery, lambda d: d.nack(delay=0), requeue=True)

    def close(self) -> None:
        """Give back what is still held, then close the queue handle."""
        with self._cond:
            held = [d for d, _ in self._held.values()]
            self._taken.clear()
        for d in held:
            self._settle(d, lambda x: x.nack(delay=0), requeue=True)
        try:
            self.q.close()
        except ShmqError as e:
            log.debug("closing %r: %s", self.q, e)
