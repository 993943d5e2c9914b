"""The remote client's calls, written once and sans-IO: every call of the Broker / Queue /
Delivery API (the Stream / Consumer calls are in ``streams``, on the same machinery),
over one connection's state (``connection.ClientCore``, which owns no socket).
``remote`` (blocking) and ``aio`` (asyncio) only move the bytes.

Each API call is written once, as a generator that yields what it needs done: ``Send``
a request (the reply's payload is sent back in, an error reply is thrown in) or
``Pause``; it returns the call's result. So the put-retry policy on QUEUE_FULL, the
blocking get (CONSUME, READ and POLL in slices: ``waiting``), the delivery tag checks
and HELLO exist once.
``@driven`` makes such a generator a method that hands the call to the transport's
``_drive``, a loop over the call's steps (``Run``): the blocking one runs it to its
result, the asyncio one returns a coroutine that does, as redis-py's commands return
whatever ``execute_command`` returns.
"""

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass

from ..auth import client_token, refused
from ..errors import BrokerUnavailable, ProtocolError, QueueEmpty, QueueExists, QueueNotFound, Unauthorized
from ..errors import SettingsMismatch
from ..errors import DeliveryExpired, SerializationError, ShmqError
from ..model import arrays, keepalive
from ..model.checks import check_pattern, check_routing_key
from ..model.headers import CORRELATION_ID
from ..model.headers import reply_headers as rpc_reply_headers
from ..model.messages import raw_body
from ..model.processing import Processing
from ..serializers import dump, load
from ..serializers import resolve as resolve_serializer
from ..protocol import MsgType
from ..protocol.shapes import Leased
from ..protocol.payloads import (
    consume_fields,
    create_fields,
    message_fields,
    message_from_fields,
    messages_fields,
    ms,
    put_fields,
    stats_from_fields,
    stream_create_fields,
)
from ..model.settings import QUEUE, QUEUE_SETTINGS, STREAM
from ..model.steps import PUT_RETRY_S, Pause, Run, deadline, retry_while_full
from .connection import HELLO_MSG_ID, ClientCore
from .options import parse_url, split_url

__all__ = ["ClientCore", "Send", "Pause", "Post", "Receive", "Run", "driven", "retry_while_full", "waiting", "slice_ms",
           "BrokerCalls", "QueueCalls", "DeliveryCalls", "parse_url", "CONSUME_SLICE_MS", "PUT_RETRY_S",
           "HELLO_MSG_ID", "resumable", "Resuming", "plain_messages", "Outage", "riding_out", "came_back"]

_log = logging.getLogger("shmq.client")
CONSUME_SLICE_MS = 5000  # a blocking get waits in slices, so the connection never idles for long


def plain_messages(bodies, core):
    """PRODUCE_BATCH's ``messages`` of plain bytes ``bodies`` on the connection ``core``:
    the bodies themselves to a server that says ``compact``, else maps of a body."""
    return bodies if core.compact else [{"body": b} for b in bodies]


# ---------------------------------------------------------------- calls and policies
@dataclass(frozen=True, slots=True)
class Send:
    """A call's step: send this request; its reply's payload comes back, its error is thrown in."""

    msg_type: MsgType
    payload: dict


@dataclass(frozen=True, slots=True)
class Post:
    """A call's step: send this request and go on at once (``ClientCore.post``)."""

    msg_type: MsgType
    payload: dict


@dataclass(frozen=True, slots=True)
class Receive:
    """A call's step: wait until something is pushed for subscription ``sid`` of the
    connection ``core`` (or it ends: then its error is thrown in; so too once the
    transport holds another connection)."""

    sid: int
    core: ClientCore


def driven(call):
    """The method that runs the generator function ``call`` through its object's transport
    (``self._drive``): the blocking client returns its result, the asyncio one a coroutine."""

    @functools.wraps(call)
    def method(self, *args, **kwargs):
        return self._drive(call(self, *args, **kwargs))

    return method


def resumable(lost: ClientCore, broker) -> bool:
    """Whether what was bound to the ended connection ``lost`` (a subscription, a group
    member) comes back on the broker handle's next one: it reconnects, is not closed,
    and ``lost`` was not a parent's of this child of fork() (that stays the parent's)."""
    return lost.failed and lost.forked_from is None and broker.options.reconnect and not broker._closed


