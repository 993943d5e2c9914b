"""The conventions users bring, the same on both transports (``any_broker``): serializers,
put_many's explicit item form, ``d.process()``, and the parity of local and remote
handles (close, ping, get_many's max_bytes, nack_many / reject_many, a double ack's words).
"""

import asyncio
import pickle

import pytest

import shmq
from shmq.client import aio

from ._wait import drain


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


# ---------------------------------------------------------------- serializers
@pytest.mark.parametrize("name, objs", [
    ("pickle", [Point(1, 2), {"a": (1, 2)}, b"raw", None]),
    ("json", [{"a": [1, 2]}, "text", 3.5, None]),
    ("msgpack", [{"a": [1, 2]}, b"\x00bin", "text", None]),
])
def test_a_serializer_round_trips_objects_through_put_get_put_many_peek(any_broker, name, objs):
    q = any_broker.create_queue("jobs", serializer=name)
    for o in objs:
        q.put(o)
    q.put_many(objs)
    assert [m.body for m in q.peek(2 * len(objs))] == objs + objs
    got = [q.get(timeout=5) for _ in objs] + q.get_many(len(objs), timeout=5)
    assert [d.body for d in got] == objs + objs
    q.ack_many(got)
    assert q.stats().ready == q.stats().in_flight == 0


def test_serializer_as_dumps_loads_pair_and_a_second_handle_sees_bytes(any_broker):
    q = any_broker.create_queue("jobs", serializer=(lambda s: s.upper().encode(), lambda b: b.decode().lower()))
    q.put("Hello")
    raw = any_broker.queue("jobs")
    assert raw.peek()[0].body == b"HELLO"
    assert any_broker.queue("jobs", serializer=(str.encode, bytes.decode)).get(timeout=5).body == "HELLO"


def test_a_body_the_serializer_cannot_load_is_given_back_not_lost(any_broker):
    q = any_broker.create_queue("jobs", serializer="json")
    any_broker.queue("jobs").put(b"\xff not json")
    with pytest.raises(shmq.SerializationError, match=r"jobs#1 does not load with serializer 'json'"):
        q.get(timeout=5)
    s = q.stats()
    assert (s.ready, s.in_flight) == (1, 0)
    d = any_broker.queue("jobs").get(timeout=5)
    assert (d.body, d.attempt) == (b"\xff not json", 2)
    d.ack()


def test_a_serialized_reject_dead_letters_the_bytes(any_broker):
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("jobs", dead_letter_queue="dlq", serializer="pickle")
    q.put({"n": 1})
    q.get(timeout=5).reject()
    assert pickle.loads(any_broker.queue("dlq").get(timeout=5).body) == {"n": 1}


def test_bad_serializers_are_refused_and_an_unpicklable_object_raises_in_the_caller(any_broker):
    any_broker.create_queue("jobs")
    with pytest.raises(ValueError, match="unknown serializer 'yaml'"):
        any_broker.queue("jobs", serializer="yaml")
    with pytest.raises(TypeError, match="serializer must be"):
        any_broker.queue("jobs", serializer=42)
    q = any_broker.queue("jobs", serializer="pickle")
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        q.put(lambda: 1)
    q.put(1)
    assert q.get(timeout=5).body == 1


def test_a_serialized_local_handle_pickles_with_its_serializer(broker):
    q = broker.create_queue("jobs", serializer="json")
    q2 = pickle.loads(pickle.dumps(q))
    q2.put([1])
    assert q.get(timeout=5).body == [1]
    q2.close()


# ---------------------------------------------------------------- put_many's items
def test_put_many_items_are_bodies_and_headers_come_explicitly(any_broker):
    q = any_broker.create_queue("jobs")
    with pytest.raises(TypeError, match="put_many items are bodies, not tuples"):
        q.put_many([("x", "y", "z")])
    with pytest.raises(TypeError, match="put_many items are bodies, not tuples"):
        q.put_many([(b"a", {"k": 1})])
    with pytest.raises(ValueError, match="put_many got 2 bodies and 1 headers"):
        q.put_many([b"a", b"b"], headers=[{"k": 1}])
    with pytest.raises(TypeError, match="headers must be a map or a list of maps"):
        q.put_many([b"a"], headers="k")
    assert q.stats().ready == 0
    q.put_many([b"a", b"b"], headers=[{"n": 1}, None])
    q.put_many([b"c", b"d"], headers={"all": True})
    ds = q.get_many(4, timeout=5)
    assert [(d.body, d.headers) for d in ds] == [(b"a", {"n": 1}), (b"b", {}), (b"c", {"all": True}),
                                                 (b"d", {"all": True})]
    q.ack_many(ds)


def test_a_serialized_put_many_takes_tuples_as_objects(any_broker):
    q = any_broker.create_queue("jobs", serializer="pickle")
    q.put_many([("x", "y", "z"), (1, 2)])
    assert [d.body for d in q.get_many(2, timeout=5)] == [("x", "y", "z"), (1, 2)]


# ---------------------------------------------------------------- process()
def test_process_acks_on_success_and_nacks_or_rejects_on_error(any_broker):
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("jobs", dead_letter_queue="dlq")
    q.put_many([b"ok", b"poison", b"retry"])
    with q.get(timeout=5).process() as d:
        assert d.body == b"ok"
    with pytest.raises(KeyError), q.get(timeout=5).process(requeue=False):
        raise KeyError("bad")
    with pytest.raises(RuntimeError), q.get(timeout=5).process():
        raise RuntimeError("boom")
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (1, 0, 1)
    again = q.get(timeout=5)
    assert (again.body, again.attempt) == (b"retry", 2)
    again.ack()
    assert any_broker.queue("dlq").get(timeout=5).body == b"poison"


