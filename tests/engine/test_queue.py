"""Queue semantics in one process: FIFO, leases, settling, dead letters, limits, stats."""

import pickle
import queue as stdlib_queue
import threading
import time

import pytest

import shmq
import shmq.engine.queues.queue as engine
from shmq.engine.queues import deadletter
from shmq.engine import maintenance
from shmq.engine.shm import waits
from shmq.engine.shm.mutex import unlock
from tests._processes import WORKERS
from tests.engine._clock import set_clock


class Clock:
    """A monotonic clock the test moves by hand (lease expiry without sleeping)."""

    def __init__(self):
        self.now = time.monotonic_ns()

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += int(seconds * 1e9)


@pytest.fixture
def clock():
    c = Clock()
    restore = set_clock(c)
    yield c
    restore()


def test_fifo_put_get_ack(broker):
    q = broker.create_queue("q")
    ids = [q.put(b"m%d" % i) for i in range(10)]
    assert ids == list(range(1, 11))
    got = [q.get_nowait() for _ in range(10)]
    assert [d.body for d in got] == [b"m%d" % i for i in range(10)]
    assert [d.id for d in got] == ids
    assert all(d.attempt == 1 and d.queue == "q" and d.headers == {} for d in got)
    for d in got:
        d.ack()
    s = q.stats()
    assert (s.ready, s.in_flight, s.enqueued_total, s.acked_total, s.bytes_used) == (0, 0, 10, 10, 0)


def test_headers_round_trip(broker):
    q = broker.create_queue("q")
    headers = {"s": "x", "i": -5, "big": 2**63, "f": 1.5, "b": True, "raw": b"\x00\xff"}
    q.put(b"body", headers=headers)
    d = q.get_nowait()
    assert d.headers == headers
    d.ack()


def test_empty_and_any_length_bodies(broker):
    q = broker.create_queue("q", max_bytes=1 << 20, max_message_bytes=100_000)
    bodies = [b"", b"x", bytes(range(256)) * 390, bytearray(b"ba"), memoryview(b"mv")]
    q.put_many(bodies)
    got = q.get_many(10, timeout=0)
    assert [d.body for d in got] == [bytes(b) for b in bodies]
    assert all(type(d.body) is bytes for d in got)
    q.ack_many(got)


def test_get_nowait_on_empty_raises_queue_empty(broker):
    q = broker.create_queue("q")
    with pytest.raises(shmq.QueueEmpty, match="'q' is empty"):
        q.get_nowait()
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0.01)
    with pytest.raises(shmq.QueueEmpty):
        q.get_many(5, timeout=0)


def test_get_many_returns_what_is_ready_up_to_max(broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b", b"c"])
    ds = q.get_many(2, timeout=0)
    assert [d.body for d in ds] == [b"a", b"b"]
    ds += q.get_many(64, timeout=0)
    assert [d.body for d in ds] == [b"a", b"b", b"c"]
    assert q.ack_many(ds) == 3
    assert q.stats().acked_total == 3


def test_nack_requeues_in_place_with_next_attempt(broker):
    q = broker.create_queue("q")
    q.put_many([b"1", b"2", b"3"])
    d1, d2 = q.get_nowait(), q.get_nowait()
    assert (d1.body, d2.body) == (b"1", b"2")
    d1.nack()
    again = q.get_nowait()
    assert (again.id, again.body, again.attempt) == (d1.id, b"1", 2)
    assert q.get_nowait().body == b"3"
    s = q.stats()
    assert (s.ready, s.in_flight, s.redelivered_total) == (0, 3, 1)


def test_nack_with_delay_waits_then_becomes_ready(broker, clock):
    q = broker.create_queue("q")
    q.put(b"x")
    q.get_nowait().nack(delay=5.0)
    assert q.stats().delayed == 1
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    clock.advance(5.001)
    d = q.get_nowait()
    assert (d.body, d.attempt) == (b"x", 2)
    d.ack()


def test_expired_lease_is_redelivered_and_old_delivery_is_dead(broker, clock):
    q = broker.create_queue("q", visibility_timeout=10.0)
    q.put(b"x")
    first = q.get_nowait()
    clock.advance(9.9)
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    clock.advance(0.2)
    second = q.get_nowait()
    assert (second.id, second.attempt) == (first.id, 2)
    with pytest.raises(shmq.DeliveryExpired):
        first.ack()
    with pytest.raises(shmq.DeliveryExpired):
        first.nack()
    second.ack()
    assert q.stats().acked_total == 1


def test_extend_keeps_the_lease(broker, clock):
    q = broker.create_queue("q", visibility_timeout=10.0)
    q.put(b"x")
    d = q.get_nowait()
    clock.advance(8)
    d.extend(30)
    clock.advance(20)
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    d.ack()
    clock.advance(100)
    with pytest.raises(shmq.DeliveryExpired):
        d.extend(1)


def test_per_get_visibility_timeout(broker, clock):
    q = broker.create_queue("q", visibility_timeout=100.0)
    q.put(b"x")
    q.get_nowait(visibility_timeout=1.0)
    clock.advance(1.5)
    assert q.get_nowait().attempt == 2


def test_double_ack_raises_and_changes_nothing(broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])
    d = q.get_nowait()
    d.ack()
    with pytest.raises(shmq.DeliveryExpired, match="no longer leased"):
        d.ack()
    with pytest.raises(shmq.DeliveryExpired):
        d.nack()
    with pytest.raises(shmq.DeliveryExpired):
        d.reject()
    s = q.stats()
    assert (s.ready, s.acked_total, s.dead_lettered_total) == (1, 1, 0)


