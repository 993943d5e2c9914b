"""The asyncio client against a real server (and a scripted fake one): pipelining,
the end of a connection, cancellation. The cases it shares with the local attach
(iteration, the engine's errors, the work queue's options...) are
tests/test_aio_local.py's, run on both."""

import asyncio

import pytest

import shmq
from shmq.client import aio
from shmq.protocol import MsgType, Status
from tests.test_client_parity import FakeServer
from tests.test_server_limits import TOKEN, Server


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


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
