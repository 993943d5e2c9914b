"""The ``--fsync batch:MS`` loop (shmq/server/logsync.py): logs written are fsynced, an
idle syncer runs no rounds, a vanished data dir wakes it; and an idle ``shmq server``
costs next to no CPU, whatever its fsync policy."""

import os
import re
import shutil
import threading
import time

import psutil
import pytest

import shmq
from shmq.auth import default_data_dir
from shmq.engine.shm import layout as L
from shmq.engine.broker import Broker
from shmq.formats.logfiles import wal_path
from shmq.persistence import Snapshotter
from shmq.persistence import snapshotter as snapshotter_module
from shmq.server.dirwatch import DirWatch
from shmq.server.logsync import LogSyncer
from tests._wait import wait_for


@pytest.fixture
def synced(broker, tmp_path):
    """(Snapshotter, LogSyncer, wal queue) on a data dir of the test's own, batch:2."""
    snap = Snapshotter(Broker(broker.namespace), str(tmp_path / "data"), wal_batch_ms=2)
    q = broker.create_queue("q", durability="wal")
    snap.open_wal(q)
    syncer = LogSyncer(snap, 2, retry_s=0.05).start()
    yield snap, syncer, q
    syncer.stop()
    snap.close()
    snap.broker.close()


def _idle(syncer):
    """Wait until the syncer sleeps on its watch; its round count then."""
    wait_for(lambda: syncer.idle, what="the syncer going idle")
    return syncer.rounds


def test_a_written_log_is_synced_and_an_idle_syncer_runs_no_rounds(synced):
    snap, syncer, q = synced
    before = _idle(syncer)
    for i in range(20):
        q.put(b"m%d" % i)
    wait_for(lambda: q.wal.pending() is None, what="the log fsynced")  # woken by the write, not by a clock
    after = _idle(syncer)
    assert after > before
    deadline = time.monotonic() + 0.5  # half a second idle: 250 rounds before this change, none now
    while time.monotonic() < deadline:
        assert syncer.idle and syncer.rounds == after
        time.sleep(0.05)  # (observing that nothing happens: not a synchronization)
    q.put(b"later")
    wait_for(lambda: q.wal.pending() is None, what="a write after the idle time fsynced")


def test_a_stream_partition_log_wakes_it_too(synced, broker):
    snap, syncer, _q = synced
    s = broker.create_stream("s", durability="wal", partitions=2)
    snap.open_stream(s)
    _idle(syncer)
    s.append(b"x", partition=1)
    wait_for(lambda: s._part(1).log.pending() is None, what="the partition's log fsynced")


def test_a_vanished_data_dir_wakes_it_and_suspends_the_logs(synced):
    snap, syncer, q = synced
    q.put(b"before")
    _idle(syncer)
    shutil.rmtree(snap.data_dir)
    wait_for(lambda: q.wal.config()[1] == L.WAL_SUSPENDED, what="the log suspended")  # no clock found it: the watch
    with pytest.raises(shmq.StorageError, match="is gone"):
        q.put(b"refused")
    os.makedirs(snap.data_dir)
    wait_for(lambda: q.wal.config()[0] != 0, what="the log reopened")  # looked for every retry_s
    q.put(b"after")
    wait_for(lambda: q.wal.pending() is None, what="the reopened log fsynced")
    _idle(syncer)
    gen, mode, _ms, directory = q.wal.config()  # in the new directory, not in the deleted one's file
    assert gen >= 2 and mode == L.WAL_BATCH and os.path.getsize(q.wal.path(gen)) > 0


def test_the_last_round_after_stop_syncs_what_was_written(broker, tmp_path):
    snap = Snapshotter(Broker(broker.namespace), str(tmp_path / "data"), wal_batch_ms=1000)
    q = broker.create_queue("q", durability="wal")
    snap.open_wal(q)
    syncer = LogSyncer(snap, 1000).start()  # a long period: only the stop's round can sync in time
    try:
        _idle(syncer)
        q.put(b"x")
    finally:
        syncer.stop()
        snap.close()
        snap.broker.close()
    assert q.wal.pending() is None


