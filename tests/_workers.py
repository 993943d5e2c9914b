"""Entry points for the processes that multi-process and fault tests start (spawn)."""

import os
import random
import signal
import sys
import time

import shmq


class StopFlag:
    """A stop signal for processes the test SIGKILLs: ``multiprocessing.Event.is_set``
    takes the event's lock, and a process killed holding it blocks every later ``set``
    (a hang seen in CI). One byte of shared memory, no lock: ``set``, ``is_set``."""

    def __init__(self, ctx):
        self._flag = ctx.RawValue("b", 0)

    def set(self):
        self._flag.value = 1

    def is_set(self):
        return bool(self._flag.value)


def _log(f, line):
    f.write(line + "\n")
    f.flush()


def producer(ns, qname, tag, count, batch, log_path=None):
    """Put ``count`` messages ``tag:seq``; with ``log_path``, log each once put returned."""
    with shmq.connect(namespace=ns) as b:
        q = b.queue(qname)
        log = open(log_path, "a") if log_path else None
        seq = 0
        while seq < count:
            bodies = [f"{tag}:{i}".encode() for i in range(seq, min(seq + batch, count))]
            if batch == 1:
                q.put(bodies[0], timeout=60)
            else:
                q.put_many(bodies, timeout=60)
            if log:
                for body in bodies:
                    _log(log, body.decode())
            seq += len(bodies)


def consumer(ns, qname, out_path, batch, done_event):
    """Consume and ack; log every body once its ack returned. Exit when the queue is
    empty after ``done_event`` (all producers finished)."""
    with shmq.connect(namespace=ns) as b, open(out_path, "w") as out:
        q = b.queue(qname)
        while True:
            try:
                ds = [q.get(timeout=0.05)] if batch == 1 else q.get_many(batch, timeout=0.05)
            except shmq.QueueEmpty:
                if done_event.is_set():
                    return
                continue
            if batch == 1:
                ds[0].ack()
            else:
                q.ack_many(ds)
            for d in ds:
                _log(out, d.body.decode())


def chaos_producer(ns, qname, tag, log_path, stop_event, with_options=False, padded=False):
    """Put until told to stop, single and batched; log each body once put returned. With
    ``with_options``: random priorities (levels 0..2), groups and long TTLs; ``padded``:
    bodies of up to 100 KB (``tag:seq`` and dots), spanning the ring's chunks."""
    rnd = random.Random(os.getpid())
    with shmq.connect(namespace=ns) as b, open(log_path, "a") as log:
        q = b.queue(qname)
        seq = 0
        while not stop_event.is_set():
            n = rnd.choice([1, 1, 5, 20])
            pad = b"." * rnd.choice([0, 3000, 30_000, 100_000]) if padded else b""
            bodies = [f"{tag}:{i}".encode() + (pad if n < 5 else pad[:3000]) for i in range(seq, seq + n)]
            options = {}
            if with_options:
                options = {"priority": rnd.randrange(3), "ttl": rnd.choice([None, 3600.0])}
                if n == 1:
                    options["group"] = rnd.choice([None, "a", "b", "c"])
            try:
                if n == 1:
                    q.put(bodies[0], timeout=0.2, **options)
                else:
                    q.put_many(bodies, timeout=0.2, **options)
            except shmq.QueueFull:
                continue
            for body in bodies:
                _log(log, body.rstrip(b".").decode())
            seq += n


def chaos_housekeeper(ns, qname):
    """Housekeeping rounds back to back (leases, and the memory given back), until killed."""
    with shmq.connect(namespace=ns) as b:
        q = b.queue(qname)
        while True:
            q._housekeep()
            time.sleep(0.002)


