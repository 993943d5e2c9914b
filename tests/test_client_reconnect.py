"""Both TCP clients across a restart of a real ``shmq server`` on a fixed port: the next
call reconnects; leases bound to the lost connection say so, subscriptions and group
members come back (tests/test_client_resume.py under load; here, without reconnecting,
they say so); without reconnecting, or until it can, every call raises
BrokerUnavailable naming the endpoint."""

import asyncio
import socket

import pytest

import shmq
from shmq.client import aio
from tests._wait import in_thread, wait_for


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture
def restartable(broker, servers):
    """``start()``: a ``shmq server`` of the test's namespace, always on one port; one
    still running at the end (a failed assertion midway) is stopped."""
    port = free_port()
    started = []

    def start():
        started.append(servers(broker.namespace, "--port", str(port), "--no-persist"))
        return started[-1]

    yield start
    for srv in started:
        srv.stop()


def test_a_handle_reconnects_at_its_next_call_and_its_old_leases_are_expired(broker, restartable):
    local = broker.create_queue("q")
    local.put(b"m")
    srv = restartable()
    with shmq.connect(srv.url) as b:
        q = b.queue("q")
        d = q.get(timeout=5)
        assert srv.stop() == 0  # the server gives back what the connection held
        srv = restartable()
        assert b.list_queues() == ["q"]  # a new connection: the old one's close was noticed before sending
        with pytest.raises(shmq.DeliveryExpired,
                           match=rf"^delivery q#1 was leased on a connection to {b.endpoint} that has ended: "):
            d.ack()
        with pytest.raises(shmq.DeliveryExpired, match="that has ended"):
            q.ack_many([d])
        again = q.get(timeout=5)
        assert (again.id, again.body, again.attempt) == (d.id, b"m", 2)
        again.ack()
    assert srv.stop() == 0
    stats = local.stats()
    assert (stats.ready, stats.in_flight, stats.acked_total) == (0, 0, 1)


def test_a_call_waiting_when_the_server_stops_raises_outcome_unknown(broker, restartable):
    broker.create_queue("q")
    srv = restartable()
    with shmq.connect(srv.url) as b:
        q = b.queue("q")
        t, outcome = in_thread(lambda: q.get(timeout=30))
        wait_for(lambda: b._link.reading, what="the get to wait for its reply")
        assert srv.stop() == 0
        t.join(20)
        assert not t.is_alive() and "got" not in outcome
        error = outcome["error"]
        assert type(error) is shmq.OutcomeUnknown  # its CONSUME was sent; what it leased was given back
        assert str(error).startswith(f"lost the connection to {b.endpoint}: ")  # closed, or reset
        assert str(error).endswith(" (the CONSUME was sent: whether it was carried out is unknown)")
        srv = restartable()
        assert b.list_queues() == ["q"]
    assert srv.stop() == 0


def test_until_it_can_reconnect_every_call_raises_broker_unavailable(broker, restartable):
    broker.create_queue("q")
    srv = restartable()
    with shmq.connect(srv.url, retries=2, backoff=(0.01, 0.02)) as b:
        assert srv.stop() == 0
        for _ in range(3):
            with pytest.raises(shmq.BrokerUnavailable,
                               match=rf"^cannot connect to {b.endpoint}: .*\(gave up reconnecting after 3 tries in "):
                b.list_queues()
        srv = restartable()
        assert b.list_queues() == ["q"]
    assert srv.stop() == 0


def test_without_reconnect_every_call_after_the_loss_raises_broker_unavailable(broker, restartable):
    broker.create_queue("q")
    srv = restartable()
    with shmq.connect(srv.url, reconnect=False) as b:
        assert srv.stop() == 0
        srv = restartable()
        for _ in range(3):
            with pytest.raises(shmq.BrokerUnavailable,
                               match=rf"^lost the connection to {b.endpoint}: connection closed by the server$"):
                b.list_queues()
    with pytest.raises(shmq.BrokerUnavailable, match=rf"^lost the connection to {b.endpoint}"):
        b.list_queues()  # closed: no reconnect either
    assert srv.stop() == 0


def test_a_closed_handle_never_reconnects(broker, tcp_server):
    b = shmq.connect(tcp_server.url)
    b.close()
    for _ in range(2):
        with pytest.raises(shmq.BrokerUnavailable, match=rf"^connection to {b.endpoint} is closed$"):
            b.ping()


