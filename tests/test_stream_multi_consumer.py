"""One consumer over several streams, or a pattern (``broker.consumer``), local and over
TCP alike, and asyncio: exact delivery across streams, a pattern picking up a new
stream and letting go of a deleted one, two members in two processes splitting the
(stream, partition) pairs and the survivor taking all after a SIGKILL, a poll waiting on
two streams woken by an append to the second, and bad arguments."""

import asyncio
import os
import signal
import time

import pytest

import shmq
from shmq import TopicPartition
from shmq.client import aio
from shmq.engine.shm import layout as L
from tests._multi_workers import reading_member
from tests._processes import WORKERS
from tests._wait import in_thread, polled, wait_for

TP = TopicPartition


def _streams(broker, spec):
    """Streams {name: records per partition}, each record's value "name/p/i"."""
    out = {}
    for name, per_partition in spec.items():
        s = out[name] = broker.create_stream(name, partitions=len(per_partition))
        for p, n in enumerate(per_partition):
            if n:
                s.append_many([f"{name}/{p}/{i}".encode() for i in range(n)], partition=p)
    return out


def test_records_from_two_streams_are_all_read_exactly_once(any_broker):
    _streams(any_broker, {"orders": (5, 3), "refunds": (4,)})
    heard = []
    c = any_broker.consumer("g", streams=["orders", "refunds"], on_assign=heard.append)
    assert c.subscription() == ["orders", "refunds"]
    got = polled(c, 12)
    assert heard == [[TP("orders", 0), TP("orders", 1), TP("refunds", 0)]]
    assert sorted((r.stream, r.partition, r.offset, r.value) for r in got) == sorted(
        [("orders", 0, i, f"orders/0/{i}".encode()) for i in range(5)]
        + [("orders", 1, i, f"orders/1/{i}".encode()) for i in range(3)]
        + [("refunds", 0, i, f"refunds/0/{i}".encode()) for i in range(4)])
    assert c.poll(timeout=0.2) == []
    assert c.assignment() == [TP("orders", 0), TP("orders", 1), TP("refunds", 0)]
    assert [c.position(tp) for tp in c.assignment()] == [5, 3, 4]
    c.commit()
    assert any_broker.stream("orders").committed("g") == {0: 5, 1: 3}
    assert any_broker.stream("refunds").committed("g") == {0: 4}
    c.commit({("orders", 1): 1})  # back: the group reads from there again
    assert any_broker.stream("orders").committed("g") == {0: 5, 1: 1}
    c.close()
    again = any_broker.consumer("g", streams=["orders", "refunds"])
    assert sorted((r.stream, r.partition, r.offset) for r in polled(again, 2)) == [("orders", 1, 1), ("orders", 1, 2)]
    again.close()


def test_seek_pause_and_position_take_stream_partition_pairs(any_broker):
    _streams(any_broker, {"a": (4,), "b": (3,)})
    c = any_broker.consumer("g", streams=["a", "b"])
    assert len(polled(c, 7)) == 7
    c.seek(("a", 0), 1)
    c.pause(TP("b", 0))
    assert c.paused() == [TP("b", 0)]
    c.seek_to_beginning(TP("b", 0))
    assert sorted((r.stream, r.offset) for r in polled(c, 3)) == [("a", 1), ("a", 2), ("a", 3)]
    assert c.poll(timeout=0.2) == []  # b is paused
    c.resume(("b", 0))
    assert sorted((r.stream, r.offset) for r in polled(c, 3)) == [("b", 0), ("b", 1), ("b", 2)]
    c.seek_to_end()
    assert (c.position(TP("a", 0)), c.position(TP("b", 0))) == (4, 3)
    with pytest.raises(ValueError, match=r"stream 'x' is not one of this member's \['a', 'b'\]"):
        c.seek(("x", 0), 0)
    with pytest.raises(TypeError, match=r"names partitions as \(stream, partition\) pairs"):
        c.seek(0, 0)
    with pytest.raises(KeyError, match="is not assigned to this member of group 'g'"):
        c.position(("x", 0))
    c.close()


def test_a_pattern_consumer_joins_a_stream_made_later_and_lets_go_of_a_deleted_one(any_broker):
    _streams(any_broker, {"orders.eu": (2,), "audit": (1,)})
    heard = []
    c = any_broker.consumer("g", pattern=r"orders\..*", refresh_interval=0.1,
                            on_assign=lambda tps: heard.append(("assign", tps)),
                            on_revoke=lambda tps: heard.append(("revoke", tps, [c.position(tp) for tp in tps])))
    assert c.subscription() == ["orders.eu"]  # "audit" does not match; the whole name must
    assert [r.value for r in polled(c, 2)] == [b"orders.eu/0/0", b"orders.eu/0/1"]
    _streams(any_broker, {"orders.us": (0, 3), "xorders.us": (1,)})
    got = polled(c, 3)
    assert sorted((r.stream, r.partition, r.offset) for r in got) == [("orders.us", 1, i) for i in range(3)]
    assert c.subscription() == ["orders.eu", "orders.us"]
    assert heard == [("assign", [TP("orders.eu", 0)]), ("assign", [TP("orders.us", 0), TP("orders.us", 1)])]
    any_broker.delete_stream("orders.eu")
    wait_for(lambda: c.poll(timeout=0.1) == [] and c.subscription() == ["orders.us"], 10, "orders.eu let go")
    assert heard[2:] == [("revoke", [TP("orders.eu", 0)], [2])]
    assert c.assignment() == [TP("orders.us", 0), TP("orders.us", 1)]
    c.close()


