"""The work-queue options on a local queue: priority (and aging), delayed puts, TTL,
FIFO groups across processes, dedup across a SIGKILL, redrive across a SIGKILL, retry
backoff, peek, prefetch, and the way back to the C hot paths. The conformance suite
(tests/test_conformance.py) runs the same semantics on both transports; the Hypothesis
model (tests/engine/test_options_model.py) checks the order and the accounting."""

import time

import pytest

import shmq
from shmq.engine.shm import cpaths
from shmq.engine.shm import layout as L
from tests import _option_workers as W
from tests._processes import WORKERS
from tests.engine._clock import set_clock, set_wall_clock


@pytest.fixture
def clocks():
    """The engine's monotonic and wall clocks, moved by hand: ``clocks(seconds)``."""
    now = [time.monotonic_ns(), time.time_ns()]
    restore = [set_clock(lambda: now[0]), set_wall_clock(lambda: now[1])]

    def advance(seconds):
        now[0] += int(seconds * 1e9)
        now[1] += int(seconds * 1e9)

    yield advance
    for r in restore:
        r()


def _run(target, *args, timeout=60):
    p = WORKERS.Process(target=target, args=args)
    p.start()
    p.join(timeout)
    assert p.exitcode is not None, f"{target.__name__} did not finish"
    return p.exitcode


# ------------------------------------------------------------------ priority
def test_priority_levels_higher_first_fifo_within_a_level(broker):
    q = broker.create_queue("q", priorities=3, priority_aging=None)
    for body, p in ((b"a0", 0), (b"b2", 2), (b"c1", 1), (b"d2", 2), (b"e0", 0)):
        q.put(body, priority=p)
    assert q.stats().ready_by_priority == (2, 1, 2)
    got = [q.get(timeout=1) for _ in range(5)]
    assert [(d.body, d.priority) for d in got] == [(b"b2", 2), (b"d2", 2), (b"c1", 1), (b"a0", 0), (b"e0", 0)]


def test_priority_out_of_range_is_a_value_error_naming_the_range(broker):
    q = broker.create_queue("q", priorities=4)
    with pytest.raises(ValueError, match=r"priority must be in 0\.\.3"):
        q.put(b"x", priority=4)
    with pytest.raises(ValueError, match=r"0\.\.3"):
        q.put_many([b"x"], priority=-1)
    plain = broker.create_queue("plain")
    with pytest.raises(ValueError, match="no priority levels"):
        plain.put(b"x", priority=1)
    with pytest.raises(ValueError, match="priorities must be an int in 1..16"):
        broker.create_queue("bad", priorities=0)
    assert q.stats().ready == plain.stats().ready == 0  # nothing was enqueued


def test_a_low_level_is_not_starved_it_ages_into_the_higher_ones(broker, clocks):
    q = broker.create_queue("q", priorities=3, priority_aging=10.0)
    q.put(b"old-low", priority=0)
    clocks(15)  # one aging step: served as level 1
    q.put(b"new-mid", priority=1)
    q.put(b"new-high", priority=2)
    assert [q.get(timeout=0).body for _ in range(3)] == [b"new-high", b"old-low", b"new-mid"]
    q.put(b"old-low-2", priority=0)
    clocks(25)  # two steps: level 2, and older than any new high message
    q.put(b"new-high-2", priority=2)
    assert [q.get(timeout=0).body for _ in range(2)] == [b"old-low-2", b"new-high-2"]


# ------------------------------------------------------------------ delay
def test_a_delayed_put_returns_at_once_and_is_delivered_when_due_in_due_order(broker, clocks):
    q = broker.create_queue("q")
    q.put(b"late", delay=20)
    q.put(b"soon", delay=10)
    q.put(b"now")
    s = q.stats()
    assert (s.ready, s.delayed) == (1, 2)
    d = q.get(timeout=0)
    assert d.body == b"now"
    d.ack()
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    clocks(30)  # both due: the one due first comes first
    assert [q.get(timeout=0).body for _ in range(2)] == [b"soon", b"late"]


