"""One TCP handle shared by threads (the blocking client) or tasks (asyncio): a call that
waits holds back no other call, and a cancelled asyncio get leaves no message leased."""

import asyncio
import threading
import time

import pytest

import shmq
from shmq.client import aio
from tests._wait import wait_for


def in_thread(fn, *args):
    """Run ``fn`` in a thread; returns (the thread, a list that gets its result or error)."""
    out = []

    def run():
        try:
            out.append(fn(*args))
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_put_in_one_thread_returns_while_a_get_waits_in_another(broker, tcp_server):
    local = broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")
        t, got = in_thread(q.get, 20)
        wait_for(lambda: b._link.reading, what="the get to wait for its reply")  # its CONSUME is sent
        start = time.monotonic()
        q.put(b"m")
        took = time.monotonic() - start
        t.join(10)
        assert took < 2.5  # not once the get's first wait at the server (5 s, begun before) ends, or its timeout
        assert got[0].body == b"m"
        got[0].ack()
    assert local.stats().acked_total == 1


def test_a_consume_iteration_in_one_thread_and_calls_in_another_share_the_connection(broker, tcp_server):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")

        def consume():
            bodies = []
            with q.consume(prefetch=2) as it:
                for d in it:
                    bodies.append(d.body)
                    d.ack(wait=False)
                    if len(bodies) == 3:
                        return bodies

        t, got = in_thread(consume)
        wait_for(lambda: b._link.reading, what="the iteration to wait for pushes")
        for body in (b"a", b"b", b"c"):
            start = time.monotonic()
            q.put(body)
            assert time.monotonic() - start < 5
        t.join(20)
        assert got == [[b"a", b"b", b"c"]]
        wait_for(lambda: q.stats().acked_total == 3, what="the pipelined acks")


def test_threads_sharing_a_handle_get_their_own_replies(broker, tcp_server):
    local = broker.create_queue("q")
    with shmq.connect(tcp_server.url) as b:
        q = b.queue("q")

        def work(n):
            ids = [q.put(f"{n}-{i}".encode()) for i in range(100)]
            got = []
            while len(got) < 100:
                ds = q.get_many(10, timeout=10)
                got += [d.body for d in ds]
                q.ack_many(ds)
            return ids, got

        threads = [in_thread(work, n) for n in range(4)]
        for t, _ in threads:
            t.join(60)
        results = [out[0] for _, out in threads]
        assert all(isinstance(r, tuple) for r in results), results
        ids = sorted(i for r in results for i in r[0])
        assert ids == list(range(1, 401))  # each put got its own reply
        assert sorted(body for r in results for body in r[1]) == sorted(f"{n}-{i}".encode() for n in range(4)
                                                                        for i in range(100))
    stats = local.stats()
    assert (stats.ready, stats.in_flight, stats.acked_total) == (0, 0, 400)


async def until(cond, what, timeout=10.0):
    """Poll ``cond`` (a real condition) without blocking the loop, for ``timeout`` seconds at most."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} never held within {timeout}s"
        await asyncio.sleep(0.005)


def test_a_cancelled_get_leaves_no_message_leased(broker, tcp_server):
    local = broker.create_queue("q")

    def ready_again():
        stats = local.stats()
        return (stats.ready, stats.in_flight) == (1, 0)

    async def main():
        async with await aio.connect(tcp_server.url) as b, await aio.connect(tcp_server.url) as other:
            q, q2 = await b.queue("q"), await other.queue("q")
            for body, taker in ((b"one", q2), (b"two", q)):  # another connection, then the same one
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(q.get(), 0.5)  # its CONSUME still waits at the server
                assert b._link.core._abandoned != {}
                local.put(body)  # leased to that CONSUME: its late reply comes to nobody...
                await until(lambda: b._link.core._abandoned == {}, "the late reply")
                await until(ready_again, "the message to be ready again")  # ...and this client gave it back
                d = await asyncio.wait_for(taker.get(timeout=5), 10)
                assert (d.body, d.attempt) == (body, 1)  # given back unseen: no attempt counted
                await d.ack()
            assert b._link.pending == {}

    asyncio.run(asyncio.wait_for(main(), 60))
    stats = local.stats()
    assert (stats.ready, stats.in_flight, stats.acked_total) == (0, 0, 2)


def test_a_cancelled_poll_leaves_no_record_unread(broker, tcp_server):
    """A stream group member's POLL abandoned while it waits at the server (asyncio
    cancellation): the records its late reply brings were handed to nobody, so the client
    seeks its member back to them and the next poll returns them; the same for a consumer
    of several streams (POLL_MANY)."""
    s = broker.create_stream("s", partitions=2)
    t = broker.create_stream("t", partitions=1)

    async def main():
        async with await aio.connect(tcp_server.url) as b:
            one = await (await b.stream("s")).consumer("g")
            many = await b.consumer("gm", streams=["t"])
            for member, append, want in ((one, lambda: [s.append(b"a", partition=0), s.append(b"b", partition=1),
                                                        s.append(b"c", partition=0)], {b"a", b"b", b"c"}),
                                         (many, lambda: t.append_many([b"x", b"y"]), {b"x", b"y"})):
                await member.poll(timeout=0)  # (joined: its partitions assigned)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(member.poll(timeout=30), 0.5)  # its POLL still waits at the server
                assert b._link.core._abandoned != {}
                append()  # read by that POLL: its late reply comes to nobody...
                await until(lambda: b._link.core._abandoned == {}, "the late reply")
                got = []
                while len(got) < len(want):  # ...and this member reads them again
                    got += [r.value for r in await asyncio.wait_for(member.poll(timeout=5), 10)]
                assert sorted(got) == sorted(want)
            await one.close()
            await many.close()

    asyncio.run(asyncio.wait_for(main(), 60))
