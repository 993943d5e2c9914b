"""Streams on disk: snapshots, write-ahead logs, reboots, the disk tail, retention, damage.

A reboot is simulated as tests/test_persistence.py does: the broker (a real ``shmq
server --data-dir``) is SIGKILLed, shared memory is deleted, and a new broker rebuilds
what it finds on disk. What must hold across it: every offset keeps its record, the next
append continues where the stream ended, committed offsets come back as the last
snapshot had them, and an offset is never handed out twice — offsets a reboot lost are a
gap a reader is told about.
"""

import logging
import os
import signal
import time

import pytest

import shmq
from shmq.formats import dmsq
from shmq.engine.shm import layout as L
from shmq.persistence import Snapshotter, recover
from tests import _workers as w
from tests import test_storage_faults as faults
from tests._processes import WORKERS

start_server, _reboot, _wait = faults.start_server, faults._reboot, faults._wait  # the fixture and helpers, shared


def _everything(s):
    """{partition: [(offset, key, value, headers, timestamp)]} of every readable record."""
    out = {}
    for p in range(s.partitions):
        earliest, end = s.offsets(p)
        rows, o = [], earliest
        while o < end:
            got = s.read(p, o, max_records=10_000)
            rows += [(r.offset, r.key, bytes(r.value), r.headers, r.timestamp) for r in got]
            o = got[-1].offset + 1
        out[p] = rows
    return out


def _snapshots_cover(data, s, committed):
    """Whether the snapshot files of ``s`` hold its end and the group's commits."""
    for p in range(s.partitions):
        path = os.path.join(data, f"@{s.name}#{p}.dmsq")
        if not os.path.exists(path):
            return False
        st = dmsq.read_snapshot(path).header.settings
        if st["next_offset"] != s.offsets(p)[1] or st["committed"].get("g") != committed.get(p):
            return False
    return True


def _append_to(s, p, n, tag):
    return s.append_many([b"%s-%d" % (tag, i) for i in range(n)], partition=p)


def _append(s, n, tag):
    return s.append_many([b"%s-%d" % (tag, i) for i in range(n)], keys=[b"key-%d" % (i % 5) for i in range(n)],
                         headers=[{"i": i, "tag": tag.decode()} for i in range(n)])


# ---------------------------------------------------------------- reboots


@pytest.mark.parametrize("durability,fsync", [("snapshot", "batch:2"), ("wal", "always"), ("wal", "batch:2"),
                                              ("wal", "never")], ids=["snapshot", "wal-always", "wal-batch", "wal-never"])
def test_a_reboot_keeps_every_offset_and_the_committed_offsets(broker, tmp_path, start_server, durability, fsync):
    """Server 1 takes appends and a commit, and stops cleanly (a last snapshot). Server 2
    takes more appends and a commit, and is SIGKILLed with the host: a "wal" stream has
    the appends in its logs, a "snapshot" stream once a snapshot covered them (waited for).
    Everything comes back where it was, the next append continues at the old end, and the
    group resumes from the last commit a snapshot holds: the one server 2 took is lost with
    a "wal" stream (the group reads those records again), kept with the snapshot covering it."""
    data = str(tmp_path / "data")
    interval = "0.05" if durability == "snapshot" else "3600"
    args = ("--data-dir", data, "--fsync", fsync, "--snapshot-interval", interval)
    s = broker.create_stream("events", partitions=3, max_bytes=4096, durability=durability)
    srv = start_server(*args)
    _append(s, 120, b"one")
    c = s.consumer("g")
    first = c.poll(max_records=40, timeout=1)
    c.commit()
    c.close()
    c1 = s.committed("g")
    assert srv.stop() == 0
    srv = start_server(*args)
    metas = _append(s, 90, b"two")
    c = s.consumer("g")
    assert c.poll(max_records=25, timeout=1)
    c.commit()
    c.close()
    c2 = s.committed("g")
    if durability == "snapshot":
        _wait(lambda: _snapshots_cover(data, s, c2), "a snapshot of the last appends and commit", 30)
    before = _everything(s)
    ends = {p: s.offsets(p)[1] for p in range(3)}
    assert sum(ends.values()) == 210
    if durability == "wal":  # all of it readable, the oldest from the logs on disk only
        assert sum(len(rows) for rows in before.values()) == 210
        assert any(part["memory_earliest"] > 0 for part in s.stats()["partitions"])
    s.close()
    srv = _reboot(broker, srv, start_server, *args)
    try:
        s = broker.stream("events")
        assert _everything(s) == before
        assert {p: s.offsets(p)[1] for p in range(3)} == ends
        assert s.committed("g") == (c2 if durability == "snapshot" else c1) and c1 != c2
        after = s.append_many([b"after"] * 3, partition=metas[0].partition)
        assert [m.offset for m in after] == [ends[metas[0].partition] + i for i in range(3)]
        with s.consumer("g") as again:  # resumes at the commit that survived (or what is left past it)
            got = again.poll(max_records=1000, timeout=1)
        resumed = {p: min(r.offset for r in got if r.partition == p) for p in {r.partition for r in got}}
        assert resumed == {p: max(o, s.offsets(p)[0]) for p, o in s.committed("g").items() if o < ends[p]}
        assert first and s.durability == durability
        s.close()
    finally:
        assert srv.stop() == 0


