"""Getting in the two other modes: auto-ack (``get(ack=False)``: settled as taken, in the
same lock hold) and zero-copy (``copy=False`` / ``d.view``: the body as a read-only view
into the segment). Each test runs on the C paths and on the pure-Python ones (``impl``);
the model tests run both modes too."""

import pickle
import threading

import pytest

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm import waits
from shmq.engine.shm import layout as L
from shmq.engine.shm.mutex import unlock
from tests._processes import WORKERS
from tests._wait import wait_for


def _registered(q):
    """A handle whose process slot is taken (the hot paths need it)."""
    q.put(b"warm-up")
    q.get().ack()
    return q


# ---------------------------------------------------------------- auto-ack
def test_an_auto_acked_get_is_settled_as_it_is_taken(impl, broker):
    q = _registered(broker.create_queue("q", max_bytes=4096))
    q.put(b"one", headers={"k": 1})
    d = q.get(ack=False)
    assert (d.id, d.body, d.headers, d.attempt) == (2, b"one", {"k": 1}, 1)
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total, s.bytes_used) == (0, 0, 2, 0)  # its space free at once
    with pytest.raises(shmq.DeliveryExpired, match=r"delivery q#2 attempt 1 is no longer leased"):
        d.ack()
    with pytest.raises(shmq.DeliveryExpired):
        d.nack()
    with pytest.raises(shmq.DeliveryExpired):
        d.view
    q.put_many([b"a", b"b", b"c"])
    ds = q.get_many(10, ack=False)
    assert [x.body for x in ds] == [b"a", b"b", b"c"]
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total, s.bytes_used) == (0, 0, 5, 0)
    with pytest.raises(shmq.DeliveryExpired):
        q.ack_many(ds)
    q.put(b"x")
    assert q.get_nowait(ack=False).body == b"x" and q.stats().acked_total == 6
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait(ack=False)
    q.close()


def test_an_auto_acked_get_behind_a_lease_frees_nothing_until_the_lease_goes(impl, broker):
    q = _registered(broker.create_queue("q", max_bytes=4096))
    q.put_many([b"leased", b"auto"])
    held = q.get()
    q.get(ack=False)
    assert q.stats().bytes_used > 0  # the lease at the head holds the space behind it
    held.ack()
    assert q.stats().bytes_used == 0  # and the auto-acked record behind it goes with it
    q.close()


@pytest.mark.parametrize("many", [False, True])
def test_an_auto_ack_that_frees_the_head_posts_a_sleeping_producer(impl, broker, many):
    q = _registered(broker.create_queue("q", max_bytes=4096))
    q.put(b"x" * 100)
    q._acquire()
    try:  # a producer asleep for room, as _append registers one
        waits.register(q._mq, q._my_slot(), waits.PRODUCERS)
    finally:
        unlock(q._lockp)
    assert q._nf.value == 0
    if many:
        q.get_many(5, ack=False)
    else:
        q.get(ack=False)
    assert (q._mq[L.I_PPOSTED], q._nf.value) == (1, 1)  # counted, and posted once
    q._acquire()
    try:
        waits.unregister(q._mq, q._slot, waits.PRODUCERS, 2)
    finally:
        unlock(q._lockp)
    q.close()


def _put_one(ns, name, body):
    with shmq.connect(namespace=ns) as b:
        b.queue(name).put(body, timeout=30)


def test_a_producer_process_waiting_for_room_gets_in_after_an_auto_ack(impl, broker):
    q = _registered(broker.create_queue("q", max_bytes=4096))
    while True:
        try:
            q.put_nowait(b"f" * 500)
        except shmq.QueueFull:
            break
    child = WORKERS.Process(target=_put_one, args=(broker.namespace, "q", b"late" * 100))
    child.start()
    try:
        wait_for(lambda: q.stats().producers_waiting == 1, what="the producer to sleep for room")
        assert q.get(ack=False).body == b"f" * 500
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    bodies = [d.body for d in q.get_many(100, timeout=0, ack=False)]
    assert bodies[-1] == b"late" * 100 and q.stats().bytes_used == 0
    q.close()