def test_ack_many_acks_the_live_ones_and_names_the_expired(broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b", b"c"])
    ds = q.get_many(3, timeout=0)
    ds[1].ack()
    with pytest.raises(shmq.DeliveryExpired, match=r"delivery q#2 attempt 1 is no longer leased"):
        q.ack_many(ds)
    assert q.stats().acked_total == 3
    assert q.stats().in_flight == 0


def test_reject_without_dlq_drops_and_counts(broker):
    q = broker.create_queue("q")
    q.put(b"bad")
    q.get_nowait().reject()
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total, s.bytes_used) == (0, 0, 1, 0)


def test_reject_moves_to_dead_letter_queue_with_reason(broker):
    dlq = broker.create_queue("dlq")
    q = broker.create_queue("q", dead_letter_queue="dlq")
    q.put(b"bad", headers={"k": "v"})
    q.get_nowait().reject()
    d = dlq.get_nowait()
    assert d.body == b"bad"
    assert d.headers["k"] == "v"
    assert d.headers["x-death-reason"] == "rejected"
    assert d.headers["x-death-queue"] == "q"
    assert q.stats().dead_lettered_total == 1
    d.ack()


def test_nack_without_requeue_is_a_reject(broker):
    broker.create_queue("dlq")
    q = broker.create_queue("q", dead_letter_queue="dlq")
    q.put(b"x")
    q.get_nowait().nack(requeue=False)
    assert broker.queue("dlq").stats().ready == 1


def test_max_deliveries_dead_letters_at_the_nack_of_the_last_delivery(broker):
    dlq = broker.create_queue("dlq")
    q = broker.create_queue("q", max_deliveries=2, dead_letter_queue="dlq")
    q.put_many([b"poison", b"fine"])
    d = q.get_nowait()
    d.nack()
    d = q.get_nowait()
    assert (d.body, d.attempt) == (b"poison", 2)
    d.nack()
    # that was its last delivery: in the DLQ now, counted, before any other get
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total, s.dead_letter_depth) == (1, 0, 1, 1)
    dead = dlq.get_nowait()
    assert (dead.body, dead.headers["x-death-reason"], dead.headers["x-death-attempts"]) == (
        b"poison", "max-deliveries", 2)
    dead.ack()
    d = q.get_nowait()
    assert d.body == b"fine"
    d.ack()
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total, s.acked_total) == (0, 0, 1, 1)


def _dead_letter_of(broker, body, attempts, reason="max-deliveries"):
    """The one message of the queue "dlq": ``body``, dead-lettered from "q" after
    ``attempts`` deliveries; acked."""
    dead = broker.queue("dlq").get(timeout=0)
    assert dead.body == body
    assert {k: v for k, v in dead.headers.items() if k != "x-death-id"} == {
        "x-death-reason": reason, "x-death-queue": "q", "x-death-attempts": attempts}
    dead.ack()
    with pytest.raises(shmq.QueueEmpty):
        broker.queue("dlq").get(timeout=0)


