"""One suite of queue behaviour, run against both transports (local attach and TCP)."""

import queue as stdlib_queue

import pytest

import shmq


def test_put_get_ack_round_trip(any_broker):
    q = any_broker.create_queue("q")
    msg_id = q.put(b"order #42", headers={"customer": "ada", "n": 3, "raw": b"\x00"})
    d = q.get(timeout=5)
    assert (d.id, d.body, d.attempt, d.queue) == (msg_id, b"order #42", 1, "q")
    assert d.headers == {"customer": "ada", "n": 3, "raw": b"\x00"}
    d.ack()
    s = q.stats()
    assert (s.ready, s.in_flight, s.enqueued_total, s.acked_total) == (0, 0, 1, 1)


def test_fifo_and_ids(any_broker):
    q = any_broker.create_queue("q")
    ids = [q.put(b"%d" % i) for i in range(20)]
    assert ids == list(range(1, 21))
    got = [q.get_nowait() for _ in range(20)]
    assert [d.body for d in got] == [b"%d" % i for i in range(20)]
    assert q.ack_many(got) == 20


def test_empty_raises_queue_empty(any_broker):
    q = any_broker.create_queue("q")
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(shmq.QueueEmpty):
        q.get_many(10, timeout=0)


def test_nack_redelivers_with_next_attempt(any_broker):
    q = any_broker.create_queue("q")
    q.put(b"x")
    q.get_nowait().nack()
    d = q.get(timeout=5)
    assert (d.body, d.attempt) == (b"x", 2)
    d.nack(delay=0.05)
    d = q.get(timeout=5)
    assert d.attempt == 3
    d.ack()
    assert q.stats().redelivered_total == 2


def test_reject_to_dead_letter_queue(any_broker):
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("q", dead_letter_queue="dlq", max_deliveries=5)
    q.put(b"bad")
    q.get_nowait().reject()
    dead = any_broker.queue("dlq").get_nowait()
    assert dead.body == b"bad" and dead.headers["x-death-reason"] == "rejected"
    dead.ack()
    assert q.stats().dead_lettered_total == 1


def test_settling_twice_raises_delivery_expired(any_broker):
    q = any_broker.create_queue("q")
    q.put(b"x")
    d = q.get_nowait()
    d.ack()
    for settle in (d.ack, d.nack, d.reject, lambda: d.extend(5)):
        with pytest.raises(shmq.DeliveryExpired):
            settle()
    assert q.stats().acked_total == 1


def test_extend_keeps_the_lease(any_broker):
    q = any_broker.create_queue("q", visibility_timeout=60)
    q.put(b"x")
    d = q.get_nowait()
    d.extend(120)
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    d.ack()


def test_full_queue_backpressure(any_broker):
    q = any_broker.create_queue("q", max_bytes=4096, max_message_bytes=976)
    for _ in range(4):
        q.put_nowait(b"x" * 976)
    with pytest.raises(shmq.QueueFull):
        q.put_nowait(b"y")
    with pytest.raises(stdlib_queue.Full):
        q.put(b"y", timeout=0.05)
    with pytest.raises(shmq.QueueFull):
        q.put_many([b"a", b"b"], timeout=0)
    assert q.stats().ready == 4


def test_too_large_and_bad_bodies(any_broker):
    q = any_broker.create_queue("q", max_message_bytes=1000)
    with pytest.raises(shmq.MessageTooLarge):
        q.put(b"x" * 1001)
    with pytest.raises(TypeError, match="bytes-like"):
        q.put("text")
    with pytest.raises(TypeError, match="header"):
        q.put(b"x", headers={"a": [1]})
    assert q.stats().ready == 0


def test_registry_errors(any_broker):
    any_broker.create_queue("q")
    with pytest.raises(shmq.QueueExists):
        any_broker.create_queue("q")
    any_broker.create_queue("q", exist_ok=True)
    with pytest.raises(shmq.QueueNotFound):
        any_broker.queue("missing")
    with pytest.raises(shmq.QueueNotFound):
        any_broker.delete_queue("missing")
    any_broker.create_queue("a")
    assert any_broker.list_queues() == ["a", "q"]
    any_broker.delete_queue("a")
    assert any_broker.list_queues() == ["q"]


def test_batches(any_broker):
    q = any_broker.create_queue("q")
    ids = q.put_many([b"a", (b"b", {"k": "v"}), b"c"])
    assert ids == [1, 2, 3]
    ds = q.get_many(2, timeout=5)
    assert [d.body for d in ds] == [b"a", b"b"] and ds[1].headers == {"k": "v"}
    ds += q.get_many(64, timeout=5)
    assert q.ack_many(ds) == 3
    assert q.put_many([]) == []


def test_purge_and_stats(any_broker):
    q = any_broker.create_queue("q", max_bytes=1 << 20)
    q.put_many([b"a", b"b", b"c"])
    d = q.get_nowait()
    assert q.purge() == 2
    s = q.stats()
    assert (s.ready, s.in_flight, s.max_bytes, s.enqueued_total) == (0, 1, 1 << 20, 3)
    assert s.oldest_ready_age_s == 0
    d.ack()