def test_a_snapshot_stream_never_hands_out_an_offset_a_reboot_lost(broker, tmp_path, start_server, caplog):
    """Appends after the last snapshot die with the host; their offsets were handed out,
    so the rebuilt stream continues past them (its high-water file says how far) and a
    read there is told the offsets were lost; a group skips them with a warning. A
    partition left with no record at all keeps its next offset through another reboot."""
    data = str(tmp_path / "data")
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    kept = _append_to(s, 0, 50, b"kept")  # no server yet: a snapshot stream takes appends anyway
    s.reset("g", to={0: 50})
    srv = start_server("--data-dir", data, "--snapshot-interval", "3600")  # snapshots them at start
    assert [m.offset for m in _append_to(s, 0, 30, b"lost")] == list(range(50, 80))
    assert [m.offset for m in _append_to(s, 1, 20, b"lost")] == list(range(20))
    s.close()
    srv = _reboot(broker, srv, start_server, "--data-dir", data, "--snapshot-interval", "3600")
    try:
        s = broker.stream("events")
        earliest, end = s.offsets(0)
        assert earliest == 0 and end >= 80
        assert [r.value for r in s.read(0, 0, max_records=1000)] == [b"kept-%d" % i for i in range(50)]
        assert kept[-1].offset == 49
        with pytest.raises(shmq.OffsetOutOfRange, match=f"offsets 50..{end - 1} were lost") as e:
            s.read(0, 50)
        assert (e.value.earliest, e.value.end) == (end, end)
        new = s.append(b"new", partition=0)
        assert new.offset == end  # never 50..79 again
        with caplog.at_level(logging.WARNING, "shmq.stream"), s.consumer("g") as c:
            got = c.poll(timeout=5)
        assert [(r.partition, r.offset, r.value) for r in got if r.partition == 0] == [(0, end, b"new")]
        assert "skips offsets 50.." in caplog.text
        empty = s.offsets(1)
        assert empty[0] == empty[1] >= 20  # nothing left of partition 1, its offsets still taken
        s.close()
    finally:
        assert srv.stop() == 0
    srv = start_server("--data-dir", data, "--snapshot-interval", "3600")  # snapshots the empty partition
    srv = _reboot(broker, srv, start_server, "--data-dir", data)
    try:
        s = broker.stream("events")
        assert s.offsets(1) == empty and s.append(b"next", partition=1).offset == empty[1]
        s.close()
    finally:
        assert srv.stop() == 0


