"""The blocking TCP client: ``shmq.connect("tcp://host:port")``.

Strategy: the same Broker / Queue / Delivery surface as local attach, over one socket
per broker. Each call sends one request frame (built by the sans-IO codec) and reads
frames until the reply with its msg id arrives; a lock makes a broker safe to share
between threads. Status codes become the engine's exceptions through one table, and
socket errors become BrokerUnavailable naming the endpoint.
"""

import itertools
import socket
import threading
import time
from urllib.parse import urlsplit

from ..errors import (
    BrokerUnavailable,
    DeliveryExpired,
    LimitExceeded,
    LockTimeout,
    MessageTooLarge,
    ProtocolError,
    QueueEmpty,
    QueueExists,
    QueueFull,
    QueueNotFound,
    ShmqError,
    StorageError,
    Unauthorized,
)
from ..auth import client_token, refused
from ..engine.headers import encode_headers
from ..protocol import FrameDecoder, MsgType, Status, encode_request
from ..engine.delivery import QueueStats

__all__ = ["RemoteBroker", "RemoteQueue", "RemoteDelivery", "EXCEPTIONS", "parse_url"]

# reply status -> exception raised by the client
EXCEPTIONS = {
    Status.BAD_FRAME: ProtocolError,
    Status.BAD_REQUEST: ValueError,
    Status.UNAUTHORIZED: Unauthorized,
    Status.NO_SUCH_QUEUE: QueueNotFound,
    Status.QUEUE_EXISTS: QueueExists,
    Status.QUEUE_FULL: QueueFull,
    Status.TOO_LARGE: MessageTooLarge,
    Status.UNKNOWN_DELIVERY: DeliveryExpired,
    Status.UNSUPPORTED_VERSION: ProtocolError,
    Status.INTERNAL: ShmqError,
    Status.STORAGE: StorageError,
    Status.LOCK_TIMEOUT: LockTimeout,
    Status.LIMIT_EXCEEDED: LimitExceeded,
}

CONSUME_SLICE_MS = 5000  # a blocking get waits in slices, so the socket never idles for long
PUT_RETRY_S = (0.0005, 0.05)  # backoff between PRODUCE retries on QUEUE_FULL: first, most
_MAX_REPLY_BYTES = 2**31 - 1


def parse_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname:
        raise ValueError(f"unsupported broker url {url!r}: use tcp://host:port")
    return parts.hostname, parts.port or 7878


def error_from_reply(frame, endpoint):
    """The exception a non-OK reply stands for."""
    reason = frame.payload.get("error") if isinstance(frame.payload, dict) else None
    cls = EXCEPTIONS.get(frame.status, ShmqError)
    message = reason or f"{endpoint}: status {frame.status}"
    if cls is ProtocolError:
        return ProtocolError(message, frame.status, frame.msg_id)
    return cls(message)


def stats_from_reply(p) -> QueueStats:
    return QueueStats(
        ready=p["ready"], in_flight=p["in_flight"], oldest_ready_age_s=p["oldest_ready_age_ms"] / 1000,
        bytes_used=p["bytes_used"], max_bytes=p["max_bytes"], enqueued_total=p["enqueued_total"],
        acked_total=p["acked_total"], redelivered_total=p["redelivered_total"],
        dead_lettered_total=p["dead_lettered_total"], consumers_waiting=p.get("consumers_waiting", 0),
        producers_waiting=p.get("producers_waiting", 0), delayed=p.get("delayed", 0),
        purged_total=p.get("purged_total", 0),
    )


def create_fields(name, max_bytes, max_message_bytes, visibility_timeout, max_deliveries, dead_letter_queue,
                  exist_ok, durability=None):
    fields = {"queue": name, "max_bytes": max_bytes, "visibility_timeout_ms": round(visibility_timeout * 1000),
              "exist_ok": exist_ok}
    for key, value in (("max_message_bytes", max_message_bytes), ("max_deliveries", max_deliveries),
                       ("dead_letter_queue", dead_letter_queue), ("durability", durability)):
        if value is not None:
            fields[key] = value
    return fields