@pytest.mark.parametrize("delay", [None, 0.0, 5.0])
def test_the_nack_of_the_last_delivery_moves_it_to_the_dead_letter_queue_at_once(impl, broker, delay):
    """Issue 27: after the nack of its ``max_deliveries``-th delivery the message showed as
    ready, and the dead-letter queue was empty, until a consumer's next get; its
    x-death-attempts said 4 for max_deliveries=3. The nack moves it now (whatever its
    delay), counted, and the header says how many deliveries it had."""
    broker.create_queue("dlq")
    q = broker.create_queue("q", max_deliveries=3, dead_letter_queue="dlq")
    q.put(b"poison")
    for attempt in (1, 2, 3):
        d = q.get(timeout=0)
        assert d.attempt == attempt
        d.nack(delay=delay if attempt == 3 else None)
    s = q.stats()
    assert (s.ready, s.in_flight, s.delayed, s.dead_lettered_total, s.dead_letter_depth) == (0, 0, 0, 1, 1)
    _dead_letter_of(broker, b"poison", 3)
    with pytest.raises(shmq.DeliveryExpired):
        d.ack()
    assert q.stats().bytes_used == 0


def test_a_batch_nack_moves_the_last_deliveries_and_requeues_the_others(impl, broker):
    broker.create_queue("dlq")
    q = broker.create_queue("q", max_deliveries=2, dead_letter_queue="dlq")
    q.put_many([b"a", b"b", b"c"])
    q.nack_many(q.get_many(1, timeout=0))  # a: one delivery
    a, b, c = q.get_many(3, timeout=0)
    assert [(d.body, d.attempt) for d in (a, b, c)] == [(b"a", 2), (b"b", 1), (b"c", 1)]
    c.ack()
    with pytest.raises(shmq.DeliveryExpired, match=f"2 deliveries of 'q' are no longer leased: #{c.id}, #{c.id}"):
        q.nack_many([a, b, c, c])
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total) == (1, 0, 1)
    _dead_letter_of(broker, b"a", 2)
    assert (q.get(timeout=0).body, q.stats().dead_lettered_total) == (b"b", 1)


@pytest.mark.parametrize("retry_delay", [0.0, 5.0])
def test_a_lapsed_last_delivery_is_moved_by_housekeeping_without_a_get(impl, broker, clock, retry_delay):
    """The lease of the last delivery lapsing: the next housekeeping (any process's, or
    ``shmq server``'s every 0.25 s) moves it; no consumer needs to come (nor a retry delay pass)."""
    broker.create_queue("dlq")
    q = broker.create_queue("q", max_deliveries=2, visibility_timeout=1, dead_letter_queue="dlq",
                            retry_delay=retry_delay)
    q.put(b"slow")
    q.get(timeout=0).nack(delay=0)
    d = q.get(timeout=0)
    assert d.attempt == 2
    clock.advance(1.5)
    assert maintenance.housekeep(q) == 0  # (none made ready)
    s = q.stats()
    assert (s.ready, s.in_flight, s.delayed, s.dead_lettered_total, s.bytes_used) == (0, 0, 0, 1, 0)
    _dead_letter_of(broker, b"slow", 2)
    with pytest.raises(shmq.DeliveryExpired):
        d.ack()


def _get_and_exit(ns):
    with shmq.connect(namespace=ns) as b:
        assert b.queue("q").get(timeout=30).attempt == 1  # and gone, holding the lease


def test_a_dead_holders_last_delivery_is_moved_by_housekeeping(impl, broker):
    broker.create_queue("dlq")
    q = broker.create_queue("q", max_deliveries=1, dead_letter_queue="dlq")
    q.put(b"m")
    p = WORKERS.Process(target=_get_and_exit, args=(broker.namespace,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert q.stats().in_flight == 1
    assert maintenance.housekeep(q) == 0
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total) == (0, 0, 1)
    _dead_letter_of(broker, b"m", 1)


def test_a_restored_message_that_had_all_its_deliveries_is_dead_lettered_by_the_next_get(impl, broker):
    """A snapshot keeps a leased message's attempts; restored ready with all of them had,
    the next get moves it, saying the deliveries it had (not one more), and delivers none."""
    broker.create_queue("dlq")
    q = broker.create_queue("q", max_deliveries=2, dead_letter_queue="dlq")
    maintenance.import_messages(q, [(7, 2, time.time_ns(), b"", b"old")])
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total, s.redelivered_total) == (0, 0, 1, 0)
    _dead_letter_of(broker, b"old", 2)


