"""A Hypothesis state machine for the work-queue options: random puts with priority,
delay, TTL, group and dedup id, gets, acks, nacks, rejects, peeks and clock moves,
against a simple model of the order and the accounting a queue must keep. It runs on the
C hot paths and on the pure-Python ones."""

import time

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from tests.engine._clock import set_clock, set_wall_clock

VIS = 10.0
LEVELS = 3
WINDOW = 60.0
MODES = st.sampled_from(["lease", "lease", "auto", "view"])


class Msg:
    def __init__(self, msg_id, body, priority, due, expires, group, enq):
        self.id = msg_id
        self.body = body
        self.priority = priority
        self.ready_at = due or enq  # when it became deliverable: its place in due order
        self.due = due
        self.expires = expires
        self.group = group
        self.enq = enq
        self.state = "delayed" if due else "ready"
        self.deadline = due
        self.attempt = 0


class OptionsModel(RuleBasedStateMachine):
    """The model: a message is ready, leased, delayed (a delayed put or a delayed nack)
    or gone. Ready messages are delivered by (priority high first, ready time, put
    order); only the oldest unsettled message of a group is deliverable, and none while
    one of its group is leased or delayed. A ready message past its expiry is dropped
    (no dead-letter queue here) and counted."""

    pure = False
    levels = LEVELS
    queue_ttl = None

    def __init__(self):
        super().__init__()
        cpaths.set_enabled(not self.pure)
        self.now = time.monotonic_ns()
        self.wall = time.time_ns()
        self._restore = [set_clock(lambda: self.now), set_wall_clock(lambda: self.wall)]
        self.ns = "hopt%d" % id(self)
        self.broker = shmq.connect(namespace=self.ns)
        self.q = self.broker.create_queue("m", max_bytes=1 << 16, visibility_timeout=VIS, priorities=self.levels,
                                          priority_aging=None, dedup_window=WINDOW, message_ttl=self.queue_ttl)
        self.msgs = {}
        self.dedup = {}  # id -> (message id, remembered until)
        self.held = []
        self.expired = 0

    def teardown(self):
        for r in self._restore:
            r()
        cpaths.set_enabled(True)
        self.broker.delete_queue("m")
        self.broker.close()
        destroy_namespace(self.ns)
        assert namespace_entries(self.ns) == []

    # -- the model ------------------------------------------------------------------
    def _lapse(self):
        for m in self.msgs.values():
            if m.state in ("leased", "delayed") and m.deadline <= self.now:
                m.state = "ready"
        for m in self.msgs.values():
            if m.state == "ready" and m.expires and m.expires <= self.wall:
                m.state = "gone"
                self.expired += 1

    def _busy(self):
        """Groups whose next message must wait: one of them is leased, or their oldest
        unsettled one is delayed."""
        busy, seen = set(), set()
        for m in sorted(self.msgs.values(), key=lambda m: m.id):
            if m.group and m.state != "gone":
                if m.state == "leased" or (m.state == "delayed" and m.group not in seen):
                    busy.add(m.group)
                seen.add(m.group)
        return busy

    def _deliverable(self):
        busy = self._busy()
        firsts, seen = [], set()
        for m in sorted(self.msgs.values(), key=lambda m: m.id):
            if m.state != "ready":
                continue
            if m.group:
                if m.group in busy or m.group in seen:
                    continue
                seen.add(m.group)
            firsts.append(m)
        return sorted(firsts, key=lambda m: (-m.priority, m.ready_at, m.id))

    def _count(self, state):
        return sum(1 for m in self.msgs.values() if m.state == state)

    # -- rules ----------------------------------------------------------------------
    @rule(priority=st.integers(0, LEVELS - 1), delay=st.sampled_from([0, 0, 0, 1, 5]),
          ttl=st.sampled_from([None, None, 2, 20]), group=st.sampled_from([None, None, "a", "b"]),
          dedup_id=st.sampled_from([None, None, None, "d1", "d2"]))
    def put(self, priority, delay, ttl, group, dedup_id):
        priority %= self.levels
        body = b"m%d" % len(self.msgs)
        msg_id = self.q.put(body, priority=priority, delay=delay, ttl=ttl, group=group, dedup_id=dedup_id,
                            timeout=0)
        known = self.dedup.get(dedup_id)
        if dedup_id and known and known[1] > self.wall:
            assert msg_id == known[0], "a dedup id seen within the window enqueued again"
            return
        assert msg_id == len(self.msgs) + 1
        due = self.now + int(delay * 1e9) if delay else 0
        expires = [self.wall + int(t * 1e9) for t in (ttl, self.queue_ttl) if t]
        m = Msg(msg_id, body, priority, self.wall + int(delay * 1e9) if delay else 0,
                min(expires) if expires else 0, group, self.wall)
        m.deadline = due
        self.msgs[msg_id] = m
        if dedup_id:
            self.dedup[dedup_id] = (msg_id, self.wall + int(WINDOW * 1e9))

    def _taken(self, d, mode):
        """The model's side of a get in ``mode`` ("lease", "auto": ack=False, "view": copy=False)."""
        m = self.msgs[d.id]
        m.attempt += 1
        if mode == "auto":
            m.state = "gone"  # settled as taken: its group moves on
        else:
            m.state, m.deadline = "leased", self.now + int(VIS * 1e9)
        assert (bytes(d.body), d.attempt, d.priority, d.group) == (m.body, m.attempt, m.priority, m.group)
        assert type(d.body) is (memoryview if mode == "view" else bytes)
        self.held.append(d)

    @rule(n=st.integers(1, 4), mode=MODES)
    def get(self, n, mode):
        self._lapse()
        expect = self._deliverable()
        try:
            got = self.q.get_many(n, timeout=0, ack=mode != "auto", copy=mode != "view")
        except shmq.QueueEmpty:
            got = []
        # one message per group per take: the model's first n, the same
        assert [d.id for d in got] == [m.id for m in expect[:n]]
        for d in got:
            assert d.enqueued_at == self.msgs[d.id].enq / 1e9
            self._taken(d, mode)

    @rule(mode=MODES)
    def get_one(self, mode):
        self._lapse()
        expect = self._deliverable()
        try:
            d = self.q.get_nowait(ack=mode != "auto", copy=mode != "view")
        except shmq.QueueEmpty:
            assert not expect, "get found nothing with messages deliverable"
            return
        assert expect and d.id == expect[0].id
        self._taken(d, mode)

    @rule(n=st.integers(1, 6))
    def peek(self, n):
        self._lapse()
        expect = self._deliverable()
        got = self.q.peek(n)
        # what a get would take next comes first (then the ready messages that wait behind
        # their group); nothing is leased
        ready = [m for m in self.msgs.values() if m.state == "ready"]
        if expect:
            assert got[0].id == expect[0].id
        assert len(got) == min(n, len(ready)) and {m.id for m in got} <= {m.id for m in ready}
        for m in got:
            assert m.attempt == self.msgs[m.id].attempt

    def _settle(self, i, action):
        d = self.held[i % len(self.held)]
        self._lapse()
        m = self.msgs[d.id]
        live = m.state == "leased" and m.attempt == d.attempt
        try:
            action(d)
        except shmq.DeliveryExpired:
            assert not live, f"a live lease of #{d.id} was refused"
            return None
        assert live, f"a dead lease of #{d.id} was accepted"
        return m

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000))
    def ack(self, i):
        m = self._settle(i, lambda d: d.ack())
        if m:
            m.state = "gone"

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000), delay=st.sampled_from([0.0, 0.0, 3.0]))
    def nack(self, i, delay):
        m = self._settle(i, lambda d: d.nack(delay=delay))
        if m:
            if delay:
                m.state, m.deadline = "delayed", self.now + int(delay * 1e9)
            else:
                m.state = "ready"

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000))
    def reject(self, i):
        m = self._settle(i, lambda d: d.reject())
        if m:
            m.state = "gone"

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 5.0, 11.0, 30.0]))
    def advance_clock(self, seconds):
        self.now += int(seconds * 1e9)
        self.wall += int(seconds * 1e9)

    @rule()
    def counts_match(self):
        self._lapse()
        self.q._housekeep()
        s = self.q.stats()
        assert (s.ready, s.in_flight, s.delayed) == (self._count("ready"), self._count("leased"),
                                                     self._count("delayed"))
        assert s.expired_total == self.expired
        levels = [0] * self.levels
        for m in self.msgs.values():
            if m.state == "ready":
                levels[m.priority] += 1
        assert s.ready_by_priority == tuple(levels)
        assert s.groups_in_flight == len(self._busy())