def test_without_inotify_it_polls_and_asks_for_it_again(broker, tmp_path, monkeypatch):
    """The per-user limit of inotify instances is shared by every process of the user."""
    import shmq.server.logsync as logsync

    refused = [OSError(24, "Too many open files")]

    def watch():
        if refused:
            raise refused[0]
        return DirWatch()

    monkeypatch.setattr(logsync, "DirWatch", watch)
    snap = Snapshotter(Broker(broker.namespace), str(tmp_path / "data"), wal_batch_ms=2)
    q = broker.create_queue("q", durability="wal")
    snap.open_wal(q)
    syncer = LogSyncer(snap, 2, retry_s=0.05).start()
    try:
        wait_for(lambda: syncer.polling, what="the fallback")
        q.put(b"x")
        wait_for(lambda: q.wal.pending() is None, what="a log fsynced by polling")
        assert not syncer.idle
        refused.clear()  # an instance is free again
        _idle(syncer)
        assert not syncer.polling
        q.put(b"y")
        wait_for(lambda: q.wal.pending() is None, what="a log fsynced once woken")
    finally:
        syncer.stop()
        snap.close()
        snap.broker.close()


# ---------------------------------------------------------------- a sync round against a snapshot round
class _PausedFsync:
    """The snapshotter module's ``os``, whose ``fsync`` of a log runs ``between`` first,
    once: the point where a sync round has read which generation to sync and opened
    it, and not yet fsynced it or asked whether it was deleted."""

    def __init__(self, between):
        self._between = between
        self.fired = 0

    def fsync(self, fd):
        if not self.fired:
            self.fired += 1
            self._between()
        os.fsync(fd)

    def __getattr__(self, name):
        return getattr(os, name)


def _snapshot_round_in_its_thread(snap):
    """One snapshot round in a thread of its own, as the server runs them; waited for."""
    failed = []

    def snapshot_round():
        try:
            snap.run_once()
        except Exception as e:
            failed.append(e)

    t = threading.Thread(target=snapshot_round, name="shmq-snapshot")
    t.start()
    t.join(10)
    assert not t.is_alive(), "the snapshot round never ended"
    assert failed == []


@pytest.mark.parametrize("owner", ["queue", "stream"])
def test_a_snapshot_rotating_a_log_under_a_sync_round_leaves_the_new_log_open(broker, tmp_path, monkeypatch,
                                                                               caplog, owner):
    """Issue 27.6: a sync round (the log-sync thread) has read generation G as the one to
    fsync when a snapshot round (its own thread) rotates the log to G+1 and removes G,
    whose entries it holds. The sync round found G's file deleted and suspended the log
    -- generation G+1: every logged put and ack failed with "its data directory ... is
    gone" until the next snapshot reopened it. Now it suspends only the generation it
    synced, and only while that is still the log."""
    data = str(tmp_path / "data")
    snap = Snapshotter(Broker(broker.namespace), data, wal_batch_ms=2)
    try:
        if owner == "queue":
            q = broker.create_queue("q", durability="wal")
            snap.open_wal(q)
            log, name = q.wal, "q"
            write = q.put
        else:  # a snapshot rolls a partition's log past 4096 bytes; retention then removes the older one
            s = broker.create_stream("s", durability="wal", partitions=1, retention_bytes=4096)
            snap.open_stream(s)
            log, name = s._part(0).log, "@s#0"
            write = s.append
        write(b"x" * 5000)
        gen = log.config()[0]
        paused = _PausedFsync(lambda: _snapshot_round_in_its_thread(snap))
        monkeypatch.setattr(snapshotter_module, "os", paused)
        assert snap.sync_logs() == 0  # its generation was rotated away: its entries are in the snapshot
        monkeypatch.undo()
        assert paused.fired == 1
        assert not os.path.exists(wal_path(data, name, gen))
        assert log.config()[:2] == (gen + 1, L.WAL_BATCH)
        write(b"after")  # before: StorageError, "its data directory ... is gone"
        assert snap.sync_logs() == 1 and log.pending() is None
        assert "was deleted" not in caplog.text
    finally:
        snap.close()
        snap.broker.close()


@pytest.mark.parametrize("synced_before", [False, True])
def test_a_log_deleted_alone_says_so_not_that_its_directory_is_gone(broker, tmp_path, caplog, synced_before):
    """The log file of the current generation deleted, its directory there: the log is
    suspended (its entries are nowhere) with a reason that is true, and the next
    snapshot round opens a new one. Before, a round that found the file gone before
    opening it passed over it (the puts went on into the deleted file); one that had it
    open suspended it, and the puts failed saying the data directory was gone."""
    data = str(tmp_path / "data")
    snap = Snapshotter(Broker(broker.namespace), data, wal_batch_ms=2)
    try:
        q = broker.create_queue("q", durability="wal")
        snap.open_wal(q)
        q.put(b"x")
        gen = q.wal.config()[0]
        path = wal_path(data, "q", gen)
        if synced_before:  # the round holds the log open from here
            assert snap.sync_logs() == 1
        os.unlink(path)
        if synced_before:
            q.put(b"into the deleted file")
        assert snap.sync_logs() == 0
        assert q.wal.config()[1] == L.WAL_SUSPENDED
        with pytest.raises(shmq.StorageError, match=rf"^queue 'q': its write-ahead log {re.escape(path)} was "
                           r"deleted \(its data directory is there\); write-ahead logged writes fail until the "
                           r"server opens a new one, at its next snapshot; nothing was changed$"):
            q.put(b"refused")
        assert caplog.text.count(f"the log of queue 'q', {path}, was deleted") == 1
        snap.run_once()
        q.put(b"after")
        assert q.wal.config()[:2] == (gen + 2, L.WAL_BATCH)  # opened at gen + 1, rotated by the snapshot
        assert [d.body for d in q.get_many(10, timeout=0)] == [b"x"] + [b"into the deleted file"] * synced_before + \
            [b"after"]
    finally:
        snap.close()
        snap.broker.close()


