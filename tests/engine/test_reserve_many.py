"""Putting a batch in place: ``q.reserve_many(sizes, headers)`` (writable views of the
ring, as many as have room, published together as the block ends; nothing on an
exception, a view kept, or a death inside it). On the C paths small bodies are claimed
together; on the Python paths (``impl``) and for a large first body it is a batch of one."""

import os
import signal

import pytest

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm import layout as L
from tests._processes import WORKERS

C_BATCHES = cpaths.FAST


def _batched(impl) -> bool:
    return impl == "fast"


def _warm(q):
    """Room made ahead (the memory a queue holds follows its bodies; where it is to grow,
    a batch stops and the Python path grows it): 64 KiB put and taken."""
    q.put_many([b"w" * 1000] * 64)
    q.ack_many(q.get_many(64, timeout=0))


def _fill(bufs, tag=b""):
    for i, buf in enumerate(bufs):
        body = tag + b"%03d" % i
        buf[:] = body.ljust(len(buf), b".")


def test_a_batch_is_claimed_together_and_published_together_as_its_block_ends(impl, broker):
    q = broker.create_queue("q")
    _warm(q)
    r = q.reserve_many([100] * 8, headers={"k": "v"})
    assert r.ids is None and "unused" in repr(r)
    with r as bufs:
        assert all(type(b) is memoryview and not b.readonly and b.nbytes == 100 for b in bufs)
        assert len(bufs) == (8 if _batched(impl) else 1)
        _fill(bufs)
        assert q._mq[L.I_READY] == 0  # not yet visible
    n = len(bufs)
    assert r.ids == list(range(65, 65 + n)) and "published" in repr(r)
    with pytest.raises(ValueError):  # released: nobody writes into a published record
        bufs[0][0] = 1
    ds = q.get_many(100, timeout=0)
    assert [(d.id, d.body[:3], d.headers) for d in ds] == [(65 + i, b"%03d" % i, {"k": "v"}) for i in range(n)]
    q.ack_many(ds)
    with pytest.raises(RuntimeError, match="entered once"):
        r.__enter__()
    q.close()


def test_a_block_that_raises_publishes_none_of_the_batch(impl, broker):
    q = broker.create_queue("q")
    _warm(q)
    r = q.reserve_many([50] * 5)
    with pytest.raises(KeyError):
        with r as bufs:
            _fill(bufs)
            raise KeyError("the producer changed its mind")
    assert r.ids is None
    s = q.stats()
    assert (s.ready, s.bytes_used) == (0, 0) and q._mq[L.I_FILL] == 0
    assert q.put(b"next") == 65  # the ids were never taken, the lock is free
    assert q.get(timeout=0).body == b"next"
    q.close()


def test_a_view_kept_past_the_block_publishes_none_of_the_batch(impl, broker):
    q = broker.create_queue("q")
    _warm(q)
    with pytest.raises(BufferError, match="nothing was published"):
        with q.reserve_many([8] * 4) as bufs:
            kept = bufs[-1][2:]
    del kept
    with pytest.raises(BufferError, match="nothing was published"):
        with q.reserve_many([8] * 4) as bufs:
            exported = memoryview(bufs[0])  # a second view of one (as a numpy array would hold)
    del exported
    assert q.stats().ready == 0 and q._mq[L.I_FILL] == 0 and q.put(b"ok") == 65
    q.close()


def test_a_batch_is_as_long_as_what_has_room_and_the_rest_comes_after(impl, broker):
    """Ten bodies of 1,000 bytes into a 4 KiB ring: a batch takes what fits, the consumer
    frees room, the next batch the rest; every body once, in order."""
    q = broker.create_queue("q", max_bytes=4096)
    q._fill_slot()
    sizes, got, lengths = [1000] * 10, [], []
    i = 0
    while i < len(sizes):
        with q.reserve_many(sizes[i:], timeout=5) as bufs:
            for j, buf in enumerate(bufs):
                buf[:] = (b"%04d" % (i + j)).ljust(1000, b"-")
        i += len(bufs)
        lengths.append(len(bufs))
        ds = q.get_many(10, timeout=0)
        got += [bytes(d.body[:4]) for d in ds]
        q.ack_many(ds)
    assert got == [b"%04d" % k for k in range(10)]
    assert sum(lengths) == 10 and max(lengths) < 10
    if _batched(impl):
        assert max(lengths) > 1
    q.close()


