"""Snapshots to .dmsq files and queues rebuilt from them (snapshot durability)."""

import json
import time
import os
import signal

import pytest

import shmq
from shmq.persistence import Snapshotter, recover, restore_file, snapshot_queue
from tests._processes import WORKERS
from tests.test_cli import shmq_cli
from tests.test_server_tcp import ServerProcess


def _fill(q):
    """Messages in every state: acked (gone), ready, leased, nacked-with-delay."""
    q.put_many([b"m%d" % i for i in range(10)])
    q.put(b"with headers", headers={"k": "v", "n": 7})
    q.get_many(3, timeout=0)[0].ack()  # #1 acked, #2 #3 leased
    q.get_nowait().nack(delay=60)      # #4 delayed, attempt 1
    return {"ready": [5, 6, 7, 8, 9, 10, 11], "leased": [2, 3], "delayed": [4]}


def test_export_import_round_trip_across_the_ring_end(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=900)
    for i in range(40):  # move the used part across the end of the ring
        q.put(b"%02d" % i * 100, headers={"i": i})
        if i < 37:
            q.get_nowait().ack()
    exported = q._export_messages()
    assert [(m[0], m[1], len(m[4])) for m in exported] == [(38, 0, 200), (39, 0, 200), (40, 0, 200)]
    other = broker.create_queue("other", max_bytes=8192)
    assert other._import_messages(exported) == 3
    got = other.get_many(10, timeout=0)
    assert [(d.id, d.body, d.headers["i"], d.attempt) for d in got] == [
        (38, b"37" * 100, 37, 1), (39, b"38" * 100, 38, 1), (40, b"39" * 100, 39, 1)]
    assert other.put(b"next") == 41  # ids go on after the restored ones


def test_snapshot_and_restore_keep_settings_ids_and_attempts(broker, tmp_path):
    broker.create_queue("dlq")
    q = broker.create_queue("q", max_bytes=1 << 20, visibility_timeout=7.5, max_deliveries=3,
                            dead_letter_queue="dlq")
    states = _fill(q)
    path, n = snapshot_queue(q, str(tmp_path))
    assert n == 10 and path == str(tmp_path / "q.dmsq")
    assert os.stat(path).st_mode & 0o777 == 0o600
    name, restored, error = restore_file(broker, path, into="copy")
    assert (name, restored, error) == ("copy", 10, None)
    c = broker.queue("copy")
    assert (c.max_bytes, c.visibility_timeout, c.max_deliveries, c.dead_letter_queue) == (1 << 20, 7.5, 3, "dlq")
    got = {d.id: d for d in c.get_many(20, timeout=0)}
    assert sorted(got) == sorted(states["ready"] + states["leased"] + states["delayed"])
    assert got[2].attempt == 2 and got[4].attempt == 2 and got[5].attempt == 1  # in-flight: delivered again
    assert got[11].headers == {"k": "v", "n": 7} and got[7].body == b"m6"


def test_memory_queues_are_never_written_and_deleted_queues_lose_their_file(broker, tmp_path):
    broker.create_queue("durable").put(b"x")
    broker.create_queue("volatile", durability="memory").put(b"y")
    snap = Snapshotter(broker, str(tmp_path))
    assert snap.run_once() == 1
    assert sorted(os.listdir(tmp_path)) == ["disk-reserve", "durable.dmsq"]
    broker.delete_queue("durable")
    snap.run_once()
    assert os.listdir(tmp_path) == ["disk-reserve"]


def test_recover_rebuilds_only_what_shared_memory_lost(namespace, tmp_path):
    with shmq.connect(namespace=namespace) as broker:
        q = broker.create_queue("q")
        q.put_many([b"a", b"b"])
        snapshot_queue(q, str(tmp_path))
        q.put(b"c")  # newer than the file
        assert recover(broker, str(tmp_path)) == []  # the segment is there: memory wins
        assert q.stats().ready == 3
        q.close()
    shmq.destroy_namespace(namespace)  # as a reboot would: the registry made anew below
    with shmq.connect(namespace=namespace) as broker:
        broker.create_namespace()
        assert recover(broker, str(tmp_path)) == ["q"]
        assert [d.body for d in broker.queue("q").get_many(5, timeout=0)] == [b"a", b"b"]