def test_an_append_that_returned_is_there_after_the_broker_and_the_host_died(broker, tmp_path, start_server):
    """Appender processes log each append that returned; the broker is SIGKILLed while
    they run (they go on: they write the log themselves), then they are killed at any
    instant, shared memory goes, and the rebuilt stream holds every one of them at its
    offset, with offsets dense from 0 (the oldest read back from the logs on disk)."""
    data = str(tmp_path / "data")
    broker.create_stream("events", partitions=2, max_bytes=1 << 14, durability="wal")
    srv = start_server("--data-dir", data, "--fsync", "batch:2", "--snapshot-interval", "0.05")
    logs = [tmp_path / f"a{i}.log" for i in range(3)]
    procs = [WORKERS.Process(target=w.stream_appender, args=(broker.namespace, "events", f"t{i}", 10**7, str(log),
                                                           1 + 4 * i)) for i, log in enumerate(logs)]
    for p in procs:
        p.start()
    try:
        lines = lambda: sum(log.stat().st_size for log in logs if log.exists())  # noqa: E731
        _wait(lambda: all(log.exists() and log.stat().st_size > 5000 for log in logs), "every appender at work", 60)
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)
        at_kill = lines()
        _wait(lambda: lines() > at_kill + 30_000, "appends after the broker died", 60)
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    srv = _reboot(broker, srv, start_server, "--data-dir", data)
    try:
        s = broker.stream("events")
        present = {}
        for p in range(2):
            assert s.offsets(p)[0] == 0
            for o, _key, value, _h, _t in _everything(s)[p]:
                present[value] = (p, o)
            assert [o for _v, (q, o) in present.items() if q == p] == list(range(s.offsets(p)[1]))
        returned = [line.split() for log in logs for line in log.read_text().splitlines() if line.count(" ") == 2]
        assert len(returned) > 1000
        missing = [v for v, p, o in returned if present.get(v.encode()) != (int(p), int(o))]
        assert missing == []
        s.close()
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- the disk tail


def _rounds(s, snap, rounds, make):
    """``rounds`` of 5 appends of 8 records (values from ``make(i)``), a snapshot round
    after each; returns the offsets appended."""
    offsets = []
    for _ in range(rounds):
        for _ in range(5):
            offsets += [m.offset for m in s.append_many([make(len(offsets) + i) for i in range(8)])]
        snap.run_once()
    return offsets


def _wal_stream(broker, data, **settings):
    """A "wal" stream of one partition whose logs a Snapshotter (returned) opened in ``data``."""
    s = broker.create_stream("events", partitions=1, durability="wal", **settings)
    snap = Snapshotter(broker, data, wal_mode=0)
    snap.open_stream(s)
    return s, snap


def _log_bytes(data):
    return sum(os.path.getsize(os.path.join(data, e)) for e in os.listdir(data) if ".wal." in e)


def test_reads_below_memory_come_from_disk_until_retention_bytes_delete_whole_files(broker, tmp_path):
    data = str(tmp_path)
    s, snap = _wal_stream(broker, data, max_bytes=4096, retention_bytes=40_000)
    try:
        # 13.6 KB of log a round; each snapshot round starts a new file (past max_bytes)
        written = _rounds(s, snap, 12, lambda i: b"r%d." % i + b"." * 300)
    finally:
        snap.close()
    earliest, end = s.offsets(0)
    memory = s.stats()["partitions"][0]["memory_earliest"]
    assert end == 480 and 0 < earliest < memory  # the oldest files went; the rest is the disk tail
    logs = sorted(e for e in os.listdir(data) if ".wal." in e)
    assert len(logs) == 2 and _log_bytes(data) <= 40_000  # a third file would pass retention_bytes
    assert dmsq.read_log(os.path.join(data, logs[0]))[0][0].msg_id == earliest  # whole files went
    got = s.read(0, earliest, max_records=1000)  # from disk, then on into memory
    assert [(r.offset, r.value.split(b".")[0]) for r in got] == [(o, b"r%d" % o) for o in written[earliest:]]
    assert got[0].headers == {} and got[0].key is None
    assert s.read(0, earliest + 3, max_records=2) == got[3:5]
    with pytest.raises(shmq.OffsetOutOfRange, match=f"outside \\[{earliest}, 480\\]") as e:
        s.read(0, earliest - 1)
    assert (e.value.earliest, e.value.end) == (earliest, 480)
    with s.consumer("late") as c:  # a new group starts at the disk tail
        assert c.poll(max_records=1, timeout=1)[0].offset == earliest
    s.close()


