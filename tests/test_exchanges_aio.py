"""Exchanges and request/reply on the asyncio client, over a real server: fanout and
topic publishes with exact accounting, bindings' admin and errors, requests answered by a
worker process and by a worker on the same connection (a waiting REQUEST does not hold
up the others), timeouts and late replies."""

import asyncio

import pytest

import shmq
from shmq.client import aio
from shmq.engine.queues.rpc import REPLY_PREFIX
from tests import _exchange_workers as workers
from tests._processes import WORKERS


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _drain(q):
    out = []
    while True:
        try:
            ds = await q.get_many(100, timeout=0)
        except shmq.QueueEmpty:
            return out
        out += [d.body for d in ds]
        await q.ack_many(ds)


async def _stream_values(s):
    return [r.value for p in range(s.partitions) for r in await s.read(p, 0, 1000)]


def test_fanout_copies_into_every_queue_and_the_stream(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            for name in ("audit", "billing"):
                await b.create_queue(name)
            await b.create_stream("history", partitions=2)
            await b.create_exchange("events", type="fanout")
            for name in ("audit", "billing", "history"):
                await b.bind("events", name)
            counts = await asyncio.gather(*(b.publish("events", b"m%d" % i, routing_key=f"k.{i}",
                                                      headers={"i": i}) for i in range(5)))
            assert counts == [3] * 5
            expected = [b"m%d" % i for i in range(5)]
            for name in ("audit", "billing"):
                assert await _drain(await b.queue(name)) == expected  # pipelined, yet in order
            assert sorted(await _stream_values(await b.stream("history"))) == expected
            assert await b.list_exchanges() == ["events"]
            info = await b.exchange_info("events")
            assert info["type"] == "fanout"
            assert sorted((x["target"], x["kind"]) for x in info["bindings"]) == [
                ("audit", "queue"), ("billing", "queue"), ("history", "stream")]
            assert await b.unbind("events", "billing") == 1
            assert await b.publish("events", b"late") == 2
            assert await _drain(await b.queue("billing")) == []
            await b.delete_exchange("events")
            assert await b.list_exchanges() == []

    run(main())


def test_topic_routes_by_pattern_once_per_target(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            for name in ("eu", "all", "paid"):
                await b.create_queue(name)
            await b.create_exchange("orders", type="topic")
            await b.bind("orders", "eu", "orders.eu.*")
            await b.bind("orders", "all", "#")
            await b.bind("orders", "paid", "*.*.paid")
            await b.bind("orders", "paid", "orders.#")  # two patterns of one target: one copy
            assert await b.publish("orders", b"1", routing_key="orders.eu.paid") == 3
            assert await b.publish("orders", b"2", routing_key="orders.us.paid") == 2
            assert await b.publish("orders", b"3", routing_key="refunds.eu") == 1
            assert await _drain(await b.queue("eu")) == [b"1"]
            assert await _drain(await b.queue("all")) == [b"1", b"2", b"3"]
            assert await _drain(await b.queue("paid")) == [b"1", b"2"]
            assert await b.unbind("orders", "paid", "orders.#") == 1
            assert await b.publish("orders", b"4", routing_key="orders.eu.new") == 2
            await b.delete_exchange("orders")

    run(main())


def test_errors_are_the_engine_errors(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            with pytest.raises(shmq.ExchangeNotFound):
                await b.publish("nope", b"x")
            await b.create_exchange("x", type="topic")
            with pytest.raises(shmq.ExchangeExists):
                await b.create_exchange("x", type="topic")
            await b.create_exchange("x", type="topic", exist_ok=True)
            with pytest.raises(shmq.ExchangeExists, match="topic exchange, not fanout"):
                await b.create_exchange("x", type="fanout", exist_ok=True)
            with pytest.raises(shmq.QueueNotFound):
                await b.bind("x", "missing")
            with pytest.raises(ValueError):
                await b.bind("x", "missing", "p" * 256)  # checked before it is sent
            await b.delete_exchange("x")
            with pytest.raises(shmq.ExchangeNotFound):
                await b.delete_exchange("x")
            assert await b.list_exchanges() == []  # the connection is still good

    run(main())


def test_request_reply_with_a_worker_process(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            await b.create_queue("rpc")
            w = WORKERS.Process(target=workers.worker, args=(tcp_server.url, "rpc", 3))
            w.start()
            try:
                replies = await asyncio.gather(*(b.request("rpc", b"job %d" % i, headers={"n": i}, timeout=30)
                                                 for i in range(3)))
            finally:
                await asyncio.to_thread(w.join, 30)
            assert replies == [b"JOB 0", b"JOB 1", b"JOB 2"]  # each request its own reply
            assert w.exitcode == 0
            assert await b.list_queues() == ["rpc"]  # the reply queues went

    run(main())


def test_a_worker_on_the_same_connection_answers_while_requests_wait(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.create_queue("rpc")
            requests = [asyncio.create_task(b.request("rpc", b"r%d" % i, timeout=30)) for i in range(4)]
            for _ in range(4):  # the REQUESTs wait; the gets and replies go by them
                d = await q.get(timeout=30)
                assert d.headers["x-reply-to"].startswith(REPLY_PREFIX)
                assert await d.reply(d.body + b"!", {"h": 1}) is True
                await d.ack()
            assert await asyncio.gather(*requests) == [b"r0!", b"r1!", b"r2!", b"r3!"]  # each its own
            assert await b.list_queues() == ["rpc"]

    run(main())


def test_a_timeout_is_request_timeout_and_a_late_reply_is_dropped(tcp_server):
    async def main():
        async with await aio.connect(tcp_server.url) as b:
            q = await b.create_queue("rpc")
            with pytest.raises(shmq.RequestTimeout, match="no reply to the request on queue 'rpc' within 0.2s"):
                await b.request("rpc", b"nobody listens", timeout=0.2)
            assert await b.list_queues() == ["rpc"]
            d = await q.get(timeout=0)  # the request itself stays for a worker
            assert await d.reply(b"late") is False  # its requester gave up: dropped
            await d.ack()
            await q.put(b"no reply wanted")
            d = await q.get(timeout=0)
            with pytest.raises(ValueError, match="asked for no reply"):
                await d.reply(b"x")
            await d.ack()
            with pytest.raises(shmq.QueueNotFound):
                await b.request("missing", b"x", timeout=1)
            assert await b.list_queues() == ["rpc"]

    run(main())