class Outage:
    """The loss of a broker handle's connection ``lost`` as its long-lived consumers ride
    it out (``riding_out``): since when, until when (``options.max_outage``; None: for
    ever), and one schedule of tries for all of them, whichever thread or task tries:
    ``due`` is when the next may be made, each failure pushing it a jittered pause away
    (``options.pauses``, capped at ``backoff[1]``), never past the end. The first
    failure is said in a WARNING (a reconnect at the first try, after a close of an idle
    connection or a restart already over, says nothing), the return then in an INFO
    (``came_back``)."""

    __slots__ = ("lost", "endpoint", "max_outage", "since", "end", "tries", "error", "due", "over", "_pauses")

    def __init__(self, lost: ClientCore, since: float, broker):
        self.lost = lost
        self.endpoint = broker.endpoint
        self.max_outage = broker.options.max_outage
        self.since = since
        self.end = broker.options.outage_end(since)
        self.tries = 0
        self.error = None  # the last try's
        self.due = 0.0  # time.monotonic() from which the next try may be made
        self.over = False  # given up
        self._pauses = broker.options.pauses(forever=True)
        next(self._pauses)  # (none before the first try)

    def failed(self, error: BrokerUnavailable) -> None:
        """A try failed with ``error``: the next is due after the next pause."""
        if self.error is None:
            why = str(self.lost.ended_error())
            said = f"lost the connection to {self.endpoint}: "
            why = why[len(said):] if why.startswith(said) else why
            most = self.max_outage
            _log.warning("lost the connection to %s (%s): reconnecting for %s, consumers wait", self.endpoint, why,
                         "as long as it takes (max_outage=None)" if most is None else f"up to {most:g}s (max_outage)")
        self.tries += 1
        self.error = error
        self.due = time.monotonic() + next(self._pauses)
        if self.end is not None:
            self.due = min(self.due, self.end)

    def lasted(self, now: float) -> bool:
        """Whether the consumers give up: a try was made, and failed, at the end."""
        return self.error is not None and self.end is not None and self.due <= now and now >= self.end

    def gave_up(self) -> BrokerUnavailable:
        """The error a consumer raises once the outage has lasted ``max_outage``."""
        self.over = True
        return BrokerUnavailable(f"{self.error} (gave up reconnecting after {self.tries} tries in "
                                 f"{time.monotonic() - self.since:.1f}s: max_outage)")


def riding_out(broker, lost: ClientCore) -> Outage:
    """The outage of ``broker``'s lost connection ``lost`` its long-lived consumers ride
    out (``broker._outage``): the one begun, else one from the loss (from now, after one
    they gave up on: iterating again tries as long again)."""
    o = broker._outage
    if o is None or o.lost is not lost or o.over:
        since = time.monotonic() if o is not None and o.lost is lost else (lost.ended_at or time.monotonic())
        o = broker._outage = Outage(lost, since, broker)
    return o


def came_back(broker, lost: ClientCore) -> None:
    """``broker`` connected again after losing ``lost``: an outage its consumers rode
    out is over, said in an INFO if its start was said."""
    o = broker._outage
    if o is not None and o.lost is lost:
        broker._outage = None
        if o.error is not None:
            _log.info("reconnected to %s after %.1fs (%d tries)", broker.endpoint, time.monotonic() - o.since,
                      o.tries + 1)


class Resuming:
    """What comes back after a reconnect (a ``consume`` iteration, a group member): the
    transports' iterations ask ``_resumes`` when a step raised BrokerUnavailable, and
    if it says so ride the outage out (``_outlast``: reconnecting until
    ``options.max_outage``) and step again, once per lost connection (a reconnect that
    gave up is raised)."""

    _tried = None  # the lost connection a step was already run again for

    def _broker_handle(self):
        raise NotImplementedError  # the broker handle it was made on

    def _is_closed(self) -> bool:
        return self._closed

    def _resumes(self) -> bool:
        broker = self._broker_handle()
        lost = broker._core if broker._core.failed else self._core  # (the broker's, if it was lost again since)
        if self._tried is lost or self._is_closed() or not resumable(lost, broker):
            return False
        self._tried = lost
        return True

    def _outlasts(self) -> bool:
        """Whether the broker handle's connection is known lost and this comes back on the
        next: a long-lived consumer's call rides the outage out (``_outlast``) then."""
        broker = self._broker_handle()
        return broker._core.failed and not self._is_closed() and resumable(broker._core, broker)


def waiting(msg_type, fields, key, timeout, clock):
    """Send a request that may wait at the server (CONSUME, READ, POLL) with ``wait_ms`` in
    slices of CONSUME_SLICE_MS, so the connection never idles for long, until its reply's
    list ``key`` has items or ``timeout`` ends (None: never); returns that list."""
    return (yield from waiting_until(msg_type, fields, lambda reply: reply[key], timeout, clock))[key]


def waiting_until(msg_type, fields, done, timeout, clock):
    """``waiting``, until ``done(reply)`` holds or ``timeout`` ends; returns the last reply."""
    until = deadline(timeout, clock)
    while True:
        reply = yield Send(msg_type, {**fields, "wait_ms": slice_ms(until, clock)})
        if done(reply) or (until is not None and clock() >= until):
            return reply


def slice_ms(until, clock) -> int:
    """The ``wait_ms`` of a waiting request's next slice, ``until`` a ``deadline``."""
    if until is None:
        return CONSUME_SLICE_MS
    return max(0, min(CONSUME_SLICE_MS, round((until - clock()) * 1000)))


def _changing_settings(request: Send):
    """Send a CREATE that changes a live queue's settings; its reply's settings. QUEUE_EXISTS
    can only mean a setting that cannot change: SettingsMismatch (as the local call
    raises). A reply without settings is a server older than CREATE's ``update`` and
    ``declare``, which took it for a CREATE with ``exist_ok`` and changed nothing."""
    try:
        reply = yield request
    except SettingsMismatch:
        raise
    except QueueExists as e:
        raise SettingsMismatch(str(e)) from None
    if "settings" not in reply:
        raise ShmqError("the server is older than CREATE's update and declare: it changed no setting (upgrade it)")
    return reply["settings"]


_SETTING_KEYS = frozenset(QUEUE_SETTINGS)