def test_dirwatch_names_the_files_written_and_says_when_the_directory_goes(tmp_path):
    with DirWatch() as w:
        wd = w.add(str(tmp_path))
        (tmp_path / "q.wal.00000001").write_bytes(b"x")
        names = {name for _wd, _mask, name in w.read()}
        assert names == {"q.wal.00000001"}
        os.unlink(tmp_path / "q.wal.00000001")
        tmp_path.rmdir()
        masks = [mask for _wd, mask, _n in w.read()]
        assert any(m & 0x400 for m in masks) and w.watching() == []  # IN_DELETE_SELF, then IN_IGNORED
        with pytest.raises(FileNotFoundError):
            w.add(str(tmp_path))
        assert wd not in w.watching()


# ---------------------------------------------------------------- an idle server
IDLE_WAKES_PER_S = 15  # measured 9-10 (housekeeping rounds, timers); a 50 ms ticker gives 26, a poller hundreds
IDLE_CORE = 0.03  # measured 0.5-1.5% (a slow VM's cold caches: ~2 ms a round); a poller takes 50-90%


def _wakes(pid) -> int:
    """The times the threads of process ``pid`` went to sleep (voluntary context switches)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return n


@pytest.mark.timing  # a CPU bound: a neighbour's load (under -n) inflates what it measures
@pytest.mark.parametrize("fsync", [None, "batch:1", "always", "never"])
def test_an_idle_server_wakes_a_few_times_a_second_and_uses_little_of_a_core(namespace, servers, fsync):
    """Persistence on (the default data dir), wal and snapshot queues and a wal stream
    holding messages, nothing written: a resource bound, measured over a few idle seconds
    as the times its threads wake (machine-independent: what a poller gives away) and the
    process's CPU time (before: a log-sync round every 2 ms, ~50-90%)."""
    srv = servers(namespace, "--log-level", "debug", *(("--fsync", fsync) if fsync else ()))
    try:
        with shmq.connect(srv.url) as remote:
            for durability in ("memory", "snapshot", "wal"):
                remote.create_queue(durability, durability=durability)
            remote.create_stream("s", durability="wal", partitions=2)
        with shmq.connect(namespace=namespace) as local:
            for name in ("memory", "snapshot", "wal"):
                local.queue(name).put_many([b"m" * 100] * 10)
            stream = local.stream("s")
            stream.append_many([b"r" * 100] * 10)
            wal = local.queue("wal")
            if fsync in (None, "batch:1"):
                wait_for(lambda: wal.wal.pending() is None, what="the log fsynced")
            # idle from here: the second snapshot round that holds the 20 queued messages (the first
            # writes their files, and deletes the wal queue's first log; the ones after find nothing new)
            wait_for(lambda: sum("snapshot of" in line and "messages=20" in line for line in list(srv.later)) >= 2,
                     what="a snapshot round after the one that wrote the puts")
            proc = psutil.Process(srv.proc.pid)
            first, woke, started = proc.cpu_times(), _wakes(proc.pid), time.monotonic()
            time.sleep(4)  # the idle seconds measured
            last, woke, took = proc.cpu_times(), _wakes(proc.pid) - woke, time.monotonic() - started
        used = (last.user + last.system) - (first.user + first.system)
        if any("no inotify" in line for line in srv.log + srv.later):  # every instance of this user taken
            pytest.skip("inotify could not be had on this host (fs.inotify.max_user_instances reached by other "
                        "processes of this user): the server fell back to polling, which this bound is not about")
        assert woke / took < IDLE_WAKES_PER_S, f"an idle server's threads woke {woke / took:.0f} times a second"
        assert used / took < IDLE_CORE, f"an idle server used {used / took:.1%} of a core over {took:.1f}s"
        assert srv.alive()
    finally:
        assert srv.stop() == 0
        shutil.rmtree(default_data_dir(namespace), ignore_errors=True)