@pytest.mark.skipif(not C_BATCHES, reason="the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
def test_a_large_body_is_a_batch_of_one_and_ends_a_batch_of_small_ones(broker):
    q = broker.create_queue("q", max_message_bytes=1 << 20)
    _warm(q)
    big = L.FILL_MIN
    with q.reserve_many([big, 10, 10]) as bufs:
        assert [len(b) for b in bufs] == [big]
        bufs[0][:3] = b"big"
    with q.reserve_many([10, 10, big, 10]) as bufs:
        assert [len(b) for b in bufs] == [10, 10]
        _fill(bufs)
    assert [bytes(d.body[:3]) for d in q.get_many(10, timeout=0, ack=False)] == [b"big", b"000", b"001"]
    q.close()


def test_a_logged_queue_reserves_a_batch_of_one_and_logs_it(broker, tmp_path):
    q = broker.create_queue("q", durability="wal")
    q.wal.configure(str(tmp_path), L.WAL_BATCH, 2)
    r = q.reserve_many([5, 5])
    with r as bufs:
        assert len(bufs) == 1
        bufs[0][:] = b"hello"
    assert r.ids == [1]
    assert q.get(timeout=0).body == b"hello"
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) > 0  # (logged, as reserve's)
    q.close()


def test_reserve_many_checks_its_sizes(impl, broker):
    q = broker.create_queue("q", max_message_bytes=1000)
    with pytest.raises(ValueError, match="empty"):
        q.reserve_many([])
    for bad in ([-1], [10, 1.5], ["8"], [10, True]):
        with pytest.raises(ValueError, match="size"):
            q.reserve_many(bad)
    with pytest.raises(shmq.MessageTooLarge, match="1001 bytes"):
        q.reserve_many([10, 1001])
    q.close()
    with pytest.raises(shmq.ShmqError, match="closed"):
        q.reserve_many([8])


def _reserve_many_and_hang(ns, name, inside, n):
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        q._fill_slot()
        with q.reserve_many([100] * n) as bufs:
            _fill(bufs)
            inside.set()
            signal.pause()  # killed here


def test_a_process_killed_inside_the_block_publishes_none_of_the_batch(impl, broker):
    q = broker.create_queue("q", max_bytes=1 << 16)
    q.put(b"before")
    ctx = WORKERS
    inside = ctx.Event()
    child = ctx.Process(target=_reserve_many_and_hang, args=(broker.namespace, "q", inside, 6))
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
    q.put(b"after")  # (it finds the fills of a process that is gone and takes them back)
    assert [d.body for d in q.get_many(10, timeout=0, ack=False)] == [b"before", b"after"]
    s = q.stats()
    assert (s.ready, s.enqueued_total) == (0, 2) and q._mq[L.I_FILL] == 0
    with q.reserve_many([10] * 3) as bufs:  # and reserving works again
        _fill(bufs)
    assert [bytes(d.body[:3]) for d in q.get_many(10, timeout=0)] == [b"%03d" % i for i in range(len(bufs))]
    q.close()


def _produce_batches(ns, name, tag, total):
    with shmq.connect(namespace=ns) as b:
        q = b.queue(name)
        i = 0
        while i < total:
            sizes = [64] * min(16, total - i)
            with q.reserve_many(sizes, timeout=30) as bufs:
                for j, buf in enumerate(bufs):
                    buf[:] = (b"%s:%06d" % (tag, i + j)).ljust(64, b" ")
            i += len(bufs)


def test_producer_processes_reserving_batches_deliver_every_message_once_in_order(impl, broker):
    q = broker.create_queue("q", max_bytes=1 << 14)  # (small: batches stop where the room does)
    ctx = WORKERS
    total, tags = 3000, [b"p0", b"p1", b"p2"]
    producers = [ctx.Process(target=_produce_batches, args=(broker.namespace, "q", t, total)) for t in tags]
    for p in producers:
        p.start()
    try:
        seen = {t: [] for t in tags}
        while sum(map(len, seen.values())) < total * len(tags):
            ds = q.get_many(64, timeout=30)
            assert ds, "no message within 30 s"
            for d in ds:
                tag, n = bytes(d.body).split(b":")
                seen[tag].append(int(n))
            q.ack_many(ds)
        for p in producers:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in producers:
            if p.is_alive():
                p.kill()
                p.join()
    assert all(seen[t] == list(range(total)) for t in tags)
    assert q.stats().ready == 0
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    q.close()
