"""Storage that runs out or goes away: a full disk under a wal queue, a damaged log, a
data dir deleted under a running broker, a start on a full disk, a small /dev/shm.

Each test puts its data on a real filesystem of its own (a small tmpfs it mounts, or
a private /dev/shm in a mount namespace of its own) and accounts exactly for what a
reboot brings back. Mounting needs root: elsewhere these tests skip, saying why.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import shmq
from shmq.engine.shm import layout as L
from shmq.formats import dmsq
from shmq.persistence import Snapshotter, recover


def _mount_tmpfs(path, size):
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs of the test's own, unmounted afterwards."""
    path = tmp_path / "small"
    path.mkdir()
    _mount_tmpfs(path, "4m")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def start_server(broker, servers):
    """``start(*args)``: a ``shmq server`` on the test's namespace (conftest's ``servers``)."""
    return lambda *args: servers(broker.namespace, *args)


def _fill_disk(path, reserve=True):
    """Write a file until the filesystem is full; returns its path. ``reserve=False``:
    a data dir's reserve under ``path`` (``disk-reserve``) is taken too, so what settles
    finds the disk full as well."""
    filler = path / "filler"
    with open(filler, "ab", buffering=0) as f:
        for pass_ in (0, 1):
            if pass_ and (reserve or not [p.unlink() for p in path.rglob("disk-reserve")]):
                break
            for size in (65536, 512):  # then the last partial chunk too
                try:
                    while f.write(b"\xff" * size):
                        pass
                except OSError as e:
                    assert e.errno == 28  # ENOSPC
    return filler


def _reboot(broker, srv, start, *args):
    """SIGKILL the broker (no last snapshot), wipe shared memory, start it again."""
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    srv.proc.stderr.close()
    broker.close()
    shmq.destroy_namespace(broker.namespace)
    broker.__init__(broker.namespace)
    return start(*args)


def _drain_ids(q):
    ids = []
    while True:
        try:
            ds = q.get_many(256, timeout=0)
        except shmq.QueueEmpty:
            return ids
        ids += [d.id for d in ds]
        q.ack_many(ds)


@pytest.mark.parametrize("body_size,after", [(1000, 300), (6000, 100)], ids=["c-path", "python-path"])
def test_a_full_disk_fails_wal_puts_cleanly_and_the_log_stays_readable(broker, small_fs, start_server, body_size,
                                                                      after):
    data = str(small_fs / "data")
    args = ("--data-dir", data, "--snapshot-interval", "3600", "--disk-free-limit", "0")  # ENOSPC itself, no alarm
    srv = start_server(*args)
    with shmq.connect(srv.url) as remote:
        remote.create_queue("q", durability="wal", max_bytes=8 << 20, max_message_bytes=8192)
    q = broker.queue("q")
    returned = [q.put(b"a" * body_size) for _ in range(5)]
    filler = _fill_disk(small_fs)
    with pytest.raises(shmq.StorageError, match="No space left on device") as err:
        for _ in range(100):  # the last page may still take an entry or two
            returned.append(q.put(b"b" * body_size))
    assert "nothing was changed" in str(err.value)
    with pytest.raises(shmq.StorageError):  # and again: it stays refused, not half-done
        q.put(b"c" * body_size)
    with shmq.connect(srv.url) as remote:  # a clear status over TCP, not INTERNAL
        with pytest.raises(shmq.StorageError, match="No space left on device"):
            remote.queue("q").put(b"d" * body_size, timeout=0)
    (log_path,) = [os.path.join(data, e) for e in os.listdir(data) if ".wal." in e]
    entries, error, _end = dmsq.read_log(log_path)
    assert error is None and [e.msg_id for e in entries] == returned  # no torn entry left behind
    assert q.stats().ready == len(returned)

    os.unlink(filler)
    returned += [q.put(b"e" * body_size) for _ in range(after)]
    q.close()
    srv = _reboot(broker, srv, start_server, *args)
    try:
        assert sorted(_drain_ids(broker.queue("q"))) == returned
    finally:
        assert srv.stop() == 0


