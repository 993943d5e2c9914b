"""The remote client, written once and sans-IO: the connection's state and every call of
the Broker / Queue / Delivery API (the Stream / Consumer calls are in ``streams``, on the
same machinery). ``remote`` (blocking) and ``aio`` (asyncio) only move the bytes.

Strategy: as h11 owns no socket, ``ClientCore`` owns none either. It numbers requests
and encodes them (``send``), takes whatever bytes arrive (``receive_data``), matches
replies to requests by msg id in any order, and turns error replies into the engine's
exceptions through the one table (``protocol.status``). An error with msg id 0 answers
the whole connection (too many connections, a frame timeout, bad magic): like a lost
connection, it ends every waiting request and every later one.

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

import functools
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..auth import client_token, refused
from ..errors import BrokerUnavailable, ProtocolError, QueueEmpty, QueueFull, Unauthorized
from ..protocol import FrameDecoder, MsgType, Status, encode_request, error_from_reply
from ..protocol.forms import (
    DEFAULT_MAX_BYTES,
    DEFAULT_VISIBILITY_S,
    consume_fields,
    create_fields,
    message_fields,
    ms,
    stats_from_fields,
    stream_create_fields,
)

__all__ = ["ClientCore", "Send", "Pause", "Run", "driven", "retry_while_full", "waiting", "BrokerCalls",
           "QueueCalls", "DeliveryCalls", "parse_url", "CONSUME_SLICE_MS", "PUT_RETRY_S"]

CONSUME_SLICE_MS = 5000  # a blocking get waits in slices, so the connection never idles for long
PUT_RETRY_S = (0.0005, 0.05)  # backoff between PRODUCE retries on QUEUE_FULL: first, most
MAX_REPLY_BYTES = 2**31 - 1  # the client trusts its server's reply sizes
DEFAULT_PORT = 7878


def parse_url(url: str) -> tuple[str, int]:
    """(host, port) of ``tcp://host[:port]``; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname:
        raise ValueError(f"unsupported broker url {url!r}: use tcp://host:port")
    return parts.hostname, parts.port or DEFAULT_PORT


# ---------------------------------------------------------------- the connection
class ClientCore:
    """One connection's state, without its socket: requests out, replies in by msg id."""

    def __init__(self, endpoint: str, max_reply_bytes: int = MAX_REPLY_BYTES):
        self.endpoint = endpoint
        self._decoder = FrameDecoder(max_reply_bytes)
        self._last_id = 0
        self._waiting = set()  # msg ids sent and not yet answered
        self._replies = {}  # msg id -> its reply frame, until result() takes it
        self._end = None  # () -> the exception that ended the connection

    @property
    def failed(self) -> bool:
        """Whether the connection has ended (lost, closed, or an error with msg id 0)."""
        return self._end is not None

    def send(self, msg_type: int, payload: dict | None = None) -> tuple[int, bytes]:
        """A new msg id and the request's bytes; raises why the connection ended, if it has."""
        if self._end is not None:
            raise self._end()
        self._last_id = self._last_id % 0xFFFFFFFF + 1  # 1 .. 2**32-1: msg id 0 speaks for the connection
        data = encode_request(msg_type, self._last_id, payload)
        self._waiting.add(self._last_id)
        return self._last_id, data

    def receive_data(self, data) -> list[int]:
        """Take bytes read off the connection (b"" once the server closed it); returns the
        msg ids whose outcome is now known, for ``result``."""
        if not data:
            return self.connection_lost("connection closed by the server")
        if self._end is not None:
            return []
        self._decoder.feed(data)
        done = []
        try:
            for frame in self._decoder.frames():
                if frame.msg_id in self._waiting:
                    self._waiting.discard(frame.msg_id)
                    self._replies[frame.msg_id] = frame
                    done.append(frame.msg_id)
                elif frame.msg_id == 0 and frame.status != Status.OK:
                    return done + self._ended(functools.partial(error_from_reply, frame, self.endpoint))
        except ProtocolError as e:  # the server's bytes cannot be read: the connection is over
            return done + self._ended(functools.partial(ProtocolError, str(e), e.status, e.msg_id, e.fatal))
        return done

    def done(self, msg_id: int) -> bool:
        """Whether ``result(msg_id)`` has an answer (a reply, or the connection's end)."""
        return msg_id in self._replies or self._end is not None

    def result(self, msg_id: int) -> dict:
        """The payload of the reply to ``msg_id``, else raises its error, or why the
        connection ended before it was answered."""
        frame = self._replies.pop(msg_id, None)
        if frame is None:
            if self._end is None:
                raise RuntimeError(f"request {msg_id} has no answer yet")  # a transport's bug
            raise self._end()
        if frame.status != Status.OK:
            raise error_from_reply(frame, self.endpoint)
        return frame.payload

    def forget(self, msg_id: int) -> None:
        """The caller of ``msg_id`` went away (a cancelled task): drop its reply."""
        self._waiting.discard(msg_id)
        self._replies.pop(msg_id, None)

    def connection_lost(self, reason) -> list[int]:
        """The socket broke (``reason``: an OSError or a text); returns the msg ids it ends."""
        return self._ended(functools.partial(BrokerUnavailable, f"lost the connection to {self.endpoint}: {reason}"))

    def close(self) -> list[int]:
        """This side closes the connection; returns the msg ids it ends."""
        return self._ended(functools.partial(BrokerUnavailable, f"connection to {self.endpoint} is closed"))

    def _ended(self, error) -> list[int]:
        if self._end is None:  # the first reason is the one every later call hears
            self._end = error
        ended, self._waiting = sorted(self._waiting), set()
        return ended