def test_the_general_take_auto_acks_too(impl, broker):
    """Requeued messages, a lease of 0 s, max_deliveries: the Python take, then the ack."""
    broker.create_queue("dlq")
    q = _registered(broker.create_queue("q", max_deliveries=2, dead_letter_queue="dlq"))
    q.put_many([b"a", b"b"])
    first, second = q.get_many(2)
    first.nack()
    d = q.get(visibility_timeout=0, ack=False)  # the lease is the call's own: it cannot lapse under it
    assert (d.body, d.attempt) == (b"a", 2)
    second.nack()
    again = q.get()
    again.nack()
    with pytest.raises(shmq.QueueEmpty):  # attempt 3 > max_deliveries: dead-lettered, not handed out
        q.get(timeout=0, ack=False)
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total, s.dead_lettered_total, s.bytes_used) == (0, 0, 2, 1, 0)
    assert broker.queue("dlq").get(timeout=0).body == b"b"
    q.close()


def test_a_logged_queue_logs_the_auto_ack(impl, broker, tmp_path):
    from shmq.formats import dmsq

    q = broker.create_queue("q", durability="wal")
    q.wal.configure(str(tmp_path), L.WAL_BATCH, 2)
    _registered(q)
    q.put_many([b"a", b"b", b"c"])
    one = q.get(ack=False)
    rest = q.get_many(5, ack=False)
    entries, error, _offset = dmsq.read_log(q.wal.path(q.wal.config()[0]))
    assert error is None
    assert [(e.op, e.msg_id, e.attempt) for e in entries if e.op == dmsq.ACK][1:] == [
        (dmsq.ACK, d.id, 1) for d in [one, *rest]]  # (after the warm-up's)
    assert q.stats().acked_total == 4
    q.close()


def test_a_view_of_an_auto_acked_message_is_refused(broker):
    q = broker.create_queue("q")
    q.put(b"x")
    for call in (lambda: q.get(timeout=0, ack=False, copy=False), lambda: q.get_many(1, 0, ack=False, copy=False),
                 lambda: q.get_nowait(ack=False, copy=False)):
        with pytest.raises(ValueError, match="copy=False needs ack=True"):
            call()
    assert q.stats().ready == 1  # nothing taken
    q.close()


def test_auto_acked_gets_do_not_count_against_the_prefetch_cap(impl, broker):
    broker.create_queue("q")
    q = _registered(broker.queue("q", prefetch=1))
    q.put_many([b"a", b"b", b"c"])
    held = q.get()
    assert q.get(ack=False).body == b"b"  # the cap is for un-settled deliveries
    with pytest.raises(shmq.QueueEmpty, match="prefetch"):
        q.get(timeout=0)
    held.ack()
    assert q.get(timeout=0).body == b"c"
    q.close()


def test_a_serializer_handle_auto_acks_what_loads_and_gives_back_what_does_not(impl, broker):
    broker.create_queue("q")
    q = broker.queue("q", serializer="json")
    q.put({"n": 1})
    assert q.get(ack=False).body == {"n": 1}
    assert q.stats().acked_total == 1
    broker.queue("q").put(b"\xff not json")
    with pytest.raises(shmq.SerializationError):
        q.get(timeout=0, ack=False)
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (1, 0, 1)  # given back, never lost
    q.close()


# ---------------------------------------------------------------- zero-copy
def test_a_view_is_the_body_in_the_segment_read_only(impl, broker):
    q = _registered(broker.create_queue("q"))
    q.put(b"hello", headers={"h": "v"})
    d = q.get(copy=False)
    assert type(d.body) is memoryview and d.view is d.body
    assert d.body.readonly and d.body.obj is q._mm  # no copy: a slice of the mapping itself
    assert (bytes(d.body), d.headers) == (b"hello", {"h": "v"})
    with pytest.raises(TypeError):
        d.body[0] = 0
    d.ack()
    q.put(b"copied")
    c = q.get()
    assert type(c.body) is bytes and bytes(c.view) == b"copied" and c.view.obj is q._mm
    c.ack()
    with pytest.raises(shmq.DeliveryExpired):  # settled: its bytes may be reused
        c.view
    q.close()


@pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
def test_a_plain_view_get_is_one_c_call_and_a_waiting_one_too(broker, monkeypatch):
    """``get(copy=False)`` on a plain queue takes the C take as a plain ``get`` does (no
    Python take), waiting for a put of another thread too; with a visibility timeout it is
    Python's, and its view the same."""
    from shmq.engine.queues.consume import Consuming

    q = _registered(broker.create_queue("q"))
    python_take = Consuming._take_one
    taken = []
    monkeypatch.setattr(Consuming, "_take_one", lambda self, *a: taken.append(a) or python_take(self, *a))
    q.put(b"ready")
    d = q.get(copy=False)
    assert (type(d.body), bytes(d.body), d.body.obj) == (memoryview, b"ready", q._mm)
    d.ack()
    put = threading.Timer(0.05, q.put, (b"later",))
    put.start()
    d = q.get(timeout=10, copy=False)
    put.join()
    assert (type(d.body), bytes(d.body)) == (memoryview, b"later") and taken == []
    d.ack()
    q.put(b"leased")
    d = q.get(visibility_timeout=30, copy=False)
    assert (type(d.body), bytes(d.body), len(taken)) == (memoryview, b"leased", 1)
    d.ack()
    q.close()


def test_get_many_hands_out_views_in_order(impl, broker):
    q = _registered(broker.create_queue("q", max_bytes=1 << 16))
    bodies = [bytes([i]) * (i * 37) for i in range(20)]
    q.put_many(bodies, headers=[{"i": i} for i in range(20)])
    ds = q.get_many(20, copy=False)
    assert [bytes(d.body) for d in ds] == bodies and [d.headers["i"] for d in ds] == list(range(20))
    assert all(type(d.body) is memoryview for d in ds)
    assert q.ack_many(ds) == 20 and q.stats().bytes_used == 0
    q.close()


def test_the_general_take_hands_out_views_too(impl, broker):
    q = _registered(broker.create_queue("q"))
    q.put(b"again")
    q.get().nack()  # requeued: the Python take
    d = q.get(copy=False)
    assert (bytes(d.body), d.attempt, type(d.body)) == (b"again", 2, memoryview)
    d.ack()
    q.close()


def test_a_large_body_is_read_in_place(impl, broker):
    q = _registered(broker.create_queue("q", max_bytes=4 << 20, max_message_bytes=1 << 20))
    body = bytes(range(256)) * 4096  # 1 MiB
    q.put(body)
    d = q.get(copy=False)
    assert d.body.nbytes == len(body) and d.body == body
    d.ack()
    q.close()


def test_a_view_outlives_its_handle_safely(impl, broker):
    """Closing a handle while a view is alive leaves the mapping to the view (never a read
    of unmapped memory); the handle itself is closed."""
    q = _registered(broker.create_queue("q"))
    q.put(b"kept")
    d = q.get(copy=False)
    v = d.view
    q.close()
    for call in (lambda: q.put(b"x"), lambda: q.get(timeout=0), lambda: q.get_many(2, timeout=0), d.ack):
        with pytest.raises(shmq.ShmqError, match="closed"):
            call()
    assert bytes(v) == b"kept"
    del d, v


def test_a_serializer_handle_loads_from_the_view(impl, broker):
    broker.create_queue("q")
    for name, obj in (("pickle", {"big": b"x" * 1000}), ("json", {"n": [1, 2]})):
        q = broker.queue("q", serializer=name)
        q.put(obj)
        d = q.get(copy=False)
        assert d.body == obj and type(d.view) is memoryview
        d.ack()
        q.close()
    raw = broker.queue("q")
    raw.put(pickle.dumps(1))
    assert raw.get(copy=False).view == pickle.dumps(1)
    raw.close()
