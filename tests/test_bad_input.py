"""Bad input: clear errors, and nothing is enqueued or lost."""

import pytest

import shmq


def test_body_must_be_bytes_like(broker):
    q = broker.create_queue("q")
    for bad in ("text", 42, None, ["list"], {"a": 1}):
        with pytest.raises(TypeError, match="message body must be bytes-like"):
            q.put(bad)
    assert q.stats().ready == 0


def test_oversize_body_raises_and_enqueues_nothing(broker):
    q = broker.create_queue("q", max_bytes=1 << 20, max_message_bytes=1000)
    q.put(b"ok")
    with pytest.raises(shmq.MessageTooLarge, match="1001 bytes; queue 'q' takes at most 1000"):
        q.put(b"x" * 1001)
    with pytest.raises(ValueError):  # MessageTooLarge is also a ValueError
        q.put_nowait(b"x" * 5000)
    assert q.stats().ready == 1
    assert q.get_nowait().body == b"ok"


def test_bad_headers(broker):
    q = broker.create_queue("q")
    with pytest.raises(TypeError, match="headers must be a dict"):
        q.put(b"x", headers=[("a", 1)])
    with pytest.raises(TypeError, match="header keys must be str"):
        q.put(b"x", headers={1: "a"})
    with pytest.raises(TypeError, match="header 'a': values must be"):
        q.put(b"x", headers={"a": [1, 2]})
    with pytest.raises(TypeError, match="values must be"):
        q.put(b"x", headers={"a": None})
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        q.put(b"x", headers={"a": 2**70})
    with pytest.raises(shmq.MessageTooLarge, match="headers encode to"):
        q.put(b"x", headers={"a": "v" * 70000})
    assert q.stats().ready == 0


def test_unknown_queue(broker):
    with pytest.raises(shmq.QueueNotFound, match="no queue 'nope'"):
        broker.queue("nope")
    with pytest.raises(LookupError):
        broker.delete_queue("nope")


def test_queue_exists(broker):
    q = broker.create_queue("q")
    q.put(b"keep")
    with pytest.raises(shmq.QueueExists, match="'q' already exists"):
        broker.create_queue("q")
    again = broker.create_queue("q", exist_ok=True)
    assert again.get_nowait().body == b"keep"


@pytest.mark.parametrize("name", ["", "a/b", "../x", ".hidden", "x" * 129, "sp ace", 5, None])
def test_bad_queue_names(broker, name):
    with pytest.raises(ValueError, match="invalid queue name"):
        broker.create_queue(name)


@pytest.mark.parametrize("ns", ["", "a.b", "a/b", "x" * 41])
def test_bad_namespaces(ns):
    with pytest.raises(ValueError, match="invalid namespace"):
        shmq.connect(namespace=ns)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"max_bytes": 100}, ValueError, "at least 4096"),
    ({"max_bytes": "big"}, TypeError, "max_bytes must be an int"),
    ({"max_bytes": 4096, "max_message_bytes": 4096}, ValueError, "can never fit"),
    ({"max_message_bytes": 0}, ValueError, "must be positive"),
    ({"visibility_timeout": 0}, ValueError, "visibility_timeout"),
    ({"visibility_timeout": "1"}, TypeError, "visibility_timeout"),
    ({"max_deliveries": 0}, ValueError, "max_deliveries"),
    ({"dead_letter_queue": "missing"}, shmq.QueueNotFound, "create it first"),
    ({"dead_letter_queue": "q"}, ValueError, "its own dead-letter queue"),
])
def test_bad_create_arguments(broker, kwargs, error, match):
    with pytest.raises(error, match=match):
        broker.create_queue("q", **kwargs)
    assert broker.list_queues() == []


def test_bad_timeouts_and_counts(broker):
    q = broker.create_queue("q")
    q.put(b"x")
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        q.get(timeout=-1)
    with pytest.raises(TypeError, match="timeout must be a number"):
        q.get(timeout="soon")
    with pytest.raises(ValueError, match="max_messages must be a positive int"):
        q.get_many(0)
    d = q.get_nowait()
    with pytest.raises(ValueError, match="delay must be >= 0"):
        d.nack(delay=-1)
    with pytest.raises(TypeError):
        q.ack_many([object()])
    d.ack()  # still leased after the bad calls
    assert q.stats().acked_total == 1


