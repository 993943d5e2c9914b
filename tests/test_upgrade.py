"""Upgrades keep the data: a namespace an older shmq made is rebuilt from its files by this
one's ``shmq server --data-dir`` (or ``shmq restore``), or refused in one line that says
what to run; a local attach names the versions; a data dir of a newer shmq is refused.

The older shmq is simulated by its memory's version word: a real server snapshots a
queue and a stream into a data dir and stops, then the version word of each segment is
rewritten to the layout version before this one's, and every byte after it is
scribbled over. That is faithful: the version word is what an older release leaves in a
segment (at the same place in every release), and nothing after it is the same layout,
so the new release must read nothing else of it — the scribbling makes sure it does not.
"""

import mmap
import os
import signal
import struct
import subprocess
import sys
import zlib

import msgpack
import pytest

import shmq
from shmq.formats import dmsq
from shmq.auth import default_data_dir
from shmq.engine.shm import layout as L
from shmq.engine.shm.names import partition_segment
from shmq.engine.shm.names import queue_segment, stream_base
from shmq.engine.shm.segment import SHM_DIR
from shmq.errors import LayoutMismatch, QueueCorrupted, StreamNotFound
from tests import test_storage_faults as faults

start_server = faults.start_server  # the fixture, shared

OLD_QUEUE, OLD_STREAM = L.LAYOUT_VERSION - 1, L.STREAM_VERSION - 1


def _shm(name):
    return os.path.join(SHM_DIR, name.lstrip("/"))


def _age(path, version):
    """What an older shmq leaves: its version word after the magic, and another layout after it."""
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<H", version))
        f.seek(8)
        f.write(b"\x5a" * (os.path.getsize(path) - 8))


def _segments(ns, partitions, queues=("jobs", "logged")):
    base = stream_base(ns, "events")
    return [_shm(queue_segment(ns, q)) for q in queues], [_shm(base)] + [
        _shm(partition_segment(base, p)) for p in range(partitions)]


def _everything(s):
    out = {}
    for p in range(s.partitions):
        earliest, end = s.offsets(p)
        got = s.read(p, earliest, max_records=10_000) if end > earliest else []
        out[p] = [(r.offset, r.key, bytes(r.value), r.headers) for r in got]
    return out


def _make_old(broker, data, start_server):
    """A queue and a stream snapshotted by a real server into ``data``, then aged. Returns
    what must come back: the queue's messages (id, body, headers, attempt), the stream's
    records, its ends and its group's commits."""
    q = broker.create_queue("jobs", durability="snapshot", max_bytes=65536)
    ids = [q.put(b"job-%d" % i, headers={"n": i}) for i in range(10)]
    leased = q.get_many(2, timeout=0)
    q.ack_many(leased[:1])  # one settled; the other in flight: saved as ready, its attempt kept
    acked, held = leased[0].id, leased[1].id
    del leased  # (a delivery's view keeps the memory mapped)
    s = broker.create_stream("events", partitions=2, max_bytes=65536, durability="snapshot")
    s.append_many([b"v-%d" % i for i in range(30)], keys=[b"k-%d" % (i % 4) for i in range(30)],
                  headers=[{"i": i} for i in range(30)])
    with s.consumer("g") as c:
        assert len(c.poll(max_records=12, timeout=1)) == 12
        c.commit()
    expected = {
        "messages": [(i, b"job-%d" % n, {"n": n}, 1 if i == held else 0) for n, i in enumerate(ids) if i != acked],
        "records": _everything(s), "ends": {p: s.offsets(p)[1] for p in range(2)}, "committed": s.committed("g"),
    }
    assert len(expected["messages"]) == 9 and sum(map(len, expected["records"].values())) == 30
    q.close()
    s.close()
    logged = broker.create_queue("logged", durability="wal", max_bytes=65536)
    srv = start_server("--data-dir", data, "--snapshot-interval", "3600")  # snapshots all at start
    expected["logged"] = [(logged.put(b"log-%d" % i), b"log-%d" % i) for i in range(5)]  # in its log only
    logged.close()
    srv.proc.send_signal(signal.SIGKILL)  # no last snapshot: "logged" comes back from its log
    assert srv.stop() == -signal.SIGKILL
    queues, streams = _segments(broker.namespace, 2)
    for path in queues:
        _age(path, OLD_QUEUE)
    for path in streams:
        _age(path, OLD_STREAM)
    return expected


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "shmq.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def _refusal(ns, where, data_dir):
    return (f"shmq: error: namespace '{ns}' holds queue(s) 'jobs', 'logged' (layout version {OLD_QUEUE}; this "
            f"shmq's is {L.LAYOUT_VERSION}) and stream(s) 'events' (layout version {OLD_STREAM}; this shmq's is "
            f"{L.STREAM_VERSION}), made by an older shmq, and {where} to rebuild them from: stop every process "
            f"using it, then run `shmq snapshot --namespace {ns} --data-dir {data_dir}` with the older shmq and "
            f"`shmq server --namespace {ns} --data-dir {data_dir}` with this one (or drop them: "
            f"`shmq namespace destroy {ns}`)")


