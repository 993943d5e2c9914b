"""One suite of queue behaviour, run against both transports (local attach and TCP)."""

import queue as stdlib_queue
import time

import pytest

import shmq
from tests._wait import in_thread, wait_for


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


def test_the_nack_of_the_last_delivery_dead_letters_it_at_once(any_broker):
    """Issue 27: after the nack of its ``max_deliveries``-th delivery the message is in the
    dead-letter queue and counted, with no get after it (over TCP too: the server's NACK
    ends in the engine's nack_many); x-death-attempts is how many deliveries it had."""
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("q", dead_letter_queue="dlq", max_deliveries=3)
    q.put(b"poison")
    for attempt in (1, 2, 3):
        d = q.get(timeout=5)
        assert (d.body, d.attempt) == (b"poison", attempt)
        d.nack()
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total, s.dead_letter_depth) == (0, 0, 1, 1)
    dead = any_broker.queue("dlq").get_nowait()
    assert (dead.body, dead.headers["x-death-reason"], dead.headers["x-death-attempts"]) == (
        b"poison", "max-deliveries", 3)
    dead.ack()


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
    ids = q.put_many([b"a", b"b", b"c"], headers=[None, {"k": "v"}, None])
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


@pytest.mark.parametrize("lanes", [1, 2])
def test_purge_with_delayed_drops_the_delayed_messages_too(any_broker, lanes):
    """purge() keeps the delayed messages; purge(delayed=True) drops them as well (put with a
    delay, or nacked with one), never the leased ones."""
    q = any_broker.create_queue("q", lanes=lanes)
    q.put_many([b"a", b"b"])
    q.put_many([b"later1", b"later2"], delay=3600)
    d, back = q.get_nowait(), q.get_nowait()
    back.nack(delay=3600)  # waiting out a retry delay: delayed too
    q.put(b"c")
    assert q.purge() == 1
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight) == (0, 3, 1)
    assert q.purge(delayed=True) == 3
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.purged_total) == (0, 0, 1, 4)
    d.ack()
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight, s.bytes_used) == (0, 0, 0, 0)
    q.put(b"after")
    assert q.get_nowait().body == b"after"


# ---------------------------------------------------------------- work-queue options (issue 13)
def test_priorities_are_served_highest_first(any_broker):
    q = any_broker.create_queue("q", priorities=3, priority_aging=None)
    for body, priority in ((b"low", 0), (b"high", 2), (b"mid", 1), (b"high2", 2)):
        q.put(body, priority=priority)
    q.put_many([b"mid2", b"mid3"], priority=1)
    s = q.stats()
    assert (s.ready, s.ready_by_priority) == (6, (1, 3, 2))
    got = [q.get_nowait() for _ in range(6)]
    assert [(d.body, d.priority) for d in got] == [(b"high", 2), (b"high2", 2), (b"mid", 1), (b"mid2", 1),
                                                   (b"mid3", 1), (b"low", 0)]
    assert q.ack_many(got) == 6
    assert q.settings()["priorities"] == 3 and q.settings()["priority_aging"] is None


def test_a_delayed_message_is_ready_only_after_its_delay(any_broker):
    q = any_broker.create_queue("q")
    before = time.time()
    q.put(b"later", delay=0.3)
    q.put_many([b"now"])
    d = q.get_nowait()
    assert d.body == b"now" and before <= d.enqueued_at <= time.time()
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    s = q.stats()
    assert (s.ready, s.delayed, s.in_flight) == (0, 1, 1)
    later = q.get(timeout=10)
    assert (later.body, later.attempt) == (b"later", 1)
    assert time.time() - before >= 0.3  # the delay is what the message waited, not a speed
    q.ack_many([d, later])


