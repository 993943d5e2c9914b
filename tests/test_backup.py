"""``shmq backup``: a namespace's durable state copied into a new directory while another
process keeps writing, consistent (every message and record in it is one a write
returned for, none twice, no hole, no torn file), and a server started from the copy
serves it: queues, streams with their offsets, their long tail and their groups'
committed offsets, exchanges."""

import json
import os
import subprocess
import sys
import uuid

import pytest

import shmq
from shmq.engine.shm.segment import destroy_namespace
from shmq.formats import dmsq
from tests._wait import wait_for
from tests.test_cli import shmq_cli

# A writer on its own: puts into two queues, appends to two streams, and commits a group's
# offsets, one step at a time, logging each write once it returned, until told to stop.
WRITER = r"""
import os, sys
import shmq

ns, stop, log_path = sys.argv[1:4]
with shmq.connect(namespace=ns) as b, open(log_path, "w", buffering=1) as log:
    orders, jobs = b.queue("orders"), b.queue("jobs")
    events, ticks = b.stream("events"), b.stream("ticks")
    group = events.consumer("g")
    i = 0
    while not os.path.exists(stop):
        log.write(f"orders {orders.put(b'order %d' % i)} {i}\n")
        log.write(f"jobs {jobs.put(b'job %d' % i, headers={'i': i})} {i}\n")
        md = events.append(b"event %d" % i, key=b"k%d" % (i % 5))
        log.write(f"events {md.partition} {md.offset} {i}\n")
        md = ticks.append(b"tick %d" % i)
        log.write(f"ticks {md.partition} {md.offset} {i}\n")
        if i % 10 == 9:
            group.poll(timeout=0)
            group.commit()
        i += 1
    group.close()
"""


def _written(log_path) -> dict:
    """What the writer's log says: {"orders": {id: i}, "jobs": {id: i}, "events": {(p, offset): i},
    "ticks": {(p, offset): i}}."""
    out = {"orders": {}, "jobs": {}, "events": {}, "ticks": {}}
    with open(log_path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # (a line being written)
            what, *rest = line.split()
            if what in ("orders", "jobs"):
                out[what][int(rest[0])] = int(rest[1])
            else:
                out[what][(int(rest[0]), int(rest[1]))] = int(rest[2])
    return out


def _count(log_path) -> int:
    return len(_written(log_path)["orders"]) if os.path.exists(log_path) else 0


def _everything(broker, stream, partitions):
    """{(partition, offset): value} of every record a stream still serves (memory and disk)."""
    out = {}
    with broker.stream(stream) as s:
        for p in range(partitions):
            first, end = s.offsets(p)
            offset = first
            while offset < end:
                records = s.read(p, offset, 500)
                for r in records:
                    out[(p, r.offset)] = r.value
                offset = records[-1].offset + 1
    return out


def _files_whole(dest):
    """Every snapshot and log in ``dest`` reads to its end, with no error (no torn file)."""
    names = sorted(os.listdir(dest))
    for name in names:
        path = os.path.join(dest, name)
        if name.endswith(".dmsq"):
            result = dmsq.read_snapshot(path)
            assert (result.complete, result.error) == (True, None), name
        elif ".wal." in name:
            _entries, error, _offset = dmsq.read_log(path)
            assert error is None, name
    return names


def test_a_backup_taken_by_the_server_while_a_process_writes_is_consistent_and_starts_a_server(
        broker, servers, tmp_path):
    data, dest, log_path, stop = tmp_path / "data", tmp_path / "backup", tmp_path / "writes", tmp_path / "stop"
    srv = servers(broker.namespace, "--data-dir", str(data), "--snapshot-interval", "0.2")
    with shmq.connect(srv.url) as remote:  # made by the server: their logs open at once
        remote.create_queue("orders", lanes=2)
        remote.create_queue("jobs", durability="wal")
        remote.create_queue("scratch", durability="memory").put(b"never kept")
        remote.create_stream("events", partitions=2, durability="wal", max_bytes=4096).close()
        remote.create_stream("ticks", partitions=1).close()
        remote.create_exchange("fan")
        remote.bind("fan", "jobs")
        remote.create_exchange("topic", "topic")
        remote.bind("topic", "events", "events.#")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, broker.namespace, str(stop), str(log_path)],
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        wait_for(lambda: _count(log_path) >= 300, 30, "300 writes")  # enough for the events' long tail on disk
        before = _count(log_path)
        r = shmq_cli("backup", str(dest), "--namespace", broker.namespace, "--json")
        after = _count(log_path)
        wait_for(lambda: _count(log_path) >= after + 50, 30, "writes after the backup")
    finally:
        stop.touch()
        assert writer.wait(30) == 0
    assert (r.returncode, r.stderr) == (0, "")
    done = json.loads(r.stdout)
    assert (done["dest"], done["by"], done["queues"], done["streams"], done["partitions"], done["exchanges"],
            done["kafka_state"], done["skipped"]) == (str(dest), "server", 2, 2, 3, 2, False, [])
    assert srv.stop() == 0
    written = _written(log_path)
    names = _files_whole(dest)
    assert not os.path.exists(str(dest) + ".partial")
    assert "scratch.dmsq" not in names and any(".wal." in n and n.startswith("@events#") for n in names)

    # a server started from the copy, in a namespace of its own, serves exactly what it holds
    other = "t" + uuid.uuid4().hex[:12]
    copy = servers(other, "--data-dir", str(dest))
    try:
        with shmq.connect(namespace=other) as b:
            assert sorted(b.list_queues()) == ["jobs", "orders"] and sorted(b.list_streams()) == ["events", "ticks"]
            for name, body in (("orders", b"order %d"), ("jobs", b"job %d")):
                with b.queue(name) as q:
                    held = q.peek(100_000)
                n = len(held)
                assert before <= n <= after + 1  # writes went on during the copy: it holds a point between
                assert sorted(written[name][m.id] for m in held) == list(range(n))  # each write once, no hole
                assert all(m.body == body % written[name][m.id] for m in held)
            assert b.queue("jobs").peek(1)[0].headers == {"i": 0}
            for name, partitions, body in (("events", 2, b"event %d"), ("ticks", 1, b"tick %d")):
                records = _everything(b, name, partitions)
                with b.stream(name) as s:
                    ends = [s.offsets(p)[1] for p in range(partitions)]
                    assert [s.offsets(p)[0] for p in range(partitions)] == [0] * partitions  # the long tail too
                    if name == "events":
                        committed, event_ends = s.committed("g"), ends
                assert sorted(records) == [(p, o) for p in range(partitions) for o in range(ends[p])]  # no hole
                assert all(v == body % written[name][key] for key, v in records.items())
                assert before <= len(records) <= after + 1
            assert committed and all(0 < committed[p] <= event_ends[p] for p in committed)
            assert b.exchange_info("fan")["bindings"] == [{"target": "jobs", "kind": "queue", "pattern": "#"}]
            assert b.exchange_info("topic")["bindings"] == [{"target": "events", "kind": "stream",
                                                             "pattern": "events.#"}]
            with b.stream("events") as s:
                s.append(b"after the restore", partition=0)  # a wal stream goes on logging in its new data dir
    finally:
        assert copy.stop() == 0
        destroy_namespace(other)


