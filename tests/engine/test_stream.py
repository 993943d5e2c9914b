"""Streams on the local transport: offsets, keys, replay, retention, the sparse index,
consumer groups (join, close, SIGKILL, the generation fence), bad input, and appends
killed at any instant."""

import multiprocessing as mp
import os
import signal
import threading
import time
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmq
from shmq.engine import layout as L
from tests import _workers as w

SPAWN = mp.get_context("spawn")


def test_offsets_are_dense_and_keys_choose_a_stable_partition(broker):
    s = broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    metas = [s.append(b"v%d" % i, key=b"user-%d" % (i % 3), headers={"i": i}) for i in range(30)]
    for key in (b"user-0", b"user-1", b"user-2"):
        mine = [m for i, m in enumerate(metas) if b"user-%d" % (i % 3) == key]
        assert {m.partition for m in mine} == {zlib.crc32(key) % 4}  # never Python's hash()
    for p in range(4):
        offs = [m.offset for m in metas if m.partition == p]
        assert offs == list(range(len(offs)))
        assert s.offsets(p) == (0, len(offs))
    rs = s.read(metas[7].partition, metas[7].offset, max_records=1)
    assert (rs[0].value, rs[0].key, rs[0].headers, rs[0].stream) == (b"v7", b"user-1", {"i": 7}, "events")
    assert abs(rs[0].timestamp - time.time()) < 60


def test_append_many_without_keys_lands_whole_in_one_partition_in_turn(broker):
    s = broker.create_stream("events", partitions=3, max_bytes=1 << 16)
    batches = [s.append_many([b"a", b"b", b"c"]) for _ in range(3)]
    parts = [{m.partition for m in ms} for ms in batches]
    assert all(len(p) == 1 for p in parts) and len({p.pop() for p in parts}) == 3  # each whole, in turn
    assert [m.offset for m in batches[0]] == [0, 1, 2]
    assert s.append_many([]) == []
    ms = s.append_many([b"x", b"y"], keys=[b"k1", b"k2"], headers=[None, {"h": "v"}], partition=1)
    assert [(m.partition, m.offset) for m in ms] == [(1, 3), (1, 4)]


def test_read_replays_the_same_records_and_waits_at_the_end(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    s.append_many([b"r%d" % i for i in range(100)])
    first = s.read(0, 0, max_records=1000)
    assert [r.offset for r in first] == list(range(100)) and first == s.read(0, 0)
    assert s.read(0, 37, max_records=5) == first[37:42]  # through the sparse index
    t0 = time.monotonic()
    assert s.read(0, 100, timeout=0.2) == [] and time.monotonic() - t0 >= 0.2
    threading.Timer(0.1, lambda: s.append(b"late")).start()
    got = s.read(0, 100, timeout=10)
    assert [r.value for r in got] == [b"late"]
    with pytest.raises(shmq.OffsetOutOfRange) as e:
        s.read(0, 102)
    assert (e.value.earliest, e.value.end) == (0, 101)


def test_retention_drops_the_oldest_records_and_never_reuses_an_offset(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=4096)
    metas = [s.append(b"x" * 200) for _ in range(100)]
    assert [m.offset for m in metas] == list(range(100))
    earliest, end = s.offsets(0)
    assert 0 < earliest < end == 100
    with pytest.raises(shmq.OffsetOutOfRange, match="outside") as e:
        s.read(0, earliest - 1)
    assert (e.value.earliest, e.value.end) == (earliest, 100)
    assert [r.offset for r in s.read(0, earliest)] == list(range(earliest, 100))
    stats = s.stats()["partitions"][0]
    assert stats["dropped_total"] == earliest and stats["appended_total"] == 100


def test_block_retention_waits_for_the_slowest_group_and_an_idle_group_lets_go(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=4096, retention="block", group_idle_timeout=0.3)
    c = s.consumer("slow")
    appended = [s.append(b"x" * 200).offset for _ in range(16)]  # fills the ring
    done = threading.Event()

    def more():
        s.append(b"x" * 200)
        done.set()

    t = threading.Thread(target=more)
    t.start()
    assert not done.wait(0.3)  # waits: the group has read nothing
    rs = c.poll(max_records=5, timeout=1)
    c.commit()
    assert done.wait(10) and [r.offset for r in rs] == appended[:5]
    t.join()
    c.close()  # no live member: after group_idle_timeout the group holds nothing back
    t0 = time.monotonic()
    for _ in range(40):
        s.append(b"x" * 200)
    assert time.monotonic() - t0 < 10


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=120), st.data())
def test_any_offset_reads_what_was_appended_there(sizes, data):
    ns = "hs" + os.urandom(5).hex()
    b = shmq.connect(namespace=ns)
    try:
        s = b.create_stream("s", partitions=1, max_bytes=8192)
        model = {}
        for i, n in enumerate(sizes):
            model[s.append(b"%d:" % i + b"z" * n, key=b"k" if i % 2 else None).offset] = i
        earliest, end = s.offsets(0)
        assert end == len(sizes)
        for _ in range(10):
            o = data.draw(st.integers(earliest, end - 1))
            (r,) = s.read(0, o, max_records=1)
            assert r.offset == o and r.value.startswith(b"%d:" % model[o]) and (r.key == b"k") == bool(model[o] % 2)
        s.close()
    finally:
        b.close()
        shmq.destroy_namespace(ns)