TestOptionsModel = OptionsModel.TestCase
TestOptionsModel.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)


class PurePythonOptionsModel(OptionsModel):
    pure = True


TestPurePythonOptionsModel = PurePythonOptionsModel.TestCase
TestPurePythonOptionsModel.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


class OneLevelOptionsModel(OptionsModel):
    """No levels: the plain FIFO path (with its TTL check) and the walk that stops early."""

    levels = 1


TestOneLevelOptionsModel = OneLevelOptionsModel.TestCase
TestOneLevelOptionsModel.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)


class QueueTtlOptionsModel(OptionsModel):
    """A queue TTL on top: every message expires, the sooner of its own and the queue's."""

    levels = 1
    queue_ttl = 15


TestQueueTtlOptionsModel = QueueTtlOptionsModel.TestCase
TestQueueTtlOptionsModel.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)


class PurePythonOneLevelOptionsModel(OneLevelOptionsModel):
    pure = True


TestPurePythonOneLevelOptionsModel = PurePythonOneLevelOptionsModel.TestCase
TestPurePythonOneLevelOptionsModel.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)


@pytest.mark.parametrize("mode", [{}, {"ack": False}, {"copy": False}], ids=["lease", "auto", "view"])
@pytest.mark.parametrize("extension", [{"ttl": 2}, {"dedup_id": "d"}], ids=["ttl", "dedup"])
def test_get_many_on_the_c_path_goes_past_a_ttl_or_dedup_record(namespace, extension, mode):
    """Found by the model in CI: the C take stops at a record with an extension block and
    hands back what it took before it; get_many goes on past it, and after it in C."""
    broker = shmq.connect(namespace=namespace)
    try:
        q = broker.create_queue("m", priorities=1)
        with pytest.raises(shmq.QueueEmpty):
            q.get(timeout=0)  # (a consumer slot: the C paths from here)
        q.put(b"a")
        q.put(b"b", **extension)
        q.put(b"c")
        assert [bytes(d.body) for d in q.get_many(2, timeout=0, **mode)] == [b"a", b"b"]
        q.put(b"d", **{k: v + "2" if k == "dedup_id" else v for k, v in extension.items()})
        q.put(b"e")
        assert [bytes(d.body) for d in q.get_many(8, timeout=0, **mode)] == [b"c", b"d", b"e"]
        assert q.stats().ready == 0
    finally:
        broker.delete_queue("m")
        broker.close()


def test_a_delayed_put_waking_past_the_frontier_hides_no_older_ready_message():
    """A found example, kept: a message expired by the queue's TTL while a delayed put
    behind it woke up; the wake must not move the first-ready cursor past the older one."""
    m = QueueTtlOptionsModel()
    try:
        m.put(dedup_id=None, delay=0, group=None, priority=0, ttl=None)
        m.advance_clock(seconds=30.0)
        m.put(dedup_id=None, delay=1, group=None, priority=0, ttl=None)
        m.advance_clock(seconds=1.0)
        m.counts_match()
    finally:
        m.teardown()
