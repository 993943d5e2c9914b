"""The TCP clients' fast paths (issue 28): a plain get, put and ack(wait=False) encoded from
bytes packed once per queue (``protocol.shapes``), sent and answered without the general
call machinery. The bytes on the wire are exactly the general path's; what the general
path does besides (a full queue retried, a closed handle refused, an empty queue's
QueueEmpty) holds on the fast one; and the Python calls per exchange stay few."""

import asyncio
import sys
import threading

import pytest

import shmq
from shmq.client import aio
from shmq.client.connection import ClientCore
from shmq.errors import DeliveryExpired, ShmqError
from shmq.protocol import FrameDecoder, MsgType, Status, encode_error, encode_reply, encode_request
from shmq.protocol.shapes import Shape, ack_shape, consume_shape, produce_shape
from tests._wait import wait_for
from tests.test_client_reconnect import restartable  # noqa: F401 (a fixture)


# ---------------------------------------------------------------- shapes
@pytest.mark.parametrize("shape, value", [
    (consume_shape("q"), 5000),
    (consume_shape("q"), 0),
    (consume_shape("a queue é" * 20), 2**31),
    (produce_shape("q"), b""),
    (produce_shape("q"), b"x" * 64),
    (produce_shape("q" * 300), b"\x00" * 70_000),
    (ack_shape("q"), 1),
    (ack_shape("q"), 2**63 - 1),
])
def test_a_shape_encodes_the_bytes_of_encode_request(shape, value):
    for msg_id in (1, 0x0D0A, 2**32 - 1):
        data = shape.frame(msg_id, value)
        assert data == encode_request(shape.msg_type, msg_id, shape.payload(value))
        dec = FrameDecoder(1 << 30)
        dec.feed(data)
        frame = dec.next_frame()
        assert (frame.type, frame.msg_id, frame.payload) == (shape.msg_type, msg_id, shape.payload(value))


def test_a_shape_refuses_what_the_header_cannot_hold():
    with pytest.raises(ValueError, match=r"header field out of range: .* msg_id=4294967296 \(u32\)"):
        consume_shape("q").frame(2**32, 5000)
    with pytest.raises(ValueError, match="'queue' is both fixed and varying"):
        Shape(MsgType.PRODUCE, {"queue": "q"}, "queue")


# ---------------------------------------------------------------- the core, sans-IO
def test_a_shaped_request_takes_the_gathered_puts_along_and_its_msg_id_follows_theirs():
    core = ClientCore("h:1")
    core.greeted({"produce_each": True})
    assert core.post(MsgType.PRODUCE, {"queue": "q", "body": b"a"}) == b""  # gathered
    msg_id, data = core.send_shaped(consume_shape("q"), 5000)
    assert msg_id == 2
    assert data == (encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"a"})
                    + encode_request(MsgType.CONSUME, 2, {"queue": "q", "max": 1, "wait_ms": 5000}))
    core.receive_data(encode_reply(MsgType.PRODUCE, 1, {"id": 7}) + encode_reply(MsgType.CONSUME, 2, {"messages": []}))
    assert core.result(2, MsgType.CONSUME) == {"messages": []}


def test_a_shaped_ack_sent_without_waiting_has_its_error_raised_by_the_next_request(caplog):
    core = ClientCore("h:1")
    assert core.post_shaped(ack_shape("q"), 9) == encode_request(MsgType.ACK, 1, {"queue": "q", "deliveries": [9]})
    core.receive_data(encode_error(MsgType.ACK, 1, Status.UNKNOWN_DELIVERY, "delivery 9 is not leased"))
    assert "a request sent without waiting (ACK) failed" in caplog.text
    with pytest.raises(DeliveryExpired, match="^delivery 9 is not leased$"):
        core.send_shaped(produce_shape("q"), b"x")
    msg_id, data = core.send_shaped(produce_shape("q"), b"x")  # raised once, before a msg id was taken
    assert (msg_id, data) == (2, encode_request(MsgType.PRODUCE, 2, {"queue": "q", "body": b"x"}))
    core.connection_lost("gone")
    assert core.failed
    with pytest.raises(shmq.BrokerUnavailable, match="^lost the connection to h:1: gone$"):
        core.send_shaped(produce_shape("q"), b"x")