def test_dead_letter_queue_full_keeps_the_message(broker, clock):
    dlq = broker.create_queue("dlq", max_bytes=4096, max_message_bytes=2000)
    dlq.put(b"x" * 2000)
    dlq.put(b"x" * 1900)
    q = broker.create_queue("q", dead_letter_queue="dlq")
    q.put(b"y" * 1000)
    q.get_nowait().reject()  # DLQ full: requeued with a delay, not lost
    s = q.stats()
    assert (s.delayed, s.dead_lettered_total) == (1, 0)
    dlq.get_nowait().ack()
    clock.advance(deadletter.DLQ_RETRY_DELAY_S + 0.01)
    q.get_nowait().reject()
    assert q.stats().dead_lettered_total == 1
    assert dlq.stats().ready == 2


def test_a_last_delivery_the_full_dead_letter_queue_refused_moves_once_it_has_room(impl, broker, clock):
    dlq = broker.create_queue("dlq", max_bytes=4096, max_message_bytes=2000)
    dlq.put(b"x" * 2000)
    dlq.put(b"x" * 1900)
    q = broker.create_queue("q", max_deliveries=1, dead_letter_queue="dlq")
    q.put(b"y" * 1000)
    q.get(timeout=0).nack()  # DLQ full: delayed where it is, not lost, not delivered again
    s = q.stats()
    assert (s.ready, s.delayed, s.dead_lettered_total) == (0, 1, 0)
    dlq.get(timeout=0).ack()
    clock.advance(deadletter.DLQ_RETRY_DELAY_S + 0.01)
    maintenance.housekeep(q)
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.dead_lettered_total) == (0, 0, 0, 1)
    kept = dlq.get(timeout=0)
    assert kept.body == b"x" * 1900
    kept.ack()
    _dead_letter_of(broker, b"y" * 1000, 1)


def test_purge_drops_ready_keeps_leased(broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b", b"c"])
    d = q.get_nowait()
    assert q.purge() == 2
    assert q.stats().ready == 0
    d.ack()
    s = q.stats()
    assert (s.bytes_used, s.in_flight, s.acked_total, s.purged_total) == (0, 0, 1, 2)
    q.put(b"after")
    assert q.get_nowait().body == b"after"


def test_stats_record_is_frozen_and_complete(broker):
    q = broker.create_queue("q", max_bytes=1 << 20)
    q.put(b"x")
    s = q.stats()
    for field in ("ready", "in_flight", "oldest_ready_age_s", "bytes_used", "max_bytes", "enqueued_total",
                  "acked_total", "redelivered_total", "dead_lettered_total", "consumers_waiting",
                  "producers_waiting"):
        assert hasattr(s, field)
    assert s.max_bytes == 1 << 20 and s.bytes_used == 56
    assert s.oldest_ready_age_s >= 0
    with pytest.raises(AttributeError):
        s.ready = 5


def test_full_queue_put_nowait_and_timeout(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    n = 0
    with pytest.raises(shmq.QueueFull, match="'q' is full"):
        while True:
            q.put_nowait(b"x" * 976)
            n += 1
    assert n == 4
    with pytest.raises(stdlib_queue.Full):
        q.put(b"x" * 976, timeout=0.01)
    assert q.stats().ready == 4


def test_blocked_put_resumes_when_a_consumer_acks(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    for _ in range(4):
        q.put(b"x" * 976)
    done = threading.Event()

    def producer():
        q.put(b"last", timeout=10)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert not done.wait(0.05)
    q.get_nowait().ack()
    assert done.wait(10)
    t.join()
    assert q.stats().ready == 4


def test_blocked_get_wakes_on_put(broker):
    q = broker.create_queue("q")
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=10)))
    t.start()
    deadline = time.monotonic() + 5
    while q.stats().consumers_waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert q.stats().consumers_waiting == 1
    q.put(b"wake")
    t.join(10)
    assert got[0].body == b"wake"
    assert q.stats().consumers_waiting == 0
    got[0].ack()