def chaos_consumer(ns, qname, log_path):
    """Get, then ack (mostly) or nack at random. Logs ``try <body>`` before an ack and
    ``done <body>`` once it returned, so a kill in between is visible."""
    rnd = random.Random(os.getpid())
    with shmq.connect(namespace=ns) as b, open(log_path, "a") as log:
        q = b.queue(qname)
        while True:
            try:
                ds = q.get_many(rnd.choice([1, 1, 8, 32]), timeout=0.2)
            except shmq.QueueEmpty:
                continue
            roll = rnd.random()
            if roll < 0.1:
                for d in ds:
                    d.nack()
                continue
            names = [bytes(d.body).rstrip(b".").decode() for d in ds]  # (a padded body's name)
            for name in names:
                _log(log, "try " + name)
            if roll < 0.5:
                for d, name in zip(ds, names):
                    d.ack()
                    _log(log, "done " + name)
            else:
                q.ack_many(ds)
                for name in names:
                    _log(log, "done " + name)


def hold_leases(ns, qname, n, ready_event, url=None):
    """Lease ``n`` messages (locally, or over TCP with ``url``), say so, then hang
    until killed."""
    b = shmq.connect(url) if url else shmq.connect(namespace=ns)
    q = b.queue(qname)
    held = []
    while len(held) < n:
        held += q.get_many(n - len(held), timeout=10)
    ready_event.set()
    time.sleep(3600)


def hold_lock(ns, qname, ready_event, half_written):
    """Take the queue's lock (lane 0's of a laned queue; optionally half-write a put), say
    so, hang until killed."""
    b = shmq.connect(namespace=ns)
    q = b.queue(qname)
    q = getattr(q, "_lanes", [q])[0]
    q._acquire()
    if half_written:
        # what a producer killed between writing a record and publishing the tail leaves:
        # a record past the tail and a count bumped ahead of the commit
        from shmq.engine.shm import layout as L
        from shmq.engine.shm.layout import I_READY, I_TAIL
        tail = q._mq[I_TAIL]
        a = q._base + tail % q._cap
        L.REC.pack_into(q._mm, a, L.READY, 64, 8, 0, 0, 999, 0, 0)
        q._mm[a + 48:a + 56] = b"HALFDONE"
        q._mq[I_READY] += 1
    ready_event.set()
    time.sleep(3600)


def lock_waiter(ns, qname, n, out_path, ready_event, go_event):
    """Register this process in the queue (so its puts and gets take the C paths), say so,
    then on ``go`` put ``n`` messages and get and ack ``n``, logging the bodies it got: its
    first call finds the lock held by another process."""
    with shmq.connect(namespace=ns) as b, open(out_path, "w") as out:
        q = b.queue(qname)
        q.put(b"warm-up")
        q.get().ack()
        ready_event.set()
        go_event.wait()
        for i in range(n):
            q.put(f"{os.getpid()}:{i}".encode())
        for _ in range(n):
            d = q.get(timeout=60)
            d.ack()
            _log(out, d.body.decode())


def attach_and_exit(ns, qname, body):
    """Attach, put one message, exit normally (the resource-tracker test)."""
    b = shmq.connect(namespace=ns)
    b.queue(qname).put(body)
    b.close()
    sys.exit(0)


def get_one_from_handle(q, out):
    """Use a pickled Queue handle in a child."""
    d = q.get(timeout=10)
    out.put(d.body)
    d.ack()



def remote_chaos_consumer(url_file, qname, log_path, stop_event):
    """Consume over TCP, reconnecting whenever the broker dies; logs like chaos_consumer.
    The broker's current URL is read from ``url_file`` (it changes across restarts)."""
    with open(log_path, "a") as log:
        while not stop_event.is_set():
            try:
                with open(url_file) as f:
                    url = f.read().strip()
                with shmq.connect(url) as b:
                    q = b.queue(qname)
                    while not stop_event.is_set():
                        try:
                            ds = q.get_many(16, timeout=0.2)
                        except shmq.QueueEmpty:
                            continue
                        for d in ds:
                            _log(log, "try " + d.body.decode())
                        q.ack_many(ds)
                        for d in ds:
                            _log(log, "done " + d.body.decode())
            except (shmq.BrokerUnavailable, shmq.DeliveryExpired, OSError):
                time.sleep(0.05)  # the broker is restarting: try again


