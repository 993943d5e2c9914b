"""The blocking and the asyncio client run one script and must agree to the letter: the
same results, the same exception types and texts.

Strategy: a step is a function of the run's handles; called on the blocking client it
returns the result, on the asyncio client an awaitable of it, which the runner awaits
(one runner for both, in an event loop either way).
Results are compared as plain values (deliveries by their fields, queues by name,
stats without the age of the oldest message); error texts are compared with the
transport's class prefix (RemoteDelivery / AsyncDelivery) and the server's delivery
tags (numbered per server process, not per connection) written alike. Errors that end
a connection come from ``FakeServer``, a socket server scripted frame by frame.
"""

import asyncio
import dataclasses
import functools
import inspect
import re
import socket
import threading
from types import SimpleNamespace

import pytest

import shmq
from shmq.client import aio
from shmq.engine.streams.partitioner import partition_of
from shmq.protocol import FrameDecoder, MsgType, Status, encode_error, encode_reply


async def _stats_when_nobody_waits(h):
    """The queue's stats once no request waits on it: a get that waited (``get it after its
    delay``) leaves the server's doorbell asleep on the queue, a waiting consumer until it
    wakes (timing, not the clients' parity). A bounded poll of the condition: 10 s."""
    stats = await maybe_await(h.q.stats())
    for _ in range(1000):
        if not stats.consumers_waiting:
            break
        await asyncio.sleep(0.01)
        stats = await maybe_await(h.q.stats())
    return stats


@dataclasses.dataclass
class Step:
    label: str
    call: object  # handles -> result (blocking) or awaitable of it (asyncio)
    keep: str | None = None  # keep the result as this handle


KEYED = partition_of(b"k", 2)  # the partition of key b"k" in a stream of two

CONNECT = [Step("connect", lambda h: h.connect(h.url), "b"), Step("connect again", lambda h: h.connect(h.url), "b2")]