def test_a_poll_waiting_on_two_streams_is_woken_by_an_append_to_the_second(any_broker, broker):
    second = _streams(broker, {"first": (0,), "second": (0,)})["second"]  # local: its readers are counted
    c = any_broker.consumer("g", streams=["first", "second"])
    assert c.poll(timeout=0) == [] and c.assignment() == [TP("first", 0), TP("second", 0)]
    woken = []
    for i in range(15):
        t, out = in_thread(lambda: c.poll(timeout=10.0))
        # the poll sleeps as a registered reader of "second" (locally its bell, over TCP the server's doorbell)
        wait_for(lambda: second._mq[L.SI_CWAIT] > 0, 10, "a reader waiting on the second stream")
        start = time.monotonic()
        second.append(f"v{i}".encode())
        t.join(10)
        woken.append(time.monotonic() - start)
        assert [(r.stream, r.offset, r.value) for r in out["got"]] == [("second", i, f"v{i}".encode())]
    assert max(woken) < 0.5, woken  # a bound, not a speed figure: the wait is woken, not sliced
    c.close()


@pytest.mark.slow
def test_two_members_in_two_processes_split_the_pairs_and_after_a_sigkill_one_takes_all(any_broker):
    _streams(any_broker, {"a": (10, 10), "b": (10, 10)})
    where = any_broker.url if not isinstance(any_broker, shmq.Broker) else any_broker.namespace
    mine = any_broker.consumer("g", streams=["a", "b"])
    out, go = WORKERS.Queue(), WORKERS.Event()
    worker = WORKERS.Process(target=reading_member, args=(where, ["a", "b"], "g", 6, out, go))
    worker.start()
    try:
        theirs_read, theirs = out.get(timeout=60)
        theirs = sorted(TP(*tp) for tp in theirs)
        wait_for(lambda: len(mine.assignment()) == 2, 20, "the split")
        owned = mine.assignment()
        assert sorted(owned + theirs) == [TP("a", 0), TP("a", 1), TP("b", 0), TP("b", 1)]
        first = polled(mine, 20)
        assert sorted((r.stream, r.partition) for r in first) == sorted([tuple(tp) for tp in owned] * 10)
        mine.commit()
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(30)
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join(10)
    committed = {(n, p): o for n in ("a", "b") for p, o in any_broker.stream(n).committed("g").items()}
    assert {tp: committed[tp] for tp in theirs} == {  # it committed what it read, no more
        tp: 1 + max((o for s, p, o in theirs_read if (s, p) == tp), default=-1) for tp in theirs}
    rest = polled(mine, 40 - 20 - 6, timeout=30)
    wait_for(lambda: len(mine.assignment()) == 4, 20, "all four pairs")
    assert mine.poll(timeout=0.3) == []
    everything = [(r.stream, r.partition, r.offset) for r in first + rest] + [tuple(x) for x in theirs_read]
    assert sorted(everything) == sorted((s, p, o) for s in "ab" for p in (0, 1) for o in range(10))  # once each
    mine.close()


def test_asyncio_reads_two_streams_and_wakes_on_an_append(broker, tcp_server):
    streams = _streams(broker, {"a": (3,), "b": (2,)})

    async def main():
        ab = await aio.connect(tcp_server.url)
        try:
            c = await ab.consumer("g", streams=["a", "b"])
            assert isinstance(c, aio.AsyncMultiConsumer)
            got = []
            async for r in c:
                got.append((r.stream, r.offset))
                if len(got) == 5:
                    break
            assert sorted(got) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
            waiting = asyncio.ensure_future(c.poll(timeout=10.0))
            while not streams["b"]._mq[L.SI_CWAIT]:  # the server's doorbell sleeps on "b"
                await asyncio.sleep(0.005)
            streams["b"].append(b"late")
            assert [(r.stream, r.value) for r in await asyncio.wait_for(waiting, 5)] == [("b", b"late")]
            await c.commit()
            assert streams["a"].committed("g") == {0: 3} and streams["b"].committed("g") == {0: 3}
            with pytest.raises(ValueError, match="give streams or pattern, not both"):
                await ab.consumer("g", streams=["a"], pattern="a")
            await c.close()
        finally:
            await ab.close()

    asyncio.run(main())


def test_bad_arguments_are_clear_errors(any_broker, broker):
    _streams(broker, {"a": (1,)})
    with pytest.raises(ValueError, match="give streams or pattern, not both"):
        any_broker.consumer("g", streams=["a"], pattern="a")
    with pytest.raises(ValueError, match=r"give streams \(a list of names\) or pattern"):
        any_broker.consumer("g")
    with pytest.raises(ValueError, match="streams must name at least one stream"):
        any_broker.consumer("g", streams=[])
    with pytest.raises(TypeError, match="streams must be a list of stream names, not 'a'"):
        any_broker.consumer("g", streams="a")
    with pytest.raises(ValueError, match=r"pattern 'orders\(' is not a regular expression: missing \)"):
        any_broker.consumer("g", pattern="orders(")
    with pytest.raises(ValueError, match="auto_offset_reset must be 'earliest', 'latest' or 'none', not 'first'"):
        any_broker.consumer("g", pattern="a", auto_offset_reset="first")
    with pytest.raises(ValueError, match="refresh_interval must be > 0"):
        any_broker.consumer("g", pattern="a", refresh_interval=0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        any_broker.consumer("g", pattern="a", bogus=1)
    with pytest.raises(shmq.StreamNotFound, match="'nope'"):
        any_broker.consumer("g", streams=["a", "nope"])
    assert broker.stream("a").stats()["groups"]["g"]["members"] == 0  # the member on "a" left again