def test_a_damaged_snapshot_restores_up_to_the_damage_and_is_set_aside(broker, tmp_path, caplog):
    q = broker.create_queue("q")
    q.put_many([b"x" * 100] * 10)
    path, _ = snapshot_queue(q, str(tmp_path))
    q.close()
    broker.delete_queue("q")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # damage a record in the middle
    open(path, "wb").write(bytes(data))
    with caplog.at_level("ERROR"):
        assert recover(broker, str(tmp_path)) == ["q"]
    n = broker.queue("q").stats().ready
    assert 0 < n < 10  # everything before the damage, nothing after
    assert sorted(os.listdir(tmp_path)) == ["q.dmsq.corrupt", "registry.id"]
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "q.dmsq" in line and "byte" in line


@pytest.mark.parametrize("lanes", [1, 2])
def test_reboot_simulation_with_the_server(broker, tmp_path, lanes):
    data_dir = str(tmp_path / "data")
    q = broker.create_queue("q", visibility_timeout=300, lanes=lanes)
    states = _fill(q)
    srv = ServerProcess(broker.namespace, "--data-dir", data_dir, "--snapshot-interval", "0.05")
    assert srv.stop() == 0  # a clean stop writes a last snapshot
    q.close()
    broker.close()
    shmq.destroy_namespace(broker.namespace)  # the reboot: shared memory is gone
    srv = ServerProcess(broker.namespace, "--data-dir", data_dir)
    try:
        with shmq.connect(srv.url) as remote:
            got = remote.queue("q").get_many(20, timeout=5)
            idof = {n: (n - 1) * lanes + 1 for n in range(1, 12)}  # one handle: one lane's ids
            assert sorted(d.id for d in got) == sorted(idof[n] for n in states["ready"] + states["leased"]
                                                       + states["delayed"])
            assert {d.id: d.attempt for d in got}[idof[3]] == 2
    finally:
        assert srv.stop() == 0
    broker.__init__(broker.namespace)  # the fixture's teardown uses it


def test_a_sigkilled_broker_loses_nothing_that_is_still_in_memory(broker, tmp_path):
    q = broker.create_queue("q")
    srv = ServerProcess(broker.namespace, "--data-dir", str(tmp_path), "--snapshot-interval", "0.05")
    with shmq.connect(srv.url) as remote:
        remote.queue("q").put_many([b"%d" % i for i in range(100)])
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    srv.proc.stderr.close()
    srv = ServerProcess(broker.namespace, "--data-dir", str(tmp_path))  # segments still there: kept as they are
    try:
        assert q.stats().ready == 100
    finally:
        assert srv.stop() == 0


def test_cli_snapshot_inspect_restore(broker, tmp_path):
    ns = ["--namespace", broker.namespace]
    broker.create_queue("orders").put_many([b"order #42", b"order #43"])
    r = shmq_cli("snapshot", "orders", "--data-dir", str(tmp_path), *ns)
    assert r.returncode == 0 and "2 message(s)" in r.stdout
    info = json.loads(shmq_cli("inspect", str(tmp_path / "orders.dmsq"), "--json").stdout)
    assert info["queue"] == "orders" and info["records"] == 2 and info["complete"] is True
    r = shmq_cli("restore", str(tmp_path / "orders.dmsq"), "--into", "copy", *ns)
    assert (r.returncode, r.stdout) == (0, "restored 2 message(s) into copy\n")
    assert [d.body for d in broker.queue("copy").get_many(5, timeout=0)] == [b"order #42", b"order #43"]
    (tmp_path / "junk.dmsq").write_bytes(b"\x89PNG not a snapshot")
    r = shmq_cli("restore", str(tmp_path / "junk.dmsq"), *ns)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_restore_into_a_queue_that_holds_messages_needs_replace_or_append(broker, tmp_path):
    """The issue's case: a queue of 95 messages snapshotted, 3 consumed and 3 more put.
    A plain restore would add the file's 95 again (92 ids delivered twice): refused, the
    queue unchanged. --append adds only the 3 consumed since; --replace empties it first
    (the message in flight stays, and is not restored twice)."""
    ns = ["--namespace", broker.namespace]
    q = broker.create_queue("orders")
    q.put_many([b"order %d" % i for i in range(95)])
    assert shmq_cli("snapshot", "orders", "--data-dir", str(tmp_path), *ns).returncode == 0
    path = str(tmp_path / "orders.dmsq")
    q.ack_many(q.get_many(3, timeout=0))  # ids 1..3 done
    q.put_many([b"new 1", b"new 2", b"new 3"])  # ids 96..98
    r = shmq_cli("restore", path, *ns)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == ("shmq: error: queue 'orders' holds 95 message(s): restoring would add the file's messages to "
                        "them (delivered twice where they are the same); give --replace (empty it first, then "
                        "restore) or --append (restore only the ids it does not hold)\n")
    assert q.stats().ready == 95
    r = shmq_cli("restore", path, "--append", "--replace", *ns)
    assert (r.returncode, r.stderr.split(";")[0]) == (
        2, "shmq: error: --replace and --append exclude each other: give one")
    r = shmq_cli("restore", path, "--append", *ns)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "restored 3 message(s) into orders (appended: skipped 92 already in it)\n", "")
    ids = [m.id for m in q.peek(200)]
    assert sorted(ids) == list(range(1, 99)) and len(ids) == 98  # each id once
    held = q.get_nowait()  # id 4, in flight
    q.put(b"newer")
    r = shmq_cli("restore", path, "--replace", *ns)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "restored 94 message(s) into orders (replaced 98 it held; skipped 1 in flight there)\n", "")
    ids = sorted(m.id for m in q.peek(200))
    assert ids == [i for i in range(1, 96) if i != held.id]  # the file's, the one in flight left to its consumer
    held.ack()
    s = q.stats()
    assert (s.ready, s.in_flight, s.delayed) == (94, 0, 0)
    assert shmq_cli("restore", path, "--into", "empty", *ns).stdout == "restored 95 message(s) into empty\n"
    broker.queue("empty").purge()
    assert shmq_cli("restore", path, "--into", "empty", *ns).returncode == 0  # empty again: no flag needed