def test_bad_input_gets_clear_errors(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=4096, max_message_bytes=1000)
    with pytest.raises(ValueError, match="partitions 0..1, not 2"):
        s.append(b"x", partition=2)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        s.read(0, -1)
    with pytest.raises(TypeError, match="offset must be an int"):
        s.read(0, "0")
    with pytest.raises(shmq.MessageTooLarge, match="at most 1000"):
        s.append(b"x" * 1001)
    with pytest.raises(TypeError, match="value must be bytes-like"):
        s.append("text")
    with pytest.raises(TypeError, match="key must be bytes-like"):
        s.append(b"x", key=7)
    with pytest.raises(ValueError, match="as many as values"):
        s.append_many([b"a"], keys=[b"k", b"l"])
    with pytest.raises(shmq.StreamExists):
        broker.create_stream("events")
    with pytest.raises(shmq.StreamNotFound):
        broker.stream("nope")
    with pytest.raises(ValueError, match="retention must be"):
        broker.create_stream("other", retention="keep")
    with pytest.raises(ValueError, match="auto_offset_reset"):
        s.consumer("g", auto_offset_reset="middle")
    assert s.offsets(0) == s.offsets(1) == (0, 0)  # nothing was appended by any of it


def test_a_deleted_stream_is_gone_for_every_handle(broker, namespace):
    s = broker.create_stream("events", partitions=2, max_bytes=4096)
    other = broker.stream("events")
    s.append(b"x")
    broker.delete_stream("events")
    with pytest.raises(shmq.StreamNotFound):
        other.append(b"y")
    assert broker.list_streams() == [] and broker.list_queues() == []
    assert shmq.engine.segment.namespace_entries(namespace) == [f"shmq.{namespace}.registry"]
    other.close()
    s.close()


# ---------------------------------------------------------------- groups

def test_members_split_the_partitions_and_a_closed_one_hands_them_over(broker):
    s = broker.create_stream("events", partitions=4, max_bytes=1 << 16)
    for p in range(4):
        s.append_many([b"p%d-%d" % (p, i) for i in range(10)], partition=p)
    a = s.consumer("billing")
    assert a.assignment() == [0, 1, 2, 3]
    b = s.consumer("billing")
    assert sorted(a.assignment() + b.assignment()) == [0, 1, 2, 3] and not set(a.assignment()) & set(b.assignment())
    got_a = a.poll(max_records=100, timeout=1)
    a.commit()
    assert {r.partition for r in got_a} == set(a.assignment()) and len(got_a) == 20
    a.close()
    assert b.assignment() == [0, 1, 2, 3]
    got_b = b.poll(max_records=100, timeout=1)
    assert len(got_b) == 20 and {r.partition for r in got_b} == {0, 1, 2, 3} - {r.partition for r in got_a}
    b.commit()
    assert s.lag("billing") == {0: 0, 1: 0, 2: 0, 3: 0}
    assert s.committed("billing") == {0: 10, 1: 10, 2: 10, 3: 10}
    other = s.consumer("audit")  # another group reads everything again, independently
    assert len(other.poll(max_records=100, timeout=1)) == 40
    assert s.groups() == ["audit", "billing"]
    other.close()
    b.close()


