"""Laned queues (``create_queue(..., lanes=K)``): the queue model run on K lanes, routing
(own lane, home lane, groups and dedup ids pinned to a lane, spilling when a lane is
full), waking a sleeper across lanes, and exact accounting with real processes."""

import os
import threading

import pytest
from hypothesis import settings

import shmq
from shmq.engine.shm import waits
from tests import _workers as w
from tests._processes import WORKERS
from tests._wait import in_thread, wait_for
from tests.engine.test_model import PurePython, QueueModel

K = 3


class LanedQueueModel(QueueModel):
    """The queue model on K lanes, one handle: its own lane and home lane are lane 0 (the
    first turns), a put spills into lanes 1, 2 only when lane 0 is full, and a get takes
    from the first lane, in order, that has a message ready: FIFO within each lane."""

    LANES = K

    def __init__(self):
        super().__init__()
        self.next_in_lane = {j: j + 1 for j in range(K)}

    def _lane(self, msg_id):
        return (msg_id - 1) % K

    def _new_id(self, msg_id):
        lane = self._lane(msg_id)
        assert msg_id not in self.msgs and msg_id == self.next_in_lane[lane], (msg_id, self.next_in_lane)
        self.next_in_lane[lane] += K

    def _new_ids(self, ids):
        assert len({self._lane(i) for i in ids}) == 1, "a batch lands in one lane"
        for i in ids:
            self._new_id(i)

    def _ready_in_order(self):
        for lane in range(K):
            ready = sorted(i for i, m in self.msgs.items() if m.state == "ready" and self._lane(i) == lane)
            if ready:
                return ready
        return []


TestLanedQueueModel = LanedQueueModel.TestCase
TestLanedQueueModel.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)


class PurePythonLanedQueueModel(PurePython, LanedQueueModel):
    """The laned model on the pure-Python paths."""


TestPurePythonLanedQueueModel = PurePythonLanedQueueModel.TestCase
TestPurePythonLanedQueueModel.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


# ---------------------------------------------------------------- routing
def test_each_handle_puts_into_its_own_lane_and_takes_from_its_home_lane_first(impl, broker):
    q = broker.create_queue("q", lanes=K)
    handles = [broker.queue("q") for _ in range(K)]
    ids = [h.put(b"from %d" % i) for i, h in enumerate([q] + handles[:K - 1])]
    assert sorted((i - 1) % K for i in ids) == list(range(K))  # one lane each, in turn
    assert q.stats().ready == K and q.stats().enqueued_total == K
    consumers = [broker.queue("q") for _ in range(K)]
    got = [c.get_nowait() for c in consumers]
    assert [(d.id - 1) % K for d in got] == list(range(K))  # each from its home lane
    for d in got:
        d.ack()
    more = q.put_many([b"a", b"b", b"c"])  # a batch, into one lane
    assert len({(i - 1) % K for i in more}) == 1
    ds = consumers[1].get_many(10, timeout=0)  # its home lane is empty: it takes from the others
    assert [d.body for d in ds] == [b"a", b"b", b"c"]
    consumers[1].ack_many(ds)
    s = q.stats()
    assert (s.ready, s.in_flight, s.enqueued_total, s.acked_total) == (0, 0, K + 3, K + 3)


def test_a_group_and_a_dedup_id_are_pinned_to_one_lane(impl, broker):
    q = broker.create_queue("q", lanes=K)
    others = [broker.queue("q") for _ in range(K)]
    group_ids = [h.put(b"%d" % i, group="g") for i, h in enumerate([q] + others)]
    assert len({(i - 1) % K for i in group_ids}) == 1  # every handle: the group's lane
    first = q.put(b"once", dedup_id="x")
    assert [h.put(b"twice", dedup_id="x") for h in others] == [first] * K
    bodies = []
    while True:
        try:
            d = q.get_nowait()
        except shmq.QueueEmpty:
            break
        bodies.append(d.body)
        d.ack()
    assert [b for b in bodies if b != b"once"] == [b"%d" % i for i in range(K + 1)]  # the group in put order
    assert bodies.count(b"once") == 1 and b"twice" not in bodies


def test_a_full_lane_spills_into_the_others_before_a_put_waits(impl, broker):
    q = broker.create_queue("q", lanes=2, max_bytes=2 * 4096, max_message_bytes=1000)
    ids = []
    while True:
        try:
            ids.append(q.put_nowait(b"x" * 1000))
        except shmq.QueueFull:
            break
    lanes = [(i - 1) % 2 for i in ids]
    assert lanes[0] == lanes[1] and set(lanes) == {0, 1}  # its own lane first, then the other
    with pytest.raises(shmq.QueueFull, match="queue 'q' is full"):
        q.put(b"x" * 1000, timeout=0.05)
    assert q.stats().producers_waiting == 0
    q.get_nowait().ack()
    q.put(b"x" * 1000, timeout=5)  # room again


def test_a_sleeping_get_is_woken_by_a_put_into_any_lane(impl, broker, monkeypatch):
    """The sleeper counts itself in lane 0; a put into lane 1 wakes it (with slices of 60 s,
    only the wake can end its wait inside the join's bound)."""
    monkeypatch.setattr(waits, "WAIT_SLICE_S", 60.0)
    monkeypatch.setattr(waits, "SPIN_NS", 0)
    q = broker.create_queue("q", lanes=2)
    producer = broker.queue("q")
    q.put(b"warm-up")  # this handle: lane 0 ...
    q.get_nowait().ack()
    out = []
    t = threading.Thread(target=lambda: out.append(q.get(timeout=50)))
    t.start()
    from tests._wait import in_thread, wait_for

    wait_for(lambda: q.stats().consumers_waiting == 1, what="the get to sleep")
    msg_id = producer.put(b"hello")  # ... that one: lane 1
    assert (msg_id - 1) % 2 == 1
    t.join(10)
    assert not t.is_alive(), "the sleeper was not woken by the put into another lane"
    assert out[0].body == b"hello"
    out[0].ack()
    assert q.stats().consumers_waiting == 0


