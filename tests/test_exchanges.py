"""Exchanges (engine/queues/exchange.py): topic matching, routing with exact accounting on both
transports, bindings' life, publishers in other processes, and a publisher killed
mid-publish whose retry with the same dedup id puts the message nowhere twice."""

import os
import signal

import pytest

import shmq
from shmq.engine.queues.exchange import topic_matches
from tests import _exchange_workers as workers
from tests._processes import WORKERS
from tests._wait import drain as _drain, wait_for as _until


def _stream_values(s):
    return [r.value for p in range(s.partitions) for r in s.read(p, 0, 1000)]


# AMQP's topic cases: words split on ".", "*" exactly one word, "#" zero or more
TOPIC_CASES = [
    ("#", "", True),            # "#" matches zero words, even of an empty key
    ("#", "a.b.c", True),
    ("*", "", False),           # "*" needs exactly one word
    ("*", "a", True),
    ("*", "a.b", False),
    ("a.*", "a.b", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("a.#", "a", True),         # zero words after "a"
    ("a.#", "a.b.c", True),
    ("#.a", "a", True),
    ("#.a", "b.a", True),
    ("#.a", "a.b", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("#.#", "", True),
    ("*.*", "a.", True),        # "a." is two words, the second one empty
    ("*", ".", False),          # "." is two empty words
    ("a.*.b", "a..b", True),    # an empty word is a word
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("orders.eu", "orders.eu", True),
    ("orders.eu", "orders.us", False),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("*.eu.#", "orders.eu", True),
    ("*.eu.#", "orders.eu.paid.late", True),
    ("*.eu.#", "eu.paid", False),
]


@pytest.mark.parametrize("pattern,key,expected", TOPIC_CASES)
def test_topic_matching_follows_amqp(pattern, key, expected):
    assert topic_matches(pattern, key) is expected


def test_fanout_copies_into_every_queue_and_the_stream(any_broker):
    b = any_broker
    for name in ("audit", "billing", "mail"):
        b.create_queue(name)
    b.create_stream("history", partitions=2)
    b.create_exchange("events", type="fanout")
    for name in ("audit", "billing", "mail", "history"):
        b.bind("events", name)
    assert [b.publish("events", f"m{i}".encode(), routing_key=f"any.{i}") for i in range(5)] == [4] * 5
    expected = [f"m{i}".encode() for i in range(5)]
    for name in ("audit", "billing", "mail"):
        assert _drain(b.queue(name)) == expected
    assert sorted(_stream_values(b.stream("history"))) == expected
    assert b.list_exchanges() == ["events"]
    b.delete_exchange("events")


def test_topic_routes_by_pattern_once_per_target(any_broker):
    b = any_broker
    for name in ("eu", "all", "paid"):
        b.create_queue(name)
    b.create_exchange("orders", type="topic")
    b.bind("orders", "eu", "orders.eu.*")
    b.bind("orders", "all", "#")
    b.bind("orders", "paid", "*.*.paid")
    b.bind("orders", "paid", "orders.#")  # two patterns of one target: still one copy
    assert b.publish("orders", b"1", routing_key="orders.eu.paid") == 3
    assert b.publish("orders", b"2", routing_key="orders.us.paid") == 2
    assert b.publish("orders", b"3", routing_key="refunds.eu") == 1
    assert b.publish("orders", b"4", routing_key="") == 1  # "#" matches zero words
    assert _drain(b.queue("eu")) == [b"1"]
    assert _drain(b.queue("all")) == [b"1", b"2", b"3", b"4"]
    assert _drain(b.queue("paid")) == [b"1", b"2"]
    info = b.exchange_info("orders")
    assert info["type"] == "topic"
    assert {(x["target"], x["kind"], x["pattern"]) for x in info["bindings"]} == {
        ("eu", "queue", "orders.eu.*"), ("all", "queue", "#"), ("paid", "queue", "*.*.paid"),
        ("paid", "queue", "orders.#")}
    assert b.unbind("orders", "paid", "orders.#") == 1
    assert b.publish("orders", b"5", routing_key="orders.eu.new") == 2  # paid: "*.*.paid" only now
    assert b.unbind("orders", "all") == 1
    assert b.unbind("orders", "all") == 0
    assert b.publish("orders", b"6", routing_key="x") == 0
    b.delete_exchange("orders")


def test_errors_are_clear(any_broker):
    b = any_broker
    b.create_queue("q")
    with pytest.raises(shmq.ExchangeNotFound, match="no exchange 'nope'"):
        b.publish("nope", b"x")
    with pytest.raises(shmq.ExchangeNotFound):
        b.bind("nope", "q")
    b.create_exchange("x", type="topic")
    with pytest.raises(shmq.ExchangeExists, match="already exists"):
        b.create_exchange("x", type="topic")
    b.create_exchange("x", type="topic", exist_ok=True)
    with pytest.raises(shmq.ExchangeExists, match="exists as a topic exchange, not fanout"):
        b.create_exchange("x", type="fanout", exist_ok=True)
    with pytest.raises(ValueError, match="exchange type must be one of fanout, topic"):
        b.create_exchange("y", type="direct")
    with pytest.raises(shmq.QueueNotFound, match="no queue or stream 'ghost'"):
        b.bind("x", "ghost")
    with pytest.raises(ValueError, match="routing_key must be at most 255"):
        b.publish("x", b"m", routing_key="k" * 256)
    with pytest.raises(TypeError, match="routing_key must be a str"):
        b.publish("x", b"m", routing_key=5)
    b.delete_exchange("x")
    with pytest.raises(shmq.ExchangeNotFound):
        b.delete_exchange("x")
    assert b.list_exchanges() == []


def test_a_deleted_target_is_passed_over_and_unbound(any_broker):
    b = any_broker
    b.create_queue("stays")
    b.create_queue("goes")
    b.create_exchange("fan")
    b.bind("fan", "stays")
    b.bind("fan", "goes")
    b.delete_queue("goes")
    assert b.publish("fan", b"m") == 1
    assert [x["target"] for x in b.exchange_info("fan")["bindings"]] == ["stays"]
    b.create_queue("goes")  # made again: not bound any more
    assert b.publish("fan", b"n") == 1
    assert _drain(b.queue("goes")) == []
    assert _drain(b.queue("stays")) == [b"m", b"n"]


def test_exchanges_are_shared_by_processes_and_go_with_the_namespace(namespace):
    with shmq.connect(namespace=namespace) as b, shmq.connect(namespace=namespace) as other:
        b.create_queue("q")
        b.create_exchange("fan")
        other.bind("fan", "q")  # another handle sees the exchange...
        assert b.publish("fan", b"m") == 1  # ...and the first one its binding
        b.delete_queue("q")
    assert f"shmq.{namespace}.exchanges" in os.listdir("/dev/shm")
    shmq.destroy_namespace(namespace)
    assert f"shmq.{namespace}.exchanges" not in os.listdir("/dev/shm")
    with shmq.connect(namespace=namespace) as b:
        assert b.list_exchanges() == []


def test_publishers_in_several_processes(broker):
    broker.create_queue("a")
    broker.create_queue("b")
    broker.create_stream("s", partitions=3)
    broker.create_exchange("fan")
    for name in ("a", "b", "s"):
        broker.bind("fan", name)
    procs = [WORKERS.Process(target=workers.publisher, args=(broker.namespace, "fan", f"p{i}", 100)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    expected = sorted(f"p{i}:{j}".encode() for i in range(3) for j in range(100))
    assert sorted(_drain(broker.queue("a"))) == expected
    assert sorted(_drain(broker.queue("b"))) == expected
    assert sorted(_stream_values(broker.stream("s"))) == expected


def test_a_publisher_killed_mid_publish_retries_with_its_dedup_id(broker):
    # Needs the engine's dedup ids (issue 13, the lead's part: put(dedup_id=...) and the
    # queue's dedup_window); until they land this fails with a TypeError.
    for name in ("first", "second"):
        broker.create_queue(name)
    full = broker.create_queue("full", max_bytes=4096, max_message_bytes=1024)
    while True:  # fill it: the publisher will wait there, after the first two got the message
        try:
            full.put_nowait(b"f" * 8)
        except shmq.QueueFull:
            break
    broker.create_exchange("fan")
    for name in ("first", "second", "full"):
        broker.bind("fan", name)
    p = WORKERS.Process(target=workers.publish_once, args=(broker.namespace, "fan", b"order-1", "order-1"))
    p.start()
    q1, q2 = broker.queue("first"), broker.queue("second")
    _until(lambda: q1.stats().ready == 1 and q2.stats().ready == 1, what="the first two targets got it")
    os.kill(p.pid, signal.SIGKILL)  # mid-publish: waiting for room in "full"
    p.join(10)
    filler = _drain(full)
    assert filler and set(filler) == {b"f" * 8}
    assert broker.publish("fan", b"order-1", dedup_id="order-1") == 3  # the retry
    assert _drain(q1) == [b"order-1"]
    assert _drain(q2) == [b"order-1"]
    assert _drain(full) == [b"order-1"]