SCRIPT = CONNECT + [
    Step("create a dead-letter queue", lambda h: h.b.create_queue("dlq"), "dlq"),
    Step("create a small queue", lambda h: h.b.create_queue(
        "q", max_bytes=4096, max_message_bytes=976, visibility_timeout=60, max_deliveries=3,
        dead_letter_queue="dlq"), "q"),
    Step("create another queue", lambda h: h.b.create_queue("other"), "other"),
    Step("create a taken name", lambda h: h.b.create_queue("q")),
    Step("create a taken name, exist_ok", lambda h: h.b.create_queue("q", exist_ok=True)),
    Step("create a taken name, exist_ok, other settings", lambda h: h.b.create_queue(
        "q", exist_ok=True, max_bytes=4096, max_deliveries=5, visibility_timeout=60)),
    Step("create with a missing dead-letter queue", lambda h: h.b.create_queue("z", dead_letter_queue="nope")),
    Step("attach an unknown queue", lambda h: h.b.queue("missing")),
    Step("delete an unknown queue", lambda h: h.b.delete_queue("missing")),
    Step("list", lambda h: h.b.list_queues()),
    Step("attach from a second connection", lambda h: h.b2.queue("q"), "q2"),
    Step("put with headers", lambda h: h.q.put(b"a", headers={"k": "v", "n": 1, "raw": b"\x00"})),
    Step("put_nowait", lambda h: h.q.put_nowait(b"b")),
    Step("put_many", lambda h: h.q.put_many([b"c", b"d"], headers=[None, {"x": 2.5}])),
    Step("put_many of nothing", lambda h: h.q.put_many([])),
    Step("oversize body", lambda h: h.q.put(b"x" * 977)),
    Step("str body", lambda h: h.q.put("text")),
    Step("bad header value", lambda h: h.q.put(b"x", headers={"a": [1]})),
    Step("negative timeout", lambda h: h.q.put(b"x", timeout=-1)),
    Step("stats", lambda h: h.q.stats()),
    Step("get", lambda h: h.q.get(timeout=5), "d1"),
    Step("get_many", lambda h: h.q.get_many(2, timeout=5, visibility_timeout=30), "ds"),
    Step("get_many of none", lambda h: h.q.get_many(0)),
    Step("get with a str timeout", lambda h: h.q.get(timeout="soon")),
    Step("ack a delivery of another queue", lambda h: h.other.ack_many([h.d1])),
    Step("ack a delivery of another connection", lambda h: h.q2.ack_many([h.d1])),
    Step("ack what is not a delivery", lambda h: h.q.ack_many([42])),
    Step("ack_many", lambda h: h.q.ack_many(h.ds)),
    Step("ack them again", lambda h: h.ds[0].ack()),
    Step("get_nowait", lambda h: h.q.get_nowait(), "d4"),
    Step("reject to the dead-letter queue", lambda h: h.d4.reject()),
    Step("extend", lambda h: h.d1.extend(120)),
    Step("extend by a negative time", lambda h: h.d1.extend(-1)),
    Step("nack with a negative delay", lambda h: h.d1.nack(delay=-1)),
    Step("nack with a delay", lambda h: h.d1.nack(delay=0.05)),
    Step("nack it again", lambda h: h.d1.nack()),
    Step("get it after its delay", lambda h: h.q.get(timeout=5), "again"),
    Step("nack without requeue", lambda h: h.again.nack(requeue=False)),
    Step("stats after settling", lambda h: _stats_when_nobody_waits(h)),
    Step("the dead letters", lambda h: h.dlq.get_many(10, timeout=5), "dead"),
    Step("ack the dead letters", lambda h: h.dlq.ack_many(h.dead)),
    Step("fill the queue", lambda h: h.q.put_many([b"x" * 976] * 4)),
    Step("put_nowait to a full queue", lambda h: h.q.put_nowait(b"y")),
    Step("put to a full queue, with a timeout", lambda h: h.q.put(b"y", timeout=0.05)),
    Step("put_many to a full queue, no wait", lambda h: h.q.put_many([b"y", b"z"], timeout=0)),
    Step("purge", lambda h: h.q.purge()),
    Step("get_many from an empty queue, with a timeout", lambda h: h.q.get_many(10, timeout=0.05)),
    Step("get_nowait from an empty queue", lambda h: h.q.get_nowait()),
    Step("delete", lambda h: h.b.delete_queue("other")),
    Step("use a deleted queue", lambda h: h.other.put(b"x")),
] + [
    Step("create a stream", lambda h: h.b.create_stream("events", partitions=2, max_bytes=4096, max_message_bytes=1000),
         "s"),
    Step("create a taken stream name", lambda h: h.b.create_stream("events")),
    Step("create it again, exist_ok", lambda h: h.b.create_stream("events", max_bytes=4096, exist_ok=True)),
    Step("create it again, exist_ok, other partitions", lambda h: h.b.create_stream("events", partitions=1,
                                                                                    exist_ok=True)),
    Step("create a stream of no partitions", lambda h: h.b.create_stream("none", partitions=0)),
    Step("attach an unknown stream", lambda h: h.b.stream("missing")),
    Step("delete an unknown stream", lambda h: h.b.delete_stream("missing")),
    Step("list streams", lambda h: h.b.list_streams()),
    Step("append with a key and headers", lambda h: h.s.append(b"a", key=b"k", headers={"n": 1, "raw": b"\x00"})),
    Step("append to a partition", lambda h: h.s.append(b"b", partition=KEYED)),
    Step("append_many", lambda h: h.s.append_many([b"c", b"d"], keys=[b"k", b"k"], headers=[None, {"x": 2.5}])),
    Step("append_many of nothing", lambda h: h.s.append_many([])),
    Step("append to an unknown partition", lambda h: h.s.append(b"x", partition=2)),
    Step("append an oversize value", lambda h: h.s.append(b"x" * 1001)),
    Step("append a str", lambda h: h.s.append("text")),
    Step("append_many with too many keys", lambda h: h.s.append_many([b"a"], keys=[b"k", b"l"])),
    Step("offsets", lambda h: h.s.offsets(KEYED)),
    Step("read", lambda h: h.s.read(KEYED, 0)),
    Step("read from the middle", lambda h: h.s.read(KEYED, 1, max_records=2)),
    Step("read past the end", lambda h: h.s.read(KEYED, 9)),
    Step("read a negative offset", lambda h: h.s.read(KEYED, -1)),
    Step("read with a str timeout", lambda h: h.s.read(KEYED, 0, timeout="soon")),
    Step("read at the end, with a timeout", lambda h: h.s.read(KEYED, 4, timeout=0.05)),
    Step("join", lambda h: h.s.consumer("g"), "c"),
    Step("join with a bad reset", lambda h: h.s.consumer("g", auto_offset_reset="middle")),
    Step("assignment", lambda h: h.c.assignment()),
    Step("poll", lambda h: h.c.poll(max_records=10, timeout=1)),
    Step("position", lambda h: h.c.position(KEYED)),
    Step("position in no partition of its", lambda h: h.c.position(7)),
    Step("commit", lambda h: h.c.commit()),
    Step("committed", lambda h: h.s.committed("g")),
    Step("lag", lambda h: h.s.lag("g")),
    Step("groups", lambda h: h.s.groups()),
    Step("commit a negative offset", lambda h: h.c.commit({KEYED: -1})),
    Step("attach the stream from the second connection", lambda h: h.b2.stream("events"), "s2"),
    Step("join from the second connection", lambda h: h.s2.consumer("g"), "c2"),
    Step("assignment of the second member", lambda h: h.c2.assignment()),
    Step("commit after the rebalance", lambda h: h.c.commit()),
    Step("the second member leaves", lambda h: h.c2.close()),
    Step("reset with a live member", lambda h: h.s.reset("g")),
    Step("the first member leaves", lambda h: h.c.close()),
    Step("poll a closed member", lambda h: h.c.poll(timeout=0)),
    Step("reset to an offset", lambda h: h.s.reset("g", to={KEYED: 1})),
    Step("lag after the reset", lambda h: h.s.lag("g")),
    Step("stream stats", lambda h: h.s.stats()),
    Step("delete the stream", lambda h: h.b.delete_stream("events")),
    Step("append to a deleted stream", lambda h: h.s.append(b"x")),
    Step("list streams at the end", lambda h: h.b.list_streams()),
] + [
    Step("close the second connection", lambda h: h.b2.close()),
    Step("use a closed connection", lambda h: h.q2.stats()),
    Step("delete the queue", lambda h: h.b.delete_queue("q")),
    Step("delete the dead-letter queue", lambda h: h.b.delete_queue("dlq")),
    Step("list at the end", lambda h: h.b.list_queues()),
]