def test_subscriptions_and_group_members_come_back_with_the_connection(broker, restartable):
    local = broker.create_queue("q")
    local.put_many([b"a", b"b"])
    broker.create_stream("s", partitions=1, max_bytes=1 << 16).append(b"r")
    srv = restartable()
    told = []
    with shmq.connect(srv.url) as b:
        it = b.queue("q").consume(prefetch=1)
        first = next(it)
        assert first.body == b"a"
        member = b.stream("s").consumer("g", on_revoke=lambda ps: told.append(("revoke", ps)),
                                        on_assign=lambda ps: told.append(("assign", ps)))
        assert [r.value for r in member.poll(timeout=5)] == [b"r"]
        assert srv.stop() == 0
        srv = restartable()
        b.ping()  # reconnected
        assert first.ack(wait=False) is None  # its lease went with the connection: nothing sent, it comes again
        again = next(it)  # subscribed again, prefetch 1, on the new connection
        assert (again.body, again.attempt) == (b"a", 2)
        again.ack()
        assert (next(it).body, it.prefetch) == (b"b", 1)
        assert [r.value for r in member.poll(timeout=5)] == [b"r"]  # joined again: nothing was committed
        assert told == [("assign", [0]), ("revoke", [0]), ("assign", [0])]  # as a rebalance
        it.close()
        member.close()
        b.ping()  # no deferred error from the old subscription or member
    assert srv.stop() == 0
    broker.delete_stream("s")


def test_without_reconnecting_subscriptions_and_group_members_end_with_their_connection(broker, restartable):
    local = broker.create_queue("q")
    local.put_many([b"a", b"b"])
    broker.create_stream("s", partitions=1, max_bytes=1 << 16).append(b"r")
    srv = restartable()
    with shmq.connect(srv.url, reconnect=False) as b:
        it = b.queue("q").consume(prefetch=1)
        assert next(it).body == b"a"
        member = b.stream("s").consumer("g")
        assert [r.value for r in member.poll(timeout=5)] == [b"r"]
        assert srv.stop() == 0
        srv = restartable()
        for _ in range(2):
            with pytest.raises(shmq.BrokerUnavailable, match=rf"^lost the connection to {b.endpoint}"):
                next(it)
            with pytest.raises(shmq.BrokerUnavailable, match=rf"^lost the connection to {b.endpoint}"):
                member.poll(timeout=0)
        it.close()  # nothing to cancel: quietly
    with shmq.connect(srv.url) as b:
        with b.queue("q").consume(prefetch=2) as again:  # consume again: both messages, given back
            assert sorted(next(again).body for _ in range(2)) == [b"a", b"b"]
        with b.stream("s").consumer("g") as member:
            assert [r.value for r in member.poll(timeout=5)] == [b"r"]  # nothing was committed
    assert srv.stop() == 0
    broker.delete_stream("s")


def test_the_asyncio_client_reconnects_alike(broker, restartable):
    local = broker.create_queue("q")
    local.put_many([b"m", b"n"])
    running = [restartable()]

    async def restart():
        assert await asyncio.to_thread(running[-1].stop) == 0
        running.append(await asyncio.to_thread(restartable))

    async def main(url):
        async with await aio.connect(url) as b:
            q = await b.queue("q")
            d = await q.get(timeout=5)
            it = q.consume(prefetch=1)
            assert (await it.__anext__()).body == b"n"
            await restart()
            assert await b.list_queues() == ["q"]
            with pytest.raises(shmq.DeliveryExpired, match="that has ended: the server gave it back$"):
                await d.ack()
            resumed = await it.__anext__()  # subscribed again on the new connection
            await resumed.ack()
            await it.aclose()
            again = [resumed] + await q.get_many(2, timeout=5)
            assert sorted((m.body, m.attempt) for m in again) == [(b"m", 2), (b"n", 2)]
            assert await q.ack_many(again[1:]) == 1
        async with await aio.connect(url, retries=1, backoff=(0.01, 0.01)) as b:
            assert await asyncio.to_thread(running[-1].stop) == 0
            for _ in range(2):
                with pytest.raises(shmq.BrokerUnavailable, match=r"\(gave up reconnecting after 2 tries in "):
                    await b.ping()
            running.append(await asyncio.to_thread(restartable))
            await b.ping()
        async with await aio.connect(url, reconnect=False) as b:
            await restart()
            for _ in range(2):
                with pytest.raises(shmq.BrokerUnavailable,
                                   match=rf"^lost the connection to {b.endpoint}: connection closed by the server$"):
                    await b.ping()

    asyncio.run(asyncio.wait_for(main(running[0].url), 60))
    assert running[-1].stop() == 0
    stats = local.stats()
    assert (stats.ready, stats.in_flight, stats.acked_total) == (0, 0, 2)
