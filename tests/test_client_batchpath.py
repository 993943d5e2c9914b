"""The batched calls' fast paths (issue 28): a plain put_many, get_many and ack_many over
TCP, in both clients, encoded from shapes packed once per queue; to a server that says
``compact``, bodies alone as PRODUCE_BATCH's ``messages`` and the messages of a CONSUME or
a DELIVER push as rows (docs/PROTOCOL.md). The same deliveries, errors and accounting as
the general path; an older server (no ``compact``) gets the maps it knows."""

import asyncio
import multiprocessing as mp
import os
import signal

import pytest

import shmq
from shmq.client import aio
from shmq.protocol import FrameDecoder, MsgType, encode_request
from shmq.protocol.payloads import ROW_ITEMS
from shmq.protocol.shapes import acks_shape, consume_many_shape, produce_batch_shape
from tests._wait import wait_for
from tests.test_client_fastpath import _calls_per, _noted_writes, _Writes, full_queue


# ---------------------------------------------------------------- shapes
@pytest.mark.parametrize("shape, value", [
    (consume_many_shape("q", 64), 5000),
    (consume_many_shape("q", 2**20, rows=True), 0),
    (produce_batch_shape("q"), [b"x" * 64] * 64),
    (produce_batch_shape("a queue é"), [{"body": b""}, {"body": b"y" * 70_000}]),
    (acks_shape("q"), [1, 2**63 - 1] * 40),
])
def test_the_batch_shapes_encode_the_bytes_of_encode_request(shape, value):
    for msg_id in (1, 2**32 - 1):
        data = shape.frame(msg_id, value)
        assert data == encode_request(shape.msg_type, msg_id, shape.payload(value))
        dec = FrameDecoder(1 << 30)
        dec.feed(data)
        frame = dec.next_frame()
        assert (frame.type, frame.payload) == (shape.msg_type, shape.payload(value))


# ---------------------------------------------------------------- the blocking client
def test_the_batch_fast_paths_send_bodies_and_ask_for_rows(tcp_server, broker):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        assert b._link.core.compact is True
        q = b.queue("q")
        b._link.sock = watched = _Writes(b._link.sock)
        ids = q.put_many([b"a", b"b", b"c"])
        ds = q.get_many(2, timeout=5)
        q.ack_many(ds, wait=False)
        rest = q.get_many(5)
        assert q.ack_many(rest) == 1
        assert [(d.id, d.body, d.headers, d.attempt, d.priority, d.group) for d in ds + rest] == [
            (ids[0], b"a", {}, 1, 0, None), (ids[1], b"b", {}, 1, 0, None), (ids[2], b"c", {}, 1, 0, None)]
        assert all(type(d.enqueued_at) is float and d.enqueued_at > 1.7e9 for d in ds)
        slice_ms = watched.writes[1][0][1]["wait_ms"]
        assert 4900 <= slice_ms <= 5000
        assert watched.writes == [
            [(MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [b"a", b"b", b"c"]})],
            [(MsgType.CONSUME, {"queue": "q", "max": 2, "rows": True, "wait_ms": slice_ms})],
            [(MsgType.ACK, {"queue": "q", "deliveries": [d._tag for d in ds]}),
             (MsgType.CONSUME, {"queue": "q", "max": 5, "rows": True, "wait_ms": 5000})],
            [(MsgType.ACK, {"queue": "q", "deliveries": [rest[0]._tag]})],
        ]
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


def test_rows_carry_headers_priorities_and_groups(tcp_server, broker):
    local = broker.create_queue("q", priorities=3)
    local.put(b"plain")
    local.put(b"rich", {"k": "v", "n": 2}, priority=2, group="g")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        got = q.get_many(10, timeout=5)
        assert [(d.body, d.headers, d.priority, d.group) for d in got] == [
            (b"rich", {"k": "v", "n": 2}, 2, "g"), (b"plain", {}, 0, None)]
        reply = b._request(MsgType.CONSUME, {"queue": "q", "max": 5, "rows": True})  # nothing left: no rows
        assert reply == {"messages": []}
        q.ack_many(got)
        local.put(b"auto", {"h": b"\x00"})
        rows = b._request(MsgType.CONSUME, {"queue": "q", "max": 5, "rows": True, "auto_ack": True})["messages"]
        assert [row[1:4] + row[5:] for row in rows] == [[0, b"auto", 1, {"h": b"\x00"}, 0, None]]
        assert len(ROW_ITEMS) == len(rows[0])
    s = local.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


