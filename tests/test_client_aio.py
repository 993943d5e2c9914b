"""The asyncio client against a real server (and a scripted fake one): pipelining,
iteration, errors, the end of a connection, cancellation."""

import asyncio

import pytest

import shmq
from shmq.client import aio
from shmq.protocol import MsgType, Status
from tests.test_client_parity import FakeServer
from tests.test_server_limits import TOKEN, Server


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_put_get_ack_and_async_for(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.create_queue("q")
            ids = [await q.put(b"m%d" % i, headers={"i": i}) for i in range(5)]
            assert ids == [1, 2, 3, 4, 5]
            seen = []
            async for d in q:
                seen.append((d.id, d.body, d.headers["i"], d.attempt))
                await d.ack()
                if len(seen) == 5:
                    break
            assert seen == [(i + 1, b"m%d" % i, i, 1) for i in range(5)]
            s = await q.stats()
            assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 5)
            assert await b.list_queues() == ["q"]

    run(main())


def test_a_waiting_get_does_not_block_puts_on_the_same_connection(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.create_queue("q")
            getter = asyncio.create_task(q.get(timeout=10))
            await asyncio.sleep(0)  # let the CONSUME go out first
            await q.put(b"wake")  # answered while the CONSUME still waits
            d = await getter
            assert d.body == b"wake"
            await d.nack()
            d2 = await q.get_nowait()
            assert d2.attempt == 2
            await q.ack_many([d2])

    run(main())


def test_errors_are_the_engine_errors(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            with pytest.raises(shmq.QueueNotFound):
                await b.queue("missing")
            q = await b.create_queue("q", max_bytes=4096, max_message_bytes=976)
            with pytest.raises(shmq.QueueEmpty):
                await q.get(timeout=0.05)
            for _ in range(4):
                await q.put_nowait(b"x" * 976)
            with pytest.raises(shmq.QueueFull):
                await q.put(b"y", timeout=0.05)
            d = await q.get_nowait()
            await d.ack()
            with pytest.raises(shmq.DeliveryExpired):
                await d.ack()
            assert await q.purge() == 3

    run(main())


def test_unreachable_endpoint_is_named():
    async def main():
        with pytest.raises(shmq.BrokerUnavailable, match="127.0.0.1:1"):
            await aio.connect("tcp://127.0.0.1:1")

    run(main())


def test_an_error_with_msg_id_0_ends_every_waiting_request_and_every_later_one():
    def server(conn):
        conn.answer(conn.read())  # HELLO
        conn.answer(conn.read())  # STATS of queue()
        consumes = [conn.read(), conn.read()]
        assert [f.type for f in consumes] == [MsgType.CONSUME] * 2
        conn.end(Status.LIMIT_EXCEEDED, "a frame must arrive whole within 30s")

    async def main(url):
        async with await aio.connect(url, reconnect=False) as b:  # every later call: the same error
            q = await b.queue("q")
            waiting = await asyncio.gather(q.get(), q.get_many(5, timeout=60), return_exceptions=True)
            assert [type(e) for e in waiting] == [shmq.LimitExceeded] * 2
            with pytest.raises(shmq.LimitExceeded, match="^a frame must arrive whole within 30s$"):
                await q.put(b"x")
            assert b._link.pending == {}

    fake = FakeServer(server, connections=1)
    try:
        run(main(fake.url))
    finally:
        fake.stop()


def test_a_connection_over_the_servers_cap_raises_limit_exceeded(broker, tmp_path):
    srv = Server(broker.namespace, tmp_path, "--max-connections", "1")

    async def main():
        async with await aio.connect(srv.url, token=TOKEN) as b:
            with pytest.raises(shmq.LimitExceeded, match=r"^too many connections \(the server's limit is 1\)$"):
                await aio.connect(srv.url, token=TOKEN)
            await b.ping()  # the first is served as before

    try:
        run(main())
    finally:
        assert srv.stop() == 0


def test_a_cancelled_request_leaves_nothing_behind(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.create_queue("q")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(q.get(), 0.05)  # its CONSUME still waits on the server
            assert b._link.pending == {}
            assert await b.list_queues() == ["q"]

    run(main())


def test_the_work_queue_options_from_asyncio(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            await b.create_queue("dlq")
            q = await b.create_queue("q", priorities=3, dead_letter_queue="dlq", dedup_window=60.0)
            first = await q.put(b"low", priority=0, dedup_id="k")
            assert await q.put(b"again", dedup_id="k") == first  # seen within the window
            await q.put(b"high", priority=2, group="g")
            await q.put(b"later", delay=3600)
            await q.put_many([b"mid1", b"mid2"], priority=1)
            assert [m.body for m in await q.peek(10)] == [b"high", b"mid1", b"mid2", b"low"]
            s = await q.stats()
            assert (s.ready, s.delayed, s.ready_by_priority, s.dead_letter_depth) == (4, 1, (1, 2, 1), 0)
            d = await q.get(timeout=5)
            assert (d.body, d.priority, d.group) == (b"high", 2, "g") and d.enqueued_at > 0
            await d.reject()
            assert await b.redrive("dlq") == 1
            d = await q.get(timeout=5)
            assert (d.body, d.attempt, d.priority, d.group) == (b"high", 1, 2, "g")
            await d.ack()

    run(main())
