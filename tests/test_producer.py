"""The batching producer (shmq/producer.py): batches closed by size and by time, counted
at ``append_many``; futures and their metadata; order per key across batches; a failed
append fails its own batch only; backpressure; flush, close and the sender thread."""

import os
import subprocess
import sys
import threading

import msgpack
import pytest

import shmq
from shmq.client.remote import RemoteBroker
from shmq.engine.streams.partition import record_size
from shmq.engine.streams.partitioner import partition_of
from shmq.producer import Producer

SLOW = 60_000  # a linger (ms) no test waits for: only size or flush sends those batches


class CountingStream:
    """A real stream that records the values of every append_many call. ``gate``, while
    set to an unset Event, holds each call until it is set (``entered`` says one came);
    a call whose values hold ``fail_on`` raises instead of appending."""

    def __init__(self, stream):
        self.stream, self.name, self.partitions, self.max_bytes = (stream, stream.name, stream.partitions,
                                                                   stream.max_bytes)
        self.calls = []
        self.entered = threading.Event()
        self.gate = None
        self.fail_on = None

    def append_many(self, values, keys=None, headers=None, partition=None, compression=None):
        values = list(values)
        if values:  # the producer's constructor checks ``compression`` with an empty call
            self.calls.append(values)
            self.entered.set()
            if self.gate is not None:
                assert self.gate.wait(30)
            if self.fail_on in values:
                raise shmq.ShmqError("injected failure")
        return self.stream.append_many(values, keys=keys, headers=headers, partition=partition,
                                       compression=compression)


def kib(tag: bytes) -> bytes:
    """A 1000-byte value: with its record header (48 bytes), three of them reach 3000."""
    return tag.ljust(1000, b".")


def producer_threads():
    return [t for t in threading.enumerate() if t.name.startswith("shmq-producer")]


@pytest.fixture
def counting(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 20)
    yield CountingStream(s)
    s.close()


def test_a_batch_goes_when_the_unsent_records_reach_batch_bytes(counting):
    with Producer(counting, linger_ms=SLOW, batch_bytes=3000) as p:
        futures = [p.send(kib(b"%d" % i)) for i in range(7)]
        assert [f.result(30).offset for f in futures[:6]] == [0, 1, 2, 3, 4, 5]
        assert [len(c) for c in counting.calls] == [3, 3]
        assert not futures[6].done()  # below batch_bytes: it waits for its linger, or a flush
        p.flush()
        assert futures[6].result(0).offset == 6 and [len(c) for c in counting.calls] == [3, 3, 1]


def test_a_batch_goes_after_linger_ms_with_every_record_sent_meanwhile(counting):
    counting.gate = threading.Event()
    with Producer(counting, linger_ms=10, batch_bytes=1 << 20) as p:
        first = p.send(b"first")
        assert counting.entered.wait(30)  # sent by its age alone: no flush, far below batch_bytes
        rest = [p.send(b"r%d" % i) for i in range(5)]  # the sender is busy: they gather in one batch
        counting.gate.set()
        assert [f.result(30).offset for f in [first] + rest] == [0, 1, 2, 3, 4, 5]
    assert counting.calls == [[b"first"], [b"r0", b"r1", b"r2", b"r3", b"r4"]]


def test_no_batch_outgrows_the_partition_it_must_fit_in(broker):
    s = CountingStream(broker.create_stream("events", partitions=1, max_bytes=4096))
    with Producer(s, linger_ms=SLOW, batch_bytes=64 * 2**10) as p:  # batch_bytes alone would allow 64 KiB
        futures = [p.send(b"%03d" % i + b"x" * 97, key=b"k", headers={"h": "v"}) for i in range(100)]
    assert [f.result(0).offset for f in futures] == list(range(100))
    assert record_size(b"k", msgpack.packb({"h": "v"}), b"x" * 100) == 160  # 25 fit in 4096 bytes, 26 do not
    assert [len(c) for c in s.calls] == [25, 25, 25, 25]
    s.stream.close()