def test_a_waiting_get_takes_a_delayed_message_when_it_comes_due(broker):
    q = broker.create_queue("q")
    t = time.monotonic()
    q.put(b"x", delay=0.3)
    d = q.get(timeout=10)  # woken by the due time, not by a post
    assert d.body == b"x" and time.monotonic() - t >= 0.3
    assert time.monotonic() - t < 5  # not a housekeeping tick away


# ------------------------------------------------------------------ TTL
def test_ttl_expired_messages_are_dropped_and_counted(broker, clocks):
    q = broker.create_queue("q")
    q.put(b"short", ttl=5)
    q.put(b"long", ttl=50)
    q.put(b"forever")
    clocks(10)
    q._housekeep()
    s = q.stats()
    assert (s.ready, s.expired_total) == (2, 1)
    assert [q.get(timeout=0).body for _ in range(2)] == [b"long", b"forever"]


def test_ttl_dead_letters_with_reason_expired_when_there_is_a_dlq(broker, clocks):
    broker.create_queue("dlq")
    q = broker.create_queue("q", dead_letter_queue="dlq", message_ttl=5)
    q.put(b"a", headers={"k": "v"})
    clocks(6)
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    d = broker.queue("dlq").get(timeout=0)
    assert d.body == b"a" and d.headers["x-death-reason"] == "expired" and d.headers["k"] == "v"
    s = q.stats()
    assert (s.ready, s.in_flight, s.expired_total, s.dead_lettered_total) == (0, 0, 1, 1)


def test_a_leased_message_does_not_expire_under_its_consumer(broker, clocks):
    q = broker.create_queue("q", visibility_timeout=100)
    q.put(b"a", ttl=5)
    d = q.get(timeout=0)
    clocks(10)
    q._housekeep()
    d.ack()  # still its lease
    assert q.stats().expired_total == 0


def test_the_lower_of_the_queue_ttl_and_the_message_ttl_wins(broker, clocks):
    q = broker.create_queue("q", message_ttl=10)
    q.put(b"queue-ttl")
    q.put(b"own-ttl", ttl=3)
    q.put(b"longer-ttl-asked", ttl=60)
    clocks(5)
    q._housekeep()
    assert q.stats().expired_total == 1
    clocks(6)
    q._housekeep()
    s = q.stats()
    assert (s.ready, s.expired_total) == (0, 3)


# ------------------------------------------------------------------ groups
def test_a_group_moves_one_message_at_a_time_in_put_order(broker):
    q = broker.create_queue("q")
    for body, g in ((b"a1", "a"), (b"a2", "a"), (b"b1", "b"), (b"plain", None)):
        q.put(body, group=g)
    got = q.get_many(10, timeout=0)
    assert [d.body for d in got] == [b"a1", b"b1", b"plain"]  # one per group
    assert q.stats().groups_in_flight == 2
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    got[0].ack()
    assert q.get(timeout=0).body == b"a2"


def test_groups_across_four_consumer_processes_keep_order_and_exclusivity(broker, tmp_path):
    groups, per_group = [f"g{i}" for i in range(6)], 40
    broker.create_queue("q", visibility_timeout=60)
    done = WORKERS.Event()
    outs = [tmp_path / f"c{i}.log" for i in range(4)]
    consumers = [WORKERS.Process(target=W.group_consumer, args=(broker.namespace, "q", str(o), done)) for o in outs]
    for p in consumers:
        p.start()
    try:
        assert _run(W.group_producer, broker.namespace, "q", groups, per_group) == 0
        done.set()
        for p in consumers:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in consumers:
            if p.is_alive():
                p.kill()
                p.join()
    records = [line.split() for o in outs for line in o.read_text().splitlines()]
    assert len(records) == len(groups) * per_group  # each exactly once
    by_group = {}
    for g, seq, took, about_to_ack in records:
        by_group.setdefault(g, []).append((int(took), int(about_to_ack), int(seq)))
    for g, recs in by_group.items():
        recs.sort()
        assert [r[2] for r in recs] == list(range(per_group)), f"group {g} out of order"
        for prev, nxt in zip(recs, recs[1:]):
            assert prev[1] < nxt[0], f"two messages of group {g} were in flight at once"