def test_a_damaged_log_is_replayed_to_the_damage_and_kept_aside(broker, tmp_path, caplog):
    data = str(tmp_path)
    q = broker.create_queue("q", durability="wal")
    snap = Snapshotter(broker, data, wal_mode=0)
    snap.open_wal(q)
    q.put_many([b"first", b"second", b"third"])
    (path,) = [os.path.join(data, e) for e in os.listdir(data)]
    entries, _error, _end = dmsq.read_log(path)
    raw = bytearray(open(path, "rb").read())
    second = len(raw) * 1 // 3 + 20  # inside the second entry (three of equal size)
    raw[second] ^= 0xFF
    open(path, "wb").write(raw)
    q.close()
    broker.delete_queue("q")  # the reboot
    assert recover(broker, data) == ["q"]
    assert [d.body for d in broker.queue("q").get_many(5, timeout=0)] == [b"first"]
    assert "moved to" in caplog.text
    snap.run_once()  # the first snapshot removes older logs, but not the evidence
    corrupt = [e for e in os.listdir(data) if e.endswith(".corrupt")]
    assert corrupt == [os.path.basename(path) + ".corrupt"]
    assert open(os.path.join(data, corrupt[0]), "rb").read() == bytes(raw)
    snap.close()


def _log_lines(srv):
    """The server's log lines after start-up, as its ServerProcess' thread collects them (until it exits)."""
    return srv.later