def test_futures_resolve_with_where_each_record_went(broker):
    s = broker.create_stream("events", partitions=3, max_bytes=1 << 20)
    sent = [(b"v%d" % i, b"k%d" % (i % 5), {"i": i}) for i in range(200)]
    with s.producer(linger_ms=1, batch_bytes=2000) as p:
        futures = [p.send(v, key=k, headers=h) for v, k, h in sent]
        pinned = p.send(bytearray(b"pinned"), partition=2)
    for (value, key, headers), f in zip(sent, futures):
        meta = f.result(0)
        assert meta.partition == partition_of(key, 3)
        (r,) = s.read(meta.partition, meta.offset, max_records=1)
        assert (r.value, r.key, r.headers, r.timestamp) == (value, key, headers, meta.timestamp)
    meta = pinned.result(0)
    assert meta.partition == 2 and s.read(2, meta.offset, max_records=1)[0].value == b"pinned"
    s.close()


def test_records_of_one_key_keep_their_send_order_across_batches(broker):
    s = CountingStream(broker.create_stream("events", partitions=4, max_bytes=1 << 20))
    with Producer(s, linger_ms=0, batch_bytes=500) as p:
        futures = [(i % 7, i, p.send(b"%d" % i, key=b"k%d" % (i % 7))) for i in range(700)]
    assert len(s.calls) > 10  # many batches: each holds about 500 bytes of records
    for k in range(7):
        metas = [f.result(0) for key, _i, f in futures if key == k]
        assert len({m.partition for m in metas}) == 1
        assert [m.offset for m in metas] == sorted(m.offset for m in metas)
        read = [int(r.value) for r in s.stream.read(metas[0].partition, 0, max_records=10_000) if r.key == b"k%d" % k]
        assert read == [i for key, i, _f in futures if key == k]
    s.stream.close()


def test_a_failed_append_fails_exactly_the_futures_of_its_batch(counting):
    counting.fail_on = kib(b"poison")
    values = [kib(t) for t in (b"a", b"b", b"c", b"poison", b"e", b"f", b"g", b"h", b"i")]
    with Producer(counting, linger_ms=SLOW, batch_bytes=3000) as p:
        futures = [p.send(v) for v in values]
    errors = [f.exception(0) for f in futures]
    assert errors[:3] == [None] * 3 and errors[6:] == [None] * 3
    assert isinstance(errors[3], shmq.ShmqError) and errors[3] is errors[4] is errors[5]
    with pytest.raises(shmq.ShmqError, match="injected failure"):
        futures[4].result(0)
    assert [f.result(0).offset for f in futures[:3] + futures[6:]] == [0, 1, 2, 3, 4, 5]
    assert [r.value[:1] for r in counting.stream.read(0, 0)] == [b"a", b"b", b"c", b"g", b"h", b"i"]


def test_a_deleted_stream_fails_the_batches_sent_after(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=1 << 16)
    with s.producer(linger_ms=SLOW) as p:
        before = p.send(b"before")
        p.flush()
        broker.delete_stream("events")
        after = [p.send(b"after"), p.send(b"after", key=b"k")]
    assert before.result(0).offset == 0
    assert all(isinstance(f.exception(0), shmq.StreamNotFound) for f in after)
    s.close()


def test_send_waits_only_while_batch_bytes_of_unsent_records_wait(counting):
    counting.gate = threading.Event()
    p = Producer(counting, linger_ms=SLOW, batch_bytes=1000)
    p.send(b"a" * 1000)  # a full load on its own: taken at once, held in the gate
    assert counting.entered.wait(30)
    p.send(b"b" * 1000)  # returns: nothing was waiting; now a full load waits for the sender
    sent = threading.Event()
    t = threading.Thread(target=lambda: (p.send(b"c"), sent.set()))
    t.start()
    assert not sent.wait(0.2)  # held back while the sender is busy
    counting.gate.set()
    assert sent.wait(30)
    t.join(30)
    p.close()
    assert counting.calls == [[b"a" * 1000], [b"b" * 1000], [b"c"]]