class RemoteBroker:
    """A broker reached over TCP; the same methods as the local ``Broker``."""

    def __init__(self, url: str, token: str | None = None, connect_timeout: float = 10.0):
        self.url = url
        self.token = token
        self.host, self.port = parse_url(url)
        self.endpoint = f"{self.host}:{self.port}"
        self.namespace = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(_MAX_REPLY_BYTES)
        try:
            self._sock = socket.create_connection((self.host, self.port), timeout=connect_timeout)
        except OSError as e:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {e.strerror or e}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)
        hello = {"client": "shmq-python"}
        token, source = client_token(token, self._sock.getsockname(), self._sock.getpeername())
        if token is not None:
            hello["token"] = token
        try:
            self.server_info = self.request(MsgType.HELLO, hello)
        except Unauthorized as e:
            self.close()
            raise refused(self.endpoint, source, e) from None

    def __repr__(self):
        return f"<shmq.RemoteBroker {self.url}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (RemoteBroker, (self.url, self.token))

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    # ---------------------------------------------------------------- transport
    def request(self, msg_type, payload=None, timeout=None) -> dict:
        """Send one request and return its reply payload (or raise its error)."""
        with self._lock:
            sock = self._sock
            if sock is None:
                raise ShmqError(f"connection to {self.endpoint} is closed")
            msg_id = next(self._ids) & 0xFFFFFFFF
            try:
                sock.settimeout(timeout)
                sock.sendall(encode_request(msg_type, msg_id, payload))
                while True:
                    frame = self._decoder.next_frame()
                    if frame is None:
                        data = sock.recv(65536)
                        if not data:
                            raise ConnectionError("connection closed by the server")
                        self._decoder.feed(data)
                        continue
                    if frame.msg_id == msg_id or (frame.status and frame.msg_id == 0):
                        break
            except (OSError, ConnectionError) as e:
                self.close()
                raise BrokerUnavailable(f"lost the connection to {self.endpoint}: {e}") from None
        if frame.status != Status.OK:
            raise error_from_reply(frame, self.endpoint)
        return frame.payload

    # ---------------------------------------------------------------- queues
    def queue(self, name: str) -> "RemoteQueue":
        self.request(MsgType.STATS, {"queue": name})  # QueueNotFound if absent
        return RemoteQueue(self, name)

    def create_queue(self, name, max_bytes=64 * 2**20, max_message_bytes=None, visibility_timeout=30.0,
                     max_deliveries=None, dead_letter_queue=None, exist_ok=False, durability=None) -> "RemoteQueue":
        self.request(MsgType.CREATE, create_fields(name, max_bytes, max_message_bytes, visibility_timeout,
                                                   max_deliveries, dead_letter_queue, exist_ok, durability))
        return RemoteQueue(self, name)

    def delete_queue(self, name: str) -> None:
        self.request(MsgType.DELETE, {"queue": name})

    def list_queues(self) -> list[str]:
        return self.request(MsgType.LIST)["queues"]

    def ping(self) -> None:
        self.request(MsgType.PING)


class WireDelivery:
    """What a CONSUME reply says of one message; the tag is this connection's handle."""

    __slots__ = ("id", "body", "headers", "attempt", "_q", "_tag")

    def __init__(self, q, m):
        self._q = q
        self._tag = m["delivery"]
        self.id = m["id"]
        self.body = m["body"]
        self.headers = m.get("headers") or {}
        self.attempt = m["attempt"]

    @property
    def queue(self) -> str:
        return self._q.name


class RemoteDelivery(WireDelivery):
    """A message leased to this connection; settle it like a local ``Delivery``."""

    __slots__ = ()

    def ack(self) -> None:
        self._q._call(MsgType.ACK, deliveries=[self._tag])

    def nack(self, requeue: bool = True, delay: float = 0.0) -> None:
        self._q._call(MsgType.NACK, deliveries=[self._tag], requeue=requeue, delay_ms=_ms(delay, "delay"))

    def reject(self) -> None:
        self._q._call(MsgType.REJECT, deliveries=[self._tag])

    def extend(self, seconds: float) -> None:
        self._q._call(MsgType.EXTEND, deliveries=[self._tag], visibility_ms=_ms(seconds, "seconds"))

    def __repr__(self):
        return f"<RemoteDelivery {self.queue}#{self.id} attempt={self.attempt} {len(self.body)}B>"