def tear_wal_append(ns, qname, ready_event):
    """Take the lock of a wal queue, leave half a log entry, hang until killed."""
    from shmq.formats import dmsq

    b = shmq.connect(namespace=ns)
    q = b.queue(qname)
    q._acquire()
    entry = dmsq.encode_log_entry(dmsq.PUT, 999, 0, 0, b"", b"torn" * 100)
    with open(q.wal.path(q.wal.config()[0]), "ab") as f:
        f.write(entry[: len(entry) // 2])
    ready_event.set()
    time.sleep(3600)


def stream_appender(ns, stream, tag, count, log_path, batch=1):
    """Append ``count`` records keyed by ``tag``; log each one whose append returned
    (``offset``), so a kill at any instant leaves "returned => present" checkable."""
    s = shmq.connect(namespace=ns).stream(stream)
    with open(log_path, "a", buffering=1) as log:
        i = 0
        while i < count:
            n = min(batch, count - i)
            values = [b"%s-%d" % (tag.encode(), i + j) for j in range(n)]
            ms = s.append_many(values, keys=[tag.encode()] * n)
            for v, m in zip(values, ms):
                _log(log, f"{v.decode()} {m.partition} {m.offset}")
            i += n


def stream_housekeeper(ns, stream, log_path):
    """Retention in memory and memory given back, round after round, with no grace (no
    reader without the lock here), until killed; logs a line a round."""
    from shmq.engine.shm import layout

    layout.GIVE_BACK_GRACE_NS = 0
    s = shmq.connect(namespace=ns).stream(stream)
    with open(log_path, "a", buffering=1) as log:
        while True:
            _log(log, "%d %d" % s.housekeep())
            time.sleep(0.001)


def stream_member(ns, stream, group, out_path, ready_event, stop_event):
    """A group member that logs every record it polls, commits after each poll, and
    runs until stopped (or killed)."""
    s = shmq.connect(namespace=ns).stream(stream)
    c = s.consumer(group)
    ready_event.set()
    with open(out_path, "a", buffering=1) as out:
        while not stop_event.is_set():
            rs = c.poll(max_records=50, timeout=0.05)
            for r in rs:
                _log(out, f"{r.partition} {r.offset} {r.value.decode()}")
            if rs:
                try:
                    c.commit()
                except shmq.CommitFailed:
                    pass
    c.close()


def join_killed_inside(ns, stream, group):
    """Join ``group`` and die (SIGKILL) inside the stream's lock, with the generation and
    the owner-since marks written and the member's slot not yet: what a kill there leaves."""
    from shmq.engine.streams.groups import Groups

    real = Groups._rebalance

    def rebalance_and_die(self, *args):
        real(self, *args)
        os.kill(os.getpid(), signal.SIGKILL)

    Groups._rebalance = rebalance_and_die
    shmq.connect(namespace=ns).stream(stream).consumer(group)


def storm_appender(ns, stream, tag, log_path, stop_event):
    """Append batches of 1-20 records ``tag:seq`` (without keys: one partition a call)
    until told to stop; log ``partition offset value`` of each once its append returned."""
    rnd = random.Random(os.getpid())
    s = shmq.connect(namespace=ns).stream(stream)
    with open(log_path, "a", buffering=1) as log:
        seq = 0
        while not stop_event.is_set():
            values = [b"%s:%d" % (tag.encode(), seq + i) for i in range(rnd.randint(1, 20))]
            ms = s.append_many(values)
            log.write("".join(f"{m.partition} {m.offset} {v.decode()}\n" for v, m in zip(values, ms)))
            seq += len(values)
            time.sleep(rnd.uniform(0, 0.02))  # pacing, so the members keep up on a small machine


def storm_member(ns, stream, group, log_path, stop_event):
    """A group member process that polls, takes a while over some polls (over most, for a
    slow one), commits (most of the time), and now and then leaves and joins again a while
    later, until stopped or killed. Its log
    (times from CLOCK_MONOTONIC, shared by every process) lets the test account for each
    offset: ``j`` a join, ``d t0 t1 p first last`` records delivered by a poll that ran
    from t0 to t1, ``t t0 p:committed:offset ...`` a commit about to be tried (the group's
    committed offset before it, -1 for none, and the offset committed), then ``ok t1`` or
    ``fail t1``; ``l`` a leave."""
    rnd = random.Random(os.getpid())
    s = shmq.connect(namespace=ns).stream(stream)
    now = time.monotonic_ns
    slow = rnd.choice([0.1, 0.5])
    with open(log_path, "a", buffering=1) as log:
        c = None
        while not stop_event.is_set():
            if c is None:
                c = s.consumer(group)
                log.write("j\n")
            t0 = now()
            rs = c.poll(max_records=rnd.choice([1, 5, 30, 200]), timeout=0.05)
            t1 = now()
            runs = {}
            for r in rs:
                first, last = runs.setdefault(r.partition, [r.offset, r.offset - 1])
                assert r.offset == last + 1, "a poll's records of one partition are consecutive"
                runs[r.partition][1] = r.offset
            log.write("".join(f"d {t0} {t1} {p} {a} {b}\n" for p, (a, b) in runs.items()))
            if rnd.random() < slow:
                time.sleep(rnd.uniform(0, 0.3))  # processing: the group may move meanwhile
            if rnd.random() < 0.6:
                mine = {}
                for p in range(s.partitions):
                    try:
                        mine[p] = c.position(p)  # what commit() commits: no view is taken in between
                    except KeyError:
                        pass
                before = s.committed(group)
                log.write("t %d %s\n" % (now(), " ".join(f"{p}:{before.get(p, -1)}:{o}" for p, o in mine.items())))
                try:
                    c.commit()
                    log.write(f"ok {now()}\n")
                except shmq.CommitFailed:
                    log.write(f"fail {now()}\n")
            if rnd.random() < 0.05:
                c.close()
                c = None
                log.write("l\n")
                time.sleep(rnd.uniform(0, 0.2))  # away a while: the others take its partitions
        if c is not None:
            c.close()


def hold_partition_lock(ns, stream, ready_event):
    """Take partition 0's lock of a stream, say so, hang until killed (or stopped)."""
    s = shmq.connect(namespace=ns).stream(stream)
    s._part(0)._acquire()
    ready_event.set()
    time.sleep(3600)


def stream_publisher(ns, target, staging, txn_hex, first_batch, batches, per_batch, log_path):
    """Stage ``per_batch`` records ``b{batch}:{i}`` and publish them as ``batch``, for
    batches ``first_batch`` on; log each batch once its publish returned."""
    with shmq.connect(namespace=ns) as b, open(log_path, "a") as log:
        t, st = b.stream(target), b.stream(staging)
        for batch in range(first_batch, first_batch + batches):
            metas = st.append_many([f"b{batch}:{i}".encode() for i in range(per_batch)], partition=0)
            t.publish(st, {0: [(0, metas[0].offset, metas[-1].offset + 1)]}, bytes.fromhex(txn_hex), batch)
            _log(log, str(batch))


def publisher_dying_before_the_commit(ns, target, staging, txn_hex, batch):
    """Publish ``batch`` but die inside the partition's lock, after noting the batch in
    the publishers' table and before the append's committing store."""
    from shmq.engine.streams.partition import Partition

    note = Partition._txn_note

    def note_and_die(self, *args):
        note(self, *args)
        os._exit(3)

    Partition._txn_note = note_and_die
    with shmq.connect(namespace=ns) as b:
        t, st = b.stream(target), b.stream(staging)
        t.publish(st, {0: [(0, 0, st.offsets(0)[1])]}, bytes.fromhex(txn_hex), batch)


def stager_dying_before_its_ack(ns, queue):
    """Move the queue's messages into its stage stream, and die (SIGKILL) after the
    append, before the ack: they stay leased by a dead process."""
    import signal

    from shmq.spark.stager import Stager

    class Dying(Stager):
        def _settle(self, ds):
            os.kill(os.getpid(), signal.SIGKILL)

    with shmq.connect(namespace=ns) as b:
        Dying(b, queue).move()
