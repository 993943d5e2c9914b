"""The asyncio API on both transports: ``aio.connect()`` attached locally and
``aio.connect(url)`` over TCP run the same cases (``abroker``); then what only the local
attach has to show: an idle waiting get costs no CPU, a put from another process wakes
it, a cancelled get leaves nothing leased, a killed holder's deliveries come back."""

import asyncio
import os
import signal
import subprocess
import sys

import psutil
import pytest

import shmq
from shmq import aio
from shmq.engine import aio as local_aio
from shmq.engine.aio import LocalAsyncBroker
from shmq.engine.doze import Doorbell


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def rings_only(monkeypatch):
    """Local waits woken only by their doorbells' rings: no slice ends within a test."""
    monkeypatch.setattr(Doorbell, "SLICE_NS", 30 * 10**9)
    monkeypatch.setattr(local_aio, "WAIT_SLICE_S", 30.0)


@pytest.fixture(params=["local", "tcp"])
def abroker(request, broker):
    """``await abroker()``: an asyncio broker on the test's namespace, local (its waits
    woken by rings only) or over TCP."""
    if request.param == "local":
        request.getfixturevalue("rings_only")
        return lambda: aio.connect(namespace=broker.namespace)
    url = request.getfixturevalue("tcp_server").url
    return lambda: aio.connect(url)


# ---------------------------------------------------------------- the same cases on both
def test_put_get_ack_and_async_for(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q")
            ids = [await q.put(b"m%d" % i, headers={"i": i}) for i in range(5)]
            assert ids == [1, 2, 3, 4, 5]
            seen = []
            async for d in q:
                seen.append((d.id, d.body, d.headers["i"], d.attempt, d.queue))
                await d.ack()
                if len(seen) == 5:
                    break
            assert seen == [(i + 1, b"m%d" % i, i, 1, "q") for i in range(5)]
            s = await q.stats()
            assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 5)
            assert await b.list_queues() == ["q"]

    run(main())