def test_an_expired_message_is_never_delivered(any_broker):
    """A message waits behind its group's leased one past its ttl: it expires, into the DLQ."""
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("q", dead_letter_queue="dlq")
    q.put(b"first", group="g")
    first = q.get_nowait()
    q.put(b"short-lived", group="g", ttl=0.05)
    q.put(b"no ttl", group="g")
    with pytest.raises(shmq.QueueEmpty):  # the group is busy: its next message waits
        q.get(timeout=0.2)
    first.ack()
    d = q.get(timeout=5)
    assert d.body == b"no ttl"
    d.ack()
    s = q.stats()
    assert (s.expired_total, s.ready, s.dead_letter_depth) == (1, 0, 1)
    dead = any_broker.queue("dlq").get_nowait()
    assert dead.body == b"short-lived"
    dead.ack()


def test_queue_message_ttl(any_broker):
    q = any_broker.create_queue("q", message_ttl=0.05)
    assert q.settings()["message_ttl"] == 0.05
    q.put(b"held", group="g")
    held = q.get_nowait()
    q.put(b"expires", group="g")
    q.put(b"expires too", group="g", ttl=3600)  # the lower of the two ttls applies, as in RabbitMQ
    with pytest.raises(shmq.QueueEmpty):
        q.get(timeout=0.2)
    held.ack()
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    s = q.stats()
    assert (s.expired_total, s.ready, s.enqueued_total) == (2, 0, 3)


def test_one_message_of_a_group_at_a_time(any_broker):
    q = any_broker.create_queue("q")
    q.put(b"a1", group="a")
    q.put(b"a2", group="a")
    q.put(b"b1", group="b")
    q.put(b"plain")
    a1, b1, plain = q.get_many(10, timeout=5)
    assert [(d.body, d.group) for d in (a1, b1, plain)] == [(b"a1", "a"), (b"b1", "b"), (b"plain", None)]
    assert q.stats().groups_in_flight == 2
    with pytest.raises(shmq.QueueEmpty):  # a2 waits for a1
        q.get_nowait()
    a1.nack()  # back in front of its group, and redelivered first
    again = q.get_nowait()
    assert (again.body, again.attempt) == (b"a1", 2)
    again.ack()
    a2 = q.get_nowait()
    assert (a2.body, a2.group) == (b"a2", "a")
    q.ack_many([a2, b1, plain])
    assert q.stats().groups_in_flight == 0


def test_a_dedup_id_seen_within_the_window_enqueues_nothing(any_broker):
    q = any_broker.create_queue("q", dedup_window=60)
    first = q.put(b"order 42", dedup_id="order-42")
    assert q.put(b"order 42 again", dedup_id="order-42") == first
    other = q.put(b"order 43", dedup_id=b"order-43")  # str or bytes
    assert other == first + 1
    s = q.stats()
    assert (s.ready, s.enqueued_total) == (2, 2)
    assert [d.body for d in q.get_many(10, timeout=5)] == [b"order 42", b"order 43"]
    assert q.settings()["dedup_window"] == 60


def test_peek_leases_nothing_and_counts_no_attempt(any_broker):
    q = any_broker.create_queue("q", priorities=2)
    q.put(b"a", headers={"k": "v"})
    q.put(b"b", priority=1, group="g")
    q.put(b"c")
    before = time.time()
    peeked = q.peek(2)
    assert all(isinstance(m, shmq.Message) for m in peeked)
    assert [(m.id, m.body, m.headers, m.attempt, m.priority, m.group, m.queue) for m in peeked] == [
        (2, b"b", {}, 0, 1, "g", "q"), (1, b"a", {"k": "v"}, 0, 0, None, "q")]
    assert all(m.enqueued_at <= before for m in peeked)
    assert [m.body for m in q.peek()] == [b"b", b"a", b"c"]
    assert q.stats().ready == 3
    d = q.get_nowait()
    assert (d.body, d.attempt) == (b"b", 1)  # peeking counted no attempt
    d.nack(delay=0)
    assert [(m.body, m.attempt) for m in q.peek(1)] == [(b"b", 1)]
    with pytest.raises(ValueError, match="max_messages must be a positive int"):
        q.peek(0)
    gone = any_broker.create_queue("gone")
    any_broker.delete_queue("gone")
    with pytest.raises(shmq.QueueNotFound):
        gone.peek()