def _forget(broker):
    """Drop what the test left of another layout (the fixture's clean-up would attach to it)."""
    broker.close()
    shmq.destroy_namespace(broker.namespace)
    broker.__init__(broker.namespace)


def test_a_new_server_rebuilds_an_older_layout_from_the_data_dir(broker, tmp_path, start_server):
    """Every message (its id, headers and attempt) and every record (its offset, key and
    headers) comes back, the group's commits too; one line per object says it was upgraded."""
    data = str(tmp_path / "data")
    expected = _make_old(broker, data, start_server)
    srv = start_server("--data-dir", data, "--snapshot-interval", "3600")
    try:
        lines = "".join(srv.log)
        assert lines.count(f"(upgraded: shared memory held it in an older shmq's layout version {OLD_QUEUE})") == 2
        assert f"queue logged rebuilt from {data}: 5 message(s) (upgraded: shared memory held it in an older " \
               f"shmq's layout version {OLD_QUEUE})" in lines
        assert f"queue jobs rebuilt from {data}: 9 message(s) (upgraded: shared memory held it in an older " \
               f"shmq's layout version {OLD_QUEUE})" in lines
        assert f"stream events rebuilt from {data}: 30 record(s) in memory, 1 group(s) (upgraded: shared memory " \
               f"held it in an older shmq's layout version {OLD_STREAM})" in lines
        with broker.queue("jobs") as q:
            got = q.get_many(100, timeout=0)
            assert [(d.id, bytes(d.body), d.headers, d.attempt - 1) for d in got] == expected["messages"]
            q.ack_many(got)
        with broker.queue("logged") as q:
            got = q.get_many(100, timeout=0)
            assert [(d.id, bytes(d.body)) for d in got] == expected["logged"]
            q.ack_many(got)
        with broker.stream("events") as s:
            assert _everything(s) == expected["records"]
            assert {p: s.offsets(p)[1] for p in range(2)} == expected["ends"]
            assert s.committed("g") == expected["committed"] and sum(expected["committed"].values()) == 12
            with s.consumer("g") as c:  # resumes at the commits
                rest = c.poll(max_records=100, timeout=1)
            assert sorted((r.partition, r.offset) for r in rest) == sorted(
                (p, o) for p, rows in expected["records"].items() for o, *_ in rows
                if o >= expected["committed"][p])
    finally:
        assert srv.stop() == 0