EXPECTED = {  # spot checks, so that two clients cannot agree on being wrong
    "ack a delivery of another queue": (TypeError, "expected deliveries of queue 'other', got <Delivery q#1"),
    "ack a delivery of another connection": (TypeError, "expected deliveries of queue 'q', got <Delivery q#1"),
    "ack them again": (shmq.DeliveryExpired, ""),
    "oversize body": (shmq.MessageTooLarge, ""),
    "put to a full queue, with a timeout": (shmq.QueueFull, ""),
    "get_many from an empty queue, with a timeout": (shmq.QueueEmpty, "queue 'q' is empty"),
    "use a closed connection": (shmq.BrokerUnavailable, "connection to 127.0.0.1:"),
    "list at the end": [],
    "create a taken stream name": (shmq.StreamExists, "stream 'events' already exists"),
    "create it again, exist_ok": ("stream", "events", 2),
    "create it again, exist_ok, other partitions": (shmq.StreamExists, "stream 'events' exists in namespace"),
    "create a taken name, exist_ok": ("queue", "q"),
    "create a taken name, exist_ok, other settings": (shmq.QueueExists, "queue 'q' exists in namespace"),
    "create a stream of no partitions": (ValueError, "partitions must be positive, not 0"),
    "append to an unknown partition": (ValueError, "stream 'events' has partitions 0..1, not 2"),
    "append an oversize value": (shmq.MessageTooLarge, "record of 1001 bytes"),
    "read past the end": (shmq.OffsetOutOfRange, "stream 'events' partition", 0, 4),
    "read from the middle": [("record", KEYED, 1, None, b"b", {}), ("record", KEYED, 2, b"k", b"c", {})],
    "read at the end, with a timeout": [],
    "assignment": [0, 1],
    "position": 4,
    "committed": {KEYED: 4, 1 - KEYED: 0},
    "assignment of the second member": [1],
    "commit after the rebalance": (shmq.CommitFailed, "group 'g' of stream 'events' rebalanced"),
    "poll a closed member": (shmq.ShmqError, "consumer of group 'g' is closed"),
    "append to a deleted stream": (shmq.StreamNotFound, ""),
    "list streams at the end": [],
}


def plain(value):
    """A result as comparable data."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if hasattr(value, "attempt") and hasattr(value, "ack"):
        return ("delivery", value.queue, value.id, value.body, value.headers, value.attempt)
    if isinstance(value, shmq.Record):  # timestamps differ from run to run
        return ("record", value.partition, value.offset, value.key, value.value, value.headers)
    if isinstance(value, shmq.RecordMetadata):
        return ("appended", value.partition, value.offset)
    if hasattr(value, "append_many"):
        return ("stream", value.name, value.partitions)
    if hasattr(value, "poll") and hasattr(value, "group"):
        return ("consumer", value.stream.name, value.group)
    if hasattr(value, "put") and hasattr(value, "name"):
        return ("queue", value.name)
    if hasattr(value, "list_queues"):
        return ("broker", value.url)
    if dataclasses.is_dataclass(value):
        return ("stats", {k: v for k, v in dataclasses.asdict(value).items() if k != "oldest_ready_age_s"})
    return value


def failure(e):
    text = re.sub(r"\b(?:Remote|Async)(Delivery|Queue|Broker|Stream|Consumer)\b", r"\1", str(e))
    details = (e.earliest, e.end) if isinstance(e, shmq.OffsetOutOfRange) else ()
    return type(e), re.sub(r"\[\d+(?:, \d+)*\]", "[tags]", text), *details


async def maybe_await(value):
    return await value if inspect.isawaitable(value) else value


async def run(script, connect, url):
    """The script's results, ``connect`` making the brokers. One runner serves both clients:
    a blocking call returns its result, an asyncio one an awaitable of it."""
    h = SimpleNamespace(connect=connect, url=url)
    results = []
    try:
        for step in script:
            try:
                value = await maybe_await(step.call(h))
            except Exception as e:
                results.append((step.label, failure(e)))
                continue
            if step.keep:
                setattr(h, step.keep, value)
            results.append((step.label, plain(value)))
    finally:
        for broker in (getattr(h, "b", None), getattr(h, "b2", None)):
            if broker is not None:
                await maybe_await(broker.close())
    return results


def run_both(script, url, **options):
    """The script's results through the blocking client, then through the asyncio one."""
    return [asyncio.run(asyncio.wait_for(run(script, functools.partial(connect, **options), url), 60))
            for connect in (shmq.connect, aio.connect)]


