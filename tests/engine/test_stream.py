"""Streams in the engine: reads that wait, block retention, the sparse index, members and
appenders killed with SIGKILL, per-key order under several processes. What must hold on
both transports (offsets, keys, retention, groups and their fence, bad input) is in
tests/test_stream_conformance.py, which runs locally too."""

import array
import os
import random
import signal
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq
from shmq.model.headers import encode_record_headers
from shmq.engine.shm import layout as L
from shmq.engine.shm import plog
from shmq.engine.streams.paths import C as PartitionPaths_C
from shmq.engine.streams.paths import PYTHON as PartitionPaths_PYTHON
from shmq.engine.streams.stream import partition_of
from shmq.engine.shm.mutex import unlock
from tests import _workers as w
from tests._dying import killed_at_each_store
from tests._processes import WORKERS


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


def test_a_deleted_stream_is_gone_for_every_handle(broker, namespace):
    s = broker.create_stream("events", partitions=2, max_bytes=4096)
    other = broker.stream("events")
    s.append(b"x")
    broker.delete_stream("events")
    with pytest.raises(shmq.StreamNotFound):
        other.append(b"y")
    assert broker.list_streams() == [] and broker.list_queues() == []
    assert shmq.engine.shm.segment.namespace_entries(namespace) == [f"shmq.{namespace}.registry"]
    other.close()
    s.close()


# ---------------------------------------------------------------- groups