def test_a_waiting_get_does_not_block_puts(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q")
            getter = asyncio.create_task(q.get(timeout=30))
            await asyncio.sleep(0)  # the get starts waiting first
            await q.put(b"wake")
            d = await asyncio.wait_for(getter, 10)  # woken, not at its timeout
            assert d.body == b"wake"
            await d.nack()
            d2 = await q.get_nowait()
            assert d2.attempt == 2
            assert await q.ack_many([d2]) == 1

    run(main())


def test_errors_are_the_engine_errors(abroker):
    async def main():
        async with await abroker() as b:
            with pytest.raises(shmq.QueueNotFound):
                await b.queue("missing")
            q = await b.create_queue("q", max_bytes=4096, max_message_bytes=976)
            with pytest.raises(shmq.QueueEmpty, match="^queue 'q' is empty$"):
                await q.get(timeout=0.05)
            with pytest.raises(shmq.QueueEmpty):
                await q.get_many(5, timeout=0)
            for _ in range(4):
                await q.put_nowait(b"x" * 976)
            with pytest.raises(shmq.QueueFull, match="^queue 'q' is full$"):
                await q.put(b"y", timeout=0.05)
            with pytest.raises(ValueError, match="timeout must be >= 0"):
                await q.get(timeout=-1)
            d = await q.get_nowait()
            await d.ack()
            with pytest.raises(shmq.DeliveryExpired):
                await d.ack()
            assert await q.purge() == 3

    run(main())


def test_a_full_put_waits_for_room_made_by_an_ack(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q", max_bytes=4096, max_message_bytes=976)
            assert await q.put_many([b"x" * 976] * 4) == [1, 2, 3, 4]
            putter = asyncio.create_task(q.put(b"late", timeout=30))
            d = await q.get(timeout=5)
            await asyncio.sleep(0)  # the put found the queue full
            await d.ack()
            assert await asyncio.wait_for(putter, 10) == 5  # woken, not at its timeout
            assert (await q.stats()).ready == 4

    run(main())


def test_a_cancelled_get_leaves_nothing_behind(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(q.get(), 0.05)
            await q.put(b"after")
            d = await q.get(timeout=5)
            assert (d.body, d.attempt) == (b"after", 1)
            await d.ack()
            s = await q.stats()
            assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 1)

    run(main())


def test_the_work_queue_options(abroker):
    async def main():
        async with await abroker() as b:
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
            async with d.process():
                pass
            assert (await q.stats()).acked_total == 1

    run(main())


def test_consume_with_prefetch_and_aclose_gives_back(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q")
            await q.put_many([b"%d" % i for i in range(6)])
            got = []
            async with q.consume(prefetch=4) as sub:
                async for d in sub:
                    got.append(d.body)
                    await d.ack()
                    if len(got) == 2:
                        break
            assert got == [b"0", b"1"]
            rest = await q.get_many(10, timeout=5)
            assert sorted(d.body for d in rest) == [b"2", b"3", b"4", b"5"]
            assert {d.attempt for d in rest} == {1}
            await q.ack_many(rest)

    run(main())


def test_streams_read_waits_and_groups(abroker):
    async def main():
        async with await abroker() as b:
            s = await b.create_stream("events", partitions=1)
            reader = asyncio.create_task(s.read(0, 0, 10, timeout=30))
            await asyncio.sleep(0)
            await s.append(b"a")
            assert [r.value for r in await asyncio.wait_for(reader, 10)] == [b"a"]
            assert await s.read(0, 1, 10, timeout=0.05) == []
            async with await s.consumer("g") as c:
                assert [r.value for r in await c.poll(timeout=10)] == [b"a"]
                poller = asyncio.create_task(c.poll(timeout=30))
                await asyncio.sleep(0)
                await s.append_many([b"b", b"c"])
                assert [r.value for r in await asyncio.wait_for(poller, 10)] == [b"b", b"c"]
                await c.commit()
            assert await s.committed("g") == {0: 3}

    run(main())


def test_request_answered_by_a_worker_on_the_same_broker(abroker):
    async def main():
        async with await abroker() as b:
            jobs = await b.create_queue("jobs")

            async def worker():
                d = await jobs.get(timeout=10)
                assert await d.reply(d.body.upper()) is True
                await d.ack()

            task = asyncio.create_task(worker())
            assert await b.request("jobs", b"ping", timeout=10) == b"PING"
            await task
            with pytest.raises(shmq.RequestTimeout, match="no reply to the request on queue 'jobs'"):
                await b.request("jobs", b"nobody", timeout=0.1)
            await b.create_exchange("fan", type="fanout")
            await b.bind("fan", "jobs")
            assert await b.publish("fan", b"p") == 1
            assert await b.list_exchanges() == ["fan"]

    run(main())


def test_a_publish_with_a_dedup_id_waits_for_room_the_others_raise(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q", max_bytes=4096, max_message_bytes=976, dedup_window=60.0)
            await b.create_exchange("x", type="fanout")
            await b.bind("x", "q")
            for i in range(4):
                assert await b.publish("x", b"%d" % i + b"." * 975) == 1
            with pytest.raises(shmq.QueueFull, match="^queue 'q' is full$"):
                await b.publish("x", b"no room")
            publisher = asyncio.create_task(b.publish("x", b"kept", dedup_id="k", timeout=30))
            d = await q.get(timeout=5)
            await d.ack()
            assert await asyncio.wait_for(publisher, 10) == 1
            assert [m.body for m in await q.peek(10)][-1] == b"kept"

    run(main())


def test_keepalive_renews_until_the_ack(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q", visibility_timeout=0.3)
            await q.put(b"long job")
            d = await q.get(timeout=5)
            async with d.keepalive(every=0.05) as ka:
                while ka.renewals < 10:  # 0.5s and more: the lease would have lapsed without it
                    await asyncio.sleep(0.05)
                assert (await q.stats()).in_flight == 1
                await d.ack()
            assert ka.error is None
            s = await q.stats()
            assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 1, 0)

    run(main())


def test_a_consumer_over_two_streams_wakes_for_either(abroker):
    async def main():
        async with await abroker() as b:
            await b.create_stream("a", partitions=1)
            s2 = await b.create_stream("b", partitions=1)
            async with await b.consumer("g", streams=["a", "b"]) as c:
                assert await c.poll(timeout=0.05) == []
                poller = asyncio.create_task(c.poll(timeout=30))
                await asyncio.sleep(0)
                await s2.append(b"on b")
                assert [(r.stream, r.value) for r in await asyncio.wait_for(poller, 10)] == [("b", b"on b")]
            async with await b.consumer("g3", pattern="^none-yet") as c:  # nothing to wait on: a slice
                assert await c.poll(timeout=0.05) == []

    run(main())


def test_a_laned_queue_wakes_waiting_gets_and_puts(abroker):
    async def main():
        async with await abroker() as b:
            q = await b.create_queue("q", lanes=2, max_bytes=8192, max_message_bytes=976)
            getters = [asyncio.create_task(q.get(timeout=30)) for _ in range(2)]
            await asyncio.sleep(0)
            await q.put_many([b"a", b"b"])
            got = await asyncio.wait_for(asyncio.gather(*getters), 10)
            assert sorted(d.body for d in got) == [b"a", b"b"]
            await q.ack_many(got)
            n = 0
            while True:  # fill every lane
                try:
                    await q.put_nowait(b"x" * 976)
                except shmq.QueueFull:
                    break
                n += 1
            putter = asyncio.create_task(q.put(b"room", timeout=30))
            await asyncio.sleep(0)
            taken = []
            while len(taken) < n:  # every lane emptied (room in another lane than the first is
                taken += await q.get_many(n, timeout=5)  # seen at a doorbell's slice: docs/CLIENTS.md)
            await q.ack_many(taken)
            assert await asyncio.wait_for(putter, 10) > 0

    run(main())


# ---------------------------------------------------------------- local only
def test_connect_without_url_is_local_and_refuses_tcp_options(namespace):
    async def main():
        with pytest.raises(ValueError, match="^timeout: options of tcp:// urls, not of a local attach$"):
            await aio.connect(timeout=3)
        with pytest.raises(shmq.NamespaceNotFound):
            await aio.connect(namespace=namespace, create=False)
        async with await aio.connect(namespace=namespace) as b:
            assert isinstance(b, LocalAsyncBroker) and b.namespace == namespace
            assert await b.list_queues() == []

    run(main())


def test_every_public_name_of_the_tcp_handles_is_on_the_local_ones(broker, tcp_server):
    """Broker, queue, delivery, subscription, stream, consumer and multi-stream consumer:
    the local handles answer to every public name the TCP ones have (but the broker's
    connection: url, host, port, endpoint, token, options, server_info)."""
    broker.create_queue("q")
    broker.create_stream("s", partitions=1)

    async def handles(b):
        q = await b.queue("q")
        await q.put(b"x")
        s = await b.stream("s")
        hs = {"broker": b, "queue": q, "delivery": await q.get(timeout=5), "subscription": q.consume(prefetch=2),
              "stream": s, "consumer": await s.consumer("g"), "multi": await b.consumer("g2", streams=["s"])}
        return {k: {n for n in dir(h) if not n.startswith("_")} for k, h in hs.items()}, hs

    async def main():
        async with await aio.connect(tcp_server.url) as t, await aio.connect(namespace=broker.namespace) as local:
            (tcp_names, th), (local_names, lh) = await handles(t), await handles(local)
            missing = {k: sorted(tcp_names[k] - local_names[k]) for k in tcp_names}
            assert missing == {"broker": ["endpoint", "host", "options", "port", "server_info", "token", "url"],
                               "queue": [], "delivery": [], "subscription": [], "stream": [], "consumer": [],
                               "multi": []}
            for hs in (th, lh):
                await hs["subscription"].aclose()
                await hs["consumer"].close()
                await hs["multi"].close()

    run(main())


def test_an_idle_waiting_get_costs_no_cpu(broker):
    async def main():
        async with await aio.connect(namespace=broker.namespace) as b:
            q = await b.create_queue("q")
            getter = asyncio.create_task(q.get(timeout=30))
            await asyncio.sleep(0.2)  # (settling in, not synchronisation: the measure below is what counts)
            me = psutil.Process()
            before, t0 = me.cpu_times(), asyncio.get_running_loop().time()
            await asyncio.sleep(1.0)
            after, t1 = me.cpu_times(), asyncio.get_running_loop().time()
            used = (after.user - before.user) + (after.system - before.system)
            assert used / (t1 - t0) < 0.05, f"an idle get used {used:.3f}s of CPU in {t1 - t0:.2f}s"
            assert not getter.done()
            getter.cancel()

    run(main())


def _worker(*args):
    return subprocess.Popen([sys.executable, "-m", "tests._aio_local_workers", *args], stdout=subprocess.PIPE,
                            text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_put_from_another_process_wakes_a_waiting_get(broker, rings_only):
    async def main():
        async with await aio.connect(namespace=broker.namespace) as b:
            q = await b.create_queue("q")
            getter = asyncio.create_task(q.get(timeout=30))
            loop = asyncio.get_running_loop()
            while (await q.stats()).consumers_waiting == 0:  # the doorbell sleeps as a consumer
                await asyncio.sleep(0.01)
            start = loop.time()
            p = _worker("put", broker.namespace, "q", "from afar")
            d = await getter
            woke = loop.time() - start
            assert p.wait(30) == 0
            assert (d.body, d.attempt) == (b"from afar", 1)
            assert woke < 20  # generous: the process started, imported shmq and put
            await d.ack()

    run(main())


def test_a_cancelled_waiting_get_leaves_nothing_leased(broker, rings_only):
    async def main():
        async with await aio.connect(namespace=broker.namespace) as b:
            q = await b.create_queue("q")
            getters = [asyncio.create_task(q.get(timeout=30)) for _ in range(3)]
            while (await q.stats()).consumers_waiting == 0:
                await asyncio.sleep(0.01)
            for g in getters:
                g.cancel()
            await asyncio.gather(*getters, return_exceptions=True)
            await q.put(b"x")
            s = await q.stats()
            assert (s.ready, s.in_flight) == (1, 0)
            d = await q.get(timeout=5)  # the next get has it, first time round
            assert (d.body, d.attempt) == (b"x", 1)
            await d.ack()

    run(main())


def test_a_killed_holders_local_asyncio_deliveries_come_back(broker):
    q = broker.create_queue("q", visibility_timeout=600)
    q.put_many([b"a", b"b", b"c"])
    p = _worker("hold", broker.namespace, "q", "2")
    try:
        assert p.stdout.readline().split() == ["held", "1", "2"]
        assert q.stats().in_flight == 2
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    got = []
    while len(got) < 3:  # the dead holder's leases come back at a look of the queue (QueueEmpty: they never did)
        got += [(d.body, d.attempt) for d in q.get_many(10, timeout=20)]
    assert sorted(got) == [(b"a", 2), (b"b", 2), (b"c", 1)]
    assert q.stats().redelivered_total == 2