def test_one_script_through_both_clients_gives_one_result(tcp_server):
    blocking, asyncio_ = run_both(SCRIPT, tcp_server.url)
    assert [label for label, _ in blocking] == [step.label for step in SCRIPT]
    assert asyncio_ == blocking
    got = dict(blocking)
    for label, expected in EXPECTED.items():
        if isinstance(expected, tuple) and isinstance(expected[0], type):  # an error
            cls, start, *details = expected
            assert got[label][0] is cls and got[label][1].startswith(start), (label, got[label])
            assert list(got[label][2:]) == details, (label, got[label])
        else:
            assert got[label] == expected, label


# ---------------------------------------------------------------- errors that end a connection
class FakeServer:
    """A TCP server in a thread that plays ``handler(conn)`` on each of ``connections``
    accepted connections in turn, then closes it."""

    def __init__(self, handler, connections):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self.errors = []
        self._thread = threading.Thread(target=self._serve, args=(handler, connections), daemon=True)
        self._thread.start()

    def _serve(self, handler, connections):
        try:
            for _ in range(connections):
                conn, _ = self._listener.accept()
                with conn:
                    conn.settimeout(10)
                    handler(FakeConnection(conn))
        except Exception as e:  # reported by stop()
            self.errors.append(e)

    def stop(self):
        self._listener.close()  # an accept still waiting (a failed test) ends
        self._thread.join(30)
        assert not self._thread.is_alive() and self.errors == []


class FakeConnection:
    def __init__(self, sock):
        self.sock = sock
        self._decoder = FrameDecoder()

    def read(self):
        """The next request frame."""
        while (frame := self._decoder.next_frame()) is None:
            data = self.sock.recv(65536)
            assert data, "the client closed the connection"
            self._decoder.feed(data)
        return frame

    def answer(self, frame, payload=None):
        self.sock.sendall(encode_reply(frame.type, frame.msg_id, payload or {}))

    def end(self, status, text):
        """An error with msg id 0 (the server closes the connection after it)."""
        self.sock.sendall(encode_error(0, 0, status, text))


def too_many_connections(conn):
    conn.end(Status.LIMIT_EXCEEDED, "too many connections (the server's limit is 8)")


def frame_timeout(conn):
    conn.answer(conn.read(), {"server": "fake"})  # HELLO
    conn.answer(conn.read(), {"queues": ["q"]})  # LIST
    assert conn.read().type == MsgType.LIST
    conn.end(Status.LIMIT_EXCEEDED, "a frame must arrive whole within 30s")


def bad_magic(conn):
    conn.answer(conn.read())  # HELLO
    conn.read()
    conn.end(Status.BAD_FRAME, "bad magic 0x00000000 (expected 0xDEADBEEF)")


LIST = Step("list", lambda h: h.b.list_queues())
ENDS = {  # what the server does -> (the client's steps, their results)
    too_many_connections: (CONNECT[:1], [("connect", (shmq.LimitExceeded, "too many connections (the server's "
                                                                           "limit is 8)"))]),
    frame_timeout: (CONNECT[:1] + [LIST] * 3, [("list", ["q"])] + [
        ("list", (shmq.LimitExceeded, "a frame must arrive whole within 30s"))] * 2),
    bad_magic: (CONNECT[:1] + [LIST] * 2, [("list", (shmq.ProtocolError, "bad magic 0x00000000 (expected "
                                                                        "0xDEADBEEF)"))] * 2),
}


@pytest.mark.parametrize("server", ENDS, ids=[s.__name__ for s in ENDS])
def test_an_error_with_msg_id_0_ends_the_connection_alike(server):
    script, expected = ENDS[server]
    fake = FakeServer(server, connections=2)
    try:
        blocking, asyncio_ = run_both(script, fake.url, reconnect=False)  # every later call: the same error
    finally:
        fake.stop()
    assert asyncio_ == blocking
    assert [r for r in blocking if r != ("connect", ("broker", fake.url))] == expected