# ------------------------------------------------------------------ dedup
def test_a_dedup_id_seen_within_the_window_returns_the_first_id(broker, clocks):
    q = broker.create_queue("q", dedup_window=60)
    first = q.put(b"a", dedup_id="order-1")
    assert q.put(b"a again", dedup_id="order-1") == first
    assert q.put(b"b", dedup_id=b"order-2") != first
    assert q.stats().ready == 2
    clocks(61)
    assert q.put(b"a later", dedup_id="order-1") not in (first,)
    assert q.stats().ready == 3
    with pytest.raises(ValueError, match="dedup_id must not be empty"):
        q.put(b"x", dedup_id="")


def test_dedup_holds_when_the_putter_is_killed_between_the_check_and_the_commit(broker):
    q = broker.create_queue("q")
    assert _run(W.die_inside_dedup_put, broker.namespace, "q", "k1") == -9
    # the dead putter held the lock: the next caller repairs, which forgets the id it
    # remembered for a message it never committed; the retry enqueues it, once
    assert q.put(b"x", dedup_id="k1", timeout=5) == 1
    assert q.put(b"x", dedup_id="k1", timeout=5) == 1
    s = q.stats()
    assert (s.ready, s.enqueued_total) == (1, 1)


def test_dedup_across_sigkill_rounds_each_id_enqueued_exactly_once(broker, tmp_path):
    q = broker.create_queue("q", max_bytes=1 << 20)
    ids = [f"id{i}" for i in range(400)]
    log = tmp_path / "put.log"
    for round_ in range(4):
        p = WORKERS.Process(target=W.dedup_putter, args=(broker.namespace, "q", ids, str(log)))
        p.start()
        deadline = time.monotonic() + 30
        while p.is_alive() and time.monotonic() < deadline and _lines(log) < 50 * (round_ + 1):
            time.sleep(0.001)  # polling the log: kill it somewhere in the middle of its puts
        p.kill()
        p.join()
    # the publisher's retry: every id again, to completion
    assert _run(W.dedup_putter, broker.namespace, "q", ids, str(log)) == 0
    bodies = []
    while True:
        try:
            d = q.get(timeout=0)
        except shmq.QueueEmpty:
            break
        bodies.append(d.body.decode())
        d.ack()
    assert sorted(bodies) == sorted(ids)  # none lost, none twice


def _lines(path):
    return len(path.read_text().split()) if path.exists() else 0


# ------------------------------------------------------------------ redrive
def _dead_letters(broker, n):
    broker.create_queue("dlq")
    q = broker.create_queue("q", dead_letter_queue="dlq", priorities=2)
    ids = [q.put(b"m%d" % i, headers={"i": i}, priority=i % 2) for i in range(n)]
    for _ in range(n):
        q.get(timeout=0).reject()
    return q, ids


def test_redrive_moves_dead_letters_back_keeping_ids_and_headers_resetting_attempts(broker):
    q, ids = _dead_letters(broker, 5)
    assert broker.redrive("dlq", max_messages=2) == 2
    assert broker.redrive("dlq") == 3
    got = q.get_many(10, timeout=0)
    assert sorted(d.id for d in got) == ids
    for d in got:
        assert d.attempt == 1 and d.body == b"m%d" % d.headers["i"] and d.priority == d.headers["i"] % 2
        assert not any(k.startswith("x-death") for k in d.headers)
    assert broker.queue("dlq").stats().ready == 0
    broker.create_queue("other")
    for d in got:
        d.reject()
    assert broker.redrive("dlq", to="other") == 5
    assert broker.queue("other").stats().ready == 5
    with pytest.raises(shmq.QueueNotFound):
        broker.redrive("dlq", to="nope")


def test_redrive_killed_midway_loses_nothing_and_a_rerun_adds_no_copy(broker):
    q, ids = _dead_letters(broker, 6)
    assert _run(W.redrive_and_die, broker.namespace, "dlq", 3) == -9
    dlq = broker.queue("dlq")
    dlq._housekeep()  # the dead redriver's lease on the 4th dead letter comes back
    assert broker.redrive("dlq") >= 2
    got = q.get_many(20, timeout=0)
    assert sorted(d.id for d in got) == ids  # each once: the 4th was put back, then not again
    assert dlq.stats().ready == dlq.stats().in_flight == 0


