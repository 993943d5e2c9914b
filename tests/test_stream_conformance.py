"""One suite of stream behaviour, run against both transports (local attach and TCP), then
what only TCP has: the server as the group member of each connection (a closed or killed
connection leaves), compressed batches, the asyncio client, waiting READs and POLLs."""

import asyncio
import inspect
import os
import signal
import socket
import struct
import threading
import time

import pytest

import shmq
import shmq.client
from shmq.client import aio
from shmq.engine.streams.partitioner import partition_of
from shmq.protocol import compression
from tests._processes import WORKERS
from tests.conftest import ThreadedServer
from tests.test_server_limits import TOKEN, Server


def until(condition, seconds=10.0, what="the condition"):
    """Wait (bounded) for ``condition()`` to hold; its last value."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)
    return value


# ---------------------------------------------------------------- both transports

def test_create_list_delete_and_their_errors(any_broker):
    s = any_broker.create_stream("events", partitions=3, max_bytes=1 << 16, max_message_bytes=1000)
    assert (s.name, s.partitions, s.max_message_bytes, s.retention, s.durability) == ("events", 3, 1000, "drop",
                                                                                       "snapshot")
    with pytest.raises(shmq.StreamExists, match="stream 'events' already exists"):
        any_broker.create_stream("events")
    again = any_broker.create_stream("events", exist_ok=True)  # the existing one, as it is
    assert again.partitions == 3
    with pytest.raises(shmq.StreamExists, match="'events' exists .* with other settings: partitions 3 \\(asked 1\\)"):
        any_broker.create_stream("events", partitions=1, exist_ok=True)
    assert any_broker.stream("events").partitions == 3
    with pytest.raises(shmq.StreamNotFound, match="no stream 'missing'"):
        any_broker.stream("missing")
    with pytest.raises(shmq.StreamNotFound, match="no stream 'missing'"):
        any_broker.delete_stream("missing")
    with pytest.raises(ValueError, match="partitions must be positive, not 0"):
        any_broker.create_stream("other", partitions=0)
    with pytest.raises(ValueError, match="partitions must be at most 256, not 300"):
        any_broker.create_stream("other", partitions=300)
    with pytest.raises(TypeError, match="partitions must be an int, not str"):
        any_broker.create_stream("other", partitions="4")
    with pytest.raises(ValueError, match="retention must be 'drop' or 'block', not 'keep'"):
        any_broker.create_stream("other", retention="keep")
    with pytest.raises(ValueError, match="invalid queue name"):
        any_broker.create_stream("bad name")
    any_broker.create_stream("alpha", partitions=1)
    assert any_broker.list_streams() == ["alpha", "events"]
    assert any_broker.list_queues() == []  # streams are not queues
    any_broker.delete_stream("alpha")
    with pytest.raises(shmq.StreamNotFound):
        any_broker.stream("alpha")
    assert any_broker.list_streams() == ["events"]


def test_keys_choose_a_stable_partition_and_offsets_are_dense(any_broker):
    s = any_broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    metas = [s.append(b"v%d" % i, key=b"user-%d" % (i % 3), headers={"i": i, "raw": b"\x00"}) for i in range(30)]
    for k in range(3):
        key = b"user-%d" % k
        assert {m.partition for i, m in enumerate(metas) if i % 3 == k} == {partition_of(key, 4)}
    for p in range(4):
        offs = [m.offset for m in metas if m.partition == p]
        assert offs == list(range(len(offs))) and s.offsets(p) == (0, len(offs))
    assert all(isinstance(m, shmq.RecordMetadata) and abs(m.timestamp - time.time()) < 60 for m in metas)
    m7 = metas[7]
    (r,) = s.read(m7.partition, m7.offset, max_records=1)
    assert isinstance(r, shmq.Record)
    assert (r.stream, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp) == (
        "events", m7.partition, m7.offset, b"user-1", b"v7", {"i": 7, "raw": b"\x00"}, m7.timestamp)


def test_append_many_lands_whole_in_a_partition_and_replays(any_broker):
    s = any_broker.create_stream("events", partitions=3, max_bytes=1 << 16)
    batches = [s.append_many([b"a", b"b", b"c"]) for _ in range(3)]
    parts = [{m.partition for m in ms} for ms in batches]
    assert all(len(p) == 1 for p in parts) and len(set().union(*parts)) == 3  # each whole, in turn
    assert [m.offset for m in batches[0]] == [0, 1, 2]
    assert len({m.timestamp for m in batches[0]}) == 1
    assert s.append_many([]) == []
    ms = s.append_many([b"x", bytearray(b"y")], keys=[b"k1", None], headers=[None, {"h": "v"}], partition=1)
    assert [(m.partition, m.offset) for m in ms] == [(1, 3), (1, 4)]
    rs = s.read(1, 3)
    assert [(r.key, r.value, r.headers) for r in rs] == [(b"k1", b"x", {}), (None, b"y", {"h": "v"})]
    first = s.read(1, 0)
    assert [r.offset for r in first] == [0, 1, 2, 3, 4] and s.read(1, 0) == first  # replay: the same records
    assert s.read(1, 1, max_records=2) == first[1:3]
    assert s.read(1, 5) == []  # at the end, no wait


def test_retention_drops_the_oldest_and_out_of_range_says_where(any_broker):
    s = any_broker.create_stream("events", partitions=1, max_bytes=4096)
    metas = [s.append(b"x" * 200) for _ in range(100)]
    assert [m.offset for m in metas] == list(range(100))
    earliest, end = s.offsets(0)
    assert 0 < earliest < end == 100
    with pytest.raises(shmq.OffsetOutOfRange, match=rf"offset {earliest - 1} is outside \[{earliest}, 100\]") as e:
        s.read(0, earliest - 1)
    assert (e.value.earliest, e.value.end) == (earliest, 100)
    with pytest.raises(IndexError) as e:  # OffsetOutOfRange is an IndexError too
        s.read(0, 101)
    assert (e.value.earliest, e.value.end) == (earliest, 100)
    assert [r.offset for r in s.read(0, earliest)] == list(range(earliest, 100))
    stats = s.stats()
    assert stats["partitions"][0]["dropped_total"] == earliest and stats["partitions"][0]["appended_total"] == 100
    assert (stats["stream"], stats["retention"], stats["groups"]) == ("events", "drop", {})


def test_read_at_the_end_waits_and_an_append_from_another_thread_wakes_it(any_broker, broker):
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append(b"first", partition=1)
    t0 = time.monotonic()
    assert s.read(1, 1, timeout=0.2) == [] and time.monotonic() - t0 >= 0.2
    local = broker.stream("events")  # another handle, as another process would have
    reading = threading.Event()

    def append_later():
        reading.wait(10)
        local.append(b"late", partition=1)

    t = threading.Thread(target=append_later)
    t.start()
    try:
        reading.set()
        t0 = time.monotonic()
        got = s.read(1, 1, timeout=30)
        assert [(r.offset, r.value) for r in got] == [(1, b"late")] and time.monotonic() - t0 < 10
    finally:
        t.join(10)
        local.close()


def test_two_members_split_the_partitions_and_a_closed_one_hands_them_over(any_broker):
    s = any_broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    for p in range(4):
        s.append_many([b"p%d-%d" % (p, i) for i in range(10)], partition=p)
    a = s.consumer("billing")
    assert a.assignment() == [0, 1, 2, 3] and a.group == "billing"
    b = s.consumer("billing")
    owned_a, owned_b = a.assignment(), b.assignment()
    assert sorted(owned_a + owned_b) == [0, 1, 2, 3] and not set(owned_a) & set(owned_b)
    got_a = a.poll(max_records=100, timeout=1)
    assert {r.partition for r in got_a} == set(owned_a) and len(got_a) == 20
    assert a.position(owned_a[0]) == 10
    a.commit()
    a.close()
    a.close()  # twice is fine
    with pytest.raises(shmq.ShmqError, match="consumer of group 'billing' is closed"):
        a.poll(timeout=0)
    assert b.assignment() == [0, 1, 2, 3]
    got_b = b.poll(max_records=100, timeout=1)
    assert len(got_b) == 20 and {r.partition for r in got_b} == set(owned_b)  # a's resume from its commit
    b.commit()
    assert s.lag("billing") == {0: 0, 1: 0, 2: 0, 3: 0}
    assert s.committed("billing") == {0: 10, 1: 10, 2: 10, 3: 10}
    with s.consumer("audit") as other:  # another group reads everything again
        assert len(other.poll(max_records=100, timeout=1)) == 40
        assert s.groups() == ["audit", "billing"]
        assert s.stats()["groups"]["audit"] == {"members": 1, "lag": {0: 10, 1: 10, 2: 10, 3: 10}, "committed": {}}
    b.close()


def test_the_commit_fence_and_reset(any_broker):
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"x"] * 5, partition=0)
    a = s.consumer("g")
    assert len(a.poll(timeout=1)) == 5
    b = s.consumer("g")  # a rebalance: a's next commit is fenced
    with pytest.raises(shmq.CommitFailed, match="rebalanced"):
        a.commit()
    assert s.committed("g") == {}
    (mine,) = a.assignment()
    a.commit({mine: 0})
    with pytest.raises(shmq.ShmqError, match="live members"):
        s.reset("g", to="latest")
    a.close()
    b.close()
    s.reset("g", to="latest")
    assert s.committed("g") == {0: 5, 1: 0} and s.lag("g") == {0: 0, 1: 0}
    s.reset("g", to={0: 2})
    assert s.lag("g") == {0: 3, 1: 0}
    with s.consumer("g") as c:
        assert [r.offset for r in c.poll(timeout=1)] == [2, 3, 4]
    with pytest.raises(ValueError, match="reset to 'earliest', 'latest'"):
        s.reset("g", to="middle")
    with s.consumer("fresh", auto_offset_reset="latest") as c:
        s.append(b"new", partition=0)
        assert [r.value for r in c.poll(timeout=5)] == [b"new"]


def test_a_partition_that_came_back_resumes_from_the_commit_and_its_stale_commit_fails(any_broker):
    """Issue 20: a polls 10 of partition 1; c joins, reads 0..49, commits 50, leaves; a
    must go on from 50 (not its stale 10), and may not commit 1 before it polled again
    (issue 27: the owner may move its commit back, a stale member may not)."""
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(100)], partition=1)
    a = s.consumer("g")
    assert [(r.partition, r.offset) for r in a.poll(max_records=10, timeout=1)] == [(1, o) for o in range(10)]
    c = s.consumer("g")
    assert c.assignment() == [1]
    assert [r.offset for r in c.poll(max_records=50, timeout=1)] == list(range(50))
    c.commit()
    c.close()
    with pytest.raises(shmq.CommitFailed, match=r"generation \d+ -> \d+\) since this member's last poll: "
                                                r"partitions \[1\] went to another member and came back"):
        a.commit({0: 0, 1: 10})  # all or nothing: partition 0, a's throughout, is not moved either
    assert s.committed("g") == {1: 50}
    assert [(r.partition, r.offset) for r in a.poll(max_records=5, timeout=1)] == [(1, o) for o in range(50, 55)]
    assert a.position(1) == 55
    a.commit()
    assert s.committed("g") == {0: 0, 1: 55}
    a.commit({1: 15})  # the owner moves it back; its own position stays
    assert s.committed("g") == {0: 0, 1: 15} and a.position(1) == 55
    a.close()


def test_records_polled_by_a_member_that_lost_them_are_read_again(any_broker):
    """Issue 20: a polls 0..59; c joins, so a's commit fails; c reads 0..29, commits 30 and
    leaves; a must read 30.. again (not go on at 60, skipping 30..59 for the group)."""
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(100)], partition=1)
    a = s.consumer("g")
    assert [r.offset for r in a.poll(max_records=60, timeout=1)] == list(range(60))
    c = s.consumer("g")
    with pytest.raises(shmq.CommitFailed, match="rebalanced"):
        a.commit()
    assert s.committed("g") == {}
    assert [r.offset for r in c.poll(max_records=30, timeout=1)] == list(range(30))
    c.commit()
    c.close()
    assert [(r.partition, r.offset) for r in a.poll(max_records=100, timeout=1)] == [(1, o) for o in range(30, 100)]
    a.commit()
    assert s.committed("g") == {0: 0, 1: 100}
    a.close()


def test_a_member_keeps_its_position_where_it_keeps_its_partition(any_broker):
    """A commit made in a generation that is no longer current fails and stores nothing
    if it names a partition the member lost, and is stored for partitions it kept (issue
    27); those it keeps go on from its position (its next commit covers what it polled),
    those that moved start at the commit."""
    s = any_broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    for p in range(4):
        s.append_many([b"p%d-%d" % (p, i) for i in range(10)], partition=p)
    a = s.consumer("g")
    assert len(a.poll(max_records=100, timeout=1)) == 40
    b = s.consumer("g")  # a keeps 0 and 2, b takes 1 and 3
    with pytest.raises(shmq.CommitFailed, match=r"generation \d+ -> \d+\) since this member's last poll: "
                                                r"partitions \[1, 3\] went to other members; nothing committed"):
        a.commit()
    assert s.committed("g") == {}
    a.commit({0: 9})  # kept without a break: a's commit stands, in a generation it has not seen
    assert s.committed("g") == {0: 9}
    assert a.assignment() == [0, 2] and b.assignment() == [1, 3]
    assert (a.position(0), a.position(2)) == (10, 10)  # kept partitions keep the position
    assert b.position(1) == 0  # moved ones start at the commit (none yet: earliest)
    a.commit()
    assert s.committed("g") == {0: 10, 2: 10}
    s.append_many([b"more"] * 5, partition=2)
    third = s.consumer("g")  # in two generations a never sees, 0 stays a's and 2 goes away and back
    assert third.assignment() == [2]
    assert [r.offset for r in third.poll(max_records=100, timeout=1)] == [10, 11, 12, 13, 14]
    third.commit()
    third.close()
    assert len(b.poll(max_records=100, timeout=1)) == 20
    b.commit()
    s.append(b"new", partition=0)
    assert [(r.partition, r.offset) for r in a.poll(max_records=100, timeout=1)] == [(0, 10)]
    assert a.position(0) == 11 and a.position(2) == 15
    a.close()
    b.close()


def test_a_producer_batches_over_either_transport(any_broker):
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    with s.producer(linger_ms=1) as producer:
        futures = [producer.send(b"v%d" % i, key=b"k%d" % (i % 2)) for i in range(50)]
        producer.flush()
        metas = [f.result(10) for f in futures]
    for k in range(2):
        mine = [(m.partition, m.offset) for i, m in enumerate(metas) if i % 2 == k]
        assert {p for p, _ in mine} == {partition_of(b"k%d" % k, 2)}
        assert [o for _, o in mine] == sorted(o for _, o in mine)  # a key in send order
    assert sum(s.offsets(p)[1] for p in range(2)) == 50


def test_tombstones_and_headers_keep_their_shape(any_broker):
    """A null value is a tombstone (None, never b""), b"" stays b""; headers come back a
    dict, or the list of pairs where a key repeats or a value is None, in order — through
    append, append_many, the producer, read and a group's poll, on either transport (the
    wire carries nil values and arrays of pairs: a remote record is the local one)."""
    s = any_broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    pairs = [("a", b"1"), ("a", b"2"), ("n", None)]
    s.append(None, key=b"k")
    s.append(b"", key=b"k", headers=pairs)
    s.append_many([None, b"v", None], keys=[None, b"k", b"k"],
                  headers=[[("x", 1), ("y", "s")], {"d": b"\x00"}, [("n", None)]], partition=0)
    with s.producer(linger_ms=1) as producer:
        futures = [producer.send(None, key=b"p", headers=pairs), producer.send(b"", headers=[])]
        producer.flush()
        assert [f.result(10).offset for f in futures] == [5, 6]
    want = [(b"k", None, {}), (b"k", b"", pairs), (None, None, {"x": 1, "y": "s"}), (b"k", b"v", {"d": b"\x00"}),
            (b"k", None, [("n", None)]), (b"p", None, pairs), (None, b"", {})]
    assert [(r.key, r.value, r.headers) for r in s.read(0, 0, max_records=100)] == want
    with s.consumer("g") as c:
        assert [(r.key, r.value, r.headers) for r in c.poll(max_records=100, timeout=5)] == want
    assert type(s.read(0, 1)[0].headers[0]) is tuple
    with pytest.raises(TypeError, match="a list of headers holds \\(key, value\\) pairs, not 'ab'"):
        s.append(b"x", headers=["ab"])
    with pytest.raises(TypeError, match="header keys must be str, not int"):
        s.append(b"x", headers=[(1, None)])
    with pytest.raises(TypeError, match="values must be str, int, float, bool or bytes, not list"):
        s.append(b"x", headers=[("a", [1]), ("a", None)])
    with pytest.raises(TypeError, match="values must be str, int, float, bool or bytes, not NoneType"):
        s.append(b"x", headers={"a": None})  # a dict holds no null value: the list form does
    assert s.offsets(0) == (0, 7)


def test_bad_input_gets_the_same_clear_errors(any_broker):
    s = any_broker.create_stream("events", partitions=2, max_bytes=4096, max_message_bytes=1000)
    with pytest.raises(ValueError, match=r"stream 'events' has partitions 0..1, not 2"):
        s.append(b"x", partition=2)
    with pytest.raises(ValueError, match=r"has partitions 0..1, not -1"):
        s.read(-1, 0)
    with pytest.raises(TypeError, match="partition must be an int, not str"):
        s.offsets("0")
    with pytest.raises(ValueError, match="offset must be >= 0, not -1"):
        s.read(0, -1)
    with pytest.raises(TypeError, match="offset must be an int, not str"):
        s.read(0, "0")
    with pytest.raises(ValueError, match="max_records must be a positive int, not 0"):
        s.read(0, 0, max_records=0)
    with pytest.raises(TypeError, match="timeout must be a number of seconds, not str"):
        s.read(0, 0, timeout="soon")
    with pytest.raises(shmq.MessageTooLarge, match="at most 1000"):
        s.append(b"x" * 1001)
    with pytest.raises(shmq.MessageTooLarge, match="at most 1000"):
        s.append_many([b"ok", b"x" * 1001], partition=0)
    with pytest.raises(TypeError, match="value must be bytes-like, not str"):
        s.append("text")
    with pytest.raises(TypeError, match="key must be bytes-like, not int"):
        s.append(b"x", key=7)
    with pytest.raises(TypeError, match="values must be str, int, float, bool or bytes, not list"):
        s.append(b"x", headers={"a": [1]})
    with pytest.raises(ValueError, match=r"as many as values \(1\)"):
        s.append_many([b"a"], keys=[b"k", b"l"])
    with pytest.raises(ValueError, match="compression must be None or 'zstd', not 'lz4'"):
        s.append_many([b"a"], compression="lz4")
    with pytest.raises(ValueError, match="auto_offset_reset must be 'earliest', 'latest' or 'none'"):
        s.consumer("g", auto_offset_reset="middle")
    with pytest.raises(ValueError, match="group must be a name of 1-126 bytes"):
        s.consumer("")
    with s.consumer("g") as c:
        with pytest.raises(ValueError, match="offsets must be ints >= 0, not -1"):
            c.commit({0: -1})
        with pytest.raises(ValueError, match="max_records must be a positive int"):
            c.poll(max_records=0)
    assert s.offsets(0) == s.offsets(1) == (0, 0)  # nothing was appended by any of it


def test_a_deleted_stream_is_gone_for_its_handles_and_members(any_broker):
    s = any_broker.create_stream("events", partitions=2, max_bytes=4096)
    c = s.consumer("g")
    s.append(b"x")
    any_broker.delete_stream("events")
    with pytest.raises(shmq.StreamNotFound):
        s.append(b"y")
    with pytest.raises(shmq.StreamNotFound):
        s.read(0, 0)
    with pytest.raises(shmq.StreamNotFound):
        c.poll(timeout=0)
    c.close()
    any_broker.create_stream("events", partitions=1, max_bytes=4096)  # a new one of the same name
    assert any_broker.stream("events").offsets(0) == (0, 0)


# ---------------------------------------------------------------- TCP: the server is the member

@pytest.fixture
def server(broker):
    srv = ThreadedServer(broker.namespace)
    yield srv
    srv.stop()


def test_a_closed_connection_leaves_its_group(server, broker):
    local = broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    with local.consumer("g") as stays:
        remote = shmq.connect(server.url)
        try:
            member = remote.stream("events").consumer("g")
            assert len(member.assignment()) == 2
            until(lambda: len(stays.assignment()) == 2, what="the rebalance to two")
        finally:
            remote.close()
        until(lambda: stays.assignment() == [0, 1, 2, 3], what="the closed connection's member to leave")
        assert broker.stream("events").stats()["groups"]["g"]["members"] == 1


def test_a_connection_reset_leaves_its_group(server, broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"a", b"b"], partition=0)
    s.append_many([b"c", b"d"], partition=1)
    remote = shmq.connect(server.url)
    sock = remote._link.sock
    member = remote.stream("events").consumer("g")
    assert member.assignment() == [0, 1]
    assert len(member.poll(timeout=1)) == 4  # read, never committed
    with shmq.connect(server.url) as other:
        survivor = other.stream("events").consumer("g")
        assert len(survivor.assignment()) == 1
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        remote.close()  # an RST, not a FIN
        until(lambda: survivor.assignment() == [0, 1], what="the reset connection's member to leave")
        assert sorted(r.value for r in survivor.poll(timeout=1)) == [b"a", b"b", b"c", b"d"]  # from the last commit


def _join_and_hang(url, ready):
    member = shmq.connect(url).stream("events").consumer("g")
    member.poll(timeout=0)
    ready.set()
    time.sleep(3600)  # until SIGKILLed


def test_a_sigkilled_client_leaves_its_group(server, broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    ready = WORKERS.Event()
    child = WORKERS.Process(target=_join_and_hang, args=(server.url, ready))
    child.start()
    try:
        assert ready.wait(30)
        with s.consumer("g") as survivor:
            until(lambda: len(survivor.assignment()) == 1, what="the rebalance to two")
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
            until(lambda: survivor.assignment() == [0, 1], what="the killed client's member to leave")
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)


def test_a_waiting_poll_hears_of_a_rebalance_and_a_waiting_read_of_a_delete(server, broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append(b"waiting for a", partition=0)
    remote = shmq.connect(server.url)
    try:
        with remote.stream("events").consumer("g") as taker, shmq.connect(server.url) as other:
            assert taker.poll(timeout=1)[0].value == b"waiting for a"
            taker.commit()
            waiter = other.stream("events").consumer("g")  # owns one partition, none with news
            s.append(b"for the waiter", partition=waiter.assignment()[0])
            got = waiter.poll(timeout=0)
            assert [r.value for r in got] == [b"for the waiter"]
            waiter.commit()
            result = []
            t = threading.Thread(target=lambda: result.append(waiter.poll(timeout=30)))
            t.start()
            taker.close()  # the waiter takes over its partition, where "late" comes
            s.append(b"late", partition=[p for p in (0, 1) if p != got[0].partition][0])
            t.join(30)
            assert [r.value for r in result[0]] == [b"late"]
            waiter.close()
        reader = remote.stream("events")
        result = []
        t = threading.Thread(target=lambda: result.append(_error_of(lambda: reader.read(0, 2, timeout=30))))
        t.start()
        until(lambda: server.server.streams.lines.get("events") and server.server.streams.lines["events"].live,
              what="the READ to wait")
        broker.delete_stream("events")
        t.join(30)
        assert type(result[0]) is shmq.StreamNotFound
    finally:
        remote.close()


def _error_of(call):
    try:
        return call()
    except Exception as e:
        return e


def test_waiting_reads_and_polls_count_against_the_connection_limit(broker, tmp_path):
    broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    srv = Server(broker.namespace, tmp_path, "--max-waiting-per-connection", "2")

    async def three_waits():
        async with await aio.connect(srv.url, token=TOKEN) as b:
            s = await b.stream("events")
            c = await s.consumer("g")
            return await asyncio.gather(s.read(0, 0, timeout=2), c.poll(timeout=2), s.read(0, 0, timeout=2),
                                        return_exceptions=True)

    try:
        results = asyncio.run(asyncio.wait_for(three_waits(), 30))
    finally:
        assert srv.stop() == 0
    assert [type(r) for r in results] == [list, list, shmq.LimitExceeded]
    assert str(results[2]).startswith("too many waiting CONSUMEs, READs and POLLs on this connection (the limit is 2)")


# ---------------------------------------------------------------- TCP: compressed batches

needs_zstd = pytest.mark.skipif(compression.zstandard is None, reason="zstandard is not installed")


@needs_zstd
def test_a_compressed_batch_round_trips(server, broker):
    with shmq.connect(server.url) as remote:
        s = remote.create_stream("events", partitions=2, max_bytes=1 << 20)
        values = [b"record %d " % i + b"z" * 500 for i in range(200)]
        metas = s.append_many(values, keys=[b"k%d" % (i % 5) for i in range(200)],
                              headers=[{"i": i} for i in range(200)], compression="zstd")
        by_partition = {}
        for i, m in enumerate(metas):
            by_partition.setdefault(m.partition, []).append((m.offset, values[i], i))
        for p, expected in by_partition.items():
            got = broker.stream("events").read(p, 0)
            assert [(r.offset, r.value, r.headers["i"]) for r in got] == expected
        assert s.append_many([b"one"], partition=1, compression="zstd")[0].partition == 1


@needs_zstd
def test_compressed_data_is_checked_like_plain_records(server, broker):
    from shmq.protocol import MsgType

    broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    zstd = compression.zstandard.ZstdCompressor()
    with shmq.connect(server.url) as remote:
        def send(**fields):
            return remote._request(MsgType.APPEND_BATCH, {"stream": "events", **fields})

        with pytest.raises(ValueError, match="compressed data cannot be read"):
            send(compression="zstd", data=b"not zstd")
        with pytest.raises(ValueError, match="compressed records must be an array of maps"):
            send(compression="zstd", data=zstd.compress(b"\x93\x01\x02\x03"))  # [1, 2, 3]
        with pytest.raises(shmq.MessageTooLarge, match="decompress to at most"):
            send(compression="zstd", data=zstd.compress(b"\x00" * (17 * 2**20)))  # a 17 MiB bomb in a few KiB
        with pytest.raises(ValueError, match='compression must be "zstd", not "lz4"'):
            send(compression="lz4", data=b"")
        with pytest.raises(ValueError, match="needs the field 'data'"):
            send(compression="zstd")
        assert broker.stream("events").offsets(0) == (0, 0)


def test_without_zstandard_the_client_says_what_to_install(server, broker, monkeypatch):
    monkeypatch.setattr(compression, "zstandard", None)
    broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    with shmq.connect(server.url) as remote:
        with pytest.raises(ModuleNotFoundError, match=r"needs the zstandard package: pip install 'shmq\[zstd\]'"):
            remote.stream("events").append_many([b"a"], compression="zstd")
    assert broker.stream("events").append_many([b"a"], compression="zstd")[0].offset == 0  # locally: no wire


# ---------------------------------------------------------------- TCP: the asyncio client

def test_the_asyncio_client_streams(server, broker):
    async def main():
        async with await aio.connect(server.url) as b:
            s = await b.create_stream("events", partitions=2, max_bytes=1 << 16)
            assert isinstance(s, aio.AsyncStream) and await b.list_streams() == ["events"]
            m = await s.append(b"a", key=b"k")
            ms = await s.append_many([b"b", b"c"], partition=m.partition)
            assert [x.offset for x in ms] == [1, 2] and await s.offsets(m.partition) == (0, 3)
            assert [r.value for r in await s.read(m.partition, 0)] == [b"a", b"b", b"c"]
            with pytest.raises(shmq.OffsetOutOfRange) as e:
                await s.read(m.partition, 9)
            assert (e.value.earliest, e.value.end) == (0, 3)
            # a waiting READ holds back nothing on the same connection
            waiting = asyncio.ensure_future(s.read(m.partition, 3, timeout=30))
            await s.append(b"d", partition=m.partition)
            assert [r.value for r in await waiting] == [b"d"]
            async with await s.consumer("g") as c:
                assert isinstance(c, aio.AsyncConsumer) and await c.assignment() == [0, 1]
                seen = []
                async for r in c:
                    seen.append(r.value)
                    if len(seen) == 2:
                        break
                await c.commit()  # up to what was handed out, not what the iteration holds
                assert await s.committed("g") == {m.partition: 2, 1 - m.partition: 0}
                assert [r.value for r in await c.poll(timeout=1)] == [b"c", b"d"]
                await c.commit()
                assert await s.lag("g") == {0: 0, 1: 0}
            assert (await s.stats())["groups"]["g"]["members"] == 0
            await b.delete_stream("events")
            with pytest.raises(shmq.StreamNotFound):
                await b.stream("events")

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_append_that_waits_for_room_never_stalls_the_server(server, broker):
    """retention="block": the append waits for the slowest group's commit, in the stream's
    appender thread, while the server goes on serving — the commit that makes room too."""
    async def main():
        async with await aio.connect(server.url) as b:
            s = await b.create_stream("events", partitions=1, max_bytes=4096, retention="block")
            c = await s.consumer("slow")
            for _ in range(16):
                await s.append(b"x" * 200)  # fills the ring
            blocked = asyncio.ensure_future(s.append(b"y" * 200))
            await b.ping()  # the loop serves others meanwhile
            assert not blocked.done()
            assert len(await c.poll(max_records=5, timeout=1)) == 5
            await c.commit()  # makes room: the waiting append goes in
            m = await asyncio.wait_for(blocked, 10)
            assert m.offset == 16
            assert [r.offset for r in await s.read(0, 16)] == [16]
            await c.close()
            await b.delete_stream("events")

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("local, remote, names", [
    (shmq.Broker, shmq.client.RemoteBroker, ["create_stream", "stream", "list_streams", "delete_stream"]),
    (shmq.Stream, shmq.client.RemoteStream, ["append", "append_many", "offsets", "read", "consumer", "groups",
                                             "committed", "lag", "reset", "stats", "producer", "close"]),
    (shmq.Consumer, shmq.client.RemoteConsumer, ["assignment", "position", "poll", "commit", "close", "seek", "seek_to_beginning",
                                         "seek_to_end", "pause", "resume", "paused"]),
    (shmq.Stream, aio.AsyncStream, ["append", "append_many", "offsets", "read", "consumer", "groups", "committed",
                                    "lag", "reset", "stats"]),
    (shmq.Consumer, aio.AsyncConsumer, ["assignment", "position", "poll", "commit", "close", "seek", "seek_to_beginning",
                                         "seek_to_end", "pause", "resume", "paused"]),
], ids=["broker", "stream", "consumer", "async stream", "async consumer"])
def test_the_remote_classes_take_the_local_arguments(local, remote, names):
    def params(cls, name):
        return [(p.name, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()]

    for name in names:
        assert params(remote, name) == params(local, name), name


def test_publish_is_once_per_batch_and_partition_and_delete_records_trims(any_broker):
    t = any_broker.create_stream("out", partitions=2)
    st = any_broker.create_stream("out:staging:q", partitions=2, durability="memory")
    txn = os.urandom(16)
    st.append_many([b"a", b"b"], keys=[b"k", b"k"], headers=[{"n": 1}, None], partition=1)
    st.append_many([b"c"], partition=0)
    assert t.publish(st, {1: [(1, 0, 2)], 0: [(0, 0, 1)]}, txn, 7) == {0: 0, 1: 0}
    assert t.publish(st.name, {1: [(1, 0, 2)]}, txn, 7) == {1: None}  # a replay: nothing twice
    assert t.publish(st, {1: [(1, 0, 2)]}, txn, 6) == {1: None}  # nor an older batch
    assert [(r.key, r.value, r.headers) for r in t.read(1, 0)] == [(b"k", b"a", {"n": 1}), (b"k", b"b", {})]
    assert t.published(txn) == {0: 7, 1: 7}
    assert st.delete_records({0: 1, 1: 2}) == 3 and [st.offsets(p) for p in (0, 1)] == [(1, 1), (2, 2)]
    with pytest.raises(shmq.OffsetOutOfRange):
        t.publish(st, {0: [(0, 0, 1)]}, txn, 8)
    with pytest.raises(ValueError, match="a publisher id is 16 bytes"):
        t.publish(st, {0: [(0, 0, 1)]}, b"x" * 15, 8)
    with pytest.raises(ValueError, match="batch must be an int >= 0, not -1"):
        t.publish(st, {0: [(0, 0, 1)]}, txn, -1)
    with pytest.raises(ValueError, match="has partitions 0..1, not 5"):
        t.publish(st, {5: [(0, 0, 1)]}, txn, 8)
    with pytest.raises(shmq.StreamNotFound):
        t.publish("nowhere", {0: [(0, 0, 1)]}, txn, 8)
    assert [t.offsets(p) for p in (0, 1)] == [(0, 1), (0, 2)]