def _wait(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_the_server_starts_on_a_full_disk_and_snapshots_once_there_is_room(broker, small_fs, start_server):
    data = small_fs / "data"
    data.mkdir()
    broker.create_queue("q").put_many([b"x" * 1000] * 50)
    filler = _fill_disk(small_fs)
    srv = start_server("--data-dir", str(data), "--snapshot-interval", "0.05", "--disk-free-limit", "0")
    lines = _log_lines(srv)
    try:
        assert srv.alive()
        failed = [line for line in srv.log if "ERROR cannot write the snapshot" in line]  # said at start-up
        assert len(failed) == 1 and "queue q" in failed[0] and "No space left on device" in failed[0]
        os.unlink(filler)
        _wait(lambda: (data / "q.dmsq").exists(), "no snapshot after the disk had room again")
        _wait(lambda: any("snapshot of queue q written again" in line for line in lines), "no word of it")
        assert srv.alive()
    finally:
        rc = srv.stop()
    assert rc == 0, lines[-5:]
    assert len(dmsq.read_snapshot(str(data / "q.dmsq")).records) == 50


@pytest.mark.parametrize("fsync", ["always", "batch:2"])
def test_wal_puts_fail_while_the_data_dir_is_gone(broker, tmp_path, start_server, fsync):
    data = tmp_path / "data"
    args = ("--data-dir", str(data), "--fsync", fsync, "--snapshot-interval", "0.05")
    srv = start_server(*args)
    with shmq.connect(srv.url) as remote:
        remote.create_queue("q", durability="wal")
    q = broker.queue("q")
    returned = [q.put(b"before")]
    shutil.rmtree(data)
    if fsync == "always":  # every put is fsynced: the very next one finds out
        with pytest.raises(shmq.StorageError):
            q.put(b"lost")
    else:  # the broker's fsync round (every 2 ms) finds out
        deadline = time.monotonic() + 10
        with pytest.raises(shmq.StorageError, match="is gone"):
            while True:
                assert time.monotonic() < deadline, "wal puts still return with the data dir gone"
                returned.append(q.put(b"in the window"))
    for _ in range(3):
        with pytest.raises(shmq.StorageError):
            q.put(b"refused")
    data.mkdir()
    deadline = time.monotonic() + 10
    while True:  # the broker reopens the logs in the new directory
        try:
            returned.append(q.put(b"after"))
            break
        except shmq.StorageError:
            assert time.monotonic() < deadline, "wal puts still refused with the data dir back"
    _wait(lambda: (data / "q.dmsq").exists(), "no snapshot in the new data dir")  # of what memory holds
    q.close()
    srv = _reboot(broker, srv, start_server, *args)
    try:
        assert sorted(_drain_ids(broker.queue("q"))) == returned
    finally:
        assert srv.stop() == 0


def test_a_log_an_appender_suspended_reopens_past_its_generation(broker, tmp_path):
    """With fsync ``always`` the appender finds the deleted log first and suspends it, so
    the broker never sees the generation it had: the reopen must still go past it, or a
    writer's descriptor for that number (into the deleted directory) is used again, the
    appender suspends the log again, and puts are refused for as long as the numbers
    meet (before: until the snapshot rounds' rotations happened to step past it)."""
    data = tmp_path / "data"
    data.mkdir()
    snap = Snapshotter(broker, str(data), wal_mode=L.WAL_ALWAYS, wal_batch_ms=0)
    q = broker.create_queue("q", durability="wal")
    other = broker.queue("q")  # another writer: a descriptor of its own
    snap.open_wal(q)
    snap.run_once()  # a snapshot round rotates the log: generation 2, as a reopen and a round would give
    q.put(b"one")
    other.put(b"two")
    had = q.wal.config()[0]
    shutil.rmtree(data)
    with pytest.raises(shmq.StorageError, match="is gone"):
        q.put(b"lost")  # the appender finds out, and suspends the log
    assert q.wal.config()[0] == 0 and q.wal.suspended_at() == had
    assert q.wal.fd is None  # its descriptor into the deleted file is closed
    data.mkdir()
    snap.run_once()  # the data dir is back: the log reopens past the generation it had
    assert q.wal.config()[0] > had and q.wal.suspended_at() == 0
    for writer in (q, other, q, other):  # and through rotations, no writer finds a deleted log
        writer.put(b"after")
        snap.run_once()
    assert q.wal.config()[0] > 0
    snap.close()
    q.close()
    other.close()


_SMALL_SHM = textwrap.dedent("""
    import json, os
    import shmq
    out = {}
    b = shmq.connect(namespace="small")
    q = b.create_queue("big", max_bytes=64 * 2**20)  # more than /dev/shm: it holds its header only
    out["held_empty"] = q.stats().bytes_held
    n = 0
    while True:  # fill /dev/shm: the put that finds no room is refused, never a SIGBUS
        try:
            q.put_nowait(b"%08d" % n + b"x" * 65000)
            n += 1
        except shmq.StorageError as e:
            out["full"] = str(e)
            break
    out["put"] = n
    got = []
    for _ in range(n // 2):  # half of it consumed: its memory goes back in a round or two
        d = q.get_nowait()
        got.append(int(d.body[:8]))
        d.ack()
    for _ in range(3):
        q._housekeep()
    for i in range(n // 4):  # and puts go on
        q.put_nowait(b"%08d" % (n + i) + b"x" * 65000)
    while True:
        try:
            d = q.get_nowait()
        except shmq.QueueEmpty:
            break
        got.append(int(d.body[:8]))
        d.ack()
    out["in_order"] = got == list(range(n + n // 4))
    b.delete_queue("big")
    b.close()
    shmq.destroy_namespace("small")
    out["left"] = sorted(os.listdir("/dev/shm"))
    print(json.dumps(out))
""")


def test_a_queue_larger_than_dev_shm_fills_it_then_refuses_puts_never_a_sigbus():
    """A 64 MiB queue in a 16 MiB /dev/shm (a container's): created at once (its header
    only), filled until the put that needs room /dev/shm has not got gets StorageError,
    then, half consumed and its memory back, it takes puts again; every message comes out
    once, in order."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    # a private mount namespace with a 16 MiB /dev/shm
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         'mount -t tmpfs -o size=16m,mode=1777 tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable, _SMALL_SHM],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert r.returncode == 0, f"exit {r.returncode} (-7 is SIGBUS): {r.stderr[-2000:]}"
    out = json.loads(r.stdout)
    assert out["held_empty"] == 128 * 1024
    assert "/dev/shm is full: queue 'big' could not take" in out["full"] and "--shm-size" in out["full"]
    assert 200 < out["put"] < 16 * 2**20 // 65000
    assert out["in_order"] and out["left"] == []


def test_the_disk_alarm_refuses_puts_before_the_disk_is_full_and_lifts_when_room_returns(broker, small_fs,
                                                                                         start_server):
    """Below --disk-free-limit a server refuses puts to 'wal' queues (a clear StorageError,
    no file left behind) while acks and a purge go on, says so once, and lifts it when
    space returns; nothing stored is lost."""
    data = small_fs / "data"
    srv = start_server("--data-dir", str(data), "--snapshot-interval", "0.05", "--disk-free-limit", "1MiB")
    lines = _log_lines(srv)
    q = broker.create_queue("q", durability="wal")
    q.put_many([b"kept %d" % i for i in range(10)])
    st = broker.create_stream("st", partitions=1, durability="wal")
    st.append(b"kept")
    filler = small_fs / "filler"
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    filler.write_bytes(b"\xff" * (free - 512 * 1024))  # half a MiB left: below the limit, not full
    _wait(lambda: any("disk alarm: data dir" in line for line in lines), "no disk alarm")
    def logs():  # (the snapshot rounds go on meanwhile: their files come and go; a log is made by an append)
        return {e for e in os.listdir(data) if ".wal." in e}

    before = logs()
    with pytest.raises(shmq.StorageError, match="disk alarm: .* --disk-free-limit: puts and appends are refused"):
        q.put(b"refused")
    with pytest.raises(shmq.StorageError, match="disk alarm"):
        q.put_many([b"refused"] * 3)
    with pytest.raises(shmq.StorageError, match="disk alarm"):
        st.append(b"refused")
    assert logs() <= before  # a refused put or append leaves no log file behind
    d = q.get(timeout=5)
    d.ack()  # what settles is logged on
    assert q.purge() == 9
    os.unlink(filler)
    _wait(lambda: any("disk alarm lifted" in line for line in lines), "the alarm was not lifted")
    q.put(b"after")
    assert [x.body for x in q.get_many(10, timeout=5)] == [b"after"]
    st.append(b"after")
    assert [r.value for r in st.read(0, 0, 10)] == [b"kept", b"after"]
    assert sum("disk alarm: data dir" in line for line in lines) == 1
    assert srv.stop() == 0


def test_acks_and_a_purge_are_logged_on_a_disk_full_to_the_last_byte_and_survive_a_reboot(broker, small_fs,
                                                                                         start_server):
    """The server keeps a reserve in its data dir; on a disk something else filled to the
    last byte (no alarm: --disk-free-limit 0), an ack (the C path's and the Python path's)
    and a purge of a 'wal' queue take it and are logged, puts are still refused, the
    server says so once and makes the reserve again when there is room; after a reboot
    (SIGKILL, shared memory gone) what was acked and purged stays gone."""
    data = small_fs / "data"
    args = ("--data-dir", str(data), "--snapshot-interval", "0.05", "--disk-free-limit", "0")
    srv = start_server(*args)
    lines = _log_lines(srv)
    reserve = data / "disk-reserve"
    _wait(reserve.exists, "no reserve in the data dir")
    assert reserve.stat().st_size == 4 * 2**20 // 64 and reserve.stat().st_mode & 0o777 == 0o600
    q = broker.create_queue("q", durability="wal")
    q.put_many([b"m %d" % i for i in range(300)])
    broker.create_queue("gone", durability="wal").put_many([b"g"] * 50)
    taken = q.get_many(201, timeout=5)
    filler = _fill_disk(small_fs)
    with pytest.raises(shmq.StorageError, match="No space left on device"):
        for _ in range(100):  # the last page may still take an entry or two
            q.put(b"refused" * 100)
    for d in taken[:100]:
        d.ack()  # (7 KiB of entries: past the log's last page)
    q.ack_many(taken[100:200])
    assert not reserve.exists()  # taken by the first logged ack that found the disk full
    assert q.purge() == 99  # the ready ones; taken[200] stays in flight
    broker.delete_queue("gone")  # and a delete (its files go at the next round)
    _wait(lambda: not any(e.startswith("gone.") for e in os.listdir(data)), "the deleted queue's files stayed")
    _wait(lambda: any("its reserve (disk-reserve) was used" in line for line in lines), "no word of the reserve")
    os.unlink(filler)
    _wait(reserve.exists, "the reserve was not made again")
    q.close()
    srv = _reboot(broker, srv, start_server, *args)
    try:
        q = broker.queue("q")
        assert [d.body for d in q.get_many(10, timeout=5)] == [taken[200].body]  # only the one never settled
        assert broker.list_queues() == ["q"]
        assert sum("its reserve (disk-reserve) was used" in line for line in lines) == 1
    finally:
        assert srv.stop() == 0