# ------------------------------------------------------------------ retry backoff
def test_retry_backoff_delays_a_nack_and_a_lapsed_lease(broker, clocks):
    q = broker.create_queue("q", visibility_timeout=5, retry_delay=1, retry_backoff=2, retry_delay_max=3)
    q.put(b"x")
    q.get(timeout=0).nack()  # attempt 1: 1 s
    assert q.stats().delayed == 1
    clocks(0.9)
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    clocks(0.2)
    d = q.get(timeout=0)
    assert d.attempt == 2
    d.nack()  # attempt 2: 2 s
    clocks(1.9)
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    clocks(0.2)
    d = q.get(timeout=0)
    clocks(5.1)  # the lease lapses (attempt 3): 4 s, capped at 3
    q._housekeep()
    assert q.stats().delayed == 1
    clocks(2.9)
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0)
    clocks(0.2)
    assert q.get(timeout=0).attempt == 4
    q.put(b"y")
    q.get(timeout=0).nack(delay=0)  # an explicit delay wins over the policy
    assert q.get(timeout=0).body == b"y"


def test_the_default_retry_policy_requeues_at_once(broker):
    q = broker.create_queue("q")
    q.put(b"x")
    q.get(timeout=0).nack()
    assert q.get(timeout=0).attempt == 2


# ------------------------------------------------------------------ peek
def test_peek_leases_nothing_and_counts_no_attempt(broker):
    q = broker.create_queue("q", priorities=2)
    q.put(b"a", headers={"h": 1})
    q.put(b"b", priority=1, group="g")
    msgs = q.peek(5)
    assert [(m.body, m.priority, m.group, m.attempt, m.headers) for m in msgs] == [
        (b"b", 1, "g", 0, {}), (b"a", 0, None, 0, {"h": 1})]
    assert isinstance(msgs[0], shmq.Message) and msgs[0].queue == "q"
    s = q.stats()
    assert (s.ready, s.in_flight) == (2, 0)
    assert q.get(timeout=0).attempt == 1
    with pytest.raises(ValueError, match="max_messages"):
        q.peek(0)


# ------------------------------------------------------------------ prefetch
def test_prefetch_caps_the_unsettled_deliveries_of_a_handle(broker, clocks):
    broker.create_queue("q", visibility_timeout=5)
    q = broker.queue("q", prefetch=2)
    q.put_many([b"%d" % i for i in range(5)])
    a, b = q.get(timeout=0), q.get(timeout=0)
    with pytest.raises(shmq.QueueEmpty, match="prefetch of 2"):
        q.get(timeout=0)
    a.ack()
    assert len(q.get_many(5, timeout=0)) == 1  # room for one
    clocks(6)  # every lease lapses: the handle holds nothing any more
    assert len(q.get_many(5, timeout=0)) == 2
    other = broker.queue("q")  # the cap is the handle's
    assert len(other.get_many(5, timeout=0)) >= 1
    with pytest.raises(ValueError, match="prefetch"):
        broker.queue("q", prefetch=0)


def test_local_consume_iterates_under_its_prefetch(broker):
    q = broker.create_queue("q")
    q.put_many([b"%d" % i for i in range(6)])
    with q.consume(prefetch=3) as it:
        held = [next(it) for _ in range(3)]
        assert q.stats().in_flight == 3
        for d in held:
            d.ack(wait=False)
        assert [next(it).body for _ in range(3)] == [b"3", b"4", b"5"]


# ------------------------------------------------------------------ the plain paths stay plain
@pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are not built")
def test_a_queue_goes_back_to_the_c_paths_once_no_record_needs_the_general_take(broker):
    q = broker.create_queue("q")
    special = lambda: q._mq[L.I_SPECIAL]  # noqa: E731
    assert special() == 0
    q.put(b"g", group="g")
    assert special() == 1
    q.get(timeout=0).ack()
    q.put(b"plain")
    q.get(timeout=0).ack()  # the general take's walk finds nothing special: cleared
    assert special() == 0
    q.put(b"plain again")
    d = q.get(timeout=0)  # the C take (a record with flags would have been left to Python)
    assert d.body == b"plain again" and d.priority == 0 and d.group is None and d.enqueued_at > 0
