"""The C hot paths (shmq/_fast.c): built, on the same layout, and exact in the cases
where they must hand over to the Python paths or refuse. Each scenario runs on both
implementations (``fast`` / ``pure``); tests/test_model.py runs the model on both."""

import os

import pytest

import shmq
import shmq.engine.queues.queue as engine
from shmq.engine.shm import layout as L
from tests.engine._clock import set_clock


def test_the_c_hot_paths_are_built_and_share_the_layout():
    if os.environ.get("SHMQ_PURE_PYTHON"):
        pytest.skip("SHMQ_PURE_PYTHON is set")
    from shmq.engine import _fast

    assert engine.FAST
    assert (_fast.MUTEX_OFF, _fast.HOT_OFF, _fast.COUNTERS_OFF, _fast.REC_SIZE) == (
        L.MUTEX_OFF, L.HOT_OFF, L.COUNTERS_OFF, L.REC_SIZE)
    assert (_fast.READY, _fast.LEASED, _fast.ACKED, _fast.PAD) == (L.READY, L.LEASED, L.ACKED, L.PAD)
    assert L.HOT_FIELDS.index("pposted") == 4 and L.COUNTER_FIELDS[:2] == ("acked_total", "redelivered_total")




@pytest.fixture
def clock():
    """The engine's monotonic clock, moved by hand."""
    now = [engine._mono()]
    restore = set_clock(lambda: now[0])
    yield now
    restore()


def _registered(q):
    """A handle whose process slot is taken (the first get of a handle takes the general
    path, which registers it; the hot paths need it)."""
    q.put(b"warm-up")
    q.get().ack()
    return q


def test_a_lapsed_lease_is_taken_again_before_the_frontier(impl, broker, clock):
    q = _registered(broker.create_queue("q", visibility_timeout=5))
    clock[0] += 6 * 10**9
    q._housekeep()  # nothing is leased: no deadline is pending, so only this get can set one
    q.put(b"one")
    q.put(b"two")
    first = q.get()
    assert (first.id, first.attempt) == (2, 1)
    clock[0] += 6 * 10**9  # the lease lapsed: the next get must see that housekeeping is due
    again = q.get()
    assert (again.id, again.attempt, again.body) == (2, 2, b"one")
    with pytest.raises(shmq.DeliveryExpired):
        first.ack()
    again.ack()
    assert q.get().body == b"two"
    s = q.stats()
    assert (s.redelivered_total, s.acked_total, s.in_flight, s.ready) == (1, 2, 1, 0)
    q.close()


def test_a_restored_message_at_the_frontier_counts_as_redelivered(impl, broker):
    q = _registered(broker.create_queue("q"))
    q._import_messages([(10, 3, 0, b"", b"restored")])  # (id, attempt, enqueued_ns, headers, body)
    d = q.get()
    assert (d.id, d.attempt, d.body) == (10, 4, b"restored")
    assert q.stats().redelivered_total == 1
    d.ack()
    q.close()


def test_an_ack_after_the_deadline_is_refused_even_before_housekeeping(impl, broker, clock):
    q = _registered(broker.create_queue("q", visibility_timeout=5))
    q.put(b"x")
    d = q.get()
    clock[0] += 5 * 10**9  # exactly at the deadline: lapsed
    with pytest.raises(shmq.DeliveryExpired):
        d.ack()
    assert q.stats().acked_total == 1  # the warm-up's
    q.close()


def test_acks_at_the_head_free_room_for_a_full_queue(impl, broker):
    q = _registered(broker.create_queue("q", max_bytes=4096))
    ids = []
    while True:
        try:
            ids.append(q.put_nowait(b"b" * 100, headers={"k": len(ids)}))
        except shmq.QueueFull:
            break
    got = [q.get() for _ in ids]
    assert [d.id for d in got] == ids and [d.headers["k"] for d in got] == list(range(len(ids)))
    for d in reversed(got[1:]):  # acks behind the head reclaim nothing yet
        d.ack()
    assert q.stats().bytes_used > 0
    got[0].ack()  # the head moves past all of them at once
    s = q.stats()
    assert (s.bytes_used, s.in_flight, s.acked_total) == (0, 0, len(ids) + 1)
    # round the ring a few times: pads at the end of a lap are skipped on both sides
    for i in range(3 * len(ids)):
        q.put(bytes([i % 256]) * (i % 300))
        d = q.get()
        assert d.body == bytes([i % 256]) * (i % 300)
        d.ack()
    assert q.stats().bytes_used == 0
    q.close()