def test_a_member_that_lost_its_partitions_cannot_commit_them(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"x"] * 5, partition=0)
    a = s.consumer("g")
    assert len(a.poll(timeout=1)) == 5
    b = s.consumer("g")  # a rebalance: a's next commit is fenced
    with pytest.raises(shmq.CommitFailed, match="rebalanced"):
        a.commit()
    assert s.committed("g") == {}
    assert len(a.assignment()) == 1  # after a poll / refresh it commits what it owns
    a.commit({a.assignment()[0]: 0})
    with pytest.raises(shmq.ShmqError, match="live members"):
        s.reset("g", to="latest")
    a.close()
    b.close()
    s.reset("g", to="latest")
    assert s.committed("g") == {0: 5, 1: 0}
    s.reset("g", to={0: 2})
    with s.consumer("g") as c:
        assert [r.offset for r in c.poll(timeout=1)] == [2, 3, 4]


def test_a_sigkilled_member_is_found_and_the_others_resume_from_the_last_commit(broker, tmp_path):
    s = broker.create_stream("events", partitions=4, max_bytes=1 << 18)
    for p in range(4):
        s.append_many([b"%d-%d" % (p, i) for i in range(200)], partition=p)
    ready, stop = SPAWN.Event(), SPAWN.Event()
    out_victim = tmp_path / "victim.log"
    victim = SPAWN.Process(target=w.stream_member, args=(broker.namespace, "events", "g", str(out_victim), ready, stop))
    victim.start()
    assert ready.wait(30)
    survivor = s.consumer("g")
    deadline = time.monotonic() + 30
    while len(survivor.assignment()) != 2:  # the victim holds the other two
        assert time.monotonic() < deadline, "no rebalance to two members"
    while not out_victim.exists() or out_victim.stat().st_size < 100:  # and has read (and committed) some
        assert time.monotonic() < deadline, "the victim never read"
        time.sleep(0.005)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    seen = {}
    t0 = time.monotonic()
    while len(survivor.assignment()) != 4:
        assert time.monotonic() - t0 < 5, "the dead member's partitions were never taken over"
    taken = time.monotonic() - t0
    while True:
        rs = survivor.poll(max_records=500, timeout=0.2)
        if not rs:
            break
        for r in rs:
            seen.setdefault((r.partition, r.offset), 0)
            seen[(r.partition, r.offset)] += 1
        survivor.commit()
    victim_seen = set()
    for line in out_victim.read_text().splitlines():
        p, o, _v = line.split()
        victim_seen.add((int(p), int(o)))
    everything = {(p, o) for p in range(4) for o in range(200)}
    assert everything <= set(seen) | victim_seen  # nothing skipped
    assert s.lag("g") == {p: 0 for p in range(4)}
    assert taken < 3
    survivor.close()


def test_order_per_key_holds_under_several_producer_processes(broker, tmp_path):
    broker.create_stream("events", partitions=3, max_bytes=1 << 20)
    procs = [SPAWN.Process(target=w.stream_appender, args=(broker.namespace, "events", f"k{i}", 300,
                                                           str(tmp_path / f"a{i}.log"), 1 + i % 2))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    s = broker.stream("events")
    by_key = {}
    for p in range(3):
        for r in s.read(p, 0, max_records=10000):
            by_key.setdefault(r.key, []).append(int(r.value.split(b"-")[1]))
    assert {k: v for k, v in by_key.items()} == {b"k%d" % i: list(range(300)) for i in range(4)}


def test_appenders_killed_at_any_instant_lose_nothing_that_returned(broker, tmp_path):
    broker.create_stream("events", partitions=2, max_bytes=1 << 20)
    logs = []
    for round_ in range(6):
        log = tmp_path / f"r{round_}.log"
        logs.append(log)
        procs = [SPAWN.Process(target=w.stream_appender, args=(broker.namespace, "events", f"r{round_}x{i}",
                                                               10**6, str(log), 1 + i * 7)) for i in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 30
        while not log.exists() or log.stat().st_size < 2000:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
    s = broker.stream("events")
    present = {}
    for p in range(2):
        offs = [r.offset for r in s.read(p, 0, max_records=10**6)]
        assert offs == list(range(len(offs)))  # dense: a killed append left no hole and no torn record
        for r in s.read(p, 0, max_records=10**6):
            present[r.value] = (p, r.offset)
    returned = [line.split() for log in logs for line in log.read_text().splitlines()]
    assert returned and all(present.get(v.encode()) == (int(p), int(o)) for v, p, o in returned)
    s.append(b"after")  # the stream works on at once