def test_process_in_the_asyncio_client(tcp_server):
    async def main():
        b = await aio.connect(tcp_server.url)
        q = await b.create_queue("jobs")
        await q.put_many([b"ok", b"retry"])
        async with (await q.get(timeout=5)).process() as d:
            assert d.body == b"ok"
        with pytest.raises(RuntimeError):
            async with (await q.get(timeout=5)).process():
                raise RuntimeError("boom")
        s = await q.stats()
        await b.close()
        return s

    s = asyncio.run(main())
    assert (s.ready, s.in_flight, s.acked_total) == (1, 0, 1)


# ---------------------------------------------------------------- parity
def test_a_closed_queue_handle_refuses_calls_in_the_same_words(any_broker):
    q = any_broker.create_queue("jobs")
    q.close()
    for call in (lambda: q.put(b"x"), lambda: q.get_nowait(), lambda: q.stats()):
        with pytest.raises(shmq.ShmqError, match="queue handle 'jobs' is closed"):
            call()
    assert any_broker.queue("jobs").stats().ready == 0


def test_ping(any_broker):
    assert any_broker.ping() is None


def test_get_many_max_bytes(any_broker):
    q = any_broker.create_queue("jobs")
    q.put_many([b"x" * 100] * 5)
    first = q.get_many(5, timeout=5, max_bytes=250)
    assert 1 <= len(first) <= 2  # the budget counts record overhead the same way on both sides
    one = q.get_many(5, timeout=5, max_bytes=1)  # the first is always taken
    assert len(one) == 1
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        q.get_many(5, max_bytes=0)
    q.ack_many(first + one)
    assert len(drain(q)) == 5 - len(first) - 1


def test_nack_many_and_reject_many(any_broker):
    any_broker.create_queue("dlq")
    q = any_broker.create_queue("jobs", dead_letter_queue="dlq")
    q.put_many([b"a", b"b", b"c"])
    ds = q.get_many(3, timeout=5)
    q.nack_many(ds[:2])
    q.reject_many(ds[2:])
    assert sorted(drain(q)) == [b"a", b"b"]
    assert drain(any_broker.queue("dlq")) == [b"c"]


def test_a_double_ack_says_the_same_on_both_transports(any_broker):
    q = any_broker.create_queue("jobs")
    q.put(b"x")
    d = q.get(timeout=5)
    d.ack()
    with pytest.raises(shmq.DeliveryExpired, match=r"^delivery jobs#1 attempt 1 is no longer leased$"):
        d.ack()
    with pytest.raises(shmq.DeliveryExpired, match=r"^delivery jobs#1 attempt 1 is no longer leased$"):
        d.nack()


def test_engine_internals_are_not_on_the_public_queue(any_broker):
    q = any_broker.create_queue("jobs")
    public = {n for n in dir(q) if not n.startswith("_")}
    assert not public & {"configure_wal", "export_messages", "import_messages", "housekeep", "ready_hint",
                         "retry_delay_ns", "set_prefetch", "release_many"}
    local = {n for n in dir(shmq.Queue) if not n.startswith("_")}
    remote = {n for n in dir(shmq.client.remote.RemoteQueue) if not n.startswith("_")}
    # reserve, reserve_many: zero-copy into shared memory; messages: the consume loop, one lock hold per step (local
    # for now); max_bytes, created_at, durability: the attached segment's own facts (over TCP: settings())
    assert local - remote <= {"deleted", "lock_timeout", "reserve", "reserve_many", "messages", "max_bytes",
                              "created_at", "durability"}


# ---------------------------------------------------------------- pipelined puts
def test_pipelined_puts_are_confirmed_by_flush(any_broker):
    q = any_broker.create_queue("jobs")
    for i in range(500):
        q.put(b"%d" % i, wait=False)
    q.put_many([b"a", b"b"], wait=False)
    q.flush()
    assert q.stats().ready == 502
    assert drain(q)[:3] == [b"0", b"1", b"2"]


def test_flush_raises_the_first_error_of_the_pipelined_puts(tcp_server):
    with shmq.connect(tcp_server.url) as b:
        q = b.create_queue("small", max_bytes=4096, max_message_bytes=1000)
        q.put(b"x" * 1001, wait=False)  # refused by the server: too large
        for _ in range(20):
            q.put(b"y" * 900, wait=False)  # the ring fills: QueueFull for the rest
        with pytest.raises(shmq.MessageTooLarge):
            q.flush()
        q.flush()  # raised once: nothing left to wait for
        n = q.stats().ready
        assert 0 < n < 20
        assert len(drain(q)) == n


# ---------------------------------------------------------------- auto-ack
@pytest.mark.parametrize("serializer", [None, "json"])
def test_auto_ack_settles_as_it_takes(any_broker, serializer):
    q = any_broker.create_queue("jobs", serializer=serializer)
    q.put_many([b"1", b"2", b"3"] if serializer is None else [1, 2, 3])
    d = q.get(timeout=5, ack=False)
    ds = q.get_many(5, timeout=5, ack=False)
    assert [x.body for x in [d] + ds] == ([b"1", b"2", b"3"] if serializer is None else [1, 2, 3])
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)
    with pytest.raises(shmq.DeliveryExpired, match=r"^delivery jobs#1 attempt 1 is no longer leased$"):
        d.ack()