class RemoteQueue:
    """A queue reached over TCP: the methods and errors of the local ``Queue``."""

    def __init__(self, broker: RemoteBroker, name: str):
        self._broker = broker
        self.name = name

    def __repr__(self):
        return f"<shmq.RemoteQueue {self._broker.url}/{self.name}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (_reattach, (self._broker.url, self._broker.token, self.name))

    def close(self) -> None:
        """Nothing to release: the connection belongs to the broker."""

    def _call(self, msg_type, timeout=None, **fields):
        fields["queue"] = self.name
        return self._broker.request(msg_type, fields, timeout)

    def put(self, body, headers=None, timeout=None) -> int:
        """Append one message; retries while the queue is full, QueueFull after ``timeout``."""
        return self._retry_full(lambda: self._call(MsgType.PRODUCE, **_message(body, headers))["id"], timeout)

    def put_nowait(self, body, headers=None) -> int:
        return self._call(MsgType.PRODUCE, **_message(body, headers))["id"]

    def put_many(self, bodies, timeout=None) -> list[int]:
        messages = []
        for item in bodies:
            body, headers = item if type(item) is tuple else (item, None)
            messages.append(_message(body, headers))
        if not messages:
            return []
        return self._retry_full(lambda: self._call(MsgType.PRODUCE_BATCH, messages=messages)["ids"], timeout)

    def _retry_full(self, attempt, timeout):
        deadline = None if timeout is None else time.monotonic() + _ms(timeout, "timeout") / 1000
        pause = PUT_RETRY_S[0]
        while True:
            try:
                return attempt()
            except QueueFull:
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)  # backpressure: the server answered QUEUE_FULL at once
                pause = min(pause * 2, PUT_RETRY_S[1])

    def get(self, timeout=None, visibility_timeout=None):
        return self.get_many(1, timeout, visibility_timeout)[0]

    def get_nowait(self, visibility_timeout=None):
        return self.get_many(1, 0, visibility_timeout)[0]

    def get_many(self, max_messages=64, timeout=None, visibility_timeout=None):
        fields = consume_fields(max_messages, visibility_timeout)
        deadline = None if timeout is None else time.monotonic() + _ms(timeout, "timeout") / 1000
        while True:
            wait = CONSUME_SLICE_MS
            if deadline is not None:
                wait = max(0, min(wait, round((deadline - time.monotonic()) * 1000)))
            reply = self._call(MsgType.CONSUME, wait_ms=wait, **fields)
            if reply["messages"]:
                return [RemoteDelivery(self, m) for m in reply["messages"]]
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueEmpty(f"queue {self.name!r} is empty")

    def ack_many(self, deliveries) -> int:
        tags = [_tag_of(d, self) for d in deliveries]
        return self._call(MsgType.ACK, deliveries=tags)["acked"] if tags else 0

    def stats(self) -> QueueStats:
        return stats_from_reply(self._call(MsgType.STATS))

    def purge(self) -> int:
        return self._call(MsgType.PURGE)["purged"]


def consume_fields(max_messages, visibility_timeout) -> dict:
    """The CONSUME fields of a get_many, checked as the local engine checks them."""
    if type(max_messages) is not int or max_messages < 1:
        raise ValueError(f"max_messages must be a positive int, not {max_messages!r}")
    fields = {"max": max_messages}
    if visibility_timeout is not None:
        fields["visibility_ms"] = _ms(visibility_timeout, "visibility_timeout")
    return fields


def _message(body, headers):
    """The wire form of one message, checked as the local engine checks it."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"message body must be bytes-like, not {type(body).__name__}")
    m = {"body": bytes(body)}
    if headers is not None and encode_headers(headers):  # same TypeError / MessageTooLarge as local
        m["headers"] = headers
    return m


def _tag_of(d, q):
    if not isinstance(d, RemoteDelivery) or d._q._broker is not q._broker or d._q.name != q.name:
        raise TypeError(f"expected deliveries of queue {q.name!r}, got {d!r}")
    return d._tag


def _ms(seconds, what):
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{what} must be >= 0, not {seconds!r}")
    return round(seconds * 1000)


def _reattach(url, token, name):
    return RemoteQueue(RemoteBroker(url, token), name)