# ---------------------------------------------------------------- the API, once
class DeliveryCalls(object if Leased is None else Leased):
    """A message leased to this connection, as a CONSUME reply tells it; the tag names the
    lease on this connection only. Settle it like a local ``Delivery``. Its fields live in
    the C codec's ``Leased`` where it is built (which then makes plain ones straight from
    the reply's bytes, ``shapes.leased``), else in these slots."""

    __slots__ = () if Leased is not None else (
        "id", "body", "headers", "attempt", "priority", "enqueued_at", "group", "_q", "_tag", "_sub", "_settled", "_raw",
        "_conn")

    def __init__(self, q, m):
        self._q = q
        self._conn = q._broker._core  # the connection holding the lease: the tag means nothing on another
        self._sub = None  # a weak reference to the consume(prefetch) iteration it came from
        self._settled = False  # acked without waiting: settled as far as this side knows
        if type(m) is list:  # a row (``rows``: payloads.ROW_ITEMS)
            if len(m) == 5:
                self.id, self._tag, self.body, self.attempt, self.enqueued_at = m
                self.headers, self.priority, self.group = {}, 0, None
            else:
                self.id, self._tag, self.body, self.attempt, self.enqueued_at, headers, self.priority, self.group = m
                self.headers = headers or {}
            return
        self._tag = m["delivery"]
        self.id = m["id"]
        self.body = m["body"]
        self.headers = m.get("headers") or {}
        self.attempt = m["attempt"]
        self.priority = m.get("priority", 0)
        self.enqueued_at = m.get("enqueued_at")  # epoch seconds (None from a server older than the field)
        self.group = m.get("group")

    @property
    def queue(self) -> str:
        return self._q.name

    def array(self, copy: bool = False):
        """The numpy array ``put_array`` sent: over TCP a read-only view of the body this
        client received (a copy already: it outlives the delivery), or with ``copy`` a
        writable array of its own. TypeError for a message sent otherwise."""
        return arrays.from_body(arrays.meta_of(self.headers), raw_body(self), copy)

    def __repr__(self):
        return f"<{type(self).__name__} {self.queue}#{self.id} attempt={self.attempt} {len(raw_body(self))}B>"

    def _drive(self, call):
        return self._q._drive(call)

    def _expired(self):
        """The local ``Delivery``'s error for a lease that is no longer this delivery's."""
        return DeliveryExpired(f"delivery {self.queue}#{self.id} attempt {self.attempt} is no longer leased")

    def _settle(self, msg_type, **fields):
        if self._settled:
            raise self._expired()
        self._check_connection()
        return Send(msg_type, {"queue": self._q.name, "deliveries": [self._tag], **fields})

    def _check_connection(self):
        """DeliveryExpired if the connection that holds the lease has ended (the server
        gave the message back when it did) and the broker handle reconnected, or is the
        parent's of this child of fork() (it stays leased to the parent)."""
        if self._conn is not self._q._broker._core:
            if self._conn.forked_from is not None:
                raise DeliveryExpired(f"delivery {self.queue}#{self.id} was leased on the connection of process "
                                      f"{self._conn.forked_from}, of which this process is a fork: only that "
                                      "process can settle it")
            raise DeliveryExpired(f"delivery {self.queue}#{self.id} was leased on a connection to "
                                  f"{self._conn.endpoint} that has ended: the server gave it back")

    def _settled_by(self, request):
        """Send a settling request; once it is answered the delivery is settled, and a
        lease the server no longer knows is ``_expired``, in the local words."""
        try:
            yield request
        except DeliveryExpired:
            self._settled = True
            raise self._expired() from None
        if request.msg_type != MsgType.EXTEND:
            self._settled = True

    def process(self, requeue: bool = True, renew: bool = False) -> Processing:
        """``with d.process(): ...`` (``async with`` on the asyncio client) acks when the
        block succeeds; when it raises, nacks (``requeue``) or rejects, and the exception
        goes on. ``renew``: the lease is renewed while the block runs (``keepalive``)."""
        return Processing(self, requeue, renew)

    def keepalive(self, every: float | None = None) -> "keepalive.Keepalive":
        """Renew the lease in the background (EXTEND, from this process's renewer thread;
        the asyncio client's: a task) every ``every`` seconds (None: a third of the
        queue's visibility timeout, asked once per queue handle), each time to ``3 *
        every`` from now, until ``stop()`` or the delivery is settled."""
        return keepalive.in_thread(self, every, self._q._visibility_timeout)

    @driven
    def ack(self, wait: bool = True):
        """Done with it: the message is gone. DeliveryExpired if the lease is no longer yours.
        With ``wait=False`` the ack is sent without waiting for the server (pipelined;
        from a ``consume`` iteration, with the acks next to it in one request, at the
        latest when the iteration next waits): an error is logged and raised by the next
        call on the connection, and a lost ack means a redelivery: once the connection
        holding the lease has ended (the server gave the message back: it comes again),
        it sends nothing and raises nothing."""
        if wait:
            yield from self._settled_by(self._settle(MsgType.ACK))
            return
        if self._conn.failed and self._conn.forked_from is None and not self._settled:
            self._settled = True
            return
        request = self._settle(MsgType.ACK)
        self._settled = True
        sub = self._sub and self._sub()  # a weak reference: a delivery kept does not keep its iteration open
        if sub is not None:
            request = sub._ack_later(self._tag)
            if request is None:
                return
        try:
            yield Post(request.msg_type, request.payload)
        except BrokerUnavailable:
            if not self._conn.failed:
                raise  # (a reconnect that gave up)
            # the connection ended as it went: the server gave the message back, it comes again

    @driven
    def nack(self, requeue: bool = True, delay: float | None = None):
        """Give it back: ready again after ``delay`` seconds (None: as the queue's retry
        policy says), or dead-lettered if not ``requeue``."""
        fields = {"requeue": requeue} if delay is None else {"requeue": requeue, "delay_ms": ms(delay, "delay")}
        yield from self._settled_by(self._settle(MsgType.NACK, **fields))

    @driven
    def reject(self):
        """Refuse it for good: to the queue's dead-letter queue, or dropped when it has none."""
        yield from self._settled_by(self._settle(MsgType.REJECT))

    @driven
    def extend(self, seconds: float):
        """Keep the lease ``seconds`` from now."""
        yield from self._settled_by(self._settle(MsgType.EXTEND, visibility_ms=ms(seconds, "seconds")))

    @driven
    def reply(self, body, headers=None):
        """Answer a message that asked for a reply (``request``); False when the requester
        has gone (timed out or died: the reply is dropped), else True. ValueError if it
        asked for no reply."""
        reply_to, corr = rpc_reply_headers(self)
        try:
            yield Send(MsgType.PRODUCE, {"queue": reply_to,
                                         **message_fields(body, {**(headers or {}), CORRELATION_ID: corr})})
        except QueueNotFound:
            return False
        return True