def test_with_no_server_the_command_copies_from_shared_memory(broker, tmp_path, servers):
    q = broker.create_queue("orders")
    q.put_many([b"a", b"b", b"c"])
    q.get_nowait()  # in flight: kept, ready again after a restore (as in a snapshot)
    q.put(b"later", delay=3600)
    with broker.create_stream("events", partitions=1) as s:
        s.append_many([b"e0", b"e1", b"e2"])
        c = s.consumer("g")
        c.poll(timeout=1)
        c.commit()
        c.close()
    dest = tmp_path / "b"
    r = shmq_cli("backup", str(dest), "--namespace", broker.namespace)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (f"backup in {dest} (" + r.stdout.split("(", 1)[1].split(",", 1)[0] + ", from shared memory: "
                        "no server runs): 1 queue(s) with 4 message(s), 1 stream(s) with 1 partition(s), 3 record(s) "
                        "and 0 log file(s), 0 exchange(s)\n")
    r = shmq_cli("backup", str(dest), "--namespace", broker.namespace)
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", f"shmq: error: {dest} exists: a backup goes into a new directory (name one that is not there)\n")
    other = "t" + uuid.uuid4().hex[:12]
    copy = servers(other, "--data-dir", str(dest))
    try:
        with shmq.connect(namespace=other) as b:
            with b.queue("orders") as q2:
                s2 = q2.stats()
                assert (s2.ready, s2.delayed) == (3, 1)
                assert sorted(m.body for m in q2.peek(10)) == [b"a", b"b", b"c"]
            with b.stream("events") as s:
                assert [r.value for r in s.read(0, 0, 10)] == [b"e0", b"e1", b"e2"]
                assert s.committed("g") == {0: 3}
    finally:
        assert copy.stop() == 0
        destroy_namespace(other)


def test_a_remote_backup_wants_an_absolute_path_and_a_new_directory(broker, servers, tmp_path):
    srv = servers(broker.namespace, "--no-persist")
    broker.create_queue("q").put(b"x")
    r = shmq_cli("backup", "relative/dir", "--url", srv.url)
    assert r.returncode == 2 and "with --url, DEST is a directory of the server's host: give its absolute path" in \
        r.stderr
    (tmp_path / "taken").mkdir()
    r = shmq_cli("backup", str(tmp_path / "taken"), "--url", srv.url)
    assert (r.returncode, r.stderr) == (
        1, f"shmq: error: {tmp_path / 'taken'} exists: a backup goes into a new directory (name one that is not "
           "there)\n")
    r = shmq_cli("backup", str(tmp_path / "nowhere" / "b"), "--url", srv.url)
    assert r.returncode == 1 and r.stderr.startswith(f"shmq: error: cannot make {tmp_path / 'nowhere' / 'b'}.partial")
    r = shmq_cli("backup", str(tmp_path / "b"), "--url", srv.url, "--json")
    assert r.returncode == 0 and '"by": "server"' in r.stdout and '"messages": 1' in r.stdout
    assert os.listdir(tmp_path / "b") == ["q.dmsq"]
    assert srv.stop() == 0


@pytest.mark.parametrize("durability", ["snapshot", "wal"])
def test_a_backup_changes_nothing_in_the_data_dir(broker, servers, tmp_path, durability):
    """No log rotated, no high-water epoch begun, no file of the server's data dir written."""
    data = tmp_path / "data"
    srv = servers(broker.namespace, "--data-dir", str(data), "--snapshot-interval", "3600")
    with shmq.connect(srv.url) as remote, remote.create_stream("s", partitions=1, durability=durability) as s:
        s.append_many([b"x"] * 10)
    before = {n: (data / n).read_bytes() for n in os.listdir(data)}
    r = shmq_cli("backup", str(tmp_path / "b"), "--namespace", broker.namespace)
    assert r.returncode == 0, r.stderr
    assert {n: (data / n).read_bytes() for n in os.listdir(data)} == before
    assert srv.stop() == 0
