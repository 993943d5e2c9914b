"""Write-ahead logs: file names (a queue's and a stream partition's), the all-or-nothing
append, reading a partition's logs back by offset, the high-water file's slots (the
full-disk case on a real small filesystem is in tests/test_storage_faults.py; streams
across reboots in tests/test_stream_persistence.py)."""

import errno
import os
import re

import pytest

import shmq
from shmq.formats import dmsq
from shmq.formats import logfiles
from shmq.persistence import Snapshotter
from shmq.engine.shm.mutex import unlock


def test_log_names_are_made_and_read_in_one_place():
    assert logfiles.wal_path("/d", "orders.eu", 7) == "/d/orders.eu.wal.00000007"
    assert logfiles.parse_wal_name("orders.eu.wal.00000007") == ("orders.eu", 7)
    for other in ("orders.dmsq", "orders.wal.00000007.corrupt", "orders.wal.", ".wal.00000001", "x.wal.1a"):
        assert logfiles.parse_wal_name(other) is None


@pytest.fixture
def wal_queue(broker, tmp_path):
    q = broker.create_queue("q", durability="wal")
    Snapshotter(broker, str(tmp_path), wal_mode=0).open_wal(q)
    q.put(b"before")
    return q


def test_a_failed_append_is_cut_back_and_changes_nothing(wal_queue, monkeypatch):
    q = wal_queue
    path = q.wal.path(q.wal.config()[0])
    size = os.path.getsize(path)
    real_write = os.write

    def half_then_full(fd, data):  # what a filling disk does: a short write, then ENOSPC
        if fd == q.wal.fd[1]:
            monkeypatch.setattr(os, "write", full)
            return real_write(fd, bytes(data)[: len(data) // 2])
        return real_write(fd, data)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(shmq.StorageError, match="No space left on device; nothing was changed"):
        q.put(b"x" * 6000)  # the Python path (the C one takes entries up to 4 KiB)
    monkeypatch.setattr(os, "write", real_write)
    assert os.path.getsize(path) == size and q.stats().ready == 1
    q.put(b"after")
    entries, error, _end = dmsq.read_log(path)
    assert error is None and [e.body for e in entries] == [b"before", b"after"]


def test_a_log_that_cannot_be_cut_back_is_left_for_the_next_generation(wal_queue, monkeypatch):
    q = wal_queue
    gen = q.wal.config()[0]
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((0,) * 6 + (10**9,) + (0,) * 3))
    with pytest.raises(shmq.StorageError, match="I/O error"):
        q.put(b"y" * 6000)
    monkeypatch.undo()
    assert q.wal.config()[0] == gen + 1  # no entry will land behind the damage
    q.put(b"next")
    entries, error, _end = dmsq.read_log(q.wal.path(gen + 1))
    assert error is None and [e.body for e in entries] == [b"next"]


def test_a_suspended_log_refuses_puts_until_it_is_configured_again(wal_queue, tmp_path):
    q = wal_queue
    gen = q.wal.config()[0]
    q.wal.suspend()
    # its directory is there: the reason given is not that it is gone (issue 27.6)
    path = re.escape(q.wal.path(gen))
    with pytest.raises(shmq.StorageError, match=rf"^queue 'q': its write-ahead log {path} was deleted \(its data "
                       r"directory is there\)"):
        q.put(b"refused")
    assert q.stats().ready == 1
    q.wal.configure(str(tmp_path), 0, 0, generation=5)
    q.put(b"back")
    assert [e.body for e in dmsq.read_log(q.wal.path(5))[0]] == [b"back"]


# ---------------------------------------------------------------- stream partitions


def test_partition_log_names_cannot_be_taken_for_a_queues():
    name = logfiles.partition_log_name("events.eu", 3)
    assert logfiles.wal_path("/d", name, 7) == "/d/@events.eu#3.wal.00000007"
    assert logfiles.parse_wal_name("@events.eu#3.wal.00000007") == ("@events.eu#3", 7)
    assert logfiles.split_partition_name(name) == ("events.eu", 3)
    assert logfiles.hwm_path("/d", name) == "/d/@events.eu#3.hwm"
    for other in ("events", "@events", "@#3", "@events#x", "events#3"):
        assert logfiles.split_partition_name(other) is None


def _log(path, offsets, torn=False, notes=False):
    """Log the records of ``offsets``; with ``notes``, a publish note after every fourth
    (as a publish writes one after its append's records)."""
    with open(path, "wb") as f:
        for o in offsets:
            f.write(dmsq.stream_entry(o, 1000 + o, b"k" if o % 2 else None, b"", b"v%d" % o))
            if notes and o % 4 == 3:
                f.write(dmsq.publish_entry(o, 1000 + o, b"\x01" * 16, o))
        if torn:
            f.write(dmsq.stream_entry(offsets[-1] + 1, 0, None, b"", b"torn")[:20])


def test_the_tail_reads_by_offset_across_files_and_says_where_a_hole_ends(tmp_path):
    d, name = str(tmp_path), logfiles.partition_log_name("s", 0)
    _log(logfiles.wal_path(d, name, 1), range(0, 100))
    _log(logfiles.wal_path(d, name, 2), range(100, 150))
    _log(logfiles.wal_path(d, name, 4), range(170, 200), torn=True)  # 150..169 lost (a damaged file, set aside)
    open(logfiles.wal_path(d, name, 5), "wb").close()  # the generation being appended to: empty yet
    tail = logfiles.Tail(name)
    assert [(f, os.path.basename(p)) for f, p in tail.files(d)] == [
        (0, "@s#0.wal.00000001"), (100, "@s#0.wal.00000002"), (170, "@s#0.wal.00000004")]
    rows, resume = tail.read(d, 95, 10, stop=1000)  # across a file boundary
    assert resume is None and [r[0] for r in rows] == list(range(95, 105))
    assert rows[0] == (95, 1095, b"k", b"", b"v95") and rows[1][2] is None
    rows, _ = tail.read(d, 140, 100, stop=1000)  # stops where the hole begins
    assert [r[0] for r in rows] == list(range(140, 150))
    assert tail.read(d, 150, 10, stop=1000) == ([], 170)  # in the hole: read on from 170
    rows, _ = tail.read(d, 190, 100, stop=1000)  # the torn entry ends the read
    assert [r[0] for r in rows] == list(range(190, 200))
    rows, _ = tail.read(d, 10, 1000, stop=30)  # memory holds 30 on
    assert [r[0] for r in rows] == list(range(10, 30))
    rows, _ = tail.read(d, 0, 1000, stop=1000, max_bytes=8)  # the first always; then within the budget
    assert [r[4] for r in rows] == [b"v0", b"v1", b"v2", b"v3"]
    for o in (64, 63, 130, 1):  # positions remembered by one scan serve the next ones
        assert tail.read(d, o, 1, stop=1000)[0][0][0] == o
    os.unlink(logfiles.wal_path(d, name, 1))  # retention deleted it
    assert tail.read(d, 5, 10, stop=1000) == ([], 100)


def test_the_tail_reads_records_only_past_the_publish_notes_among_them(tmp_path):
    d, name = str(tmp_path), logfiles.partition_log_name("s", 0)
    _log(logfiles.wal_path(d, name, 1), range(0, 300), notes=True)
    _log(logfiles.wal_path(d, name, 2), range(300, 400), notes=True)
    tail = logfiles.Tail(name)
    assert [f for f, _p in tail.files(d)] == [0, 300]
    rows, resume = tail.read(d, 0, 1000, stop=1000)
    assert resume is None and [r[0] for r in rows] == list(range(400))
    for o in (200, 51, 63, 64, 65, 191, 192, 299, 5, 128):  # through the positions one scan remembered (the
        assert tail.read(d, o, 3, stop=1000)[0] == rows[o:o + 3], o  # 65th entry is the note after offset 51)


def test_a_torn_high_water_write_leaves_the_slot_written_before(tmp_path):
    path = str(tmp_path / "@s#0.hwm")
    hw = logfiles.HighWater("@s#0", "stream 's' partition 0")
    hw.write(str(tmp_path), 0, 3, 5000, sync=True)
    hw.write(str(tmp_path), 1, 4, 9000, sync=False)
    assert dmsq.read_hwm(path) == (4, 9000)
    hw.write(str(tmp_path), 2, 5, 20000, sync=False)  # slot 0 again
    assert dmsq.read_hwm(path) == (5, 20000)
    hw.close()
    raw = bytearray(open(path, "rb").read())
    raw[10] ^= 0xFF  # the newest slot torn
    open(path, "wb").write(bytes(raw))
    assert dmsq.read_hwm(path) == (4, 9000)
    open(path, "wb").write(bytes(7))
    assert dmsq.read_hwm(path) is None


def _start_generation_and_die(log):
    """What a holder killed inside ``Log.rotate`` leaves: the next generation published,
    its size word still the old generation's."""
    from shmq.engine.shm import layout as L

    gen, mode, ms, directory = log.config()
    raw = directory.encode()
    L.WALCFG.pack_into(log._o._mm, log._cfg, gen + 1, mode, ms, len(raw), raw)


def _entries(path):
    return [(e.msg_id, e.body) for _pos, e in dmsq.scan_log(path)]


def test_a_repair_trusts_the_file_over_a_stale_size_word(wal_queue):
    q = wal_queue
    _start_generation_and_die(q.wal)
    q.put(b"a")  # the new generation's first entry, at 0; the size word says more
    path = q.wal.path(q.wal.config()[0])
    with open(path, "ab") as f:  # a putter killed half-way through its entry
        f.write(dmsq.encode_put_entry(9, 0, b"", b"torn")[:20])
    q._acquire()
    try:
        q._repair()
    finally:
        unlock(q._lockp)
    q.put(b"b")  # lands right after "a": the torn bytes were cut, so it can be read back
    assert [body for _i, body in _entries(path)] == [b"a", b"b"]
    assert q.wal.size() == os.path.getsize(path)


def test_a_partition_repair_cuts_the_entries_of_an_append_that_never_committed(broker, tmp_path):
    s = broker.create_stream("s", partitions=1, durability="wal")
    Snapshotter(broker, str(tmp_path), wal_mode=0).open_wal(s)
    s.append(b"r0", partition=0)
    part = s._part(0)
    _start_generation_and_die(part.log)
    s.append(b"r1", partition=0)
    path = part.log.path(part.log.config()[0])
    with open(path, "ab") as f:  # an appender killed after logging offset 2, before its commit
        f.write(b"".join(_entries_bytes(2, b"never committed")))
    part._acquire()
    try:
        part._repair()
    finally:
        unlock(part._lockp)
    assert s.append(b"r2", partition=0).offset == 2
    assert _entries(path) == [(1, b"r1"), (2, b"r2")]  # offset 2 once: the committed one
    s.close()


def _entries_bytes(offset, value):
    from shmq.engine.streams.partition import _stream_entry

    return [_stream_entry(offset, 0, None, b"", value)]