def test_restore_file_refuses_a_queue_that_holds_messages_unless_told(broker, tmp_path):
    from shmq.persistence.queues import QueuesNotEmpty

    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])
    path, _n = snapshot_queue(q, str(tmp_path))
    with pytest.raises(QueuesNotEmpty, match=r"^queue 'q' holds 2 message\(s\): restoring would add") as e:
        restore_file(broker, path)
    assert e.value.held == {"q": 2}
    assert restore_file(broker, path, mode="append") == ("q", 0, None)
    assert restore_file(broker, path, mode="replace") == ("q", 2, None)
    assert [m.body for m in q.peek(10)] == [b"a", b"b"]
    with pytest.raises(ValueError, match="mode must be one of replace, append or None, not 'merge'"):
        restore_file(broker, path, mode="merge")


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["memory", "snapshot", "wal"])
def test_sigkill_the_broker_under_load_loses_nothing(broker, tmp_path, durability):
    """Local producers and consumers and remote consumers hammer a queue while the
    broker is SIGKILLed and restarted: nothing acked comes back, nothing put is lost."""

    from tests import _workers as w

    ctx = WORKERS
    broker.create_queue("q", max_bytes=256 * 1024, visibility_timeout=300, durability=durability)
    url_file = tmp_path / "url"

    def publish(url):  # atomically: the consumers read it while we rewrite it
        (tmp_path / "url.tmp").write_text(url)
        os.replace(tmp_path / "url.tmp", url_file)

    srv = ServerProcess(broker.namespace, "--data-dir", str(tmp_path / "data"), "--snapshot-interval", "0.05")
    publish(srv.url)
    stop = w.StopFlag(ctx)  # (a process polling it is killed)
    procs = [ctx.Process(target=w.chaos_producer, args=(broker.namespace, "q", f"p{i}", str(tmp_path / f"p{i}"), stop))
             for i in range(2)]
    procs.append(ctx.Process(target=w.chaos_consumer, args=(broker.namespace, "q", str(tmp_path / "c0"))))
    procs += [ctx.Process(target=w.remote_chaos_consumer, args=(str(url_file), "q", str(tmp_path / f"r{i}"), stop))
              for i in range(2)]
    for p in procs:
        p.start()
    try:
        for _ in range(3):
            deadline = time.monotonic() + 30
            start = broker.queue("q").stats().acked_total
            while broker.queue("q").stats().acked_total < start + 200 and time.monotonic() < deadline:
                time.sleep(0.01)  # under load: wait for real progress before the kill
            srv.proc.send_signal(signal.SIGKILL)
            srv.proc.wait(10)
            srv.proc.stderr.close()
            srv = ServerProcess(broker.namespace, "--data-dir", str(tmp_path / "data"), "--snapshot-interval", "0.05")
            publish(srv.url)
        stop.set()
        for p in procs[:2] + procs[3:]:
            p.join(30)
            assert p.exitcode == 0
        os.kill(procs[2].pid, signal.SIGKILL)
        procs[2].join(10)
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert srv.stop() == 0
    produced, tried, done = [], set(), []
    for path in tmp_path.iterdir():
        if path.name[0] == "p" and path.is_file():
            produced += path.read_text().split("\n")[:-1]
        elif path.name[0] in "cr":
            for line in path.read_text().split("\n")[:-1]:
                verb, body = line.split(" ")
                (tried.add(body) if verb == "try" else done.append(body))
    q = broker.queue("q")
    drained = []
    while True:
        try:
            ds = q.get_many(256, timeout=3)
        except shmq.QueueEmpty:
            break
        drained += [d.body.decode() for d in ds]
        q.ack_many(ds)
    assert len(done) == len(set(done)), "a message was acked twice"
    assert not set(drained) & set(done), "an acked message came back"
    assert not set(produced) - tried - set(drained), "a message whose put returned was lost"
    assert len(produced) > 500


