"""Kafka's consumer semantics in the native stream Consumer, local and over TCP alike:
seek / position, pause / resume, on_assign / on_revoke, auto-commit, the iteration, and
max_poll_interval (a member that stops polling leaves the group; its next poll joins again)."""

import asyncio

import pytest

import shmq
from shmq.client import aio
from tests._consumer_workers import stalling_member
from tests._processes import WORKERS
from tests._wait import polled, wait_for
from tests.conftest import ThreadedServer


def _filled(broker, name="events", per_partition=(5, 3)):
    s = broker.create_stream(name, partitions=len(per_partition))
    for p, n in enumerate(per_partition):
        s.append_many([f"{p}-{i}".encode() for i in range(n)], partition=p)
    return s


def test_seek_and_position_move_where_poll_reads(any_broker):
    s = _filled(any_broker)
    c = s.consumer("g")
    assert len(polled(c, 8)) == 8 and (c.position(0), c.position(1)) == (5, 3)
    c.seek(0, 2)
    assert c.position(0) == 2
    assert [(r.partition, r.offset, r.value) for r in c.poll(timeout=1)] == [(0, 2, b"0-2"), (0, 3, b"0-3"),
                                                                             (0, 4, b"0-4")]
    c.seek_to_beginning()
    assert (c.position(0), c.position(1)) == (0, 0)
    c.seek_to_end(1)
    assert (c.position(0), c.position(1)) == (0, 3)
    assert sorted((r.partition, r.offset) for r in polled(c, 5)) == [(0, i) for i in range(5)]
    assert s.committed("g") == {}  # a seek commits nothing
    with pytest.raises(ValueError, match="partition 5 of stream 'events' is not assigned to this member of group 'g'"):
        c.seek(5, 0)
    with pytest.raises(ValueError, match="offsets must be ints >= 0, not -1"):
        c.seek(0, -1)
    with pytest.raises(KeyError, match="partition 5 of stream 'events' is not assigned"):
        c.position(5)
    c.close()


def test_a_paused_partition_stays_owned_and_unread_until_resumed(any_broker):
    s = _filled(any_broker)
    c = s.consumer("g")
    c.pause(0)
    assert c.paused() == [0]
    assert sorted((r.partition, r.offset) for r in polled(c, 3)) == [(1, 0), (1, 1), (1, 2)]
    assert c.poll(timeout=0.3) == []  # partition 0 has 5 records, unread
    assert c.assignment() == [0, 1] and c.position(0) == 0
    c.resume(0)
    assert c.paused() == []
    assert sorted((r.partition, r.offset) for r in polled(c, 5)) == [(0, i) for i in range(5)]
    with pytest.raises(ValueError, match="partition 7 of stream 'events' is not assigned"):
        c.pause(7)
    c.close()


def test_on_revoke_comes_before_the_positions_go_and_its_commit_counts(any_broker):
    s = _filled(any_broker)
    heard = []

    def on_revoke(ps):
        heard.append(("revoke", ps, [c1.position(p) for p in ps]))
        c1.commit()  # the revoked partition's position too: its new owner has committed nothing

    c1 = s.consumer("g", on_assign=lambda ps: heard.append(("assign", ps)), on_revoke=on_revoke)
    assert heard == []  # called from poll, not before
    assert len(polled(c1, 8)) == 8
    assert heard == [("assign", [0, 1])]
    c2 = s.consumer("g")
    assert c1.poll(timeout=0.2) == []
    assert heard == [("assign", [0, 1]), ("revoke", [1], [3])]
    assert any_broker.stream("events").committed("g") == {0: 5, 1: 3}  # seen from another handle
    assert c2.poll(timeout=0.2) == [] and c2.position(1) == 3  # nothing read twice
    c2.close()
    s.append(b"1-3", partition=1)
    assert [(r.partition, r.offset) for r in polled(c1, 1)] == [(1, 3)]
    assert heard[-1] == ("assign", [1])
    c1.close()
    assert heard[-1] == ("revoke", [0, 1], [5, 4])  # close tells on_revoke too; it committed there
    assert any_broker.stream("events").committed("g") == {0: 5, 1: 4}


def test_an_on_revoke_commit_is_refused_once_the_new_owner_committed(any_broker):
    s = _filled(any_broker)
    refused = []

    def on_revoke(ps):
        if ps == [1]:
            with pytest.raises(shmq.CommitFailed, match=r"partitions \[1\] were committed by their new owner"):
                c1.commit()
            refused.append(ps)

    c1 = s.consumer("g", on_revoke=on_revoke)
    assert len(polled(c1, 8)) == 8
    c2 = s.consumer("g")
    assert c2.poll(timeout=0.5)[0].offset == 0 and c2.assignment() == [1]
    c2.commit({1: 1})
    c1.poll(timeout=0.2)
    assert len(refused) == 1
    assert any_broker.stream("events").committed("g") == {1: 1}  # all or nothing: partition 0 not either
    c1.close()
    c2.close()