# ---------------------------------------------------------------- calls and policies
@dataclass(frozen=True, slots=True)
class Send:
    """A call's step: send this request; its reply's payload comes back, its error is thrown in."""

    msg_type: MsgType
    payload: dict


@dataclass(frozen=True, slots=True)
class Pause:
    """A call's step: sleep this many seconds, then go on."""

    seconds: float


class Run:
    """A call as its transport runs it: iterate for its steps and answer each one, with
    ``send(reply)`` or ``throw(error)``; when the iteration ends, ``result`` holds what
    the call returned (an error of the call itself is raised from the iteration)."""

    def __init__(self, call):
        self._call = call
        self._resume = functools.partial(call.send, None)
        self.result = None

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return self._resume()
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    def send(self, reply) -> None:
        self._resume = functools.partial(self._call.send, reply)

    def throw(self, error: BaseException) -> None:
        self._resume = functools.partial(self._call.throw, error)


def driven(call):
    """The method that runs the generator function ``call`` through its object's transport
    (``self._drive``): the blocking client returns its result, the asyncio one a coroutine."""

    @functools.wraps(call)
    def method(self, *args, **kwargs):
        return self._drive(call(self, *args, **kwargs))

    return method


def deadline(timeout, clock):
    """When a call given ``timeout`` seconds gives up, on ``clock`` (None: it never does)."""
    return None if timeout is None else clock() + ms(timeout, "timeout") / 1000


def retry_while_full(request: Send, timeout, clock):
    """Send ``request`` until it is not refused with QUEUE_FULL (the server answers that at
    once, never waits for room), pausing PUT_RETRY_S[0] seconds, doubling up to
    PUT_RETRY_S[1]; QueueFull once the next pause would end past ``timeout``."""
    until = deadline(timeout, clock)
    pause = PUT_RETRY_S[0]
    while True:
        try:
            return (yield request)
        except QueueFull:
            if until is not None and clock() + pause > until:
                raise
            yield Pause(pause)
            pause = min(pause * 2, PUT_RETRY_S[1])


def waiting(msg_type, fields, key, timeout, clock):
    """Send a request that may wait at the server (CONSUME, READ, POLL) with ``wait_ms`` in
    slices of CONSUME_SLICE_MS, so the connection never idles for long, until its reply's
    list ``key`` has items or ``timeout`` ends (None: never); returns that list."""
    until = deadline(timeout, clock)
    while True:
        wait = CONSUME_SLICE_MS
        if until is not None:
            wait = max(0, min(wait, round((until - clock()) * 1000)))
        reply = yield Send(msg_type, {**fields, "wait_ms": wait})
        if reply[key] or (until is not None and clock() >= until):
            return reply[key]