def test_delivery_of_another_queue_is_refused(broker):
    a, b = broker.create_queue("a"), broker.create_queue("b")
    a.put(b"x")
    d = a.get_nowait()
    with pytest.raises(TypeError, match="expected deliveries of queue 'b'"):
        b.ack_many([d])
    d.ack()


def test_bad_urls():
    with pytest.raises(shmq.BrokerUnavailable, match="cannot connect to 127.0.0.1:1"):
        shmq.connect("tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="unsupported broker url"):
        shmq.connect("http://x")
    with pytest.raises(ValueError, match="unsupported broker url"):
        shmq.connect("tcp://")


# ---------------------------------------------------------------- work-queue fields over the wire (issue 13)
@pytest.mark.parametrize("msg_type, payload, error, match", [
    ("CREATE", {"queue": "x", "priorities": 0}, ValueError, r"^priorities must be an int in 1\.\.16, not 0$"),
    ("CREATE", {"queue": "x", "message_ttl": -1}, ValueError, "^message_ttl must be > 0 seconds"),
    ("CREATE", {"queue": "x", "retry_backoff": "2"}, ValueError, "^CREATE: field 'retry_backoff' must be a msgpack float or int"),
    ("CREATE", {"queue": "x", "priority_aging": 0}, ValueError, "^priority_aging must be > 0 seconds"),
    ("PRODUCE", {"queue": "q", "body": b"x", "priority": 3}, ValueError, "queue 'q' has no priority levels"),
    ("PRODUCE", {"queue": "q", "body": b"x", "ttl_ms": 0}, ValueError, "^ttl must be > 0 seconds"),
    ("PRODUCE", {"queue": "q", "body": b"x", "group": ""}, ValueError, "^group must be 1 to 255 bytes"),
    ("PRODUCE", {"queue": "q", "body": b"x", "group": "g" * 256}, ValueError, "^group must be 1 to 255 bytes"),
    ("PRODUCE", {"queue": "q", "body": b"x", "dedup_id": ""}, ValueError, "^dedup_id must not be empty"),
    ("PRODUCE", {"queue": "q", "body": b"x", "delay_ms": -1}, ValueError, "field 'delay_ms' must be a non-negative"),
    ("PRODUCE_BATCH", {"queue": "q", "messages": [{"body": b"x"}], "priority": -1}, ValueError, "priority"),
    ("PEEK", {"queue": "missing"}, shmq.QueueNotFound, "missing"),
    ("PEEK", {"queue": "q", "max": 0}, ValueError, "^PEEK: field 'max' must be a positive integer, not 0$"),
    ("REDRIVE", {"queue": "missing"}, shmq.QueueNotFound, "missing"),
    ("REDRIVE", {"queue": "q", "max": "all"}, ValueError, "^REDRIVE: field 'max' must be a positive integer"),
    ("NACK", {"queue": "q", "deliveries": [1], "delay_ms": 0.5}, ValueError, "field 'delay_ms'"),
])
def test_bad_work_queue_fields_get_an_error_reply(tcp_server, broker, msg_type, payload, error, match):
    from shmq.protocol import MsgType

    q = broker.create_queue("q")
    with shmq.connect(tcp_server.url) as remote:
        with pytest.raises(error, match=match):
            remote._request(MsgType[msg_type], payload)  # the raw request (the transport's)
        remote.ping()  # the connection goes on
    assert q.stats().enqueued_total == 0 and broker.list_queues() == ["q"]


# ---------------------------------------------------------------- keyed-store requests over the wire
@pytest.mark.parametrize("msg_type, payload, error, match", [
    ("KV_OPEN", {"store": "a/b"}, ValueError, "^invalid queue name 'a/b'"),
    ("KV_OPEN", {}, ValueError, "^KV_OPEN: missing required field 'store'$"),
    ("KV_DROP", {"store": ""}, ValueError, "^invalid queue name ''"),
    ("KV_SET", {"store": "s", "key": "", "value": b"x"}, ValueError, "^a key must be 1-1024 characters, not 0$"),
    ("KV_SET", {"store": "s", "key": "k" * 1025, "value": b"x"}, ValueError, "not 1025$"),
    ("KV_SET", {"store": "s", "key": "k", "value": "text"}, ValueError, "^KV_SET: field 'value' must be a msgpack bin"),
    ("KV_SET", {"store": "s", "key": "k", "value": b"x", "ttl": -1}, ValueError, r"^ttl must be > 0 seconds"),
    ("KV_SET", {"store": "s", "key": "k", "value": b"x", "ttl": 0}, ValueError, r"^ttl must be > 0 seconds"),
    ("KV_GET", {"store": "s", "key": "k", "wait_ms": -5}, ValueError, "^KV_GET: field 'wait_ms'"),
    ("KV_GET", {"store": "s", "key": "set"}, shmq.WrongType, "^key 'set' holds a set, not a value$"),
    ("KV_GET_MANY", {"store": "s", "keys": [1]}, ValueError, "^KV_GET_MANY: field 'keys' must be an array"),
    ("KV_GET_MANY", {"store": "s", "keys": [""]}, ValueError, "^a key must be 1-1024 characters"),
    ("KV_INCR", {"store": "s", "key": "v"}, shmq.WrongType, "^key 'v' holds b'text', not an integer$"),
    ("KV_INCR", {"store": "s", "key": "n", "by": 2**63}, ValueError, "^by must fit in 64 bits"),
    ("KV_INCR", {"store": "s", "key": "n", "by": True}, ValueError, "^KV_INCR: field 'by' must be an integer"),
    ("KV_ADD", {"store": "s", "key": "v", "member": "m"}, shmq.WrongType, "^key 'v' holds a value, not a set$"),
    ("KV_ADD", {"store": "s", "key": "c", "member": ""}, ValueError, "^a member must be 1-1024 characters"),
    ("KV_EXPIRE", {"store": "s", "key": "v", "ttl": float("nan")}, ValueError, "^ttl must be > 0 seconds"),
    ("KV_EXPIRE", {"store": "s", "key": "v", "ttl": 1e300}, ValueError, "^ttl must be > 0 seconds"),
    ("KV_KEYS", {"store": "s", "prefix": "x" * 2000}, ValueError, "^a prefix must be 1-1024 characters"),
])
def test_bad_store_requests_get_an_error_reply(tcp_server, broker, msg_type, payload, error, match):
    from shmq.protocol import MsgType

    kv = broker.store("s")
    kv.set("v", b"text")
    kv.add("set", "m")
    with shmq.connect(tcp_server.url) as remote:
        with pytest.raises(error, match=match):
            remote._request(MsgType[msg_type], payload)  # the raw request (the transport's)
        remote.ping()  # the connection goes on
        assert remote.store("s").get_many(["v", "n", "c"]) == [b"text", None, None]
    assert broker.list_stores() == ["s"] and kv.keys() == ["set", "v"]


def test_a_store_reply_too_big_for_a_frame_is_an_error_reply(broker):
    from tests.conftest import ThreadedServer

    srv = ThreadedServer(broker.namespace, max_frame_bytes=64 * 1024)
    try:
        kv = broker.store()
        kv.set("big", b"x" * 100_000)  # made locally: more than the server's frames hold
        with shmq.connect(srv.url) as remote:
            rkv = remote.store()
            with pytest.raises(shmq.MessageTooLarge, match="the value of key 'big' takes 100000 bytes"):
                rkv.get("big")
            with pytest.raises(shmq.MessageTooLarge, match="more than a reply of this server holds"):
                rkv.get_many(["big"])
            assert rkv.set("small", b"y") and rkv.get("small") == b"y"
    finally:
        srv.stop()