def test_a_sleeping_get_that_cannot_have_lane_0s_lock_back_leaves_no_sleeper(impl, broker, monkeypatch):
    """A laned get sleeps counted in lane 0 and uncounts itself under its lock; when a live
    process holds that lock past the lock timeout, the get raises, and the sleep is
    uncounted at the handle's next lock hold of lane 0 (it stayed counted for ever)."""
    from shmq.engine.shm import mutex

    monkeypatch.setattr(mutex, "LOCK_TIMEOUT_S", 0.3)
    q = broker.create_queue("q", lanes=2)
    t, out = in_thread(lambda: q.get(timeout=30))
    wait_for(lambda: q.stats().consumers_waiting == 1, what="the get to sleep")
    ready = WORKERS.Event()
    holder = WORKERS.Process(target=w.hold_lock, args=(broker.namespace, "q", ready, False))
    holder.start()
    try:
        assert ready.wait(60)  # (it holds lane 0's lock until killed)
        t.join(30)
        assert not t.is_alive()
    finally:
        holder.kill()
        holder.join(30)
    assert isinstance(out.get("error"), shmq.LockTimeout), out
    assert "its lock stayed held by a live process" in str(out["error"])
    s = q.stats()  # (lane 0 repaired after its holder's death, then the sleep uncounted)
    assert (s.consumers_waiting, s.producers_waiting) == (0, 0)
    q.put(b"x")
    assert q.get(timeout=5).body == b"x"


def test_settles_stats_peek_and_purge_cover_every_lane(impl, broker):
    broker.create_queue("dlq", lanes=2)
    q = broker.create_queue("q", lanes=K, dead_letter_queue="dlq")
    handles = [broker.queue("q") for _ in range(K)]
    for i, h in enumerate(handles):
        h.put_many([b"%d-%d" % (i, k) for k in range(3)])
    assert [m.body for m in q.peek(4)] == [b"0-0", b"0-1", b"0-2", b"1-0"]  # oldest first across the lanes
    ds = [d for _ in range(K) for d in q.get_many(3, timeout=0)]  # a lane a call, its home lane first
    assert [d.body for d in ds] == [b"%d-%d" % (i, k) for i in range(K) for k in range(3)]
    q.ack_many(ds[:3])
    q.nack_many(ds[3:6], 0)
    q.reject_many(ds[6:])
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total, s.dead_lettered_total, s.dead_letter_depth) == (3, 0, 3, 3, 3)
    with pytest.raises(shmq.DeliveryExpired):
        q.ack_many(ds[:1])
    assert q.purge() == 3
    assert broker.queue("dlq").stats().ready == 3


def test_a_prefetch_cap_covers_every_lane(impl, broker):
    q = broker.create_queue("q", lanes=2)
    for h in (q, broker.queue("q")):
        h.put_many([b"a", b"b"])  # two in each lane
    c = broker.queue("q")
    it = c.consume(prefetch=3)
    got = [next(it) for _ in range(3)]
    assert len({(d.id - 1) % 2 for d in got}) == 2  # from both lanes, under one cap
    with pytest.raises(shmq.QueueEmpty, match="holds its prefetch of 3"):
        it._q.get(timeout=0.05)
    got[0].ack()  # a settle in any lane makes room
    got.append(next(it))
    it._q.ack_many(got[1:])
    assert q.stats().acked_total == 4
    it.close()


# ---------------------------------------------------------------- real processes
@pytest.mark.slow
def test_producers_and_consumers_per_lane_deliver_every_message_exactly_once(broker, tmp_path):
    q = broker.create_queue("q", lanes=2, max_bytes=2 * 2**20)
    n, count = 3, 3000  # 3 producers and 3 consumers on 2 lanes: several of each per lane
    done = WORKERS.Event()
    producers = [WORKERS.Process(target=w.producer, args=(broker.namespace, "q", f"p{i}", count, 1 + i * 7))
                 for i in range(n)]
    consumers = [WORKERS.Process(target=w.consumer, args=(broker.namespace, "q", str(tmp_path / f"c{i}"), 1 + i * 5,
                                                        done)) for i in range(n)]
    for p in producers + consumers:
        p.start()
    for p in producers:
        p.join(120)
        assert p.exitcode == 0
    from tests._wait import in_thread, wait_for

    wait_for(lambda: q.stats().acked_total == n * count, timeout=120, what="every message acked")
    done.set()
    for c in consumers:
        c.join(30)
        assert c.exitcode == 0
    got = []
    for i in range(n):
        got += (tmp_path / f"c{i}").read_text().split()
    assert sorted(got) == sorted(f"p{i}:{k}" for i in range(n) for k in range(count))  # each exactly once
    s = q.stats()
    assert (s.ready, s.in_flight, s.enqueued_total, s.acked_total) == (0, 0, n * count, n * count)


def test_a_forked_child_takes_lanes_of_its_own(broker):
    """A handle passed to a fork child: the child takes its own turns, so a parent and a
    child that both put fill two lanes, not one."""
    q = broker.create_queue("q", lanes=2)
    parent_id = q.put(b"parent")
    pid = os.fork()
    if pid == 0:  # the child: put, then leave at once (no test machinery after a fork)
        try:
            q.put(b"child")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ids = sorted(d.id for d in q.get_many(10, timeout=0) + q.get_many(10, timeout=0))
    assert len(ids) == 2 and {(i - 1) % 2 for i in ids} == {0, 1}, ids
    assert parent_id in ids