def test_a_wal_queue_refuses_puts_until_its_log_is_open(broker, tmp_path):
    q = broker.create_queue("q", durability="wal")
    with pytest.raises(shmq.ShmqError, match="no shmq server with a --data-dir"):
        q.put(b"x")
    assert q.stats().ready == 0
    Snapshotter(broker, str(tmp_path)).open_wal(q)
    q.put(b"x")
    assert q.get_nowait().body == b"x"


def test_the_batch_fsync_round_syncs_only_logs_with_new_entries(broker, tmp_path):
    snap = Snapshotter(broker, str(tmp_path), wal_mode=2, wal_batch_ms=2)
    q = broker.create_queue("q", durability="wal")
    broker.create_queue("plain", durability="memory")
    snap.open_wal(q)
    try:
        assert q.wal.pending() is None and snap.sync_logs() == 0  # nothing logged yet
        q.put(b"x")
        gen, size = q.wal.pending()
        assert size > 0 and snap.sync_logs() == 1
        assert q.wal.pending() is None and snap.sync_logs() == 0  # synced; nothing new
        q.get().ack()
        assert snap.sync_logs() == 1 and q.wal.pending() is None
        snap.run_once()  # a snapshot rotates the log: the next entries go to a new generation
        q.put(b"y")
        assert q.wal.pending()[0] == gen + 1 and snap.sync_logs() == 1 and q.wal.pending() is None
        q.wal.mark_synced(gen, 10**9)  # a stale generation's mark changes nothing
        q.put(b"z")
        assert q.wal.pending() is not None
        q.close()
        broker.delete_queue("q")
        assert snap.sync_logs() == 0 and list(snap._logs) == ["plain"]  # the deleted queue is let go
    finally:
        snap.close()
    assert snap._logs == {}


@pytest.mark.parametrize("mode,ms", [(0, 0), (1, 0), (2, 2)])
def test_wal_replay_rebuilds_exactly_what_was_put_and_not_acked(broker, tmp_path, mode, ms):
    data = str(tmp_path)
    q = broker.create_queue("q", durability="wal", max_bytes=1 << 20)
    Snapshotter(broker, data, wal_mode=mode, wal_batch_ms=ms).open_wal(q)
    ids = q.put_many([b"a%d" % i for i in range(10)])
    q.put(b"single", headers={"h": 1})
    ds = q.get_many(4, timeout=0)
    ds[0].ack()
    q.ack_many(ds[1:3])          # ids 1-3 acked, 4 leased (comes back ready)
    q.get_nowait().nack()        # 5 nacked: still there
    assert q.purge() == 7        # ids 5..11 purged
    q.put(b"after purge")
    q.close()
    broker.delete_queue("q")     # the reboot; its logs stay in the data dir
    assert recover(broker, data) == ["q"]
    got = broker.queue("q").get_many(20, timeout=0)
    assert [(d.id, d.body) for d in got] == [(4, b"a3"), (12, b"after purge")]
    assert ids == list(range(1, 11))