# ---------------------------------------------------------------- the blocking client
class _Writes:
    """The connection's socket, each write noted as its frames (type, payload)."""

    def __init__(self, sock):
        self._sock = sock
        self.writes = []

    def sendall(self, data):
        self.writes.append(_frames(data))
        return self._sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self._sock, name)


def full_queue(broker):
    """A local handle of a new queue "q", filled until a put finds no room."""
    local = broker.create_queue("q", max_bytes=4096, max_message_bytes=1024)
    while True:
        try:
            local.put_nowait(b"f" * 1000)
        except shmq.QueueFull:
            return local


def _noted_writes(b) -> list:
    """The asyncio connection's writes from now on, each noted as its frames."""
    writes, writer = [], b._link.writer
    write = writer.write

    def noted(data):
        writes.append(_frames(data))
        write(data)

    writer.write = noted
    return writes


def _frames(data):
    dec = FrameDecoder(1 << 30)
    dec.feed(data)
    return [(MsgType(f.type), f.payload) for f in dec.frames()]


def test_the_fast_paths_send_what_the_general_path_sends(tcp_server, broker):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        link = b._link
        link.sock = watched = _Writes(link.sock)
        first = q.put(b"one")
        q.put(b"two", priority=0, delay=0)  # defaults given: still a plain put
        d = q.get()
        d.ack(wait=False)
        d2 = q.get(timeout=5)
        d2.ack()
        assert (d.body, d2.body, d.id) == (b"one", b"two", first)
        slice_ms = watched.writes[3][1][1]["wait_ms"]
        assert 4900 <= slice_ms <= 5000  # the slice of a 5 s timeout
        assert watched.writes == [
            [(MsgType.PRODUCE, {"queue": "q", "body": b"one"})],
            [(MsgType.PRODUCE, {"queue": "q", "body": b"two"})],
            [(MsgType.CONSUME, {"queue": "q", "max": 1, "wait_ms": 5000})],
            [(MsgType.ACK, {"queue": "q", "deliveries": [d._tag]}),
             (MsgType.CONSUME, {"queue": "q", "max": 1, "wait_ms": slice_ms})],
            [(MsgType.ACK, {"queue": "q", "deliveries": [d2._tag]})],
        ]
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 2)


def test_a_fast_get_of_an_empty_queue_raises_queue_empty_and_a_closed_handle_refuses(tcp_server, broker):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        with pytest.raises(shmq.QueueEmpty, match="^queue 'q' is empty$"):
            q.get(timeout=0.05)
        q.close()
        with pytest.raises(ShmqError, match="^queue handle 'q' is closed$"):
            q.get()
        with pytest.raises(ShmqError, match="^queue handle 'q' is closed$"):
            q.put(b"x")
    assert broker.queue("q").stats().enqueued_total == 0


def test_a_fast_put_to_a_full_queue_retries_until_there_is_room(tcp_server, broker):
    local = full_queue(broker)
    held = local.stats().ready
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        link = b._link
        link.sock = watched = _Writes(link.sock)
        done = []
        t = threading.Thread(target=lambda: done.append(q.put(b"p" * 1000)))
        t.start()
        try:  # refused at least twice: the fast try, then the general put's retries
            wait_for(lambda: sum(w[0][0] == MsgType.PRODUCE for w in watched.writes) >= 2, what="two PRODUCEs")
            assert t.is_alive()
            local.get().ack()  # room for one
        finally:
            t.join(10)
        assert not t.is_alive() and len(done) == 1
    bodies = []
    while True:
        try:
            d = local.get_nowait()
        except shmq.QueueEmpty:
            break
        bodies.append(d.body)
        d.ack()
    assert bodies == [b"f" * 1000] * (held - 1) + [b"p" * 1000]