def test_without_files_the_server_refuses_in_one_line_and_changes_nothing(broker, tmp_path, start_server):
    data = str(tmp_path / "data")
    _make_old(broker, data, start_server)
    ns = broker.namespace
    queues, streams = _segments(ns, 2)
    before = {p: open(p, "rb").read(8) for p in queues + streams}
    empty = str(tmp_path / "empty")
    os.mkdir(empty)
    for args, where, data_dir in (
            (("--no-persist",), "no --data-dir (--no-persist)", default_data_dir(ns)),
            (("--data-dir", empty), f"no files in {empty}", empty)):
        done = _cli("server", "--namespace", ns, "--port", "0", *args)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1] == _refusal(ns, where, data_dir)
        assert "serving namespace" not in done.stderr
        assert {p: open(p, "rb").read(8) for p in queues + streams} == before  # nothing removed or changed
    assert sorted(os.listdir(empty)) == []
    _forget(broker)


def test_a_local_attach_names_the_versions_and_the_fix(broker, tmp_path, start_server):
    _make_old(broker, str(tmp_path / "data"), start_server)
    ns = broker.namespace
    with shmq.connect(namespace=ns) as b:
        with pytest.raises(LayoutMismatch, match=rf"^queue 'jobs' in namespace '{ns}' has layout version "
                           rf"{OLD_QUEUE}, made by an older shmq \(this one reads queue layout version "
                           rf"{L.LAYOUT_VERSION}\): stop every process using namespace '{ns}', then start this "
                           rf"shmq's `shmq server --namespace {ns} --data-dir DIR`") as e:
            b.queue("jobs")
        assert isinstance(e.value, QueueCorrupted)
        assert (e.value.kind, e.value.name, e.value.found, e.value.expected) == (
            "queue", "jobs", OLD_QUEUE, L.LAYOUT_VERSION)
        with pytest.raises(LayoutMismatch, match=rf"^stream 'events' in namespace '{ns}' has layout version "
                           rf"{OLD_STREAM}, made by an older shmq \(this one reads stream layout version "
                           rf"{L.STREAM_VERSION}\)") as e:
            b.stream("events")
        assert isinstance(e.value, StreamNotFound)  # as before: so a delete goes on
        b.delete_stream("events")
        assert b.list_streams() == [] and not any(os.path.exists(p) for p in _segments(ns, 2)[1])
    _forget(broker)


def test_a_process_still_using_the_old_memory_is_named(broker, tmp_path, start_server):
    """A process that maps the old memory (an older shmq's client, here this one's mmap)
    would go on using it after the upgrade removed it: refused, naming it."""
    data = str(tmp_path / "data")
    with broker.create_queue("jobs", durability="snapshot", max_bytes=65536) as q:
        q.put(b"x")
    srv = start_server("--data-dir", data, "--snapshot-interval", "3600")
    assert srv.stop() == 0
    path = _segments(broker.namespace, 0, ["jobs"])[0][0]
    _age(path, OLD_QUEUE)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0):
        done = _cli("server", "--namespace", broker.namespace, "--port", "0", "--data-dir", data)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"shmq: error: namespace '{broker.namespace}' holds queue(s) 'jobs' (layout version {OLD_QUEUE}; this "
        f"shmq's is {L.LAYOUT_VERSION}), and process(es) {os.getpid()} still use it: stop every process using the "
        "namespace, then start again")
    _forget(broker)