# ---------------------------------------------------------------- the API, once
class DeliveryCalls:
    """A message leased to this connection, as a CONSUME reply tells it; the tag names the
    lease on this connection only. Settle it like a local ``Delivery``."""

    __slots__ = ("id", "body", "headers", "attempt", "_q", "_tag")

    def __init__(self, q, m: dict):
        self._q = q
        self._tag = m["delivery"]
        self.id = m["id"]
        self.body = m["body"]
        self.headers = m.get("headers") or {}
        self.attempt = m["attempt"]

    @property
    def queue(self) -> str:
        return self._q.name

    def __repr__(self):
        return f"<{type(self).__name__} {self.queue}#{self.id} attempt={self.attempt} {len(self.body)}B>"

    def _drive(self, call):
        return self._q._drive(call)

    def _settle(self, msg_type, **fields):
        return Send(msg_type, {"queue": self._q.name, "deliveries": [self._tag], **fields})

    @driven
    def ack(self):
        """Done with it: the message is gone. DeliveryExpired if the lease is no longer yours."""
        yield self._settle(MsgType.ACK)

    @driven
    def nack(self, requeue: bool = True, delay: float = 0.0):
        """Give it back: ready again after ``delay`` seconds (or dead-lettered if not ``requeue``)."""
        yield self._settle(MsgType.NACK, requeue=requeue, delay_ms=ms(delay, "delay"))

    @driven
    def reject(self):
        """Refuse it for good: to the queue's dead-letter queue, or dropped when it has none."""
        yield self._settle(MsgType.REJECT)

    @driven
    def extend(self, seconds: float):
        """Keep the lease ``seconds`` from now."""
        yield self._settle(MsgType.EXTEND, visibility_ms=ms(seconds, "seconds"))


class QueueCalls:
    """A queue reached over a connection: the methods and errors of the local ``Queue``."""

    _delivery_class = DeliveryCalls  # the transport's

    def __init__(self, broker, name: str):
        self._broker = broker
        self.name = name

    def _drive(self, call):
        return self._broker._drive(call)

    @driven
    def put(self, body, headers=None, timeout=None):
        """Append one message and return its id; while the queue is full, retry for up to
        ``timeout`` seconds (None: for ever), then QueueFull."""
        message = message_fields(body, headers)
        request = Send(MsgType.PRODUCE, {"queue": self.name, **message})
        return (yield from retry_while_full(request, timeout, self._broker._clock))["id"]

    @driven
    def put_nowait(self, body, headers=None):
        """Append one message and return its id; QueueFull at once if there is no room."""
        return (yield Send(MsgType.PRODUCE, {"queue": self.name, **message_fields(body, headers)}))["id"]

    @driven
    def put_many(self, bodies, timeout=None):
        """Append bodies (or (body, headers) pairs), all or none, and return their ids;
        retries while the queue is full like ``put``."""
        messages = []
        for item in bodies:
            body, headers = item if type(item) is tuple else (item, None)
            messages.append(message_fields(body, headers))
        if not messages:
            return []
        request = Send(MsgType.PRODUCE_BATCH, {"queue": self.name, "messages": messages})
        return (yield from retry_while_full(request, timeout, self._broker._clock))["ids"]

    @driven
    def get(self, timeout=None, visibility_timeout=None):
        """Lease the next message; wait up to ``timeout`` seconds (None: for ever), then QueueEmpty."""
        return (yield from self._consume(1, timeout, visibility_timeout))[0]

    @driven
    def get_nowait(self, visibility_timeout=None):
        """Lease the next message; QueueEmpty at once if none is ready."""
        return (yield from self._consume(1, 0, visibility_timeout))[0]

    @driven
    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None):
        """Lease up to ``max_messages`` ready messages, waiting like ``get`` for the first."""
        return (yield from self._consume(max_messages, timeout, visibility_timeout))

    def _consume(self, max_messages, timeout, visibility_timeout):
        """CONSUME until messages come or ``timeout`` ends (see ``waiting``)."""
        fields = {"queue": self.name, **consume_fields(max_messages, visibility_timeout)}
        messages = yield from waiting(MsgType.CONSUME, fields, "messages", timeout, self._broker._clock)
        if not messages:
            raise QueueEmpty(f"queue {self.name!r} is empty")
        return [self._delivery_class(self, m) for m in messages]

    @driven
    def ack_many(self, deliveries):
        """Ack deliveries of this queue on this connection in one request; how many were acked.
        TypeError, before anything is sent, for anything else."""
        tags = [self._tag_of(d) for d in deliveries]
        if not tags:
            return 0
        return (yield Send(MsgType.ACK, {"queue": self.name, "deliveries": tags}))["acked"]

    def _tag_of(self, d) -> int:
        if not isinstance(d, DeliveryCalls) or d._q._broker is not self._broker or d._q.name != self.name:
            raise TypeError(f"expected deliveries of queue {self.name!r}, got {d!r}")
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
    def purge(self):
        """Drop every ready message (leased and delayed ones stay); how many were dropped."""
        return (yield Send(MsgType.PURGE, {"queue": self.name}))["purged"]