def test_a_server_that_does_not_say_compact_gets_maps(tcp_server, broker):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        b._link.core.compact = False  # as a server older than the field leaves it out
        b._link.sock = watched = _Writes(b._link.sock)
        q.put_many([b"a", b"b"])
        ds = q.get_many(2, timeout=0)
        assert [d.body for d in ds] == [b"a", b"b"]
        with q.consume(prefetch=4) as sub:
            q.put(b"c")
            d = next(sub)
            d.ack()
        q.ack_many(ds)
        assert d.body == b"c"
        sent = [f for w in watched.writes for f in w]
        assert sent[:2] == [(MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [{"body": b"a"}, {"body": b"b"}]}),
                            (MsgType.CONSUME, {"queue": "q", "max": 2, "wait_ms": 0})]
        assert (MsgType.SUBSCRIBE, {"queue": "q", "prefetch": 4}) in sent
        assert not any("rows" in payload for _t, payload in sent)
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


def test_what_is_not_plain_takes_the_general_path_and_fails_alike(tcp_server, broker):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q, other = b.queue("q"), b.queue("q")
        with pytest.raises(TypeError, match="^message body must be bytes-like, not str$"):
            q.put_many([b"a", "text"])
        assert q.put_many([bytearray(b"a"), b"b"], headers={"k": 1}) and q.put_many((b"c",))
        ds = q.get_many(3, timeout=5)
        assert [(d.body, d.headers) for d in ds] == [(b"a", {"k": 1}), (b"b", {"k": 1}), (b"c", {})]
        with pytest.raises(TypeError, match="^expected deliveries of queue 'q', got 'x'$"):
            q.ack_many([ds[0], "x"])
        assert other.ack_many(ds[:2]) == 2  # another handle's deliveries of the same queue
        q.ack_many([ds[2]], wait=False)
        with pytest.raises(shmq.DeliveryExpired, match=r"^unknown deliveries on this connection: \[\d+\]$"):
            q.ack_many([ds[2]])
        assert q.put_many([]) == []
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


def test_a_fast_put_many_to_a_full_queue_retries_until_there_is_room(tcp_server, broker):
    local = full_queue(broker)
    full = local.stats().ready
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        b._link.sock = watched = _Writes(b._link.sock)
        out = []
        import threading
        t = threading.Thread(target=lambda: out.append(q.put_many([b"p" * 500, b"p" * 400])))
        t.start()
        wait_for(lambda: sum(f[0] == MsgType.PRODUCE_BATCH for w in watched.writes for f in w) >= 2, timeout=10,
                 what="the fast try and a retry, both refused")
        assert t.is_alive()
        local.get().ack()  # room for both
        t.join(10)
        assert len(out) == 1 and len(out[0]) == 2
    s = local.stats()
    assert (s.ready, s.in_flight) == (full + 1, 0)


def test_the_batch_calls_take_few_python_calls_per_message(tcp_server, broker):
    """The general path took 7.7 Python calls per message (64 per call: put_many, get_many,
    ack_many(wait=False))."""
    broker.create_queue("q", max_bytes=2**24)
    bodies = [b"x" * 64] * 64
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")

        def batch():
            q.put_many(bodies)
            q.ack_many(q.get_many(64, timeout=5), wait=False)

        batch()
        assert _calls_per(batch, 50) / 64 <= 3  # one: each delivery made; the rest: per call
        q.flush()
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 51 * 64)


def test_a_subscription_gets_rows_with_what_each_message_carries(tcp_server, broker):
    local = broker.create_queue("q", priorities=2)
    local.put(b"h", {"k": "v"}, priority=1)
    local.put_many([b"%d" % i for i in range(20)])
    with shmq.connect(tcp_server.url) as b:
        got = []
        with b.queue("q").consume(prefetch=8) as sub:
            for d in sub:
                got.append((d.body, d.headers, d.priority))
                d.ack(wait=False)
                if len(got) == 21:
                    break
    assert got == [(b"h", {"k": "v"}, 1)] + [(b"%d" % i, {}, 0) for i in range(20)]
    wait_for(lambda: local.stats().acked_total == 21, timeout=10, what="the 21 acks")
    s = local.stats()
    assert (s.ready, s.in_flight) == (0, 0)


def _get_many_and_ack(url, acked):
    """get_many and ack_many(wait=False) for ever, saying each batch's bodies acked."""
    with shmq.connect(url) as b:
        q = b.queue("q")
        while True:
            ds = q.get_many(7, timeout=30)
            q.ack_many(ds, wait=False)
            acked.send([d.body for d in ds])