def test_retention_seconds_delete_the_files_last_written_before_it(broker, tmp_path):
    data = str(tmp_path)
    s, snap = _wal_stream(broker, data, max_bytes=4096, retention_seconds=3600)
    try:
        _rounds(s, snap, 4, lambda i: b"." * 300)  # one file a round (rolled at max_bytes)
        logs = sorted(e for e in os.listdir(data) if ".wal." in e)
        assert s.offsets(0) == (0, 160) and len(logs) >= 3
        for e in logs[:2]:
            os.utime(os.path.join(data, e), ns=(1, 1))  # last written in 1970
        snap.run_once()
    finally:
        snap.close()
    assert sorted(e for e in os.listdir(data) if ".wal." in e) == logs[2:]
    assert s.offsets(0)[0] == dmsq.read_log(os.path.join(data, logs[2]))[0][0].msg_id > 0
    s.close()


def test_a_damaged_stream_log_is_replayed_to_the_damage_and_set_aside(broker, tmp_path, caplog):
    """A flipped byte mid-log: the records before it come back (and stay readable from
    the log's intact part, written back under its name), the damaged file is kept as
    ``.corrupt``, and the offsets the damage hid are a gap, never handed out again."""
    data = str(tmp_path)
    s, snap = _wal_stream(broker, data)
    s.append_many([b"%03d" % i + b"." * 100 for i in range(30)])
    snap.close()
    s.close()
    (path,) = [os.path.join(data, e) for e in os.listdir(data) if ".wal." in e]
    raw = bytearray(open(path, "rb").read())
    entry = len(raw) // 30
    raw[10 * entry + 50] ^= 0xFF  # inside the entry of offset 10
    open(path, "wb").write(bytes(raw))
    broker.delete_stream("events")  # the reboot: the files stay
    with caplog.at_level(logging.ERROR, "shmq.persistence"):
        assert recover(broker, data) == ["@events"]
    assert "log entry 10: checksum mismatch" in caplog.text and "moved to" in caplog.text
    assert open(path + ".corrupt", "rb").read() == bytes(raw)
    assert open(path, "rb").read() == bytes(raw[:10 * entry])
    s = broker.stream("events")
    assert s.offsets(0) == (0, 30)
    assert [r.value[:3] for r in s.read(0, 0, max_records=100)] == [b"%03d" % i for i in range(10)]
    with pytest.raises(shmq.OffsetOutOfRange, match="offsets 10..29 were lost") as e:
        s.read(0, 10)
    assert e.value.earliest == 30
    snap = Snapshotter(broker, data, wal_mode=0)
    snap.open_stream(s)  # as the server does after recover: a new log generation
    snap.close()
    assert s.append(b"next").offset == 30
    s.close()


def _log_and_hang(ns, stream, ready):
    """An appender killed between its log append and its commit: take partition 0's lock,
    log a record for the next offset as an append does, say so, hang until killed."""
    s = shmq.connect(namespace=ns).stream(stream)
    part = s._part(0)
    part._acquire()
    mq = part._mq
    first = mq[L.PI_NEXT]
    mq[L.PI_WAL_MARK_OFFSET], mq[L.PI_WAL_MARK] = first, part.log.size()
    part.log.append(dmsq.stream_entry(first, time.time_ns(), None, b"", b"never committed"))
    ready.set()
    time.sleep(3600)