def test_redrive_moves_dead_letters_back(any_broker):
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("q", dead_letter_queue="dlq")
    other = any_broker.create_queue("other")
    q.put_many([b"1", b"2", b"3"])
    for d in q.get_many(3, timeout=5):
        d.reject()
    assert q.stats().dead_letter_depth == 3
    assert any_broker.redrive("dlq", max_messages=2) == 2  # each back to where it came from
    assert [d.body for d in q.get_many(10, timeout=5)] == [b"1", b"2"]
    assert any_broker.redrive("dlq", to="other") == 1
    assert other.get_nowait().body == b"3"
    assert any_broker.redrive("dlq") == 0
    assert any_broker.queue("dlq").stats().ready == 0
    with pytest.raises(shmq.QueueNotFound):
        any_broker.redrive("missing")


def test_stats_and_settings_have_the_work_queue_fields(any_broker):
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("q", dead_letter_queue="dlq", priorities=4, message_ttl=30, dedup_window=10,
                                retry_delay=0.5, retry_backoff=2, retry_delay_max=8, priority_aging=5)
    settings = q.settings()
    assert {k: settings[k] for k in ("priorities", "message_ttl", "dedup_window", "retry_delay", "retry_backoff",
                                     "retry_delay_max", "priority_aging")} == {
        "priorities": 4, "message_ttl": 30, "dedup_window": 10, "retry_delay": 0.5, "retry_backoff": 2,
        "retry_delay_max": 8, "priority_aging": 5}
    q.put(b"x", priority=3)
    s = q.stats()
    assert (s.ready_by_priority, s.expired_total, s.groups_in_flight, s.dead_letter_depth) == ((0, 0, 0, 1), 0, 0, 0)
    assert type(s.ready_by_priority) is tuple
    assert any_broker.queue("dlq").stats().dead_letter_depth is None  # it has none
    q.purge()


def test_nack_without_a_delay_follows_the_retry_policy(any_broker):
    q = any_broker.create_queue("q", retry_delay=0.2, retry_backoff=2, retry_delay_max=0.3)
    q.put(b"x")
    q.get_nowait().nack()  # ready again after 0.2 s
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    assert q.stats().delayed == 1
    d = q.get(timeout=10)
    assert d.attempt == 2
    d.nack(delay=0)  # an explicit delay wins over the policy
    d = q.get_nowait()
    assert d.attempt == 3
    d.nack()  # 0.2 * 2 ** 2 = 0.8, capped at 0.3
    with pytest.raises(shmq.QueueEmpty):
        q.get_nowait()
    assert q.get(timeout=10).attempt == 4


