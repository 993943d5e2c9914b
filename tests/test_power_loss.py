"""Power losses, not just reboots: the durability promises checked on lazyfs.

Strategy: the other reboot tests SIGKILL the broker and delete shared memory, but the
page cache keeps every byte written, so ``always``, ``batch:MS`` and ``never`` all look
perfect there. Here the data dir is a lazyfs mount (tests/lazyfs.py): at a "power loss"
every byte and every directory entry not fsynced is dropped, and nothing more can be
written. A real broker and a producer process run on it; the producer notes, outside
the mount, when each numbered put returned. The power goes at a chosen instant (or at
the worst one: just before the next fsync of the log, or just before a snapshot's
rename), everything is SIGKILLed, shared memory is deleted, the broker restarts on what
was durable, and the queue is drained and accounted for exactly: what comes back is
always the puts 1..k in order (no loss in the middle, no duplicate, nothing never put),
and k is checked against the policy's promise. Skipped where FUSE cannot be mounted.
"""

import os
import signal
import time

import pytest

import shmq
from shmq.persistence import snapshot_queue
from tests._processes import WORKERS
from tests.lazyfs import Mount, Unavailable
from tests.test_server_tcp import ServerProcess

BATCH_MS = 50
SLOW_FSYNC_S = 0.2
# Allowed on top of a promise: the event loop's timer, a thread to start, the GIL, a few
# busy processes sharing the CPUs, and the first instants of a snapshot, before lazyfs
# sees its file created (the copy of a small queue).
SLACK_S = 0.05


# ---------------------------------------------------------------------- processes
def produce(ns, qname, record, first=1, count=None, pace=0.0):
    """Put b"<seq>" from ``first`` on (``count`` of them, or until killed or a put
    fails: the power went); once each put returned, append "<seq> <monotonic time>" to
    ``record``. ``pace``: seconds to rest between puts (load shaping, not a wait)."""
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with shmq.connect(namespace=ns) as b:
        q = b.queue(qname)
        seq = first
        while count is None or seq < first + count:
            try:
                q.put(b"%d" % seq)
            except OSError:  # StorageError: the log could not be written or synced
                return
            os.write(fd, b"%d %.6f\n" % (seq, time.monotonic()))
            seq += 1
            if pace:
                time.sleep(pace)


def returned(record):
    """[(seq, monotonic time)] of every put that returned, in order."""
    if not os.path.exists(record):
        return []
    with open(record) as f:
        lines = f.read().split("\n")[:-1]  # a line cut by SIGKILL has no newline
    return [(int(s), float(t)) for s, t in (line.split() for line in lines)]


