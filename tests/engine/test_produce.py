"""Putting in place: ``q.reserve(size, headers)`` (a writable view of the ring, published
as its block ends, nothing on an exception or a death inside it). Each test runs on the
C paths and on the pure-Python ones (``impl``); the model test reserves too."""

import os
import signal

import pytest

import shmq
from shmq.engine import _fast
from shmq.engine.shm import cpaths
from shmq.engine.queues.reserve import Reservation
from shmq.engine.shm import waits
from shmq.engine.shm import layout as L
from shmq.engine.shm.mutex import unlock
from tests._processes import WORKERS
from tests._wait import wait_for


# ---------------------------------------------------------------- reserve
def test_a_reserved_message_is_published_as_its_block_ends(impl, broker):
    q = broker.create_queue("q")
    r = q.reserve(5, headers={"k": "v"})
    with r as buf:
        assert type(buf) is memoryview and not buf.readonly and buf.nbytes == 5
        buf[:] = b"hello"
        assert q._mq[L.I_READY] == 0  # not yet visible
    assert r.id == 1 and "published" in repr(r)
    with pytest.raises(ValueError):  # released: nobody writes into a published record
        buf[0] = 1
    d = q.get(timeout=0)
    assert (d.id, d.body, d.headers) == (1, b"hello", {"k": "v"})
    assert d.enqueued_at > 0
    d.ack()
    with q.reserve(0):
        pass
    assert q.get(timeout=0).body == b""
    s = q.stats()
    assert (s.enqueued_total, s.ready, s.in_flight) == (2, 0, 1)
    with pytest.raises(RuntimeError, match="entered once"):
        r.__enter__()
    q.close()


def test_a_block_that_raises_publishes_nothing(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    r = q.reserve(100)
    with pytest.raises(KeyError):
        with r as buf:
            buf[:4] = b"lost"
            raise KeyError("the producer changed its mind")
    assert r.id is None and "abandoned" in repr(r)
    assert q.stats().ready == 0 and q.stats().bytes_used == 0
    assert q.put(b"next") == 1  # the id was never taken, the lock is free
    assert q.get(timeout=0).body == b"next"
    q.close()


def test_a_view_kept_past_the_block_publishes_nothing(impl, broker):
    q = broker.create_queue("q")
    with pytest.raises(BufferError, match="nothing was published"):
        with q.reserve(8) as buf:
            kept = buf[2:]
    del kept
    with pytest.raises(BufferError, match="nothing was published"):
        with q.reserve(8) as buf:
            exported = memoryview(buf)  # a second view of it (as a numpy array would hold)
    del exported
    assert q.stats().ready == 0 and q.put(b"ok") == 1
    q.close()


@pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
def test_a_reservation_is_claimed_and_published_in_c_and_handed_to_python_when_it_cannot(broker, monkeypatch):
    """On the C paths ``reserve`` claims and publishes the record in C (no Python
    reservation, no Python placement); where it cannot -- a handle not yet in the process
    table, no room -- reserve.py's Reservation takes the whole block, waiting as before. A
    logged queue's is reserve.py's from the start."""
    q = broker.create_queue("q", max_bytes=4096)
    calls = []
    for cls, name in ((Reservation, "__enter__"), (type(q), "_try_reserve")):
        python = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, _f=python, _n=name, **k: calls.append(_n) or _f(self, *a, **k))
    r = q.reserve(8)
    assert type(r) is _fast.Reservation and "unused" in repr(r) and q._slot < 0
    with r as buf:
        buf[:] = b"1" * 8
    assert calls == ["__enter__"] and q._slot >= 0  # the first registers the handle, in Python
    assert r.id == 1 and "published" in repr(r)
    del calls[:]
    for i in range(2, 12):
        with q.reserve(200, headers={"n": i}) as buf:
            buf[:] = b"%d" % i * 200 if i < 10 else b"%d" % i * 100
    assert calls == []  # claimed and published in C, round the ring (4096 bytes)
    with pytest.raises(shmq.QueueFull):  # no room: the Python reservation waits, then gives up
        with q.reserve(3000, timeout=0.01):
            pass
    assert calls[:2] == ["__enter__", "_try_reserve"]
    got = [q.get(timeout=0) for _ in range(11)]
    assert [(d.id, d.body[:4], d.headers) for d in got] == [(1, b"1111", {})] + [
        (i, (b"%d" % i * 4)[:4], {"n": i}) for i in range(2, 12)]
    q.ack_many(got)
    large = broker.create_queue("large")
    for i in range(64):  # (the first lap allocates the ring's memory as it goes, in Python)
        if i == 32:
            del calls[:]
        with large.reserve(L.FILL_MIN) as buf:
            buf[:4] = b"%4d" % i
        d = large.get(timeout=0)
        assert d.body[:4] == b"%4d" % i
        d.ack()
    assert calls == []
    logged = broker.create_queue("logged", durability="wal")
    assert type(logged.reserve(8)) is Reservation
    for h in (q, large, logged):
        h.close()


@pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
def test_a_large_reservation_handed_to_python_is_paced_once(broker, monkeypatch):
    """A large reservation paces first (``_pace``, as a large put does), in C; where it then
    has no room and hands the block to reserve.py's Reservation, that one does not pace
    again."""
    q = broker.create_queue("q", max_bytes=16 << 20, max_message_bytes=1 << 20)
    while True:
        try:
            q.put_nowait(b"f" * (1 << 20))
        except shmq.QueueFull:
            break
    paced, python_pace = [], type(q)._pace
    monkeypatch.setattr(type(q), "_pace", lambda self, *a: paced.append(a) or python_pace(self, *a))
    with pytest.raises(shmq.QueueFull):
        with q.reserve(1 << 20, timeout=0.01):
            pass
    assert len(paced) == 1
    q.close()


@pytest.mark.skipif(not cpaths.FAST, reason="the C paths are not built (or SHMQ_PURE_PYTHON=1)")
def test_a_large_reservation_whose_pacing_state_cannot_be_read_raises_that_error(broker):
    """C's pacing check reads the handle's ``_pace_idle``; what reading it raises is the
    reservation's error (not a call of ``_pace`` made with an exception pending), and
    nothing is claimed."""
    class Unreadable:
        def __bool__(self):
            raise ZeroDivisionError("unreadable")

    q = broker.create_queue("q", max_message_bytes=1 << 20)
    with q.reserve(64 << 10):  # (the first one registers this process, in Python)
        pass
    q.get(timeout=5).ack()
    q._pace_idle, paced = Unreadable(), []
    q._pace = lambda *a: paced.append(a)
    with pytest.raises(ZeroDivisionError, match="unreadable"):
        with q.reserve(64 << 10):
            pass
    assert paced == []
    del q._pace_idle, q._pace
    with q.reserve(64 << 10) as buf:
        buf[:3] = b"abc"
    d = q.get(timeout=5)
    assert d.body[:3] == b"abc" and q.stats().ready == 0
    d.ack()
    q.close()


def test_reserve_checks_its_size(broker):
    q = broker.create_queue("q", max_message_bytes=1000)
    with pytest.raises(shmq.MessageTooLarge, match="1001 bytes"):
        q.reserve(1001)
    for bad in (-1, 1.5, "8"):
        with pytest.raises(ValueError, match="size"):
            q.reserve(bad)
    q.close()
    with pytest.raises(shmq.ShmqError, match="closed"):
        q.reserve(8)