class BrokerCalls:
    """A broker reached over a connection: the methods of the local ``Broker``."""

    _queue_class = QueueCalls  # the transport's
    _stream_class = None  # the transport's (a ``streams.StreamCalls``)
    _clock = staticmethod(time.monotonic)  # the deadlines' clock

    def __init__(self, url: str, token: str | None = None):
        self.url = url
        self.token = token
        self.host, self.port = parse_url(url)
        self.endpoint = f"{self.host}:{self.port}"
        self._core = ClientCore(self.endpoint)

    def _drive(self, call):
        raise NotImplementedError  # the transport's

    @driven
    def _hello(self, client: str, local_addr, peer_addr):
        """Say HELLO with the token given, else $SHMQ_TOKEN, else the one shmq.auth finds for
        this server; returns the server's info. Unauthorized says which token was refused."""
        token, source = client_token(self.token, local_addr, peer_addr)
        fields = {"client": client}
        if token is not None:
            fields["token"] = token
        try:
            return (yield Send(MsgType.HELLO, fields))
        except Unauthorized as e:
            raise refused(self.endpoint, source, e) from None

    @driven
    def queue(self, name: str):
        """A handle on the queue ``name``; QueueNotFound if there is none."""
        yield Send(MsgType.STATS, {"queue": name})
        return self._queue_class(self, name)

    @driven
    def create_queue(self, name, max_bytes=DEFAULT_MAX_BYTES, max_message_bytes=None,
                     visibility_timeout=DEFAULT_VISIBILITY_S, max_deliveries=None, dead_letter_queue=None,
                     exist_ok=False, durability=None):
        """Create the queue ``name`` and return a handle on it; QueueExists if it exists
        (unless ``exist_ok``)."""
        yield Send(MsgType.CREATE, create_fields(name, max_bytes, max_message_bytes, visibility_timeout,
                                                 max_deliveries, dead_letter_queue, exist_ok, durability))
        return self._queue_class(self, name)

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

    # ------------------------------------------------------------ streams
    @driven
    def stream(self, name: str):
        """A handle on the stream ``name``; StreamNotFound if there is none."""
        return self._stream_class(self, (yield Send(MsgType.STREAM_INFO, {"stream": name})))

    @driven
    def create_stream(self, name: str, partitions: int = 4, max_bytes: int = 64 * 2**20,
                      max_message_bytes: int = 2**20, retention: str = "drop", retention_bytes: int | None = None,
                      retention_seconds: float | None = None, group_idle_timeout: float = 300.0,
                      durability: str = "snapshot", exist_ok: bool = False):
        """Create a stream of ``partitions`` append-only logs and return a handle on it;
        StreamExists if it exists (unless ``exist_ok``: then a handle on that one). The
        settings are the local ``Broker.create_stream``'s."""
        fields = stream_create_fields(
            name, exist_ok, partitions=partitions, max_bytes=max_bytes, max_message_bytes=max_message_bytes,
            retention=retention, retention_bytes=retention_bytes, retention_seconds=retention_seconds,
            group_idle_timeout=group_idle_timeout, durability=durability)
        return self._stream_class(self, (yield Send(MsgType.STREAM_CREATE, fields)))

    @driven
    def delete_stream(self, name: str):
        """Delete the stream ``name``, its records and its groups; StreamNotFound if there is none."""
        yield Send(MsgType.STREAM_DELETE, {"stream": name})

    @driven
    def list_streams(self):
        """The names of the streams, sorted."""
        return (yield Send(MsgType.STREAM_LIST, {}))["streams"]