def _wal_reboot(broker, tmp_path, fsync, interval, lanes=1):
    """Producers put, consumers ack, over a wal queue; the broker is SIGKILLed (no last
    snapshot) and shared memory is wiped; what comes back is exactly what was not acked.
    With ``lanes``, a handle a lane puts (each lane logs apart)."""
    data = str(tmp_path / "data")
    srv = ServerProcess(broker.namespace, "--data-dir", data, "--fsync", fsync, "--snapshot-interval", interval)
    with shmq.connect(srv.url) as remote:
        remote.create_queue("q", durability="wal", max_bytes=lanes << 20, lanes=lanes)
    handles = [broker.queue("q") for _ in range(lanes)]
    q = handles[0]
    put = []
    for i in range(300):
        h = handles[i % lanes]
        put += h.put_many([b"m%d" % (2 * i), b"m%d" % (2 * i + 1)]) if i % 3 else [h.put(b"m%d" % (2 * i))]
    assert len({(i - 1) % lanes for i in put}) == lanes
    acked = []
    for _ in range(40):
        d = q.get_nowait()
        d.ack()
        acked.append(d.id)
    leased = [d.id for d in q.get_many(5, timeout=0)]
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    srv.proc.stderr.close()
    for h in handles:
        h.close()
    broker.close()
    shmq.destroy_namespace(broker.namespace)  # the reboot
    broker.__init__(broker.namespace)
    srv = ServerProcess(broker.namespace, "--data-dir", data, "--fsync", fsync)
    try:
        with shmq.connect(srv.url) as remote:
            rq = remote.queue("q")
            got = []
            while True:
                try:
                    got += rq.get_many(256, timeout=0)
                except shmq.QueueEmpty:
                    break
            assert sorted(d.id for d in got) == sorted(set(put) - set(acked))
            # deliveries are not logged: a lease taken after the last snapshot comes back
            # with the attempt count that snapshot had
            assert all(d.attempt >= 1 for d in got) and len(leased) == 5
            rq.ack_many(got)
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("fsync", ["always", "batch:2", "never"])
def test_wal_survives_a_reboot_from_the_log_alone(broker, tmp_path, fsync):
    _wal_reboot(broker, tmp_path, fsync, "3600")


def test_wal_survives_a_reboot_from_snapshots_plus_logs(broker, tmp_path):
    _wal_reboot(broker, tmp_path, "batch:2", "0.02")


@pytest.mark.parametrize("interval", ["3600", "0.02"])
def test_a_laned_wal_queue_survives_a_reboot(broker, tmp_path, interval):
    """Each lane's log, and the one snapshot of every lane, rebuild exactly what was not acked."""
    _wal_reboot(broker, tmp_path, "batch:2", interval, lanes=3)


def test_a_torn_log_append_is_cut_off_by_the_next_lock_holder(broker, tmp_path):

    from tests import _workers as w

    data = str(tmp_path)
    q = broker.create_queue("q", durability="wal")
    Snapshotter(broker, data, wal_mode=0).open_wal(q)
    q.put(b"before")
    ctx = WORKERS
    ready = ctx.Event()
    p = ctx.Process(target=w.tear_wal_append, args=(broker.namespace, "q", ready))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    q.put(b"after")  # EOWNERDEAD: the repair cuts the torn entry before this append
    q.close()
    broker.delete_queue("q")  # the reboot
    assert recover(broker, data) == ["q"]
    assert [d.body for d in broker.queue("q").get_many(5, timeout=0)] == [b"before", b"after"]