def test_reserve_waits_for_room_and_places_records_round_the_ring(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    while True:
        try:
            q.put_nowait(b"f" * 300)
        except shmq.QueueFull:
            break
    with pytest.raises(shmq.QueueFull):
        with q.reserve(300, timeout=0):
            pass
    assert q.stats().producers_waiting == 0  # a wait that gave up is not counted
    q.ack_many(q.get_many(100, timeout=0))
    for i in range(60):  # sizes that leave pads at the end of the lap
        n = (i * 137) % 900
        with q.reserve(n, headers={"i": i} if i % 3 else None) as buf:
            buf[:] = bytes([i]) * n
        d = q.get(timeout=0)
        assert (d.body, d.headers) == (bytes([i]) * n, {"i": i} if i % 3 else {})
        d.ack()
    assert q.stats().bytes_used == 0
    q.close()


def test_a_call_on_a_logged_queue_inside_the_block_raises_instead_of_waiting_for_itself(impl, broker, tmp_path):
    q = broker.create_queue("q", durability="wal")
    q.wal.configure(str(tmp_path), L.WAL_BATCH, 2)
    other = broker.queue("q")  # another handle on the same queue: the same lock
    with q.reserve(3) as buf:
        buf[:] = b"abc"
        with pytest.raises(RuntimeError, match="inside its reserve"):
            q.put(b"x")
        with pytest.raises(RuntimeError, match="inside its reserve"):
            other.get(timeout=0)
    assert [d.body for d in q.get_many(10, timeout=0)] == [b"abc"]
    q.close()
    other.close()


def test_the_block_runs_with_the_lock_let_go_and_what_is_put_meanwhile_comes_after(impl, broker):
    """A reservation is a fill (``layout.FILL_OFF``): other calls go on while its block
    runs, a put meanwhile is placed after it, and nothing past it is seen until it is
    published: then both, in order."""
    q = broker.create_queue("q")
    other = broker.queue("q")
    q.put(b"first")
    with q.reserve(3) as buf:
        assert q._mq[L.I_FILL] > q._mq[L.I_TAIL]
        assert other.get(timeout=0).body == b"first"  # (no lock held: the get goes on)
        other.put(b"after")  # placed past the reservation, not yet seen
        with pytest.raises(shmq.QueueEmpty):
            other.get(timeout=0)
        assert q.stats().ready == 0
        buf[:] = b"abc"
    assert [d.body for d in other.get_many(10, timeout=0)] == [b"abc", b"after"]
    assert (q._mq[L.I_FILL], q.stats().enqueued_total) == (0, 3)
    q.close()
    other.close()


def test_an_abandoned_reservation_leaves_no_id_when_nothing_follows_it_else_a_pad_whose_id_is_not_counted(impl,
                                                                                                          broker):
    q = broker.create_queue("q")
    with pytest.raises(KeyError):
        with q.reserve(8):
            raise KeyError
    assert (q.put(b"a"), q._mq[L.I_VOIDED], q.stats().enqueued_total) == (1, 0, 1)  # taken back whole
    with pytest.raises(KeyError):
        with q.reserve(8):
            q.put(b"b")  # placed after it: its id stays taken
            raise KeyError
    assert q.put(b"c") == 4
    assert [d.body for d in q.get_many(10, timeout=0)] == [b"a", b"b", b"c"]
    s = q.stats()
    assert (q._mq[L.I_VOIDED], s.enqueued_total, s.bytes_used) == (1, 3, s.bytes_used)
    q.close()


def test_a_logged_queue_logs_a_reserved_message_at_publish(impl, broker, tmp_path):
    from shmq.formats import dmsq

    q = broker.create_queue("q", durability="wal")
    q.wal.configure(str(tmp_path), L.WAL_BATCH, 2)
    with pytest.raises(ZeroDivisionError):
        with q.reserve(4) as buf:
            buf[:] = b"lost"
            1 / 0
    with q.reserve(4, headers={"h": 1}) as buf:
        buf[:] = b"kept"
    entries, error, _offset = dmsq.read_log(q.wal.path(q.wal.config()[0]))
    assert error is None
    assert [(e.op, e.msg_id, e.body) for e in entries] == [(dmsq.PUT, 1, b"kept")]
    q.close()


def _reserve_and_hang(ns, name, inside, size):
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        q._fill_slot()  # in the process table first: on the C paths the block is then the C Reservation's
        r = q.reserve(size)
        assert q.paths.Reservation is None or type(r) is q.paths.Reservation
        with r as buf:
            buf[:] = b"z" * size
            inside.set()
            signal.pause()  # killed here


def test_a_process_killed_inside_the_block_publishes_nothing(impl, broker):
    q = broker.create_queue("q", max_bytes=1 << 16)
    q.put(b"before")
    ctx = WORKERS
    inside = ctx.Event()
    child = ctx.Process(target=_reserve_and_hang, args=(broker.namespace, "q", inside, 5000))
    child.start()
    try:
        assert inside.wait(30)
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    assert child.exitcode == -signal.SIGKILL
    # the next put finds the fill of a process that is gone and takes it back whole (nothing was placed
    # after it): the id the child held is the put's
    assert q.put(b"after") == 2
    assert [d.body for d in q.get_many(10, timeout=0, ack=False)] == [b"before", b"after"]
    s = q.stats()
    assert (s.ready, s.enqueued_total, s.bytes_used) == (0, 2, 0)
    assert (q._mq[L.I_REPAIRS], q._mq[L.I_VOIDED], q._mq[L.I_FILL]) == (0, 0, 0)  # (it held no lock)
    with q.reserve(10) as buf:  # and reserving works again
        buf[:] = b"0123456789"
    assert q.get(timeout=0).body == b"0123456789"
    q.close()


def test_a_publish_posts_a_sleeping_consumer_once(impl, broker):
    q = broker.create_queue("q")
    q._acquire()
    try:  # a consumer asleep on the empty queue, as _get registers one
        waits.register(q._mq, q._my_slot(), waits.CONSUMERS)
    finally:
        unlock(q._lockp)
    with q.reserve(2) as buf:
        buf[:] = b"ok"
    assert (q._mq[L.I_CPOSTED], q._ne.value) == (1, 1)
    with q.reserve(2) as buf:
        buf[:] = b"ok"
    assert (q._mq[L.I_CPOSTED], q._ne.value) == (1, 1)  # one sleeper, one post
    q._acquire()
    try:
        waits.unregister(q._mq, q._slot, waits.CONSUMERS, 2)
    finally:
        unlock(q._lockp)
    q.close()


def _get_one(ns, name, out):
    with shmq.connect(namespace=ns) as b:
        out.put(bytes(b.queue(name).get(timeout=30, ack=False).body))


def test_a_consumer_process_asleep_is_woken_by_the_publish(impl, broker):
    q = broker.create_queue("q")
    ctx = WORKERS
    out = ctx.Queue()
    child = ctx.Process(target=_get_one, args=(broker.namespace, "q", out))
    child.start()
    try:
        wait_for(lambda: q.stats().consumers_waiting == 1, what="the consumer to sleep")
        with q.reserve(6) as buf:
            buf[:] = b"wake!!"
        assert out.get(timeout=30) == b"wake!!"
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    q.close()


# ---------------------------------------------------------------- put_many (C under one lock hold)
def test_put_many_is_all_or_nothing_and_places_pads(impl, broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    assert q.put_many([b"a" * 900] * 3) == [1, 2, 3]
    with pytest.raises(shmq.QueueFull):  # 2 fit, 3 do not: none is put
        q.put_many([b"b" * 900] * 3, timeout=0)
    with pytest.raises(shmq.MessageTooLarge):
        q.put_many([b"c", b"d" * 1001])
    with pytest.raises(TypeError, match="not tuples"):
        q.put_many([b"e", (b"f", {})])
    assert q.stats().enqueued_total == 3
    q.ack_many(q.get_many(10, timeout=0))
    # the next batch starts at 2856 of 4096: its second record does not fit before the end
    ids = q.put_many([b"x" * 700, bytearray(b"y" * 700), memoryview(b"z" * 10)],
                     headers=[{"n": 1}, None, {"n": 3}])
    got = q.get_many(10, timeout=0)
    assert [(d.id, d.body, d.headers) for d in got] == [
        (ids[0], b"x" * 700, {"n": 1}), (ids[1], b"y" * 700, {}), (ids[2], b"z" * 10, {"n": 3})]
    q.ack_many(got)
    assert q.put_many([b"h"] * 3, headers={"all": True}) == [7, 8, 9]
    assert [d.headers for d in q.get_many(10, timeout=0)] == [{"all": True}] * 3
    assert q.put_many(iter([b"g1", b"g2"])) == [10, 11] and q.put_many([]) == []
    # no headers: other buffers (from a generator) taken as views, one too large anywhere refusing the batch
    assert q.put_many(b for b in [b"b1", bytearray(b"b2"), memoryview(b"b3")]) == [12, 13, 14]
    with pytest.raises(shmq.MessageTooLarge, match="1001 bytes"):
        q.put_many(iter([b"ok", bytearray(1001)]))
    assert [d.body for d in q.get_many(10, timeout=0)][-3:] == [b"b1", b"b2", b"b3"]
    assert q.stats().enqueued_total == 14
    with pytest.raises(ValueError, match="2 bodies and 1 headers"):
        q.put_many([b"1", b"2"], headers=[{}])
    q.close()


def test_put_many_posts_as_many_sleeping_consumers_as_it_brings_messages(impl, broker):
    q = broker.create_queue("q")
    q._acquire()
    try:
        for _ in range(3):
            waits.register(q._mq, q._my_slot(), waits.CONSUMERS)
    finally:
        unlock(q._lockp)
    q.put_many([b"1", b"2"])
    assert (q._mq[L.I_CPOSTED], q._ne.value) == (2, 2)
    q.put_many([b"3", b"4", b"5"])
    assert (q._mq[L.I_CPOSTED], q._ne.value) == (3, 3)
    q._acquire()
    try:
        for _ in range(3):
            waits.unregister(q._mq, q._slot, waits.CONSUMERS, 2)
    finally:
        unlock(q._lockp)
    q.close()


# ---------------------------------------------------------------- nack_many (C under one lock hold)
def test_nack_many_requeues_at_once_in_order_and_names_the_stale(impl, broker):
    q = broker.create_queue("q", visibility_timeout=30)
    q.put_many([b"a", b"b", b"c", b"d"])
    a, b, c, d = q.get_many(4, timeout=0)
    b.ack()
    with pytest.raises(shmq.DeliveryExpired, match=r"2 deliveries of 'q' are no longer leased: #2, #3"):
        q.nack_many([c, b, a, c])  # b is acked, c named twice: c and a go back
    assert q.nack_many([d], delay=0) == 1
    s = q.stats()
    assert (s.ready, s.in_flight) == (3, 0)
    got = q.get_many(10, timeout=0)
    assert [(x.body, x.attempt) for x in got] == [(b"a", 2), (b"c", 2), (b"d", 2)]  # their places kept
    q.ack_many(got)
    assert q.stats().redelivered_total == 3
    q.close()


def test_nack_many_wakes_sleeping_consumers_and_leaves_a_retry_policy_to_python(impl, broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])
    ds = q.get_many(2, timeout=0)
    q._acquire()
    try:
        waits.register(q._mq, q._my_slot(), waits.CONSUMERS)
    finally:
        unlock(q._lockp)
    q.nack_many(ds)
    assert (q._mq[L.I_CPOSTED], q._ne.value) == (1, 1)
    q._acquire()
    try:
        waits.unregister(q._mq, q._slot, waits.CONSUMERS, 2)
    finally:
        unlock(q._lockp)
    q.close()
    r = broker.create_queue("r", retry_delay=5.0)
    r.put(b"x")
    r.nack_many([r.get(timeout=0)])  # the policy: delayed, not ready
    assert (r.stats().ready, r.stats().delayed) == (0, 1)
    r.close()


# ---------------------------------------------------------------- a full queue
@pytest.mark.parametrize("many", [False, True])
def test_a_put_that_finds_no_room_sleeps_until_an_ack_makes_some(impl, broker, monkeypatch, many):
    """The C put counts itself as waiting for room (no Python lock hold), sleeps, and the ack
    that frees room wakes it: with sleep slices of 60 s, only the wake can end the wait within
    the join's bound."""
    import threading

    monkeypatch.setattr(waits, "WAIT_SLICE_S", 60.0)
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    q.put(b"warm-up")
    q.get_nowait().ack()  # this process's slot
    while True:
        try:
            q.put_nowait(b"x" * 900)
        except shmq.QueueFull:
            break
    out = []
    put = (lambda: out.append(q.put_many([b"y" * 900], timeout=50))) if many else (
        lambda: out.append(q.put(b"y" * 900, timeout=50)))
    t = threading.Thread(target=put)
    t.start()
    wait_for(lambda: q.stats().producers_waiting == 1, what="the put to sleep")
    q.get_nowait().ack()
    t.join(10)
    assert not t.is_alive(), "the put was not woken by the ack that made room"
    assert out and q.stats().producers_waiting == 0


@pytest.mark.slow
def test_producers_that_keep_finding_the_queue_full_deliver_every_message_once(broker, tmp_path):
    """Backpressure: a ring of 4 KiB, two producers (one a message at a time, one in batches)
    and a consumer; each message arrives once, and no waiter stays counted."""
    from tests import _workers as w

    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=512)
    ctx = WORKERS
    done = ctx.Event()
    producers = [ctx.Process(target=w.producer, args=(broker.namespace, "q", f"p{i}", 2000, (1, 7)[i]))
                 for i in range(2)]
    consumer = ctx.Process(target=w.consumer, args=(broker.namespace, "q", str(tmp_path / "c"), 5, done))
    for p in producers + [consumer]:
        p.start()
    for p in producers:
        p.join(120)
        assert p.exitcode == 0
    done.set()
    consumer.join(60)
    assert consumer.exitcode == 0
    got = (tmp_path / "c").read_text().split()
    assert sorted(got) == sorted(f"p{i}:{k}" for i in range(2) for k in range(2000))
    s = q.stats()
    assert (s.ready, s.in_flight, s.consumers_waiting, s.producers_waiting) == (0, 0, 0, 0)