def test_a_sigkilled_member_is_found_and_the_others_resume_from_the_last_commit(broker, tmp_path):
    s = broker.create_stream("events", partitions=4, max_bytes=1 << 18)
    for p in range(4):
        s.append_many([b"%d-%d" % (p, i) for i in range(200)], partition=p)
    ready, stop = WORKERS.Event(), w.StopFlag(WORKERS)  # (the victim polling stop is killed)
    out_victim = tmp_path / "victim.log"
    victim = WORKERS.Process(target=w.stream_member, args=(broker.namespace, "events", "g", str(out_victim), ready, stop))
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
    procs = [WORKERS.Process(target=w.stream_appender, args=(broker.namespace, "events", f"k{i}", 300,
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


@pytest.mark.parametrize("retention", [False, True])
def test_appenders_killed_at_any_instant_lose_nothing_that_returned(broker, tmp_path, retention):
    """With ``retention``, a housekeeper drops what is past 64 KiB of a partition and gives
    its memory back as fast as it can, and is killed with the appenders: every record whose
    append returned and that retention kept is there, dense."""
    broker.create_stream("events", partitions=2, max_bytes=1 << 20, retention_bytes=4096 if retention else None)
    logs = []
    for round_ in range(6):
        log = tmp_path / f"r{round_}.log"
        logs.append(log)
        procs = [WORKERS.Process(target=w.stream_appender, args=(broker.namespace, "events", f"r{round_}x{i}",
                                                               10**6, str(log), 1 + i * 7)) for i in range(2)]
        rounds = tmp_path / f"h{round_}.log"
        if retention:
            procs.append(WORKERS.Process(target=w.stream_housekeeper, args=(broker.namespace, "events", str(rounds))))
        for p in procs:
            p.start()
        deadline = time.monotonic() + 30
        while not log.exists() or log.stat().st_size < 2000 or (retention and (
                not rounds.exists() or rounds.stat().st_size < 20)):  # (a few rounds of the housekeeper, too)
            assert time.monotonic() < deadline
            time.sleep(0.005)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
    s = broker.stream("events")
    present, earliest = {}, {}
    for p in range(2):
        earliest[p] = s.offsets(p)[0]
        offs = [r.offset for r in s.read(p, earliest[p], max_records=10**6)]
        assert offs == list(range(earliest[p], earliest[p] + len(offs)))  # dense: no hole, no torn record
        for r in s.read(p, earliest[p], max_records=10**6):
            present[r.value] = (p, r.offset)
    assert any(earliest.values()) == retention
    returned = [line.split() for log in logs for line in log.read_text().splitlines()]
    kept = [(v, p, o) for v, p, o in returned if int(o) >= earliest[int(p)]]
    assert kept and all(present.get(v.encode()) == (int(p), int(o)) for v, p, o in kept)
    s.append(b"after")  # the stream works on at once


# ---------------------------------------------------------------------------- exactly-once publish

def _batches(s, p=0):
    got = {}
    for r in s.read(p, s.offsets(p)[0], max_records=10**6):
        batch, i = r.value.decode()[1:].split(":")
        got.setdefault(int(batch), []).append(int(i))
    return got


def test_a_publisher_dead_before_its_commit_leaves_neither_records_nor_its_note(broker):
    t = broker.create_stream("out", partitions=1)
    st = broker.create_stream("out:staging:x", partitions=1, durability="memory")
    txn = os.urandom(16)
    st.append_many([b"b0:0", b"b0:1"], partition=0)
    t.publish(st, {0: [(0, 0, 2)]}, txn, 0)
    st.append_many([b"b1:0", b"b1:1", b"b1:2"], partition=0)
    p = WORKERS.Process(target=w.publisher_dying_before_the_commit, args=(broker.namespace, "out", st.name, txn.hex(), 1))
    p.start()
    p.join(30)
    assert p.exitcode == 3
    assert t.published(txn) == {0: 0}  # the lock's repair took the dead publisher's note back
    assert t.publish(st, {0: [(0, 2, 5)]}, txn, 1) == {0: 2}  # so the replay publishes it
    assert t.publish(st, {0: [(0, 2, 5)]}, txn, 1) == {0: None}  # once
    assert _batches(t) == {0: [0, 1], 1: [0, 1, 2]}
    assert t.published(txn) == {0: 1}


@pytest.mark.parametrize("first", [False, True])
def test_a_publish_note_killed_between_any_two_stores_is_repaired_to_the_previous_batch(broker, first):
    """A kill inside the note of batch 1 (before its commit, so its end is past the end):
    the repair takes the note back to batch 0 (or, for a publisher's first batch, to none),
    and a repair killed between its own stores is made right by the next one."""
    t = broker.create_stream("out", partitions=1)
    part, a, other = t._part(0), os.urandom(16), os.urandom(16)
    t.append_many([b"x"] * 4, partition=0)  # offsets 0..3: the end is 4
    part._acquire()
    try:
        part._txn_note(other, 7, 2, 1)  # another publisher's entry, left as it is
        if not first:
            part._txn_note(a, 0, 3, 2)
        before = part._txn_rows()
        kills = 0
        for k in killed_at_each_store(part, lambda: part._txn_note(a, 1, 9, 3)):
            if k is None:  # the whole note: batch 1, up to offset 9
                assert part._txn_batch(a) == 1 and sorted(part._txn_rows()) == sorted(
                    [r for r in before if r[0] != a] + [(a, 1, 9)])
                break
            kills += 1
            noted = bytes(part._mm[L.PART_TXN_OFF:L.PART_MEM_OFF])
            for j in killed_at_each_store(part, lambda: plog.txn_repair(part._mq, 4)):
                plog.txn_repair(part._mq, 4)  # (the next holder's, after the repairer's death; or a second, harmless)
                assert sorted(part._txn_rows()) == sorted(before), (k, j)
                part._mm[L.PART_TXN_OFF:L.PART_MEM_OFF] = noted
            part._mm[L.PART_TXN_OFF:L.PART_MEM_OFF] = noted
            plog.txn_repair(part._mq, 4)
            assert part._txn_batch(a) == (-1 if first else 0)
            assert part._txn_batch(other) == 7
        assert kills >= 3  # each of the note's stores was a place to die
    finally:
        unlock(part._lockp)


def test_publishers_killed_at_any_instant_and_replayed_publish_each_batch_once(broker, tmp_path):
    t = broker.create_stream("out", partitions=1, max_bytes=8 << 20)
    st = broker.create_stream("out:staging:x", partitions=1, max_bytes=8 << 20, durability="memory")
    txn, log, next_batch = os.urandom(16), tmp_path / "published.log", 0
    for _round in range(8):
        p = WORKERS.Process(target=w.stream_publisher, args=(broker.namespace, "out", st.name, txn.hex(), next_batch,
                                                          10**6, 40, str(log)))
        p.start()
        deadline = time.monotonic() + 30
        while len(log.read_text().split() if log.exists() else []) < next_batch + 5:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        next_batch = int(log.read_text().split()[-1])  # replay the last batch that returned, and on
    p = WORKERS.Process(target=w.stream_publisher, args=(broker.namespace, "out", st.name, txn.hex(), next_batch,
                                                      3, 40, str(log)))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    last = next_batch + 2
    assert t.published(txn) == {0: last}
    assert _batches(t) == {b: list(range(40)) for b in range(last + 1)}  # each batch once, whole, in order


def test_publish_skips_what_is_in_reads_nothing_for_it_and_delete_records_trims(broker):
    t = broker.create_stream("out", partitions=2)
    st = broker.create_stream("out:staging:x", partitions=2, durability="memory")
    txn = os.urandom(16)
    st.append_many([b"b0:0", b"b0:1"], partition=0)
    st.append_many([b"b0:2"], partition=1)
    assert t.publish(st, {0: [(0, 0, 2)]}, txn, 0) == {0: 0}
    assert st.delete_records({0: 2}) == 2 and st.offsets(0) == (2, 2)
    # a replay after the crash: partition 0 has the batch (its staged records are gone: not read), 1 gets it
    assert t.publish(st, {0: [(0, 0, 2)], 1: [(1, 0, 1)]}, txn, 0) == {0: None, 1: 0}
    with pytest.raises(shmq.OffsetOutOfRange):  # a new batch whose staged records are gone
        t.publish(st, {0: [(0, 0, 2)]}, txn, 1)
    assert t.published(txn) == {0: 0, 1: 0} and t.published(os.urandom(16)) == {0: -1, 1: -1}
    with pytest.raises(ValueError, match="16 bytes"):
        t.publish(st, {}, b"short", 0)
    assert st.delete_records({1: 0}) == 0 and st.delete_records({1: 99}) == 1 and st.offsets(1) == (1, 1)
    st.append(b"again", partition=1)
    assert [r.offset for r in st.read(1, 1)] == [1]


# ---------------------------------------------------------------------------- tombstones and header lists

PAIRS = [("a", b"1"), ("a", b"2"), ("n", None)]


def test_a_null_value_is_a_tombstone_on_every_path_and_across_a_rebuild(broker, tmp_path, impl):
    """A tombstone (value None) is stored with the null-value flag and read back as None
    (b"" stays b""), and a list of header pairs as the list: by read, read_raw, a group's
    poll, the bulk columns and an append of them; its log entry and snapshot record keep it,
    so a "wal" stream rebuilt from a snapshot and the logs after it has it back."""
    from shmq.engine.shm import ring
    from shmq.persistence import Snapshotter, recover

    s = broker.create_stream("events", partitions=1, durability="wal")
    snap = Snapshotter(broker, str(tmp_path), wal_mode=0)
    snap.open_stream(s)
    s.append_many([None, b"", b"v"], keys=[b"k", b"k", None], headers=[None, PAIRS, {"d": 1}], partition=0)
    snap.run_once()  # the first three in the snapshot, the rest in the log after it
    s.append(None, headers=[("n", None)], partition=0)
    s.append(b"", key=b"k", partition=0)
    want = [(0, b"k", None, {}), (1, b"k", b"", PAIRS), (2, None, b"v", {"d": 1}), (3, None, None, [("n", None)]),
            (4, b"k", b"", {})]
    assert [(r.offset, r.key, r.value, r.headers) for r in s.read(0, 0)] == want
    assert [v for _o, _t, _k, _h, v in s.read_raw(0, 0)] == [None, b"", b"v", None, b""]
    with s.consumer("g") as c:
        assert [(r.offset, r.key, r.value, r.headers) for r in c.poll(timeout=5)] == want
    part = s._part(0)
    head, tail = part._mq[L.PI_HEAD], part._mq[L.PI_TAIL]
    copy = ring.copy_used(part._mm, part._base, part._cap, head, tail)
    assert [fields[4] for _o, fields in ring.copied_records(copy, part._cap, head, tail)] == [
        L.FLAG_NULL_VALUE, 0, 0, L.FLAG_NULL_VALUE, 0]  # the record's flags
    cols = s.read_columns(0, 0)
    if impl == "fast":
        assert cols[0] == 5 and cols[8] == bytes([0b10110])  # the values' validity: 1, 2 and 4 there
        assert s.read_columns(0, 1, 2)[8] is None  # none null: no bitmap
        copy = broker.create_stream("copy", partitions=1)
        assert copy.append_columns(cols, 0) == 0  # read_columns' fields are a chunk
        assert [(r.offset, r.key, r.value, r.headers) for r in copy.read(0, 0)] == want
    else:
        assert cols is None
    snap.close()
    s.close()
    broker.delete_stream("events")  # a reboot: the files stay
    assert recover(broker, str(tmp_path)) == ["@events"]
    s = broker.stream("events")
    assert [(r.offset, r.key, r.value, r.headers) for r in s.read(0, 0)] == want
    s.close()


# ---------------------------------------------------------------------------- bulk reads in C

@pytest.mark.skipif(not shmq.engine.shm.cpaths.FAST, reason="the C paths are not built (or SHMQ_PURE_PYTHON=1)")
def test_read_columns_gives_what_read_raw_gives_across_laps_of_the_ring(broker):
    pytest.importorskip("pyarrow")
    from shmq.spark.arrow import columns_to_batch, rows_to_batch

    s = broker.create_stream("events", partitions=1, max_bytes=8192)
    rnd = __import__("random").Random(7)
    for i in range(400):  # laps of a small ring: records wrap, pads at lap ends, the head moves
        n = rnd.randint(1, 5)
        s.append_many([None if rnd.random() < 0.1 else bytes([i % 256]) * rnd.randint(0, 300) for _ in range(n)],
                      keys=[None if rnd.random() < 0.3 else b"k%d" % rnd.randint(0, 9) for _ in range(n)],
                      headers=[rnd.choice((None, {"i": i, "b": b"\xff"}, [("i", i), ("i", None)])) for _ in range(n)],
                      partition=0)
        earliest, end = s.offsets(0)
        for offset in {earliest, (earliest + end) // 2, end - 1}:
            want = rows_to_batch("events", 0, s.read_raw(0, offset, 7), True)
            got = columns_to_batch("events", 0, s.read_columns(0, offset, 7), True)
            got.validate(full=True)
            assert got.equals(want), (i, offset)
    assert s.read_columns(0, s.offsets(0)[1], 5)[0] == 0  # at the end: nothing
    with pytest.raises(shmq.OffsetOutOfRange):
        s.read_columns(0, s.offsets(0)[0] - 1, 5)


# ---------------------------------------------------------------------------- bulk appends (C, and its Python twin)

def _column(items, pad):
    """Arrow binary buffers of ``items`` (None: empty), int32 offsets starting at ``pad``
    (as a sliced array's do)."""
    offsets, data = array.array("i", [pad]), bytearray(b"\0" * pad)
    for x in items:
        data += x or b""
        offsets.append(len(data))
    return offsets.tobytes(), bytes(data)


def _validity(items) -> bytes:
    bits = bytearray((len(items) + 7) // 8)
    for i, x in enumerate(items):
        if x is not None:
            bits[i >> 3] |= 1 << (i & 7)
    return bytes(bits)


def _chunk(values, keys=None, headers=None, pad=0):
    """A chunk for ``append_columns``: (n, value offsets, values, key offsets, keys, key
    validity, header offsets, headers), and the values' validity where one is None."""
    voffs, vals = _column(values, pad)
    koffs = kdata = kvalid = hoffs = hdata = None
    if keys is not None:
        koffs, kdata = _column(keys, pad)
        kvalid = _validity(keys)
    if headers is not None:
        hoffs, hdata = _column([encode_record_headers(h) if h else b"" for h in headers], pad)
    chunk = (len(values), voffs, vals, koffs, kdata, kvalid, hoffs, hdata)
    return chunk + (_validity(values),) if None in values else chunk


def _records(rnd, n):
    """Values (some None: tombstones), keys, headers (dicts, lists of pairs that a dict
    cannot hold, none)."""
    values = [None if rnd.random() < 0.1 else bytes([rnd.randrange(256)]) * rnd.randint(0, 300) for _ in range(n)]
    keys = [None if rnd.random() < 0.3 else b"k%d" % rnd.randint(0, 99) for _ in range(n)]
    headers = [rnd.choice((None, {"i": i, "b": b"\xff"}, [("i", i), ("i", None)])) for i in range(n)]
    return values, keys, headers


def _rows(s, p):
    earliest, end = s.offsets(p)
    return [(r.offset, r.key, r.value, r.headers) for r in s.read(p, earliest, max_records=10**6)], (earliest, end)


def test_append_columns_stores_what_append_many_stores_across_laps_of_the_ring(broker, impl):
    """Chunks of Arrow buffers (keys with nulls, headers, offsets not from 0, several
    chunks in one append) land as the same records at the same offsets, with the same
    drops for room, as the same records appended one by one."""
    rnd = random.Random(11)
    a = broker.create_stream("a", partitions=1, max_bytes=8192)
    b = broker.create_stream("b", partitions=1, max_bytes=8192)
    for i in range(300):
        chunks, every = [], ([], [], [])
        for _ in range(rnd.randint(1, 3)):
            values, keys, headers = _records(rnd, rnd.randint(0, 6))
            with_keys, with_headers = rnd.random() < 0.7, rnd.random() < 0.5
            chunks.append(_chunk(values, keys if with_keys else None, headers if with_headers else None,
                                 pad=rnd.choice((0, 3))))
            every[0].extend(values)
            every[1].extend(keys if with_keys else [None] * len(values))
            every[2].extend(headers if with_headers else [None] * len(values))
        first = b._part(0).append_columns(chunks, time.time_ns())
        if every[0]:
            want = a.append_many(every[0], keys=every[1], headers=every[2], partition=0)[0].offset
            assert first == want, i
        else:
            assert first is None
        assert _rows(a, 0) == _rows(b, 0), i
    assert b.offsets(0)[0] > 0  # the ring went round: records were dropped for room


def test_append_columns_refuses_bad_buffers_and_big_records_and_takes_an_empty_chunk(broker, impl):
    s = broker.create_stream("s", partitions=2, max_message_bytes=100)
    n, voffs, vals, *rest = _chunk([b"ab", b"c"])
    bad = {
        "past the data": (n, voffs, b"ab", *rest),
        "decreasing": (n, array.array("i", [0, 2, 1]).tobytes(), vals, *rest),
        "too few": (3, voffs, vals, *rest),
        "validity": _chunk([b"a"] * 9, [b"k"] * 9)[:5] + (b"\xff",) + (None, None),
        "value validity": _chunk([b"a"] * 9) + (b"\xff",),  # 9 records: 2 bytes of bits
    }
    for what, chunk in bad.items():
        with pytest.raises(ValueError):
            s.append_columns(chunk, 0)
        assert s.offsets(0) == (0, 0), what
    with pytest.raises(shmq.MessageTooLarge, match="record of 101 bytes"):
        s.append_columns(_chunk([b"x" * 90], [b"k" * 11]), 1)
    assert s.append_columns(_chunk([]), 1) is None and s.offsets(1) == (0, 0)
    assert s.append_columns(_chunk([b"x" * 90], [b"k" * 10]), 1) == 0
    with pytest.raises(ValueError, match="partitions 0..1"):
        s.append_columns(_chunk([b"x"]), 2)


@pytest.mark.skipif(not shmq.engine.shm.cpaths.FAST, reason="the C paths are not built (or SHMQ_PURE_PYTHON=1)")
def test_the_c_log_entries_and_key_partitions_are_the_python_ones():
    from shmq.formats import dmsq
    from shmq.engine.streams.paths import C as c_paths

    rnd = random.Random(5)
    values, keys, headers = _records(rnd, 50)
    chunks = [_chunk(values[:20], keys[:20], headers[:20], pad=5), _chunk(values[20:], keys[20:])]
    txn = os.urandom(16)
    want = [dmsq.stream_entry(100 + i, 77, k, encode_record_headers(h) if h and i < 20 else b"", v)
            for i, (v, k, h) in enumerate(zip(values, keys, headers))]
    assert c_paths.columns_log(chunks, 100, 77, None, 0) == b"".join(want)
    assert c_paths.columns_log(chunks, 100, 77, txn, 9) == b"".join(want) + dmsq.publish_entry(149, 77, txn, 9)
    assert c_paths.columns_log([_chunk([])], 5, 77, txn, 9) == b""  # no records, no note
    _n, _vo, _v, koffs, kdata, kvalid, _ho, _h = chunks[0][:8]
    raw = c_paths.key_partitions(koffs, kdata, kvalid, 20, 7, 3)
    assert list(array.array("i", raw)) == [3 if k is None else partition_of(k, 7) for k in keys[:20]]
    with pytest.raises(ValueError):
        c_paths.key_partitions(koffs, kdata, kvalid, 21, 7, 3)


def test_publish_in_c_and_in_python_appends_and_logs_the_same(broker, tmp_path, impl):
    """A publish moves the staged records (from several staging partitions, keys and
    headers kept) into one append per target partition, and a "wal" target logs them
    with the publish note: rebuilt from its logs alone, the target and its table are back."""
    from shmq.persistence import Snapshotter, recover

    t = broker.create_stream("out", partitions=2, durability="wal")
    snap = Snapshotter(broker, str(tmp_path), wal_mode=0)
    snap.open_wal(t)
    st = broker.create_stream("out:staging:x", partitions=2, durability="memory")
    rnd = random.Random(3)
    values, keys, headers = _records(rnd, 40)
    st.append_many(values[:25], keys=keys[:25], headers=headers[:25], partition=0)
    st.append_many(values[25:], keys=keys[25:], headers=headers[25:], partition=1)
    txn = os.urandom(16)
    assert t.publish(st, {1: [(0, 5, 25), (1, 0, 15)], 0: [(0, 0, 5)]}, txn, 3) == {0: 0, 1: 0}
    want = {0: [(None, values[i], keys[i], headers[i] or {}) for i in range(5)],
            1: [(None, values[i], keys[i], headers[i] or {}) for i in range(5, 40)]}
    for p in (0, 1):
        rows = _rows(t, p)[0]
        assert [(None, v, k, h) for _o, k, v, h in rows] == want[p]
    snap.close()
    t.close()
    broker.delete_stream("out")  # a reboot: the logs alone (no snapshot was taken)
    assert recover(broker, str(tmp_path)) == ["@out"]
    t = broker.stream("out")
    assert t.published(txn) == {0: 3, 1: 3}
    assert [(None, v, k, h) for _o, k, v, h in _rows(t, 1)[0]] == want[1]
    assert t.publish(st, {1: [(0, 5, 25)]}, txn, 3) == {1: None}
    t.close()


def test_a_stream_deleted_as_a_handle_attaches_is_not_found(broker):
    """Its segment still there, its semaphore already unlinked (a delete between the two):
    StreamNotFound, and the half-made handle has nothing to close (no error at its
    collection)."""
    import gc
    import sys

    import posix_ipc

    from shmq.engine.streams.stream import Stream, stream_base

    broker.create_stream("s").close()
    posix_ipc.unlink_semaphore(stream_base(broker.namespace, "s") + ".ne")
    unraisable, hook = [], sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        with pytest.raises(shmq.StreamNotFound, match="deleted"):
            Stream(broker.namespace, "s")
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []


def test_read_raw_stops_at_a_byte_bound_the_first_record_always_comes(broker):
    s = broker.create_stream("big", partitions=1, max_bytes=1 << 22)
    s.append_many([b"x" * 100_000] * 20, partition=0)
    assert [r[0] for r in s.read_raw(0, 0, 500, max_bytes=1)] == [0]  # bigger than the bound: it alone
    assert [r[0] for r in s.read_raw(0, 3, 500, max_bytes=250_000)] == [3, 4]
    assert len(s.read_raw(0, 0, 500)) == 20
    s.close()


@pytest.mark.skipif(PartitionPaths_C is None, reason="the C paths are not built")
@given(st.lists(st.lists(st.integers(0, 3000), min_size=1, max_size=15), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(1, 9000), st.one_of(st.none(), st.integers(0, 300))), min_size=1, max_size=8))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_c_walk_drops_what_the_python_walk_drops(broker, batches, asks):
    """Where an append puts the head of a full ring, and what it drops (``Partition._room``):
    C's walk (``ring_drop``) and Python's agree, through pads at lap ends, with and without a
    group's floor (retention="block"). The appends themselves ran the C walk."""
    s = broker.create_stream("ring", partitions=1, max_bytes=64 * 1024)
    part = s._part(0)
    try:
        for sizes in batches:
            s.append_many([b"v" * n for n in sizes], partition=0)
        part._acquire()
        try:
            for size, limit in asks:
                end_from = lambda tail, size=size: L.place(tail, L.record_size(0, size), part._cap)[1]  # noqa: E731
                got = {}
                for paths in (PartitionPaths_C, PartitionPaths_PYTHON):
                    part.paths = paths
                    got[paths.kind] = part._room(end_from, limit)
                assert got["c"] == got["python"], (size, limit)
        finally:
            unlock(part._lockp)
    finally:
        s.close()
        broker.delete_stream("ring")