def test_a_batch_consumer_killed_between_its_acks_and_its_next_get_loses_nothing(servers, broker):
    """SIGKILL lands wherever it lands: what the server saw acked is gone, every other
    message is ready again, none twice."""
    srv = servers(broker.namespace, "--no-persist")
    q = broker.create_queue("q", visibility_timeout=300)
    n = 2100
    q.put_many([b"%d" % i for i in range(n)])
    ctx = mp.get_context("fork")
    for_parent, for_child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_get_many_and_ack, args=(srv.url, for_child), daemon=True)
    p.start()
    try:
        acked = []
        while len(acked) < n // 2:
            acked += for_parent.recv()
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        while for_parent.poll(0):
            acked += for_parent.recv()
    finally:
        if p.is_alive():
            p.kill()
            p.join(5)
    wait_for(lambda: q.stats().in_flight == 0, timeout=10, what="the killed connection's leases back")
    left = []
    while q.stats().ready:
        ds = q.get_many(500, timeout=0)
        left += [d.body for d in ds]
        q.ack_many(ds)
    s = q.stats()
    assert len(left) == len(set(left)), "a message ready twice"
    assert set(left) | set(acked) == {b"%d" % i for i in range(n)}, "a message lost"
    assert s.acked_total == n
    assert n - len(left) <= len(acked)
    srv.proc.terminate()
    srv.proc.wait(10)


# ---------------------------------------------------------------- the asyncio client
def test_the_asyncio_batch_fast_paths_send_bodies_and_ask_for_rows(tcp_server, broker):
    broker.create_queue("q")

    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.queue("q")
            writes = _noted_writes(b)
            ids = await q.put_many([b"a", b"b", b"c"])
            ds = await q.get_many(2)
            await q.ack_many(ds, wait=False)
            rest = await q.get_many(5, timeout=0)
            assert await q.ack_many(rest) == 1
            with pytest.raises(TypeError, match="^message body must be bytes-like, not int$"):
                await q.put_many([b"a", 1])
            assert [(d.id, d.body, d.headers) for d in ds + rest] == [
                (ids[0], b"a", {}), (ids[1], b"b", {}), (ids[2], b"c", {})]
            assert writes == [
                [(MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [b"a", b"b", b"c"]})],
                [(MsgType.CONSUME, {"queue": "q", "max": 2, "rows": True, "wait_ms": 5000})],
                [(MsgType.ACK, {"queue": "q", "deliveries": [d._tag for d in ds]}),
                 (MsgType.CONSUME, {"queue": "q", "max": 5, "rows": True, "wait_ms": 0})],
                [(MsgType.ACK, {"queue": "q", "deliveries": [rest[0]._tag]})],
            ]

    asyncio.run(main())
    s = broker.queue("q").stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


# ---------------------------------------------------------------- puts without waiting
def test_puts_without_waiting_go_as_bodies_alone_and_with_headers_as_maps(tcp_server, broker):
    q = broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        rq = b.queue("q")
        b._link.sock = watched = _Writes(b._link.sock)
        for i in range(3):
            rq.put(b"%d" % i, wait=False)
        rq.flush()
        rq.put(b"a", wait=False)
        rq.put(b"h", {"k": "v"}, wait=False)  # one with headers: the batch goes as maps
        rq.put(bytearray(b"c"), wait=False)
        rq.flush()
        rq.put(b"one", wait=False)  # one alone: a PRODUCE
        rq.flush()
        with pytest.raises(TypeError, match="^message body must be bytes-like, not str$"):
            rq.put("text", wait=False)
        sent = [f for w in watched.writes for f in w if f[0] != MsgType.PING]
        assert sent == [
            (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [b"0", b"1", b"2"], "each": True}),
            (MsgType.PRODUCE_BATCH, {"queue": "q", "each": True, "messages": [
                {"body": b"a"}, {"body": b"h", "headers": {"k": "v"}}, {"body": b"c"}]}),
            (MsgType.PRODUCE, {"queue": "q", "body": b"one"}),
        ]
    got = q.get_many(10, timeout=0)
    assert [(d.body, d.headers) for d in got] == [(b"0", {}), (b"1", {}), (b"2", {}), (b"a", {}), (b"h", {"k": "v"}),
                                                 (b"c", {}), (b"one", {})]