def test_auto_commit_commits_what_poll_returned_and_is_off_by_default(any_broker):
    s = _filled(any_broker)
    other = any_broker.stream("events")
    c = s.consumer("g", auto_commit=True, auto_commit_interval=0.2)
    assert len(polled(c, 8)) == 8
    wait_for(lambda: c.poll(timeout=0.05) == [] and other.committed("g") == {0: 5, 1: 3}, 10, "the auto-commit")
    c.close()
    closing = s.consumer("h", auto_commit=True, auto_commit_interval=3600)
    assert len(polled(closing, 8)) == 8
    assert other.committed("h") == {}
    closing.close()  # commits where it is
    assert other.committed("h") == {0: 5, 1: 3}
    plain = s.consumer("k")
    assert len(polled(plain, 8)) == 8
    plain.close()
    assert other.committed("k") == {}
    with pytest.raises(ValueError, match="auto_commit_interval must be > 0"):
        s.consumer("k", auto_commit=True, auto_commit_interval=0)
    with pytest.raises(TypeError, match="auto_commit must be True or False"):
        s.consumer("k", auto_commit="yes")


def test_iteration_yields_records_one_by_one_and_commit_stays_behind_it(any_broker):
    s = _filled(any_broker, per_partition=(6,))
    c = s.consumer("g")
    it = iter(c)
    assert [next(it).offset for _ in range(4)] == [0, 1, 2, 3]
    assert c.position(0) == 4
    c.commit()
    assert s.committed("g") == {0: 4}  # not past the records the iteration holds
    assert [r.offset for r in c.poll()] == [4, 5]
    c.close()
    assert list(c) == []


def test_the_asyncio_consumer_seeks_pauses_calls_back_and_iterates(broker, tcp_server):
    _filled(broker)
    heard = []

    async def run():
        async with await aio.connect(tcp_server.url) as b:
            s = await b.stream("events")
            async with await s.consumer("g", on_assign=lambda ps: heard.append(("assign", ps)),
                                        auto_commit=True, auto_commit_interval=3600) as c:
                await c.pause(1)
                got = [await c.__anext__() for _ in range(5)]
                assert heard == [("assign", [0, 1])] and await c.paused() == [1]
                await c.seek(0, 3)
                assert await c.position(0) == 3
                await c.resume(1)
                got += await c.poll(timeout=1)
                got += await c.poll(timeout=1)
                with pytest.raises(ValueError, match="partition 9 of stream 'events' is not assigned"):
                    await c.seek_to_end(9)
            return sorted((r.partition, r.offset) for r in got), await s.committed("g")

    got, committed = asyncio.run(asyncio.wait_for(run(), 30))
    assert got == sorted([(0, i) for i in range(5)] + [(0, 3), (0, 4)] + [(1, i) for i in range(3)])
    assert committed == {0: 5, 1: 3}  # the auto-commit at close


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["local", "tcp"])
def test_a_member_that_stops_polling_leaves_and_comes_back_on_its_next_poll(broker, transport):
    """Two members in two processes; the one in the child stops polling for longer than
    its max_poll_interval (1 s): its partition moves to the other, which reads it from
    the last commit (nothing lost); the child's next poll joins the group again."""
    srv = ThreadedServer(broker.namespace) if transport == "tcp" else None
    here = shmq.connect(srv.url) if srv else broker
    where = srv.url if srv else broker.namespace
    out, go = WORKERS.Queue(), WORKERS.Event()
    child = None
    try:
        s = _filled(here, per_partition=(10, 10))
        heard = []
        c = s.consumer("g", on_assign=lambda ps: heard.append(("assign", ps)),
                       on_revoke=lambda ps: heard.append(("revoke", ps)))
        child = WORKERS.Process(target=stalling_member, args=(where, "events", "g", out, go))
        child.start()
        kind, owned = out.get(timeout=60)
        assert kind == "owned" and len(owned) == 1
        mine = 1 - owned[0]
        got = []
        # the child stalls: within its max_poll_interval (and a liveness check) its partition is ours
        wait_for(lambda: got.extend(c.poll(timeout=0.2)) or c.assignment() == [0, 1], 30, "the stalled member's leave")
        got += polled(c, 20 - len(got))
        assert sorted((r.partition, r.offset) for r in got) == sorted(
            {(mine, i) for i in range(10)} | {(owned[0], i) for i in range(10)})
        assert ("revoke", [owned[0]]) in heard and heard[-1] == ("assign", [owned[0]])
        c.commit()
        go.set()
        kind, child_heard, child_owned = out.get(timeout=60)
        assert kind == "after"
        assert child_heard[:2] == [["assign", owned], ["revoke", owned]]  # its next poll: it joins again
        assert child_heard[2][0] == "assign" and len(child_owned) == 1
        child.join(30)
        assert child.exitcode == 0
        assert here.stream("events").committed("g") == {0: 10, 1: 10}
        c.close()
    finally:
        if child is not None and child.is_alive():
            child.kill()
            child.join(10)
        if srv:
            here.close()
            srv.stop()