def wait_for(cond, what, timeout=30.0):
    """Poll a real condition until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.002)


class Host:
    """One machine: a broker whose data dir is on lazyfs, and producer processes."""

    def __init__(self, fs, namespace, tmp_path):
        self.fs, self.ns, self.tmp = fs, namespace, tmp_path
        self.server = None
        self.procs = []
        self.ctx = WORKERS

    def start(self, fsync, interval=3600.0):
        self.server = ServerProcess(self.ns, "--data-dir", self.fs.path, "--fsync", fsync,
                                    "--snapshot-interval", str(interval))
        return self.server

    def create(self, name, **settings):
        """Create over TCP: the broker opens a wal queue's log at once."""
        with shmq.connect(self.server.url) as remote:
            remote.create_queue(name, max_bytes=64 << 20, **settings)

    def producer(self, name, first=1, count=None, pace=0.0):
        p = self.ctx.Process(target=produce, args=(self.ns, name, self.record(name), first, count, pace))
        p.start()
        self.procs.append(p)
        return p

    def record(self, name):
        return str(self.tmp / f"{name}.returned")

    def queue_stat(self, name, fn):
        with shmq.connect(namespace=self.ns) as b:
            q = b.queue(name)
            try:
                return fn(q)
            finally:
                q.close()

    def kill_all(self):
        """SIGKILL every process of the machine and reap it."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(30)
        self.procs = []
        if self.server is not None:
            if self.server.proc.poll() is None:
                self.server.proc.send_signal(signal.SIGKILL)
            self.server.proc.wait(30)
            self.server.proc.stderr.close()
            self.server = None

    def reboot(self):
        """After the power went: kill everything, shared memory is gone, power back."""
        self.kill_all()
        shmq.destroy_namespace(self.ns)
        self.fs.power_on()

    def drain(self, name):
        """Every message of ``name`` after the reboot, as ints where the body is a number."""
        got = []
        with shmq.connect(namespace=self.ns) as b:
            if name not in b.list_queues():
                return got
            q = b.queue(name)
            while True:
                try:
                    got += [d.body for d in q.get_many(4096, timeout=0)]
                except shmq.QueueEmpty:
                    break
            q.close()
        return [int(body) for body in got if body.isdigit()]

    def stop(self):
        assert self.server.stop() == 0
        self.server = None


@pytest.fixture
def lazyfs(tmp_path):
    try:
        fs = Mount(str(tmp_path / "data"), journal=str(tmp_path / "journal"))
    except Unavailable as e:
        pytest.skip(f"FUSE cannot be mounted here: {e}")
    yield fs
    fs.unmount()  # fails the test if the mount is left behind


@pytest.fixture
def host(lazyfs, namespace, tmp_path):
    h = Host(lazyfs, namespace, tmp_path)
    yield h
    h.kill_all()


def account(got, puts):
    """What came back is the puts 1..k, in order (nothing missing in between, nothing
    twice), all of which returned: nothing can be written once the power is gone, so
    not even the put in flight comes back. Returns k."""
    k = len(got)
    assert got == list(range(1, k + 1)), f"not the first {k} puts in order: {got[:5]}...{got[-5:]}"
    assert k <= len(puts), f"{k} messages back, but only {len(puts)} puts returned"
    return k


def snapshots(tmp_path, name, before):
    """[start, end] of each snapshot of queue ``name`` lazyfs saw before ``before``:
    the creation of its temporary file, and the directory fsync after its rename (None
    if it never got there)."""
    tmp, out = f"/{name}.dmsq.tmp", []
    with open(tmp_path / "journal") as f:
        for t, op, path, *rest in (line.split() for line in f):
            if float(t) >= before:
                break
            if op == "create" and path == tmp:
                out.append([float(t), None, False])
            elif op == "rename" and path == tmp and out:
                out[-1][2] = True
            elif op == "fsyncdir" and out and out[-1][2] and out[-1][1] is None:
                out[-1][1] = float(t)
    return [(start, end) for start, end, _renamed in out]


# ---------------------------------------------------------------------- the model
def test_the_filesystem_loses_exactly_what_was_not_synced(lazyfs):
    """The model itself: unsynced data, unsynced names, unsynced renames and unlinks go;
    what fsync and fsync of the directory made durable stays; then nothing is written."""
    root = lazyfs.path

    def write(name, data, sync=False, flags=os.O_CREAT | os.O_WRONLY | os.O_APPEND):
        fd = os.open(os.path.join(root, name), flags, 0o600)
        os.write(fd, data)
        if sync:
            os.fsync(fd)
        os.close(fd)

    def sync_dir():
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

    write("kept", b"kept", sync=True)
    write("gone", b"x")
    sync_dir()                                        # durable: kept (with its data), gone (empty)
    os.rename(os.path.join(root, "gone"), os.path.join(root, "renamed"))
    write("named-only", b"n")
    sync_dir()                                        # durable: the rename, the name named-only
    write("kept", b" appended")                       # not synced: the data ...
    os.unlink(os.path.join(root, "kept"))             # ... the unlink ...
    os.rename(os.path.join(root, "renamed"), os.path.join(root, "renamed-again"))  # ... the rename
    write("late", b"l", sync=True)                    # ... and the name of a synced file
    before = lazyfs.stats()
    assert (before["fsync"], before["fsyncdir"], before["losses"]) == (2, 2, 0)
    lazyfs.power_off()
    contents = {n: open(os.path.join(root, n), "rb").read() for n in sorted(os.listdir(root))}
    assert contents == {"kept": b"kept", "named-only": b"", "renamed": b""}
    with pytest.raises(OSError):
        write("after", b"a")
    lazyfs.power_on()
    write("after", b"a")
    assert sorted(os.listdir(root)) == ["after", "kept", "named-only", "renamed"]


# ---------------------------------------------------------------------- the wal policies
@pytest.mark.parametrize("fsync", ["always", f"batch:{BATCH_MS}", "never"])
def test_a_power_loss_keeps_what_the_fsync_policy_promises(host, fsync, tmp_path):
    """A wal queue, a producer putting a few thousand messages a second, a snapshot (so
    a log rotation) every 0.2 s; the power goes just before the next fsync of the log,
    the worst instant. (Flat out, on two CPUs, the snapshots of a queue growing by 20 k
    messages a second starve the broker's fsync round of the GIL: up to ~50 ms late.)"""
    host.start(fsync, interval=0.2)
    host.create("q", durability="wal")
    host.producer("q", pace=0.0002)
    generation = lambda: host.queue_stat("q", lambda q: q.wal.config()[0])  # noqa: E731
    wait_for(lambda: os.path.exists(host.record("q")) and os.path.getsize(host.record("q")), "the first put")
    first = generation()
    wait_for(lambda: generation() >= first + 2, "two log rotations while the producer runs")
    host.fs.arm("fsync", "/q.wal.*")
    t_loss = host.fs.wait_lost(10)
    host.reboot()
    host.start(fsync)
    got = host.drain("q")
    host.stop()
    puts = returned(host.record("q"))
    k = account(got, puts)
    if fsync == "always":  # every put that returned
        assert k == len(puts), f"{len(puts) - k} puts that returned were lost"
    elif fsync == "never":  # the model does lose what was not synced
        assert k < len(puts)
    else:  # everything that returned more than MS (and a little) before the loss
        due = [seq for seq, t in puts if t < t_loss - BATCH_MS / 1000 - SLACK_S]
        window = t_loss - puts[k][1] if k < len(puts) else 0.0
        assert k >= len(due), f"lost the puts of the last {window * 1000:.1f} ms (batch:{BATCH_MS})"


# ---------------------------------------------------------------------- new log files
@pytest.mark.parametrize("fsync", ["always", f"batch:{BATCH_MS}"])
def test_the_first_log_of_a_new_queue_survives(host, fsync):
    """No snapshot ever runs: the log's name is durable only if its creator (the first
    producer to append) fsynced the directory."""
    host.start(fsync)
    host.create("q", durability="wal")
    p = host.producer("q", count=200)
    p.join(30)
    assert p.exitcode == 0
    wait_for(lambda: host.queue_stat("q", lambda q: q.wal.pending()) is None, "the log synced")
    host.fs.power_off()
    host.reboot()
    host.start(fsync)
    got = host.drain("q")
    host.stop()
    assert got == list(range(1, 201)), f"{200 - len(got)} of 200 synced puts lost (was q.wal.00000001 named?)"


def test_the_log_after_a_rotation_survives(host):
    """A snapshot rotates the log once its puts are in the snapshot; the next put creates
    the next log, after the snapshot synced the directory: its name needs its own sync."""
    host.start("always")
    host.create("q", durability="wal")
    for first in (1, 101):
        p = host.producer("q", first=first, count=100)
        p.join(30)
        assert p.exitcode == 0
        if first == 1:  # the snapshot the broker takes every interval, taken by hand now
            host.queue_stat("q", lambda q: snapshot_queue(q, host.fs.path))
    assert host.queue_stat("q", lambda q: q.wal.config()[0]) == 2
    host.fs.power_off()
    host.reboot()
    host.start("always")
    got = host.drain("q")
    host.stop()
    assert got == list(range(1, 201)), f"{200 - len(got)} of 200 synced puts lost (was q.wal.00000002 named?)"


# ---------------------------------------------------------------------- snapshot mode
@pytest.mark.parametrize("interval", [0.3, 0.1], ids=["snapshot-shorter-than-interval", "snapshot-longer"])
def test_snapshot_mode_loses_at_most_one_interval_plus_one_snapshot(host, tmp_path, interval):
    """Snapshots start ``interval`` apart, start to start (at once after one that took
    longer), so a power loss just before a snapshot lands loses the puts since the
    previous one began: max(interval, that snapshot's duration) plus the time the lost
    one had run. A slow disk (each fsync of a snapshot takes SLOW_FSYNC_S) makes the
    snapshots long."""
    host.start("never", interval=interval)
    host.create("q")  # durability="snapshot"
    host.fs.slow("fsync", "/q.dmsq.tmp", SLOW_FSYNC_S)
    host.producer("q", pace=0.001)
    wait_for(lambda: len(returned(host.record("q"))) >= 50, "50 puts")
    host.fs.arm("rename", "/q.dmsq.tmp", 3)
    t_loss = host.fs.wait_lost(10)
    host.reboot()
    host.start("never")
    got = host.drain("q")
    host.stop()
    puts = returned(host.record("q"))
    k = account(got, puts)
    assert k < len(puts)  # the snapshot in progress is lost, and what came after the last one
    (s1, e1), (s2, e2), (s3, e3) = snapshots(tmp_path, "q", t_loss)[-3:]
    assert e3 is None and None not in (e1, e2) and min(e1 - s1, e2 - s2) >= SLOW_FSYNC_S
    for (start, end), next_start in (((s1, e1), s2), ((s2, e2), s3)):
        due = max(interval, end - start)
        assert next_start - start <= due + SLACK_S, (
            f"a snapshot started {next_start - start:.3f} s after the previous one, which took {end - start:.3f} s")
    window, promise = t_loss - puts[k][1], max(interval, e2 - s2) + (t_loss - s3)
    assert window <= promise + SLACK_S, f"lost the puts of {window:.3f} s; the promise: {promise:.3f} s"