class QueueCalls:
    """A queue reached over a connection: the methods and errors of the local ``Queue``."""

    _delivery_class = DeliveryCalls  # the transport's
    _subscription_class = None  # the transport's (a ``subscription.SubscriptionCalls``)

    def __init__(self, broker, name: str, serializer=None):
        self._broker = broker
        self.name = name
        self.serializer = resolve_serializer(serializer)
        self.closed = False

    def _drive(self, call):
        if self.closed:
            call.close()
            raise ShmqError(f"queue handle {self.name!r} is closed")  # the local handle's words
        return self._broker._drive(call)

    _lease_s = None  # the queue's visibility timeout, once a keepalive asked for it

    def _visibility_timeout(self) -> float:
        """The queue's visibility timeout, asked once per handle (a keepalive's default)."""
        if self._lease_s is None:
            self._lease_s = self.settings()["visibility_timeout"]
        return self._lease_s

    def close(self) -> None:
        """Close this handle: its calls raise from now on (the connection is the broker's)."""
        self.closed = True

    def _body(self, obj):
        return obj if self.serializer is None else dump(self.serializer, obj)

    def _dumps_all(self, objs):
        ser = self.serializer
        return objs if ser is None else [dump(ser, o) for o in objs]

    def _deliveries(self, messages, leased=True):
        """Deliveries of a CONSUME reply (``leased``: not auto-acked); with a serializer
        their bodies loaded, else (SerializationError) all given back, the error raised."""
        ds = [self._delivery_class(self, m) for m in messages]
        if not leased:
            for d in ds:
                d._settled = True  # settled as taken: an ack says what the local one says
        ser = self.serializer
        if ser is not None:
            try:
                for d in ds:
                    raw = d.body
                    d.body = load(ser, self.name, d.id, raw)
                    d._raw = raw
            except SerializationError:
                yield Send(MsgType.NACK, {"queue": self.name, "deliveries": [d._tag for d in ds]})
                raise
        return ds

    @driven
    def put(self, body, headers=None, timeout=None, *, priority=0, delay=0.0, ttl=None, group=None, dedup_id=None,
            wait=True):
        """Append one message and return its id; while the queue is full, retry for up to
        ``timeout`` seconds (None: for ever), then QueueFull. The options are the local
        ``Queue.put``'s: ``priority`` level, ready after ``delay`` seconds, dropped ``ttl``
        seconds after the put, one at a time per ``group``, dropped when ``dedup_id`` was
        put within the queue's dedup window (the id of the first is returned).
        ``wait=False``: send it and return None at once (pipelined, RabbitMQ's publisher
        confirms): its confirmation comes later, ``flush()`` waits for all and raises the
        first error (a full queue is one: no retry)."""
        message = message_fields(self._body(body), headers)
        options = put_fields(priority, delay, ttl, group, dedup_id)
        if not wait:
            yield Post(MsgType.PRODUCE, {"queue": self.name, **message, **options})
            return None
        request = Send(MsgType.PRODUCE, {"queue": self.name, **message, **options})
        return (yield from retry_while_full(request, timeout, self._broker._clock))["id"]

    def put_array(self, a, headers=None, timeout=None, **options):
        """Put numpy array ``a`` (``Queue.put_array``'s message: its bytes, and its dtype,
        shape and strides in a header; over TCP its bytes are sent as a copy). Returns what
        ``put`` returns (the asyncio client's: an awaitable)."""
        body, headers = arrays.to_message(a, headers)
        return self.put(body, headers, timeout, **options)

    @driven
    def put_nowait(self, body, headers=None, *, priority=0, delay=0.0, ttl=None, group=None, dedup_id=None):
        """Append one message and return its id; QueueFull at once if there is no room."""
        options = put_fields(priority, delay, ttl, group, dedup_id)
        message = message_fields(self._body(body), headers)
        return (yield Send(MsgType.PRODUCE, {"queue": self.name, **message, **options}))["id"]

    @driven
    def put_many(self, bodies, timeout=None, *, priority=0, delay=0.0, ttl=None, headers=None, wait=True):
        """Append bodies, all or none, and return their ids; ``headers``: one map for all,
        or a list of maps (or None) item by item; retries while the queue is full like
        ``put``; the options apply to every one. ``wait=False``: as ``put``'s (returns None)."""
        messages = messages_fields(self._dumps_all(bodies), headers)
        options = put_fields(priority, delay, ttl)
        if not messages:
            return None if not wait else []
        if not wait:
            yield Post(MsgType.PRODUCE_BATCH, {"queue": self.name, "messages": messages, **options})
            return None
        request = Send(MsgType.PRODUCE_BATCH, {"queue": self.name, "messages": messages, **options})
        return (yield from retry_while_full(request, timeout, self._broker._clock))["ids"]

    @driven
    def flush(self):
        """Wait until every request this connection sent without waiting (``put`` and
        ``put_many`` with ``wait=False``, pipelined acks) is answered; raise the first
        error among them."""
        first = None
        while True:
            try:
                yield Send(MsgType.PING, {})  # answered after everything sent before it
            except (BrokerUnavailable, ProtocolError):
                raise
            except Exception as e:  # an earlier one's error, raised before the PING went out
                first = first or e
                continue
            core = self._broker._core
            if core._deferred is None:
                break
            first = first or core._deferred
            core._deferred = None
        if first is not None:
            raise first

    @driven
    def peek(self, max_messages=10):
        """Up to ``max_messages`` ready messages (``shmq.Message``), in the order ``get``
        would take them, without leasing them or counting an attempt."""
        fields = {"queue": self.name, **consume_fields(max_messages, None)}
        out = [message_from_fields(self.name, m) for m in (yield Send(MsgType.PEEK, fields))["messages"]]
        ser = self.serializer
        if ser is not None:
            out = [dataclasses.replace(m, body=load(ser, self.name, m.id, m.body)) for m in out]
        return out

    @driven
    def get(self, timeout=None, visibility_timeout=None, ack=True, copy=True):
        """Lease the next message; wait up to ``timeout`` seconds (None: for ever), then
        QueueEmpty. ``ack=False``: settled as the server takes it (RabbitMQ's autoAck: at
        most once, nothing to settle). ``copy``: the local handle's (a body read off the
        wire is always a copy)."""
        return (yield from self._consume(1, timeout, visibility_timeout, None, ack))[0]

    @driven
    def get_nowait(self, visibility_timeout=None, ack=True, copy=True):
        """Lease the next message; QueueEmpty at once if none is ready."""
        return (yield from self._consume(1, 0, visibility_timeout, None, ack))[0]

    @driven
    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None, max_bytes=None, ack=True, copy=True):
        """Lease up to ``max_messages`` ready messages, waiting like ``get`` for the first;
        with ``max_bytes``, no more than fit in it (the first is always taken)."""
        return (yield from self._consume(max_messages, timeout, visibility_timeout, max_bytes, ack))

    def consume(self, prefetch: int = 100, visibility_timeout=None):
        """An iterator of deliveries the server pushes while fewer than ``prefetch`` of them
        are un-acked (SUBSCRIBE; RabbitMQ's basic.qos): no round trip per message. Closing
        it (``close``, leaving its ``with``, or dropping it) cancels the subscription, and
        what was pushed but not yet handed out is given back, ready again at once."""
        return self._subscription_class(self, prefetch, visibility_timeout)

    def _empty(self) -> QueueEmpty:
        return QueueEmpty(f"queue {self.name!r} is empty")

    def _consume(self, max_messages, timeout, visibility_timeout, max_bytes=None, ack=True):
        """CONSUME until messages come or ``timeout`` ends (see ``waiting``)."""
        # with a serializer, ack=False takes leased, loads, then acks (as the local handle
        # does): a body that does not load is given back, never lost
        auto = not ack and self.serializer is None
        fields = {"queue": self.name, **consume_fields(max_messages, visibility_timeout, max_bytes, not auto)}
        messages = yield from waiting(MsgType.CONSUME, fields, "messages", timeout, self._broker._clock)
        if not messages:
            raise self._empty()
        ds = yield from self._deliveries(messages, not auto)
        if not ack and not auto:
            yield Send(MsgType.ACK, {"queue": self.name, "deliveries": [d._tag for d in ds]})
            for d in ds:
                d._settled = True
        return ds

    @driven
    def ack_many(self, deliveries, wait: bool = True):
        """Ack deliveries of this queue on this connection in one request; how many were acked.
        TypeError, before anything is sent, for anything else. ``wait=False``: as
        ``Delivery.ack``'s (sent with the next request, returns None)."""
        deliveries = list(deliveries)
        tags = [self._tag_of(d) for d in deliveries]
        if not tags:
            return 0
        keepalive.settling(deliveries)
        if not wait:
            yield Post(MsgType.ACK, {"queue": self.name, "deliveries": tags})
            for d in deliveries:
                d._settled = True
            return None
        return (yield Send(MsgType.ACK, {"queue": self.name, "deliveries": tags}))["acked"]

    @driven
    def nack_many(self, deliveries, delay: float | None = None):
        """Nack deliveries of this queue on this connection in one request (``nack``'s
        ``delay``); how many were nacked."""
        deliveries = list(deliveries)
        tags = [self._tag_of(d) for d in deliveries]
        keepalive.settling(deliveries)
        if tags:
            fields = {} if delay is None else {"delay_ms": ms(delay, "delay")}
            yield Send(MsgType.NACK, {"queue": self.name, "deliveries": tags, "requeue": True, **fields})
        return len(tags)

    @driven
    def reject_many(self, deliveries):
        """Reject deliveries of this queue on this connection in one request: to the
        dead-letter queue, or dropped when there is none."""
        deliveries = list(deliveries)
        tags = [self._tag_of(d) for d in deliveries]
        keepalive.settling(deliveries)
        if tags:
            yield Send(MsgType.REJECT, {"queue": self.name, "deliveries": tags})

    def _tag_of(self, d) -> int:
        if not isinstance(d, DeliveryCalls) or d._q._broker is not self._broker or d._q.name != self.name:
            raise TypeError(f"expected deliveries of queue {self.name!r}, got {d!r}")
        d._check_connection()
        return d._tag

    @driven
    def stats(self):
        """The queue's ``QueueStats``."""
        return stats_from_fields((yield Send(MsgType.STATS, {"queue": self.name})))

    @driven
    def settings(self):
        """The queue's settings, as ``create_queue`` takes them (a server older than
        this field gives {})."""
        return (yield Send(MsgType.STATS, {"queue": self.name})).get("settings", {})

    @driven
    def purge(self, delayed: bool = False):
        """Drop every ready message, and with ``delayed`` every delayed one too (leased ones
        stay); how many were dropped. (A server older than ``delayed`` keeps the delayed ones.)"""
        return (yield Send(MsgType.PURGE, {"queue": self.name, **({"delayed": True} if delayed else {})}))["purged"]

    @driven
    def add_consumer(self):
        """Register one more consumer of the queue, this connection's (given back when the
        connection closes, the client killed too); returns the queue's count."""
        return (yield Send(MsgType.CONSUMER_ADD, {"queue": self.name}))["consumers"]

    @driven
    def remove_consumer(self):
        """Unregister one of this connection's consumers; returns the count left. An
        ``auto_delete`` queue left with none is deleted. ValueError if it has none."""
        return (yield Send(MsgType.CONSUMER_REMOVE, {"queue": self.name}))["consumers"]