@pytest.mark.parametrize("call, error, match", [
    (lambda b: b.create_queue("x", priorities=0), ValueError, "priorities must be an int in 1..16, not 0"),
    (lambda b: b.create_queue("x", priorities=17), ValueError, "priorities must be an int in 1..16"),
    (lambda b: b.create_queue("x", message_ttl=0), ValueError, "message_ttl must be > 0 seconds"),
    (lambda b: b.create_queue("x", message_ttl="1h"), TypeError, "message_ttl must be a number of seconds"),
    (lambda b: b.create_queue("x", dedup_window=-1), ValueError, "dedup_window must be >= 0 seconds"),
    (lambda b: b.create_queue("x", retry_backoff=0.5), ValueError, "retry_backoff must be a number in 1..1000"),
    (lambda b: b.create_queue("x", retry_delay_max=0), ValueError, "retry_delay_max must be > 0 seconds"),
    (lambda b: b.create_queue("x", priority_aging=-1), ValueError, "priority_aging must be > 0 seconds"),
    (lambda b: b.queue("q").put(b"x", priority=1), ValueError, "has no priority levels"),
    (lambda b: b.queue("q").put(b"x", priority=-1), ValueError, "priority must be 0, not -1"),
    (lambda b: b.queue("q").put(b"x", priority="high"), TypeError, "priority must be an int"),
    (lambda b: b.queue("q").put_many([b"x"], priority=2), ValueError, "has no priority levels"),
    (lambda b: b.queue("q").put(b"x", ttl=0), ValueError, "ttl must be > 0 seconds"),
    (lambda b: b.queue("q").put(b"x", delay=-1), ValueError, "delay"),
    (lambda b: b.queue("q").put(b"x", group=""), ValueError, "group must be 1 to 255 bytes"),
    (lambda b: b.queue("q").put(b"x", group=5), TypeError, "group must be a str"),
    (lambda b: b.queue("q").put(b"x", dedup_id=5), TypeError, "dedup_id must be str or bytes"),
    (lambda b: b.queue("q").put(b"x", dedup_id=""), ValueError, "dedup_id must not be empty"),
    (lambda b: b.redrive("q", max_messages=0), ValueError, "max_messages"),
])
def test_bad_work_queue_options(any_broker, call, error, match):
    q = any_broker.create_queue("q")
    with pytest.raises(error, match=match):
        call(any_broker)
    assert "x" not in any_broker.list_queues() and q.stats().enqueued_total == 0


def test_the_remote_classes_take_the_local_work_queue_arguments():
    import inspect

    from shmq.client import aio
    from shmq.client.remote import RemoteBroker, RemoteDelivery, RemoteQueue
    from shmq.engine.queues.delivery import Delivery

    def params(cls, name):
        return [(p.name, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()]

    for local, remotes, names in [(shmq.Queue, (RemoteQueue, aio.AsyncQueue), ["put", "put_many", "peek"]),
                                  (Delivery, (RemoteDelivery, aio.AsyncDelivery), ["nack"]),
                                  (shmq.Broker, (RemoteBroker, aio.AsyncBroker), ["redrive"])]:
        for remote in remotes:
            for name in names:
                assert params(remote, name) == params(local, name), (remote, name)
    options = ["priorities", "message_ttl", "dedup_window", "retry_delay", "retry_backoff", "retry_delay_max",
               "priority_aging"]
    local = dict(params(shmq.Broker, "create_queue"))
    assert {k: v for k, v in params(RemoteBroker, "create_queue") if k in options} == {k: local[k] for k in options}


def test_a_get_waiting_for_a_message_that_is_dead_lettered_meanwhile_times_out_cleanly(any_broker):
    """Issue 20 item 2: the message a sleeping get waits for is nacked for the last time
    (max_deliveries); the get goes on waiting (QueueEmpty at its timeout, never ValueError),
    and every waiter it counted is uncounted. (Since issue 27 the nack dead-letters it: the
    get never sees it.)"""
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("q", dead_letter_queue="dlq", max_deliveries=1)
    q.put(b"poison")
    d = q.get_nowait()
    t, out = in_thread(lambda: q.get(timeout=1.5))
    if isinstance(any_broker, shmq.Broker):  # locally the sleeper counts itself: nack once it sleeps
        wait_for(lambda: q.stats().consumers_waiting == 1, what="the get to sleep")
    d.nack()
    t.join(10)
    assert not t.is_alive()
    assert isinstance(out.get("error"), shmq.QueueEmpty), out
    dead = any_broker.queue("dlq").get_nowait()
    assert dead.body == b"poison" and dead.headers["x-death-reason"] == "max-deliveries"
    dead.ack()
    s = q.stats()
    assert (s.ready, s.in_flight, s.dead_lettered_total) == (0, 0, 1)
    # (over TCP the server's doorbell, a registered consumer while a request waits, is
    # uncounted as its doze ends: within 0.5 s of the get's timeout, server/waiters.py)
    wait_for(lambda: q.stats().consumers_waiting == 0, timeout=5, what="every waiter to be uncounted")
