"""The consume loop, ``q.messages()``: each delivery acked as the loop takes the next (with
the C paths one lock hold, ``_fast.take_next``), unless the application settled it or its
lease lapsed; how the loop ends (its timeout acks everything, ``break`` leaves the last
delivery leased, a ``with`` block acks it unless it ends by an exception). Each test runs on
the C paths and the pure-Python ones (``impl``); a Hypothesis machine mixes loop steps with
the application's own settles against a model, on both."""

import time

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shmq
from shmq.formats import dmsq
from shmq.engine.shm import cpaths
from shmq.engine.shm import waits
from shmq.engine.shm import layout as L
from shmq.engine.shm.segment import destroy_namespace
from shmq.engine.shm.mutex import unlock
from tests._wait import in_thread, wait_for
from tests.engine.test_model import PurePython
from tests.engine._clock import set_clock


def _counts(q):
    s = q.stats()
    return s.ready, s.in_flight, s.acked_total


def test_each_delivery_is_acked_as_the_next_is_taken(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    q.put_many([b"a", b"b", b"c"])
    seen = [(d.body, d.attempt, _counts(q)) for d in q.messages(timeout=0)]
    assert seen == [(b"a", 1, (2, 1, 0)), (b"b", 1, (1, 1, 1)), (b"c", 1, (0, 1, 2))]
    s = q.stats()
    # the timeout that ended the loop acked the last one: nothing leased, the space free
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total, s.bytes_used) == (0, 0, 3, 0, 0)
    q.close()


def test_a_laned_queues_loop_acks_each_delivery_as_the_next_is_taken(impl, broker):
    q = broker.create_queue("q", lanes=3)
    for i in range(9):
        broker.queue("q").put(b"%d" % i)  # (handles of their own: the puts spread over the lanes)
    seen = []
    for d in q.messages(timeout=0):
        s = q.stats()
        seen.append(d.body)
        assert (s.in_flight, s.acked_total) == (1, len(seen) - 1)
    s = q.stats()
    assert sorted(seen) == [b"%d" % i for i in range(9)] and (s.ready, s.in_flight, s.acked_total) == (0, 0, 9)