def test_restore_makes_an_older_layouts_queue_again_from_the_file(broker, tmp_path, start_server):
    data = str(tmp_path / "data")
    expected = _make_old(broker, data, start_server)
    done = _cli("restore", "--namespace", broker.namespace, os.path.join(data, "jobs.dmsq"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "restored 9 message(s) into jobs\n"
    assert done.stderr == (f"queue jobs: shared memory held it in an older shmq's layout version {OLD_QUEUE}, "
                           "which this shmq cannot read; removed, and made again from the file\n")
    with broker.queue("jobs") as q:
        got = q.get_many(100, timeout=0)
        assert [(bytes(d.body), d.headers) for d in got] == [(b, h) for _i, b, h, _a in expected["messages"]]
        q.ack_many(got)
    _forget(broker)  # (the stream is still the older layout's)


def test_this_shmqs_snapshot_keeps_the_files_of_an_older_layout(broker, tmp_path, start_server):
    """``shmq snapshot`` run with the new shmq before the upgrade (it cannot read them) says
    so once per object and leaves their files, which the upgrade rebuilds them from."""
    data = str(tmp_path / "data")
    _make_old(broker, data, start_server)
    files = {name: open(os.path.join(data, name), "rb").read() for name in os.listdir(data)}
    assert {"jobs.dmsq", "logged.dmsq", "@events#0.dmsq", "@events#1.dmsq"} <= set(files)
    done = _cli("snapshot", "--namespace", broker.namespace, "--data-dir", data)
    assert done.returncode == 0, done.stderr
    said = done.stderr.splitlines()
    assert len(said) == 3 and [line.split(" in namespace ")[0] for line in said] == [
        "queue 'jobs'", "queue 'logged'", "stream 'events'"]
    assert all(line.endswith("; retrying every interval") and "made by an older shmq" in line for line in said)
    assert {name: open(os.path.join(data, name), "rb").read() for name in os.listdir(data)} == files
    _forget(broker)


def _future_snapshot(path):
    """A .dmsq file of the format version after this shmq's: intact (its header CRC checks)."""
    dmsq.write_snapshot(path, dmsq.SnapshotHeader("jobs", {"durability": "snapshot"}, 1, 2), [])
    raw = bytearray(open(path, "rb").read())
    struct.pack_into("<H", raw, 4, dmsq.FORMAT_VERSION + 1)
    header_len = dmsq.PREFIX.unpack_from(raw)[3]
    struct.pack_into("<I", raw, header_len - 4, zlib.crc32(raw[:header_len - 4]))
    open(path, "wb").write(raw)
    return bytes(raw)


def _future_exchanges(path):
    table = msgpack.packb({}, use_bin_type=True)
    raw = dmsq.PREFIX.pack(dmsq.EXCHANGES_MAGIC, dmsq.EXCHANGES_VERSION + 1, 0, len(table)) + table
    raw += struct.pack("<I", zlib.crc32(raw))
    open(path, "wb").write(raw)
    return raw


def test_restore_refuses_a_newer_snapshot_in_one_line(broker, tmp_path):
    path = str(tmp_path / "jobs.dmsq")
    _future_snapshot(path)
    done = _cli("restore", "--namespace", broker.namespace, path)
    assert done.returncode == 1
    assert done.stderr == (f"shmq: error: {path}: unsupported format version {dmsq.FORMAT_VERSION + 1} (this shmq "
                           f"reads versions 1, 2) (at byte 0)\n")
    assert broker.list_queues() == []


@pytest.mark.parametrize("name,make,what", [
    ("jobs.dmsq", _future_snapshot,
     f"unsupported format version {dmsq.FORMAT_VERSION + 1} (this shmq reads versions 1, 2) (at byte 0)"),
    (dmsq.EXCHANGES_FILE, _future_exchanges,
     f"unsupported exchange table version {dmsq.EXCHANGES_VERSION + 1} (this shmq reads version "
     f"{dmsq.EXCHANGES_VERSION})")], ids=["snapshot", "exchanges"])
def test_a_server_refuses_a_data_dir_a_newer_shmq_wrote(broker, tmp_path, name, make, what):
    """In one line, the file left as it is (not set aside as damage) and nothing made."""
    data = tmp_path / "data"
    data.mkdir()
    path = str(data / name)
    raw = make(path)
    done = _cli("server", "--namespace", broker.namespace, "--port", "0", "--data-dir", str(data))
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (f"shmq: error: {path}: {what}: written by a newer shmq; run that one "
                                            f"on {data} (or move the file out of it and start again)")
    assert sorted(os.listdir(data)) == [name] and open(path, "rb").read() == raw
    assert broker.list_queues() == [] and broker.list_exchanges() == []