class BrokerCalls:
    """A broker reached over a connection: the methods of the local ``Broker``."""

    _queue_class = QueueCalls  # the transport's
    _stream_class = None  # the transport's (a ``streams.StreamCalls``)
    _store_class = None  # the transport's (a ``stores.StoreCalls``)
    _transactional_class = None  # the transport's (a ``transactions.TransactionalCalls``)
    _clock = staticmethod(time.monotonic)  # the deadlines' clock
    _outage = None  # while its long-lived consumers ride an outage out, that one (``Outage``)

    def __init__(self, url: str, token: str | None = None):
        where = split_url(url)
        self.url = where.url  # without a token
        self.token = where.token if token is None else token  # the argument wins over the url's
        self.host, self.port = where.host, where.port
        self.endpoint = f"{self.host}:{self.port}"
        self._core = ClientCore(self.endpoint)

    def _drive(self, call):
        raise NotImplementedError  # the transport's

    def _lost(self) -> bool:
        """Whether the connection is known lost and a reconnect would bring it back: a
        long-lived consumer (kombu's, Dramatiq's) rides the outage out then, with the
        transport's ``_outlast``, instead of a call that tries ``retries`` times."""
        return resumable(self._core, self)

    @driven
    def _hello(self, client: str, local_addr, peer_addr):
        """Say HELLO with the token given, else $SHMQ_TOKEN, else the one shmq.auth finds for
        this server; returns the server's info. Unauthorized says which token was refused."""
        token, source = client_token(self.token, local_addr, peer_addr)
        fields = {"client": client}
        heartbeat = getattr(self, "options", None) and self.options.heartbeat  # (a transport's options)
        if heartbeat:  # HEARTBEAT pushes (a server older than the field sends none)
            fields["heartbeat_ms"] = max(1, round(heartbeat * 1000))
        if token is not None:
            fields["token"] = token
        try:
            return (yield Send(MsgType.HELLO, fields))
        except Unauthorized as e:
            raise refused(self.endpoint, source, e) from None

    @driven
    def _backup(self, dest: str):
        """BACKUP: the server copies what it holds durably into the new directory ``dest``
        of its host (``shmq backup``); its summary. An admin request of the server, not a
        Broker method: a local namespace has no server to ask."""
        return (yield Send(MsgType.BACKUP, {"dest": dest}))

    @driven
    def queue(self, name: str, serializer=None):
        """A handle on the queue ``name``; QueueNotFound if there is none. ``serializer``:
        as the local ``Broker.queue`` takes it."""
        resolve_serializer(serializer)
        yield Send(MsgType.STATS, {"queue": name})
        return self._queue_class(self, name, serializer)

    @driven
    def create_queue(self, name, max_bytes=QUEUE.max_bytes, max_message_bytes=QUEUE.max_message_bytes,
                     visibility_timeout=QUEUE.visibility_timeout, max_deliveries=QUEUE.max_deliveries,
                     dead_letter_queue=QUEUE.dead_letter_queue, exist_ok=False,
                     durability=QUEUE.rows["durability"].remote_default, priorities=QUEUE.priorities,
                     message_ttl=QUEUE.message_ttl, dedup_window=QUEUE.dedup_window, retry_delay=QUEUE.retry_delay,
                     retry_backoff=QUEUE.retry_backoff, retry_delay_max=QUEUE.retry_delay_max,
                     priority_aging=QUEUE.priority_aging, serializer=None, lanes=QUEUE.lanes,
                     auto_delete=QUEUE.auto_delete, expires=QUEUE.expires):
        """Create the queue ``name`` and return a handle on it; QueueExists if it exists
        (unless ``exist_ok``). The work-queue options are the local ``create_queue``'s."""
        resolve_serializer(serializer)
        yield Send(MsgType.CREATE, create_fields(
            name, max_bytes, max_message_bytes, visibility_timeout, max_deliveries, dead_letter_queue, exist_ok,
            durability, priorities=priorities, message_ttl=message_ttl, dedup_window=dedup_window,
            retry_delay=retry_delay, retry_backoff=retry_backoff, retry_delay_max=retry_delay_max,
            priority_aging=priority_aging, **({"lanes": lanes} if lanes != QUEUE.lanes else {}),
            **({"auto_delete": auto_delete} if auto_delete is not QUEUE.auto_delete else {}),
            **({"expires": expires} if expires is not QUEUE.expires else {})))
        return self._queue_class(self, name, serializer)

    @driven
    def update_queue(self, name: str, **settings):
        """Change settings of the live queue ``name``, as the local ``update_queue`` does
        (SettingsMismatch naming one that cannot change); returns the queue's settings."""
        return (yield from _changing_settings(self._settings_request(name, settings, "update")))

    @driven
    def declare_queue(self, name: str, serializer=None, **settings):
        """Create the queue ``name`` as ``settings`` say, or change those of them a live
        queue can change, as the local ``declare_queue`` does; returns a handle."""
        resolve_serializer(serializer)
        yield from _changing_settings(self._settings_request(name, settings, "declare"))
        return self._queue_class(self, name, serializer)

    def _settings_request(self, name, settings, how) -> Send:
        """CREATE with ``how`` ("update" or "declare") and only the settings given."""
        fields, clear = {"queue": name, how: True, "exist_ok": True}, []  # (exist_ok: for a server older than them)
        for key, value in settings.items():
            if key not in _SETTING_KEYS:
                raise TypeError(f"{how}_queue() got an unexpected keyword argument {key!r}")
            if value is None:
                clear.append(key)
            elif key == "visibility_timeout":
                fields["visibility_timeout_ms"] = ms(value, key)
            else:
                fields[key] = value
        if clear:
            fields["clear"] = clear
        return Send(MsgType.CREATE, fields)

    @driven
    def redrive(self, dead_letter_queue: str, to: str | None = None, max_messages: int | None = None):
        """Move messages of ``dead_letter_queue`` back to ``to`` (None: each to the queue
        it was dead-lettered from), up to ``max_messages`` (None: all); returns how many
        were moved."""
        fields = {"queue": dead_letter_queue}
        if to is not None:
            fields["to"] = to
        if max_messages is not None:
            fields["max"] = consume_fields(max_messages, None)["max"]
        return (yield Send(MsgType.REDRIVE, fields))["redriven"]

    @driven
    def delete_queue(self, name: str):
        """Delete the queue ``name`` and its messages; QueueNotFound if there is none."""
        yield Send(MsgType.DELETE, {"queue": name})

    @driven
    def list_queues(self):
        """The names of the queues, sorted."""
        return (yield Send(MsgType.LIST, {}))["queues"]

    @driven
    def ping(self):
        """One round trip to the server."""
        yield Send(MsgType.PING, {})

    # ------------------------------------------------------------ transactions
    @driven
    def transactional(self, transactional_id: str, timeout: float = 60.0):
        """A transactional producer of ``transactional_id`` (``transactions.TransactionalCalls``:
        a transaction over appends to several streams and native groups' offsets, seen by
        every reader only once committed), the id taken from whoever held it."""
        t = self._transactional_class(self, transactional_id, timeout)
        yield from t._init_steps()
        return t

    # ------------------------------------------------------------ streams
    @driven
    def stream(self, name: str):
        """A handle on the stream ``name``; StreamNotFound if there is none."""
        return self._stream_class(self, (yield Send(MsgType.STREAM_INFO, {"stream": name})))

    @driven
    def create_stream(self, name: str, partitions: int = STREAM.partitions, max_bytes: int = STREAM.max_bytes,
                      max_message_bytes: int = STREAM.max_message_bytes, retention: str = STREAM.retention,
                      retention_bytes: int | None = STREAM.retention_bytes,
                      retention_seconds: float | None = STREAM.retention_seconds,
                      group_idle_timeout: float = STREAM.group_idle_timeout, durability: str = STREAM.durability,
                      exist_ok: bool = False, *, timestamp_type: str = STREAM.timestamp_type,
                      compression: str = STREAM.compression, segment_bytes: int | None = STREAM.segment_bytes,
                      compact: bool = STREAM.compact, delete_retention_seconds: float = STREAM.delete_retention_seconds,
                      min_cleanable_dirty_ratio: float = STREAM.min_cleanable_dirty_ratio,
                      max_compaction_lag_seconds: float | None = STREAM.max_compaction_lag_seconds):
        """Create a stream of ``partitions`` append-only logs and return a handle on it;
        StreamExists if it exists (unless ``exist_ok``: then a handle on that one). The
        settings are the local ``Broker.create_stream``'s."""
        kafka = {k: v for k, v in (("timestamp_type", timestamp_type), ("compression", compression),
                                   ("compact", compact), ("delete_retention_seconds", delete_retention_seconds),
                                   ("min_cleanable_dirty_ratio", min_cleanable_dirty_ratio))
                 if v != STREAM.rows[k].default}  # (sent only when asked for: an older server knows none of them)
        if max_compaction_lag_seconds is not None:
            kafka["max_compaction_lag_seconds"] = max_compaction_lag_seconds
        fields = stream_create_fields(
            name, exist_ok, partitions=partitions, max_bytes=max_bytes, max_message_bytes=max_message_bytes,
            retention=retention, retention_bytes=retention_bytes, retention_seconds=retention_seconds,
            group_idle_timeout=group_idle_timeout, durability=durability, segment_bytes=segment_bytes, **kafka)
        return self._stream_class(self, (yield Send(MsgType.STREAM_CREATE, fields)))

    @driven
    def delete_stream(self, name: str):
        """Delete the stream ``name``, its records and its groups; StreamNotFound if there is none."""
        yield Send(MsgType.STREAM_DELETE, {"stream": name})

    def consumer(self, group: str, streams=None, pattern=None, auto_offset_reset: str = "earliest", **options):
        """Join ``group`` on several ``streams``, or on every stream matching ``pattern``,
        as the local ``Broker.consumer`` (``multiconsumer.MultiConsumerCalls``)."""
        from .multiconsumer import start  # (it builds on this module)
        return self._drive(start(self, group, streams, pattern, auto_offset_reset, options))

    @driven
    def list_streams(self):
        """The names of the streams, sorted."""
        return (yield Send(MsgType.STREAM_LIST, {}))["streams"]

    # ------------------------------------------------------------ exchanges, request/reply
    @driven
    def create_exchange(self, name: str, type: str = "fanout", exist_ok: bool = False):
        """Create an exchange ("fanout" or "topic"); ExchangeExists unless ``exist_ok``."""
        yield Send(MsgType.X_CREATE, {"exchange": name, "type": type, "exist_ok": exist_ok})

    @driven
    def delete_exchange(self, name: str):
        """Delete an exchange and its bindings; ExchangeNotFound if there is none."""
        yield Send(MsgType.X_DELETE, {"exchange": name})

    @driven
    def list_exchanges(self):
        """The names of the exchanges, sorted."""
        return (yield Send(MsgType.X_LIST, {}))["exchanges"]

    @driven
    def exchange_info(self, name: str):
        """{"name", "type", "bindings": [{"target", "kind", "pattern"}]}."""
        return (yield Send(MsgType.X_LIST, {"exchange": name}))

    @driven
    def bind(self, exchange: str, target: str, pattern: str = "#"):
        """Bind a queue or a stream (by name) to an exchange, with a topic ``pattern``."""
        yield Send(MsgType.X_BIND, {"exchange": exchange, "target": target, "pattern": check_pattern(pattern)})

    @driven
    def unbind(self, exchange: str, target: str, pattern: str | None = None):
        """Drop the bindings of ``target`` (only the one of ``pattern``, if given); how many went."""
        fields = {"exchange": exchange, "target": target}
        if pattern is not None:
            fields["pattern"] = check_pattern(pattern)
        return (yield Send(MsgType.X_UNBIND, fields))["unbound"]

    @driven
    def publish(self, exchange: str, body, routing_key: str = "", headers=None, dedup_id=None, timeout=None):
        """Copy a message into every target the exchange routes ``routing_key`` to; how
        many got it. A full queue: QueueFull, the targets before it having the message;
        with a ``dedup_id`` the publish is retried while a queue is full, for up to
        ``timeout`` seconds (None: for ever), the queues that have it dropping repeats."""
        fields = {"exchange": exchange, **message_fields(body, headers), "routing_key": check_routing_key(routing_key)}
        if dedup_id is None:
            return (yield Send(MsgType.X_PUBLISH, fields))["targets"]
        if not isinstance(dedup_id, str):
            raise TypeError(f"dedup_id must be a str, not {type(dedup_id).__name__}")
        request = Send(MsgType.X_PUBLISH, {**fields, "dedup_id": dedup_id})
        return (yield from retry_while_full(request, timeout, self._clock))["targets"]

    @driven
    def request(self, queue: str, body, headers=None, timeout=None):
        """Put a request into ``queue`` and return the reply's body; RequestTimeout after
        ``timeout`` seconds (None: wait for ever). The server makes the reply queue and
        removes it when the request ends or this connection closes."""
        fields = {"queue": queue, **message_fields(body, headers)}
        if timeout is not None:
            fields["timeout_ms"] = ms(timeout, "timeout")
        return (yield Send(MsgType.REQUEST, fields))["body"]

    # ------------------------------------------------------------ keyed stores (stores.py)
    @driven
    def store(self, name: str = "default"):
        """A handle on the keyed store ``name``, made on first use (as the local ``Broker.store``)."""
        yield Send(MsgType.KV_OPEN, {"store": name})
        return self._store_class(self, name)

    @driven
    def list_stores(self):
        """The names of the keyed stores, sorted."""
        return (yield Send(MsgType.KV_LIST, {}))["stores"]

    @driven
    def delete_store(self, name: str):
        """Delete the keyed store ``name`` and its keys; False if there was none."""
        return (yield Send(MsgType.KV_DROP, {"store": name}))["deleted"]