def test_a_snapshot_that_would_say_the_same_is_not_written_again(broker, tmp_path):
    """An idle broker writes nothing: the file is rewritten when a message comes, goes or
    is delivered (its attempt), when older logs are to go, or when the file is gone."""
    snap = Snapshotter(broker, str(tmp_path), wal_mode=2, wal_batch_ms=2)
    q = broker.create_queue("q")
    w = broker.create_queue("w", durability="wal")
    s = broker.create_stream("s", partitions=2, durability="wal")
    snap.open_wal(w)
    snap.open_stream(s)
    q.put(b"a")
    files = {name: tmp_path / name for name in ("q.dmsq", "w.dmsq", "@s#0.dmsq", "@s#1.dmsq")}

    def inodes():
        snap.run_once()
        return {name: os.stat(path).st_ino for name, path in files.items()}  # a rewrite renames a new file in

    try:
        first = inodes()
        assert inodes() == first  # nothing changed: nothing written
        d = q.get()
        after_get = inodes()
        assert after_get["q.dmsq"] != first["q.dmsq"] and after_get["w.dmsq"] == first["w.dmsq"]
        d.nack()  # ready again with the attempt it had: the file says so already
        assert inodes() == after_get
        s.append(b"r", partition=1)
        after_append = inodes()
        assert after_append["@s#1.dmsq"] != after_get["@s#1.dmsq"]
        assert after_append["@s#0.dmsq"] == after_get["@s#0.dmsq"]
        w.put(b"x")
        w.get().ack()  # the same (empty) queue, but a log to remove
        assert any(e.startswith("w.wal.") for e in os.listdir(tmp_path))
        after_log = inodes()
        assert after_log["w.dmsq"] != after_append["w.dmsq"]
        assert not any(e.startswith("w.wal.") for e in os.listdir(tmp_path))
        os.unlink(files["q.dmsq"])
        assert os.path.exists(inodes() and files["q.dmsq"])  # gone from the disk: written again
    finally:
        snap.close()


def test_a_create_during_a_snapshot_round_waits_for_the_file_it_shares(broker, tmp_path, monkeypatch):
    """The server's creates (``open_wal``, on the event loop's thread) and the rounds (a
    thread of their own) write the same snapshot through the same ``.tmp``: one at a
    time, else one's rename finds the other's file gone (seen under ``pytest -n 4``)."""
    import threading
    from shmq.persistence import snapshotter as module
    real, inside, most, lock = module.snapshot_stream, [], [], threading.Lock()
    entered, release = threading.Event(), threading.Event()

    def held(s, *args, **kwargs):  # the round's first write waits for the test's word
        with lock:
            inside.append(threading.get_ident())
            most.append(len(inside))
        entered.set()
        if len(most) == 1:
            release.wait(10)
        try:
            return real(s, *args, **kwargs)
        finally:
            with lock:
                inside.remove(threading.get_ident())

    monkeypatch.setattr(module, "snapshot_stream", held)
    s = broker.create_stream("events", partitions=1, durability="snapshot")
    snap = Snapshotter(broker, str(tmp_path))
    errors = []

    def run(work):
        try:
            work()
        except Exception as e:  # pragma: no cover - the failure this test looks for
            errors.append(e)

    create = threading.Thread(target=run, args=(lambda: snap.open_wal(s),))
    create.start()
    rounds = None
    try:
        assert entered.wait(10)  # the create is writing the stream's first snapshot
        entered.clear()
        rounds = threading.Thread(target=run, args=(snap.run_once,))
        rounds.start()
        assert not entered.wait(0.3)  # the round waits for it (a bound, not a sync)
    finally:
        release.set()
        create.join(10)
        if rounds is not None:
            rounds.join(10)
        snap.close()
        s.close()
    assert errors == [] and max(most) == 1
    assert os.path.exists(os.path.join(str(tmp_path), "@events#0.dmsq"))


def test_a_stream_created_during_a_round_keeps_the_files_its_create_wrote(broker, tmp_path, monkeypatch):
    """A round removes the files of queues and streams that are gone: not those of one
    created (and snapshotted by its create) after the round listed what there is."""
    from shmq.persistence import snapshotter as module
    real, made = module.snapshot_stream, []
    snap = Snapshotter(broker, str(tmp_path))
    early = broker.create_stream("early", partitions=1, durability="snapshot")
    snap.open_wal(early)

    def and_create(s, *args, **kwargs):  # the create comes while the round is at the streams it listed
        if not made:
            made.append(broker.create_stream("late", partitions=1, durability="wal"))
            snap.open_wal(made[0])
        return real(s, *args, **kwargs)

    monkeypatch.setattr(module, "snapshot_stream", and_create)
    try:
        snap.run_once()
        assert os.path.exists(os.path.join(str(tmp_path), "@late#0.dmsq"))
        made[0].append(b"logged")  # into the log its create opened
        monkeypatch.setattr(module, "snapshot_stream", real)
        made[0].close()
        broker.delete_stream("late")  # the reboot: shared memory gone, the files stay
        assert recover(broker, str(tmp_path)) == ["@late"]
        with broker.stream("late") as late:
            assert [r.value for r in late.read(0, 0)] == [b"logged"]
    finally:
        snap.close()
        early.close()
