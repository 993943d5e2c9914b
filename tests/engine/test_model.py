"""A Hypothesis state machine: random put/get/ack/nack/reject/extend/expire/purge
sequences against a simple model of what the queue must do. Puts copy or fill in place
(``reserve``); gets lease, auto-ack (``ack=False``: settled as taken) or hand out views
(``copy=False``)."""

import time

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from tests.engine._clock import set_clock

VIS = 10.0
CAPACITY = 4096
MODES = st.sampled_from(["lease", "lease", "auto", "view"])


class Msg:
    def __init__(self, body, headers=None):
        self.body = body
        self.headers = headers or {}
        self.state = "ready"
        self.attempt = 0
        self.deadline = None


class QueueModel(RuleBasedStateMachine):
    LANES = 1  # (tests/engine/test_lanes.py runs this machine on a laned queue)
    CAPACITY, MAX_MESSAGE = CAPACITY, 1500  # (tests/engine/test_memory.py: a ring of several chunks)
    shm_full = False  # (and there, a /dev/shm that refuses to grow: a put may get StorageError then)

    def __init__(self):
        super().__init__()
        self.now = time.monotonic_ns()
        self._restore_clock = set_clock(lambda: self.now)
        self.ns = "hyp%d" % id(self)
        self.broker = shmq.connect(namespace=self.ns)
        self.q = self.broker.create_queue("m", max_bytes=self.CAPACITY * self.LANES,
                                          max_message_bytes=self.MAX_MESSAGE, visibility_timeout=VIS, lanes=self.LANES)
        self.msgs = {}
        self.held = []  # deliveries handed out, live or stale
        self.acked = 0

    def teardown(self):
        self._restore_clock()
        self.broker.delete_queue("m")
        self.broker.close()
        destroy_namespace(self.ns)
        assert namespace_entries(self.ns) == []

    # -- the model ------------------------------------------------------------------
    def _lapse(self):
        for m in self.msgs.values():
            if m.state in ("leased", "delayed") and m.deadline <= self.now:
                m.state = "ready"

    def _live(self):
        return [m for m in self.msgs.values() if m.state != "gone"]

    def _count(self, state):
        return sum(1 for m in self.msgs.values() if m.state == state)

    # the hooks a laned queue's model changes (test_lanes.py): which ids puts give, which order gets take
    def _new_id(self, msg_id):
        assert msg_id not in self.msgs and msg_id == len(self.msgs) + 1

    def _new_ids(self, ids):
        assert ids == list(range(len(self.msgs) + 1, len(self.msgs) + 1 + len(ids)))

    def _ready_in_order(self):
        return sorted(i for i, m in self.msgs.items() if m.state == "ready")

    def _made(self, body, headers=None):
        """The model's message of a put (tests/engine/test_window.py: one put past an open
        reservation is not seen until it ends)."""
        return Msg(body, headers)

    # -- rules ----------------------------------------------------------------------
    @rule(size=st.sampled_from([0, 1, 7, 64, 300, 700, 1500]))
    def put(self, size):
        body = bytes([len(self.msgs) % 256]) * size
        try:
            msg_id = self.q.put_nowait(body)
        except shmq.StorageError:  # (first: /dev/shm full, ShmFull, is a QueueFull too)
            assert self.shm_full
            return
        except shmq.QueueFull:
            assert self._live(), "an empty queue refused a message that fits"
            return
        self._new_id(msg_id)
        self.msgs[msg_id] = self._made(body)

    @rule(size=st.sampled_from([0, 1, 64, 700, 1500]), abort=st.booleans())
    def reserve(self, size, abort):
        """A message filled in place: published as the block ends, nothing when it raises."""
        body = bytes([len(self.msgs) % 256]) * size
        r = self.q.reserve(size, timeout=0)
        try:
            with r as buf:
                buf[:] = body
                if abort:
                    raise ValueError("abandoned")
        except shmq.StorageError:  # (first: /dev/shm full, ShmFull, is a QueueFull too)
            assert self.shm_full and r.id is None
            return
        except shmq.QueueFull:
            assert self._live(), "an empty queue refused a message that fits"
            return
        except ValueError:
            assert abort and r.id is None
            return
        self._new_id(r.id)
        self.msgs[r.id] = self._made(body)

    @rule(n=st.integers(1, 4), size=st.sampled_from([0, 10, 200, 900]),
          headers=st.sampled_from([None, "one", "each"]))
    def put_many(self, n, size, headers):
        bodies = [b"b" * size] * n
        hs = {"one": [{"h": "all"}] * n, "each": [{"i": i} if i % 2 else None for i in range(n)]}.get(headers)
        try:
            ids = self.q.put_many(bodies, timeout=0, headers=hs[0] if headers == "one" else hs)
        except shmq.StorageError:  # (first: /dev/shm full, ShmFull, is a QueueFull too)
            assert self.shm_full
            return
        except shmq.QueueFull:
            assert self._live()
            return
        assert len(ids) == n
        self._new_ids(ids)
        for k, i in enumerate(ids):
            self.msgs[i] = self._made(b"b" * size, hs[k] if hs else None)

    def _taken(self, d, mode):
        """The model's side of a get in ``mode`` ("lease", "auto": ack=False, "view": copy=False)."""
        m = self.msgs[d.id]
        m.attempt += 1
        if mode == "auto":
            m.state = "gone"
            self.acked += 1
        else:
            m.state, m.deadline = "leased", self.now + int(VIS * 1e9)
        if mode == "view":
            assert type(d.body) is memoryview and d.body.readonly and d.view is d.body
        assert (bytes(d.body), d.attempt, d.headers) == (m.body, m.attempt, m.headers)
        self.held.append(d)  # (an auto-acked one too: settling it must fail)

    @rule(n=st.integers(1, 5), mode=MODES)
    def get(self, n, mode):
        self._lapse()
        ready = self._ready_in_order()
        try:
            got = self.q.get_many(n, timeout=0, ack=mode != "auto", copy=mode != "view")
        except shmq.QueueEmpty:
            got = []
        assert [d.id for d in got] == ready[:n]
        for d in got:
            self._taken(d, mode)
        self._reclaimed()

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

    @rule(mode=MODES)
    def get_one(self, mode):
        """``get`` alone: the hot path (C when built) while nothing is requeued or due."""
        self._lapse()
        ready = self._ready_in_order()
        try:
            d = self.q.get_nowait(ack=mode != "auto", copy=mode != "view")
        except shmq.QueueEmpty:
            assert not ready, "get found nothing with messages ready"
            return
        assert ready and d.id == ready[0]
        self._taken(d, mode)
        self._reclaimed()

    def _reclaimed(self):
        """Nothing live: every byte is free again, at once (an auto-ack frees its space too)."""
        if not self._live():
            assert self.q.stats().bytes_used == 0

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000))
    def ack(self, i):
        m = self._settle(i, lambda d: d.ack())
        if m:
            m.state = "gone"
            self.acked += 1

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000))
    def ack_many_one(self, i):
        m = self._settle(i, lambda d: d._q.ack_many([d]))
        if m:
            m.state = "gone"
            self.acked += 1

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000), delay=st.sampled_from([0.0, 0.0, 1.0, 30.0]))
    def nack(self, i, delay):
        m = self._settle(i, lambda d: d.nack(delay=delay))
        if m:
            if delay:
                m.state, m.deadline = "delayed", self.now + int(delay * 1e9)
            else:
                m.state = "ready"

    @precondition(lambda self: self.held)
    @rule(picks=st.lists(st.integers(0, 1000), min_size=1, max_size=4), delay=st.sampled_from([None, 0.0]))
    def nack_batch(self, picks, delay):
        """``nack_many`` of a few deliveries at once (some stale, some named twice): the
        live ones ready again at once, DeliveryExpired for the rest."""
        self._lapse()
        ds = [self.held[i % len(self.held)] for i in picks]
        live = {}
        for d in ds:
            m = self.msgs[d.id]
            if m.state == "leased" and m.attempt == d.attempt:
                live.setdefault(d.id, m)
        try:
            assert self.q.nack_many(ds, delay) == len(live) == len(ds)
        except shmq.DeliveryExpired:
            assert len(live) < len(ds), "a live lease was refused"
        for m in live.values():
            m.state = "ready"

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000))
    def reject(self, i):
        m = self._settle(i, lambda d: d.reject())
        if m:
            m.state = "gone"

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 1000), seconds=st.sampled_from([0.5, 5.0, 50.0]))
    def extend(self, i, seconds):
        m = self._settle(i, lambda d: d.extend(seconds))
        if m:
            m.deadline = self.now + int(seconds * 1e9)

    @rule(seconds=st.sampled_from([0.1, 1.0, 5.0, 9.99, 10.0, 25.0]))
    def advance_clock(self, seconds):
        self.now += int(seconds * 1e9)

    @rule()
    def purge(self):
        self._lapse()
        self.q._housekeep()
        expected = self._count("ready")
        assert self.q.purge() == expected
        for m in self.msgs.values():
            if m.state == "ready":
                m.state = "gone"

    @rule()  # a rule, not an invariant: housekeeping after every step would hide lapsed leases
    def counts_match(self):
        self._lapse()
        self.q._housekeep()
        s = self.q.stats()
        assert (s.ready, s.in_flight, s.delayed) == (self._count("ready"), self._count("leased"), self._count("delayed"))
        assert s.enqueued_total == len(self.msgs)
        assert s.acked_total == self.acked
        assert (s.consumers_waiting, s.producers_waiting) == (0, 0)  # nobody sleeps between steps
        if not self._live():
            assert s.bytes_used == 0


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)

class PurePython:
    """A machine with the C hot paths switched off (when they are built, the machine itself
    runs them: the two implementations must both match the model)."""

    def __init__(self):
        cpaths.set_enabled(False)
        super().__init__()

    def teardown(self):
        try:
            super().teardown()
        finally:
            cpaths.set_enabled(True)


class PurePythonQueueModel(PurePython, QueueModel):
    """The queue model on the pure-Python paths."""


TestPurePythonQueueModel = PurePythonQueueModel.TestCase
TestPurePythonQueueModel.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)
