"""Putting in place: ``q.reserve(size, headers)`` (a writable view of the ring, published
as its block ends, nothing on an exception or a death inside it). Each test runs on the
C paths and on the pure-Python ones (``impl``); the model test reserves too."""

import multiprocessing as mp
import os
import signal

import pytest

import shmq
import shmq.engine.queue as engine
from shmq.engine import cpaths
from shmq.engine import layout as L
from tests._wait import wait_for


@pytest.fixture(params=["fast", "pure"])
def impl(request):
    if request.param == "fast" and not engine.FAST:
        pytest.skip("the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
    cpaths.set_enabled(request.param == "fast")
    yield request.param
    cpaths.set_enabled(True)


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


def test_a_call_on_the_queue_inside_the_block_raises_instead_of_waiting_for_itself(impl, broker):
    q = broker.create_queue("q")
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


def test_a_logged_queue_logs_a_reserved_message_at_publish(impl, broker, tmp_path):
    from shmq import dmsq

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
        with q.reserve(size) as buf:
            buf[:] = b"z" * size
            inside.set()
            signal.pause()  # killed here


def test_a_process_killed_inside_the_block_publishes_nothing(impl, broker):
    q = broker.create_queue("q", max_bytes=1 << 16)
    q.put(b"before")
    ctx = mp.get_context("spawn")
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
    assert q.put(b"after") == 2  # the next locker repairs; the id the child held was never used
    assert [d.body for d in q.get_many(10, timeout=0, ack=False)] == [b"before", b"after"]
    s = q.stats()
    assert (s.ready, s.enqueued_total, s.bytes_used) == (0, 2, 0)
    assert q._mq[L.I_REPAIRS] == 1
    with q.reserve(10) as buf:  # and reserving works again
        buf[:] = b"0123456789"
    assert q.get(timeout=0).body == b"0123456789"
    q.close()


def _get_one(ns, name, out):
    with shmq.connect(namespace=ns) as b:
        out.put(bytes(b.queue(name).get(timeout=30, ack=False).body))


def test_a_consumer_process_asleep_is_woken_by_the_publish(impl, broker):
    q = broker.create_queue("q")
    ctx = mp.get_context("spawn")
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