def test_a_fast_get_and_put_after_a_restart_connect_again_first(broker, restartable):  # noqa: F811
    local = broker.create_queue("q")
    srv = restartable()
    with shmq.connect(srv.url) as b:
        q = b.queue("q")
        first = q.put(b"a")
        assert srv.stop() == 0
        srv = restartable()
        second = q.put(b"b")  # the close was noticed before sending: a new connection, nothing lost
        assert srv.stop() == 0
        srv = restartable()
        d = q.get(timeout=5)
        assert (d.id, d.body, d.attempt) == (first, b"a", 1)
        d.ack()
        assert q.get(timeout=5).id == second
    assert srv.stop() == 0
    s = local.stats()
    assert (s.ready, s.in_flight, s.acked_total, s.enqueued_total) == (1, 0, 1, 2)  # the second given back


def _calls_per(fn, n=200) -> float:
    """Python function calls per ``fn()``, this thread's (sys.setprofile)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        for _ in range(n):
            fn()
    finally:
        sys.setprofile(None)
    return calls / n


def test_a_plain_get_ack_and_put_take_few_python_calls(tcp_server, broker):
    """The general path took 65 Python calls per put and 105 per get + ack(wait=False)."""
    broker.create_queue("q", max_bytes=2**24)
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")

        def get_ack():
            q.get(timeout=5).ack(wait=False)

        for _ in range(300):
            q.put(b"x" * 64)
        assert _calls_per(lambda: q.put(b"x" * 64)) <= 30
        assert _calls_per(get_ack) <= 50
        q.flush()
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (300, 0, 200)


# ---------------------------------------------------------------- the asyncio client
def test_the_asyncio_fast_paths_send_what_the_general_path_sends(tcp_server, broker):
    broker.create_queue("q")

    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.queue("q")
            writes = _noted_writes(b)
            first = await q.put(b"one")
            d = await q.get()
            await d.ack(wait=False)
            with pytest.raises(shmq.QueueEmpty, match="^queue 'q' is empty$"):
                await q.get(timeout=0.05)
            assert (d.body, d.id) == (b"one", first)
            assert writes[:3] == [
                [(MsgType.PRODUCE, {"queue": "q", "body": b"one"})],
                [(MsgType.CONSUME, {"queue": "q", "max": 1, "wait_ms": 5000})],
                [(MsgType.ACK, {"queue": "q", "deliveries": [d._tag]}),
                 (MsgType.CONSUME, {"queue": "q", "max": 1, "wait_ms": writes[2][1][1]["wait_ms"]})],
            ]
            assert 0 < writes[2][1][1]["wait_ms"] <= 50
            q.close()
            with pytest.raises(ShmqError, match="^queue handle 'q' is closed$"):
                await q.get()

    asyncio.run(main())
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 1)


def test_an_asyncio_fast_put_to_a_full_queue_retries_until_there_is_room(tcp_server, broker):
    local = full_queue(broker)

    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.queue("q")
            produced = []
            writer = b._link.writer
            write = writer.write

            def noted(data):
                produced.extend(t for t, _ in _frames(data) if t == MsgType.PRODUCE)
                write(data)

            writer.write = noted
            put = asyncio.ensure_future(q.put(b"p" * 1000))
            async with asyncio.timeout(10):  # refused at least twice: the fast try, then the general put's retries
                while len(produced) < 2:
                    await asyncio.sleep(0.005)
            assert not put.done()
            local.get().ack()  # room for one
            return await asyncio.wait_for(put, 10)

    asyncio.run(main())
    s = local.stats()
    assert (s.ready, s.in_flight, s.enqueued_total - s.ready) == (s.enqueued_total - 1, 0, 1)