def test_put_many_is_all_or_nothing(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    with pytest.raises(shmq.MessageTooLarge):
        q.put_many([b"a", b"x" * 1001])  # over max_message_bytes
    with pytest.raises(TypeError):
        q.put_many([b"a", "not bytes"])
    assert q.stats().ready == 0
    q.put_many([b"x" * 900] * 3)
    with pytest.raises(shmq.QueueFull):
        q.put_many([b"y" * 900] * 2, timeout=0)
    assert q.stats().ready == 3
    with pytest.raises(shmq.MessageTooLarge, match="can never fit"):
        q.put_many([b"z" * 900] * 5)
    assert q.put_many([]) == []


def test_put_many_with_headers(broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b"], headers=[{"n": 1}, None])
    a, b = q.get_many(2, timeout=0)
    assert (a.headers, b.headers) == ({"n": 1}, {})


def test_wrap_around_many_laps_keeps_fifo(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=3000)
    expected = []
    sizes = [0, 1, 100, 500, 1003, 2000, 7, 3000, 48, 333]

    def drain():
        while True:
            try:
                d = q.get_nowait()
            except shmq.QueueEmpty:
                return
            assert d.body == expected.pop(0)
            d.ack()

    for i in range(300):
        body = bytes([i % 251]) * sizes[i % len(sizes)]
        try:
            q.put_nowait(body)
        except shmq.QueueFull:
            drain()  # an empty queue takes any message up to max_bytes
            q.put_nowait(body)
        expected.append(body)
        if i % 3 == 2:
            drain()
    while expected:
        d = q.get_nowait()
        assert d.body == expected.pop(0)
        d.ack()
    assert q.stats().bytes_used == 0


def test_a_leased_head_message_blocks_reuse_until_acked(broker):
    q = broker.create_queue("q", max_bytes=4096, max_message_bytes=1000)
    q.put(b"h" * 976)
    head = q.get_nowait()
    for _ in range(3):
        q.put(b"x" * 976)
        q.get_nowait().ack()
    with pytest.raises(shmq.QueueFull):
        q.put_nowait(b"x" * 976)  # acked records behind the leased head are not yet reusable
    head.ack()
    q.put_nowait(b"x" * 976)


def test_queue_handles_pickle_by_name(broker):
    q = broker.create_queue("q")
    q2 = pickle.loads(pickle.dumps(q))
    assert (q2.name, q2.namespace) == ("q", broker.namespace)
    q2.put(b"via copy")
    assert q.get_nowait().body == b"via copy"
    q2.close()


def test_the_layer_that_attaches_hands_in_how_to_open_other_queues(broker):
    """Dead letters and replies reach other queues through the opener ``lanes.attach``
    hands each handle (a laned queue whole), kept by a pickled handle; a handle attached
    alone (``Queue(ns, name)``) opens them by their lane 0."""
    from shmq.engine.queues.lanes import LanedQueue, attach

    broker.create_queue("dlq", lanes=2)
    broker.create_queue("q", max_deliveries=1, dead_letter_queue="dlq")
    q = broker.queue("q")
    again = pickle.loads(pickle.dumps(q))
    alone = engine.Queue(broker.namespace, "q")
    assert (q._opener, again._opener, alone._opener) == (attach, attach, None)
    q.put_many([b"a", b"b"])
    q.get(timeout=5).reject()
    alone.get(timeout=5).reject()
    assert type(q._dead_letter_target()) is LanedQueue and type(alone._dead_letter_target()) is engine.Queue
    dlq = broker.queue("dlq")
    got = dlq.get_many(2, timeout=5)
    assert sorted(d.body for d in got) == [b"a", b"b"] and dlq.stats().dead_letter_depth is None
    dlq.ack_many(got)
    # a reply: into the requester's (laned) reply queue, through the delivery's handle's opener
    q.put(b"question", headers={"x-reply-to": "dlq", "x-correlation-id": "c1"})
    d = again.get(timeout=5)
    assert d.reply(b"answer", {"h": 1}) is True
    d.ack()
    r = dlq.get(timeout=5)
    assert (r.body, r.headers) == (b"answer", {"h": 1, "x-correlation-id": "c1"})
    r.ack()
    for h in (q, again, alone, dlq):
        h.close()


def test_closed_handle_raises_clearly(broker):
    q = broker.create_queue("q")
    q.close()
    with pytest.raises(shmq.ShmqError, match="closed"):
        q.put(b"x")
    q.close()  # idempotent


def test_deleted_queue_raises_not_found_on_old_handles(broker):
    q = broker.create_queue("q")
    q.put(b"x")
    broker.delete_queue("q")
    with pytest.raises(shmq.QueueNotFound, match="deleted"):
        q.put(b"y")
    with pytest.raises(shmq.QueueNotFound):
        q.get_nowait()
    q.close()


def test_delete_wakes_a_blocked_consumer(broker):
    q = broker.create_queue("q")
    errors = []

    def consumer():
        try:
            q.get(timeout=30)
        except shmq.QueueNotFound as e:
            errors.append(e)

    t = threading.Thread(target=consumer)
    t.start()
    deadline = time.monotonic() + 5
    while q.stats().consumers_waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    broker.delete_queue("q")
    t.join(5)
    assert not t.is_alive() and len(errors) == 1


def test_one_liner_attach_outlives_its_broker(broker):
    broker.create_queue("q")
    q = shmq.connect(namespace=broker.namespace).queue("q")  # the temporary broker is collected at once
    import gc
    gc.collect()
    q.put(b"still attached")
    assert q.get_nowait().body == b"still attached"
    q.close()


def test_get_many_max_bytes_bounds_the_batch(broker):
    q = broker.create_queue("q")
    q.put_many([b"x" * 100] * 5)
    first = q.get_many(10, timeout=0, max_bytes=250)
    assert [len(d.body) for d in first] == [100, 100]
    one = q.get_many(10, timeout=0, max_bytes=10)  # the first message is always taken
    assert len(one) == 1
    one[0].nack()  # requeued below the frontier: max_bytes must leave the next requeued one in place
    first[0].nack()
    again = q.get_many(10, timeout=0, max_bytes=150)
    assert [d.id for d in again] == [1]
    rest = q.get_many(10, timeout=0)
    assert [d.id for d in rest] == [3, 4, 5]
    q.ack_many(again + rest + first[1:])
    assert q.stats().in_flight == 0 and q.stats().ready == 0


def test_an_interrupted_sleep_unregisters_the_waiter(broker, monkeypatch):
    q = broker.create_queue("q")

    def interrupted(sem, deadline, now, next_due):
        raise KeyboardInterrupt

    monkeypatch.setattr(waits, "sleep_slice", interrupted)
    with pytest.raises(KeyboardInterrupt):
        q.get(timeout=5)
    assert q.stats().consumers_waiting == 0
    small = broker.create_queue("small", max_bytes=4096, max_message_bytes=976)
    for _ in range(4):
        small.put(b"x" * 976)
    with pytest.raises(KeyboardInterrupt):
        small.put(b"y", timeout=5)
    assert small.stats().producers_waiting == 0


def test_ready_hint_reads_without_the_lock(broker):
    q = broker.create_queue("q")
    assert q._ready_hint() is False
    q.put(b"x")
    assert q._ready_hint() is True
    q._acquire()  # even while someone holds the lock
    try:
        assert q._ready_hint() is True
    finally:
        unlock(q._lockp)
    q.get_nowait().ack()
    assert q._ready_hint() is False


def test_a_delivery_named_twice_in_a_batch_is_settled_once(broker):
    q = broker.create_queue("q")
    q.put_many([b"a", b"b"])
    d, e = q.get_many(2, timeout=0)
    with pytest.raises(shmq.DeliveryExpired, match="delivery q#1 attempt 1 is no longer leased"):
        q.ack_many([d, d])
    s = q.stats()
    assert (s.acked_total, s.in_flight) == (1, 1)
    with pytest.raises(shmq.DeliveryExpired, match="is no longer leased"):
        q.nack_many([e, e])
    assert q.stats().ready == 1 and q.stats().in_flight == 0


@pytest.mark.parametrize("gone", [".ne", ".nf"])
def test_an_attach_that_finds_a_semaphore_gone_says_deleted_and_leaves_nothing_open(broker, monkeypatch, gone):
    """A queue deleted while another process attaches (its semaphores unlinked after its
    segment was opened): QueueNotFound, and nothing half-open that fails as it is collected."""
    import gc
    import sys

    import posix_ipc

    from shmq.engine.shm.names import queue_segment

    broker.create_queue("q")
    name = queue_segment(broker.namespace, "q") + gone
    posix_ipc.unlink_semaphore(name)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    try:
        with pytest.raises(shmq.QueueNotFound, match="was deleted"):
            broker.queue("q")
        gc.collect()
    finally:
        posix_ipc.Semaphore(name, posix_ipc.O_CREAT, mode=0o600)  # for the fixture's delete
    assert unraisable == []


def test_a_handle_keeps_its_attributes_within_what_cpython_reads_fast(broker):
    """CPython 3.11 reads an instance attribute fast while its class's instances have at
    most 30 of them (a shared-keys table); past that, each gets a dict of its own, and
    every attribute read on the hot paths costs more (a 31st made get + ack 10% slower).
    New facts go into the tuples that hold several (``_made``, ``_opts``)."""
    q = broker.create_queue("q")
    q.put(b"x")
    q.get().ack()
    assert len(vars(q)) <= 30, sorted(vars(q))
    s = broker.create_stream("s", partitions=1)
    s.append(b"x")
    assert len(vars(s._part(0))) <= 30 and len(vars(s)) <= 30
    s.close()