def test_the_c_get_passes_over_a_pad_at_the_frontier(impl, broker, monkeypatch):
    """A record at the start of a lap, after the pad of the last one's end, is taken by the C
    get itself, as get_many's loop takes it (the general take is not asked)."""
    q = _registered(broker.create_queue("q", max_bytes=4096))
    general = []
    if impl == "fast":
        take = type(q)._get
        monkeypatch.setattr(type(q), "_get", lambda self, *a, **k: general.append(1) or take(self, *a, **k))
    q.put(b"first")  # one record always held: no put finds the queue empty (a new lap, no pad)
    for i in range(40):  # 48 + 200 bytes a record: a pad at the end of every lap
        q.put(bytes([i]) * 200)
        d = q.get()
        assert d.body == (b"first" if i == 0 else bytes([i - 1]) * 200)
        d.ack()
    assert general == [] and q.stats().ready == 1
    q.close()


def test_max_deliveries_hands_the_last_attempt_to_the_dead_letter_path(impl, broker, clock):
    broker.create_queue("dlq")
    q = _registered(broker.create_queue("q", visibility_timeout=1, max_deliveries=2, dead_letter_queue="dlq"))
    q.put(b"m")
    for attempt in (1, 2):
        assert q.get().attempt == attempt
        clock[0] += 2 * 10**9
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    dlq = broker.queue("dlq")
    assert dlq.get(timeout=0).body == b"m"
    q.close()
    dlq.close()


def test_a_deleted_queue_is_refused_on_every_hot_path(impl, broker):
    q = _registered(broker.create_queue("q"))
    q.put(b"x")
    d = q.get()
    broker.delete_queue("q")
    with pytest.raises(shmq.QueueNotFound):
        q.put(b"y")
    with pytest.raises(shmq.QueueNotFound):
        d.ack()
    with pytest.raises(shmq.QueueNotFound):
        q.get(timeout=0)
    q.close()


@pytest.mark.parametrize("mode", [L.WAL_BATCH, L.WAL_ALWAYS])
def test_the_write_ahead_log_is_the_same_from_either_path(impl, broker, tmp_path, mode):
    from shmq.formats import dmsq
    from shmq.model.headers import decode_headers

    q = broker.create_queue("q", durability="wal")
    q.wal.configure(str(tmp_path), mode, 2)
    bodies = [b"", b"a", b"x" * 300, b"y" * 5000]  # 5000 B: past the C path's limit, logged by Python
    ids = [q.put(b, headers={"n": i} if i % 2 else None) for i, b in enumerate(bodies)]
    got = [q.get() for _ in bodies]
    for d in got:
        d.ack()
    entries, error, _offset = dmsq.read_log(q.wal.path(q.wal.config()[0]))
    assert error is None  # every CRC checks out
    puts = [(e.op, e.msg_id, e.attempt, e.body) for e in entries if e.op == dmsq.PUT]
    acks = [(e.op, e.msg_id, e.attempt) for e in entries if e.op == dmsq.ACK]
    assert puts == [(dmsq.PUT, i, 0, b) for i, b in zip(ids, bodies)]
    assert [decode_headers(e.headers) if e.headers else None for e in entries if e.op == dmsq.PUT] == [
        None, {"n": 1}, None, {"n": 3}]
    assert acks == [(dmsq.ACK, d.id, d.attempt) for d in got]
    assert q.stats().acked_total == len(bodies)
    assert q._mq[L.I_WAL_SIZE] == sum(len(e.headers) + len(e.body) + 36 for e in entries)
    q.close()