def test_an_append_logged_and_never_committed_is_cut_from_the_log(broker, tmp_path):
    """Its offset was never handed out, so the next appender (repairing the lock) cuts
    the entry off: the log never holds two records for one offset."""
    data = str(tmp_path)
    s, snap = _wal_stream(broker, data)
    snap.close()
    s.append(b"before")
    ready = WORKERS.Event()
    p = WORKERS.Process(target=_log_and_hang, args=(broker.namespace, "events", ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    assert s.append(b"after").offset == 1  # EOWNERDEAD: the repair cuts the entry first
    (path,) = [os.path.join(data, e) for e in os.listdir(data) if ".wal." in e]
    entries, error, _end = dmsq.read_log(path)
    assert error is None and [(e.msg_id, e.body) for e in entries] == [(0, b"before"), (1, b"after")]
    s.close()


def test_a_wal_stream_created_over_tcp_logs_its_first_append(broker, tmp_path, start_server):
    data = tmp_path / "data"
    srv = start_server("--data-dir", str(data), "--fsync", "always", "--snapshot-interval", "3600")
    with shmq.connect(srv.url) as remote:
        remote.create_stream("s", partitions=1, max_bytes=1 << 16, durability="wal")
        m = remote.stream("s").append(b"first")  # the server opened its log at create, not a round later
    logs = [e for e in os.listdir(data) if ".wal." in e]
    assert m.offset == 0 and len(logs) == 1 and os.path.getsize(data / logs[0]) > 0
    assert srv.stop() == 0


def test_the_publishers_table_comes_back_with_the_snapshot(broker, tmp_path):
    """A batch published before the snapshot is known after a reboot: its replay appends
    nothing; the table never names a batch whose records the snapshot lacks."""
    data = str(tmp_path)
    t = broker.create_stream("events", partitions=2, durability="snapshot")
    st = broker.create_stream("staging", partitions=2, durability="memory")
    txn = os.urandom(16)
    st.append_many([b"a", b"b"], partition=1)
    assert t.publish(st, {1: [(1, 0, 2)]}, txn, 4) == {1: 0}
    snap = Snapshotter(broker, data)
    snap.run_once()
    snap.close()
    t.close()
    broker.delete_stream("events")  # the reboot: the files stay
    assert recover(broker, data) == ["@events"]
    t = broker.stream("events")
    assert t.published(txn) == {0: -1, 1: 4}
    assert t.publish(st, {1: [(1, 0, 2)]}, txn, 4) == {1: None}
    assert [r.value for r in t.read(1, 0)] == [b"a", b"b"]
    t.close()


@pytest.mark.parametrize("fast", [True, False], ids=["c-path", "python-path"])
def test_a_batch_published_after_the_last_snapshot_lands_once_after_a_reboot(broker, tmp_path, start_server, fast):
    """A "wal" stream logs each publish's note (publisher, batch) in the same write as its
    records, so the publishers' table comes back from the logs: a batch published after
    the last snapshot, replayed after the broker (a real ``shmq server``) was SIGKILLed
    and shared memory wiped, appends nothing; the next batch goes in."""
    from shmq.engine.shm import cpaths

    if fast and not cpaths.FAST:
        pytest.skip("the C paths are not built (or SHMQ_PURE_PYTHON=1)")
    data = str(tmp_path / "data")
    args = ("--data-dir", data, "--fsync", "always", "--snapshot-interval", "3600")
    txn = os.urandom(16)

    def stage(batch):
        """What a Spark sink's tasks do for ``batch``: its rows into a staging stream (memory)."""
        st = broker.create_stream("out:staging", partitions=2, durability="memory", exist_ok=True)
        ranges = {}
        for p, n in ((0, 3), (1, 2 if batch == 7 else 0)):
            if n:
                first = st.append_many([b"%d-%d-%d" % (batch, p, i) for i in range(n)], partition=p)[0].offset
                ranges[p] = [(p, first, first + n)]
        return st, ranges

    def values(t):
        return sorted(r.value for p in range(2) for r in t.read(p, 0, max_records=100))

    cpaths.set_enabled(fast)
    srv = start_server(*args)
    try:
        with shmq.connect(srv.url) as remote:  # the server opens its logs at create
            remote.create_stream("out", partitions=2, durability="wal")
        t = broker.stream("out")
        st, ranges = stage(7)
        assert t.publish(st, ranges, txn, 7) == {0: 0, 1: 0}
        st, ranges = stage(8)
        assert t.publish(st, ranges, txn, 8) == {0: 3}  # a batch of partition 0 only
        before = values(t)
        assert len(before) == 8 and t.published(txn) == {0: 8, 1: 7}
        st.close()
        t.close()
        snapshots = [os.path.join(data, e) for e in os.listdir(data) if e.startswith("@out#") and e.endswith(".dmsq")]
        assert not any(dmsq.read_snapshot(f).header.settings.get("published") for f in snapshots)  # the logs only
        srv = _reboot(broker, srv, start_server, *args)  # SIGKILL, shared memory gone, a new broker
        t = broker.stream("out")
        assert t.published(txn) == {0: 8, 1: 7}
        for batch in (7, 8):  # the replays stage their rows again: nothing lands twice
            st, ranges = stage(batch)
            assert t.publish(st, ranges, txn, batch) == {p: None for p in ranges}
        assert values(t) == before
        st, ranges = stage(9)
        assert t.publish(st, ranges, txn, 9) == {0: 6}
        assert len(values(t)) == 11
        st.close()
        t.close()
    finally:
        cpaths.set_enabled(True)
        assert srv.stop() == 0