def test_a_loop_acks_the_last_delivery_before_it_waits(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    q.put(b"first")
    loop = q.messages(timeout=30)
    assert next(loop).body == b"first"
    t, out = in_thread(lambda: next(loop))
    wait_for(lambda: q.stats().consumers_waiting == 1, what="the loop asleep on the empty queue")
    assert _counts(q) == (0, 0, 1)
    q.put(b"second")
    t.join(30)
    assert out["got"].body == b"second" and _counts(q) == (0, 1, 1)
    loop.close()
    assert _counts(q) == (0, 0, 2)
    with pytest.raises(StopIteration):
        next(loop)  # closed: ended for good
    q.close()


def test_a_step_whose_ack_frees_the_head_posts_a_sleeping_producer(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    q.put_many([b"x" * 100, b"y"])
    loop = q.messages(timeout=0)
    next(loop)
    q._acquire()
    try:  # a producer asleep for room, as _append registers one
        waits.register(q._mq, q._my_slot(), waits.PRODUCERS)
    finally:
        unlock(q._lockp)
    assert q._nf.value == 0
    assert next(loop).body == b"y"  # its ack of the head frees room
    assert (q._mq[L.I_PPOSTED], q._nf.value) == (1, 1)  # counted, and posted once
    q._acquire()
    try:
        waits.unregister(q._mq, q._slot, waits.PRODUCERS, 2)
    finally:
        unlock(q._lockp)
    loop.close()
    q.close()


def test_what_the_application_settled_is_not_acked_by_the_loop(impl, broker):
    dlq = broker.create_queue("q.dlq", max_bytes=4096)
    q = broker.create_queue("q", max_bytes=8192, dead_letter_queue="q.dlq")
    q.put_many([b"acked", b"nacked", b"rejected", b"processed", b"kept"])
    seen = []
    for d in q.messages(timeout=0):
        seen.append((d.body, d.attempt))
        if d.body == b"acked":
            d.ack()
        elif d.body == b"nacked" and d.attempt == 1:
            d.nack()  # ready again at once: the loop takes it next, not acking it first
        elif d.body == b"rejected":
            d.reject()
        elif d.body == b"processed":
            with d.process():
                pass
    assert seen == [(b"acked", 1), (b"nacked", 1), (b"nacked", 2), (b"rejected", 1), (b"processed", 1),
                    (b"kept", 1)]
    s = q.stats()
    # acked once each: "acked" and "processed" by the application, "nacked" (2nd) and "kept" by the loop
    assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total, s.dead_lettered_total) == (0, 0, 4, 1, 1)
    assert [d.body for d in dlq.get_many(10, timeout=0)] == [b"rejected"]
    q.close()
    dlq.close()


def test_a_nack_with_a_delay_is_honoured(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    q.put_many([b"later", b"now"])
    loop = q.messages(timeout=0)
    d = next(loop)
    d.nack(delay=3600)
    assert next(loop).body == b"now"
    loop.close()
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.acked_total) == (0, 1, 0, 1)
    q.close()


def test_break_leaves_the_last_delivery_leased(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    q.put_many([b"a", b"b", b"c"])
    for d in q.messages(timeout=0):
        if d.body == b"b":
            break
    assert _counts(q) == (1, 1, 1)  # "a" acked by the step that took "b"; "b" is the caller's
    d.ack()
    assert _counts(q) == (1, 0, 2)
    q.close()


def test_a_with_block_acks_the_last_delivery_unless_it_raised(impl, broker):
    q = broker.create_queue("q", max_bytes=4096, visibility_timeout=60)
    q.put_many([b"a", b"b", b"c"])
    with q.messages(timeout=0) as loop:
        for d in loop:
            break
    assert d.body == b"a" and _counts(q) == (2, 0, 1)
    with pytest.raises(RuntimeError, match="handling b failed"):
        with q.messages(timeout=0) as loop:
            for d in loop:
                raise RuntimeError(f"handling {d.body.decode()} failed")
    assert _counts(q) == (1, 1, 1)  # "b" stays leased: delivered again once its lease lapses
    with pytest.raises(StopIteration):
        next(loop)
    d.ack()
    q.close()


def test_a_lapsed_lease_is_not_acked_and_comes_back(impl, broker):
    now = [time.monotonic_ns()]
    restore = set_clock(lambda: now[0])
    try:
        q = broker.create_queue("q", max_bytes=4096, visibility_timeout=5)
        q.put_many([b"slow", b"next"])
        loop = q.messages(timeout=0)
        assert next(loop).body == b"slow"
        now[0] += 6 * 10**9  # the handler took longer than the visibility timeout
        d = next(loop)
        assert (d.body, d.attempt) == (b"slow", 2)  # not acked: delivered again, first
        assert [(x.body, x.attempt) for x in loop] == [(b"next", 1)]
        s = q.stats()
        assert (s.ready, s.in_flight, s.acked_total, s.redelivered_total) == (0, 0, 2, 1)
        q.close()
    finally:
        restore()


def test_views_and_serializers_and_a_prefetch_cap(impl, broker):
    broker.create_queue("q", max_bytes=4096)
    q = broker.queue("q")
    q.put_many([b"v1", b"v2"])
    views = [(type(d.body), bytes(d.body)) for d in q.messages(timeout=0, copy=False)]
    assert views == [(memoryview, b"v1"), (memoryview, b"v2")]
    p = broker.queue("q", serializer="json")
    p.put({"n": 1})
    p.put({"n": 2})
    assert [d.body for d in p.messages(timeout=0)] == [{"n": 1}, {"n": 2}]
    capped = broker.queue("q", prefetch=1)
    q.put_many([b"c1", b"c2"])
    assert [d.body for d in capped.messages(timeout=0)] == [b"c1", b"c2"]  # the cap of 1 is freed by each ack
    assert _counts(q) == (0, 0, 6)
    for h in (q, p, capped):
        h.close()


@pytest.mark.parametrize("mode", [L.WAL_BATCH, L.WAL_ALWAYS])  # (always: an fsync per entry, the Python path)
def test_the_loops_acks_are_logged_before_they_commit(impl, broker, tmp_path, mode):
    q = broker.create_queue("q", durability="wal")
    q.wal.configure(str(tmp_path), mode, 2)
    ids = q.put_many([b"a", b"b", b"c"])
    assert [d.id for d in q.messages(timeout=0)] == ids
    entries, error, _offset = dmsq.read_log(q.wal.path(q.wal.config()[0]))
    assert error is None
    assert [(e.op, e.msg_id, e.attempt) for e in entries if e.op == dmsq.ACK] == [(dmsq.ACK, i, 1) for i in ids]
    assert _counts(q) == (0, 0, 3)
    q.close()


def test_bad_arguments_and_a_deleted_queue(impl, broker):
    q = broker.create_queue("q", max_bytes=4096)
    with pytest.raises(ValueError, match=r"^timeout must be >= 0, not -1$"):
        q.messages(timeout=-1)
    with pytest.raises(ValueError, match=r"^visibility_timeout must be >= 0, not -1$"):
        q.messages(visibility_timeout=-1)
    q.put_many([b"a", b"b"])
    loop = q.messages(timeout=0)
    next(loop)
    broker.delete_queue("q")
    with pytest.raises(shmq.QueueNotFound, match="'q'"):
        next(loop)
    q.close()


def test_take_next_refuses_a_delivery_of_another_handle(broker):
    if not cpaths.FAST:
        pytest.skip("the C hot paths are off")
    q = broker.create_queue("q", max_bytes=4096)
    other = broker.queue("q")
    q.put_many([b"a", b"b"])
    d = other.get()
    with pytest.raises(TypeError, match="prev must be a delivery of this queue handle"):
        q.paths.take_next(q, q._segp, q._base, q._cap, max(q._slot, 0), q._vis_ns, 0, 0, 0, q._ring, d, -1, 0)
    with pytest.raises(TypeError, match="prev must be a delivery"):
        q.paths.take_next(q, q._segp, q._base, q._cap, max(q._slot, 0), q._vis_ns, 0, 0, 0, q._ring, b"x", -1, 0)
    assert _counts(q) == (1, 1, 0)  # nothing changed
    d.ack()
    q.close()
    other.close()


# ---------------------------------------------------------------- the model
class LoopModel(RuleBasedStateMachine):
    """Loop steps (``next``), the application's settles of the delivery in hand, ``break``
    (a new loop) and ``close`` against a model: ready ids taken lowest first (a requeued
    message goes back to its place), exact acked / dead-lettered counts."""

    def __init__(self):
        super().__init__()
        self.ns = "hyploop%d" % id(self)
        self.broker = shmq.connect(namespace=self.ns)
        self.q = self.broker.create_queue("m", max_bytes=1 << 16, visibility_timeout=600)
        self.loop = self.q.messages(timeout=0)
        self.next_id = 1
        self.ready = set()
        self.hand = None  # (delivery, settled by the application?)
        self.leased = set()  # ids leased and not settled: the one in hand, and those left by a break
        self.attempts = {}
        self.acked = self.dead = 0

    def teardown(self):
        self.q.close()
        self.broker.delete_queue("m")
        self.broker.close()
        destroy_namespace(self.ns)

    def _settle_hand(self):
        """What the loop does with the delivery in hand as it steps or closes."""
        if self.hand is not None:
            d, settled = self.hand
            if not settled:
                self.leased.discard(d.id)
                self.acked += 1
            self.hand = None

    @rule(n=st.integers(1, 4))
    def put(self, n):
        for _ in range(n):
            assert self.q.put(b"m%d" % self.next_id) == self.next_id
            self.ready.add(self.next_id)
            self.attempts[self.next_id] = 0
            self.next_id += 1

    @rule()
    def step(self):
        self._settle_hand()
        if not self.ready:
            with pytest.raises(StopIteration):
                next(self.loop)
            self.loop = self.q.messages(timeout=0)  # a timeout ends a loop for good: the next is new
            return
        d = next(self.loop)
        want = min(self.ready)
        self.ready.discard(want)
        self.attempts[want] += 1
        assert (d.id, d.body, d.attempt) == (want, b"m%d" % want, self.attempts[want])
        self.leased.add(want)
        self.hand = (d, False)

    @precondition(lambda self: self.hand is not None and not self.hand[1])
    @rule(how=st.sampled_from(["ack", "nack", "reject"]))
    def settle(self, how):
        d = self.hand[0]
        getattr(d, how)()
        self.leased.discard(d.id)
        if how == "ack":
            self.acked += 1
        elif how == "nack":
            self.ready.add(d.id)
        else:
            self.dead += 1
        self.hand = (d, True)

    @rule()
    def break_out(self):
        self.hand = None  # left leased: still counted in self.leased
        self.loop = self.q.messages(timeout=0)

    @rule()
    def close(self):
        self.loop.close()
        self._settle_hand()
        self.loop = self.q.messages(timeout=0)

    @invariant()
    def matches(self):
        s = self.q.stats()
        assert (s.ready, s.in_flight, s.acked_total, s.dead_lettered_total) == (
            len(self.ready), len(self.leased), self.acked, self.dead)


TestLoopModel = LoopModel.TestCase
TestLoopModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


class PurePythonLoopModel(PurePython, LoopModel):
    """The loop model on the pure-Python paths."""


TestPurePythonLoopModel = PurePythonLoopModel.TestCase
TestPurePythonLoopModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