def test_flush_and_close(counting):
    p = Producer(counting, linger_ms=SLOW, batch_bytes=1 << 20)
    p.flush()  # nothing to send: returns at once
    one = p.send(b"one")
    p.flush()
    assert one.result(0).offset == 0 and counting.calls == [[b"one"]]
    two, three = p.send(b"two"), p.send(b"three", partition=0)  # two routes: two batches
    p.close()  # flushes
    assert (two.result(0).offset, three.result(0).offset) == (1, 2)
    assert counting.calls == [[b"one"], [b"two"], [b"three"]]
    with pytest.raises(shmq.ShmqError, match="producer of stream 'events' is closed"):
        p.send(b"late")
    p.close()
    assert producer_threads() == []


def test_a_cancelled_future_leaves_its_record_out(counting):
    with Producer(counting, linger_ms=SLOW) as p:
        keep, drop, keep_too = p.send(b"keep"), p.send(b"drop"), p.send(b"keep too")
        assert drop.cancel()
    assert counting.calls == [[b"keep", b"keep too"]]
    assert (keep.result(0).offset, keep_too.result(0).offset) == (0, 1)


def test_a_callback_may_send_but_not_flush(counting):
    counting.gate = threading.Event()
    seen = []
    with Producer(counting, linger_ms=0, batch_bytes=100) as p:
        first = p.send(b"x" * 200)
        assert counting.entered.wait(30)

        def on_done(_f):  # runs in the sender thread: a send there must not wait for that thread
            seen.append(p.send(b"y" * 200))
            try:
                p.flush()
            except RuntimeError as e:
                seen.append(e)

        first.add_done_callback(on_done)
        counting.gate.set()
        assert first.result(30).offset == 0
    assert seen[0].result(0).offset == 1
    assert str(seen[1]) == "Producer.flush() from a future's callback would wait for itself"


def test_bad_arguments_fail_at_send_not_in_a_batch(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    with pytest.raises(ValueError, match="linger_ms must be"):
        s.producer(linger_ms=-1)
    with pytest.raises(ValueError, match="batch_bytes must be a positive int"):
        s.producer(batch_bytes=0)
    with pytest.raises(ValueError, match="compression must be None or 'zstd'"):
        s.producer(compression="lz4")
    with s.producer() as p:
        with pytest.raises(TypeError, match="value must be bytes-like"):
            p.send("text")
        with pytest.raises(TypeError, match="key must be bytes-like"):
            p.send(b"x", key=7)
        with pytest.raises(TypeError, match="values must be str, int"):
            p.send(b"x", headers={"h": object()})
        with pytest.raises(ValueError, match="partitions 0..1, not 2"):
            p.send(b"x", partition=2)
        with pytest.raises(TypeError, match="partition must be an int"):
            p.send(b"x", partition="0")
    assert s.offsets(0) == s.offsets(1) == (0, 0)
    s.close()
    assert producer_threads() == []


def test_a_producer_left_open_is_flushed_at_exit(broker):
    broker.create_stream("events", partitions=1, max_bytes=1 << 16).close()
    code = ("import shmq; b = shmq.connect(namespace=%r); p = b.stream('events').producer(linger_ms=%d); "
            "p.send(b'sent, never flushed')" % (broker.namespace, SLOW))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert (r.returncode, r.stderr) == (0, "")
    with broker.stream("events") as s:
        assert [r.value for r in s.read(0, 0)] == [b"sent, never flushed"]


def test_the_producer_works_on_both_transports(any_broker):
    if isinstance(any_broker, RemoteBroker) and not hasattr(any_broker, "create_stream"):
        pytest.skip("streams over TCP: shmq.client.remote.RemoteBroker has no create_stream yet")
    s = any_broker.create_stream("events", partitions=2, max_bytes=1 << 18)
    with Producer(s, linger_ms=1, batch_bytes=1000) as p:
        futures = [p.send(b"%d" % i, key=b"k%d" % (i % 3)) for i in range(300)]
    metas = [f.result(0) for f in futures]
    for k in range(3):
        mine = [m for i, m in enumerate(metas) if i % 3 == k]
        assert {m.partition for m in mine} == {partition_of(b"k%d" % k, 2)}
        assert [m.offset for m in mine] == sorted(m.offset for m in mine)
    assert sum(s.offsets(p)[1] for p in range(2)) == 300
    s.close()
