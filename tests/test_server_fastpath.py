"""The server's fast path for the plain requests (a PRODUCE with no options, a CONSUME of
one, an ACK): its checks (``requests.PLAIN_CHECKS``) give ``check_request``'s verdict,
its replies (``handlers.PLAIN``) are ``encode_reply``'s bytes, bad requests of those
types get the same error replies as ever, and a plain request costs the server few
Python calls."""

import os
import re
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.errors import ProtocolError
from shmq.protocol import FrameDecoder, MsgType, Status, encode_reply, encode_request
from shmq.protocol.requests import PLAIN_CHECKS, check_request
from shmq.protocol.shapes import ack_shape, acks_shape, consume_shape, produce_shape
from shmq.server import handlers
from shmq.server.limits import Limits
from tests.conftest import ThreadedServer
from tests.test_server_tcp import _read_frames, _sock

P, C, A = MsgType.PRODUCE, MsgType.CONSUME, MsgType.ACK


# ---------------------------------------------------------------- the checks, sans-IO
def _verdict(msg_type, payload):
    try:
        return check_request(msg_type, 1, payload)
    except ProtocolError as e:
        return e


_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(2**62, 2**64), st.floats(),
                    st.text(max_size=3), st.binary(max_size=3), st.lists(st.integers(0, 9), max_size=3),
                    st.lists(st.one_of(st.booleans(), st.text(max_size=1), st.integers()), max_size=3),
                    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
_payloads = st.dictionaries(
    st.sampled_from(["queue", "body", "max", "wait_ms", "deliveries", "headers", "priority", "rows", "other"]),
    _values, max_size=4)


@settings(max_examples=3000, deadline=None)
@given(st.sampled_from([P, C, A]), _payloads)
def test_a_plain_check_takes_only_what_check_request_takes_and_gives_its_fields(msg_type, payload):
    fields = PLAIN_CHECKS[msg_type](payload)
    if fields is not None:
        assert _verdict(msg_type, payload) == fields


@pytest.mark.parametrize("msg_type, payload", [
    (P, produce_shape("q").payload(b"")), (P, produce_shape("a queue é").payload(b"x" * 70_000)),
    (C, consume_shape("q").payload(0)), (C, consume_shape("q").payload(2**40)),
    (A, ack_shape("q").payload(1)), (A, acks_shape("q").payload([1, 2, 2**63 - 1])), (A, acks_shape("q").payload([])),
])
def test_the_plain_shapes_of_the_clients_take_the_fast_check(msg_type, payload):
    assert PLAIN_CHECKS[msg_type](payload) == check_request(msg_type, 1, payload) == payload


@pytest.mark.parametrize("msg_type, payload, error", [
    (P, {"queue": "q", "body": "text"}, "PRODUCE: field 'body' must be a msgpack bin"),
    (P, {"queue": 7, "body": b"x"}, "PRODUCE: field 'queue' must be a string, not 7"),
    (P, {"body": b"x", "queue": "q", "priority": "high"}, "PRODUCE: field 'priority' must be an integer"),
    (C, {"queue": "q", "max": 1, "wait_ms": -1}, "CONSUME: field 'wait_ms' must be a non-negative integer, not -1"),
    (C, {"queue": "q", "max": True, "wait_ms": 0}, "CONSUME: field 'max' must be a positive integer, not true"),
    (C, {"queue": "q", "max": 1}, None),  # not the plain shape, but good: the general path takes it
    (A, {"queue": "q", "deliveries": [1, "2"]}, r"ACK: field 'deliveries' must be an array of integers \(item 1 is str"),
    (A, {"queue": "q", "deliveries": 5}, "ACK: field 'deliveries' must be an array of integers, not 5"),
])
def test_what_the_plain_checks_refuse_goes_to_check_request(msg_type, payload, error):
    assert PLAIN_CHECKS[msg_type](payload) is None
    if error is None:
        assert check_request(msg_type, 1, payload)["max"] == 1
        return
    with pytest.raises(ProtocolError, match=error):
        check_request(msg_type, 1, payload)


@pytest.mark.parametrize("shape, value", [
    (handlers.queues._PRODUCED, 1), (handlers.queues._PRODUCED, 2**63 - 1), (handlers.queues._ACKED, 0),
    (handlers.queues._ACKED, 3), (handlers.queues._CONSUMED, []),
    (handlers.queues._CONSUMED, [{"id": 5, "delivery": 9, "body": b"x" * 300, "headers": {"k": "v"}, "attempt": 1,
                                  "enqueued_at": 1.5}]),
])
def test_a_plain_reply_is_the_bytes_of_encode_reply(shape, value):
    for msg_id in (0, 1, 2**32 - 1):
        assert shape.frame(msg_id, value) == encode_reply(shape.msg_type & 0x7F, msg_id, {shape.last: value})


def _parts_fed(data, max_frame_bytes=1 << 20):
    dec = FrameDecoder(max_frame_bytes)
    dec.feed(data)
    try:
        return dec.next_parts()
    except ProtocolError as e:
        return str(e)


_PUT = encode_request(P, 7, {"queue": "q", "body": b"x" * 64})


@pytest.mark.parametrize("data", [
    _PUT, encode_request(MsgType.PING, 1), encode_request(C, 2**32 - 1, {"queue": "q", "max": 1, "wait_ms": 5}),
    encode_request(P, 1, {"queue": "q", "body": b"x" * 4000}),
])
def test_one_frame_decodes_a_read_of_one_frame_as_feed_and_next_parts_do(data):
    dec = FrameDecoder(1 << 20)
    assert dec.one_frame(memoryview(data)) == _parts_fed(data)
    assert dec.buffered == 0 and dec.next_parts() is None  # nothing taken in


@pytest.mark.parametrize("data, max_frame_bytes", [
    (_PUT + _PUT, 1 << 20),  # two frames
    (_PUT[:-1], 1 << 20),  # not whole
    (_PUT[:10], 1 << 20),  # not even a header
    (b"\x00" * 4 + _PUT[4:], 1 << 20),  # bad magic
    (_PUT, 40),  # past max_frame_bytes
    (encode_request(P, 1, {"queue": "q", "body": b"x" * 5000}), 1 << 20),  # past 4 KiB: next_parts reads it in place
    (_PUT[:16] + b"\xc1" * (len(_PUT) - 16), 1 << 20),  # malformed msgpack
    (_PUT[:9] + b"\x07" + _PUT[10:], 1 << 20),  # another version
])
def test_one_frame_takes_nothing_from_any_other_read(data, max_frame_bytes):
    dec = FrameDecoder(max_frame_bytes)
    assert dec.one_frame(data) is None
    assert dec.buffered == 0
    dec.feed(b"")
    assert dec.next_parts() is None


def test_one_frame_takes_nothing_while_the_decoder_holds_bytes():
    dec = FrameDecoder()
    dec.feed(_PUT[:5])
    assert dec.one_frame(_PUT) is None
    dec.feed(_PUT[5:])
    assert dec.next_parts() == _parts_fed(_PUT)


def test_the_c_paths_reply_budget_is_generated_from_answers():
    """_plain.c sizes a CONSUME reply as ``reply_budget`` does, with its terms from the generated
    _reply_budget.h (tests/test_mirrors.py holds it fresh): none copied by hand."""
    from shmq import mirrors

    source = open(os.path.join(os.path.dirname(mirrors.path("server/_reply_budget.h")), "_plain.c")).read()
    assert '#include "_reply_budget.h"' in source
    assert not re.search(r"#define (RECORD_OVERHEAD|REPLY_RESERVE)\b", source)
    assert not re.search(r"max_frame_bytes\s*[-<]\s*\d", source), "a literal reserve in _plain.c"


# ---------------------------------------------------------------- over TCP
def _ask(s, msg_type, msg_id, payload):
    s.sendall(encode_request(msg_type, msg_id, payload))
    (f,) = _read_frames(s)
    assert (f.type, f.msg_id) == (msg_type | 0x80, msg_id)
    return f


def test_plain_requests_are_answered_as_by_the_general_path(tcp_server, broker):
    broker.create_queue("q")
    s, other = _sock(tcp_server.port), _sock(tcp_server.port)
    try:
        assert _ask(s, P, 1, {"queue": "q", "body": b"one"}).payload == {"id": 1}
        f = _ask(s, C, 2, {"queue": "q", "max": 1, "wait_ms": 0})
        (m,) = f.payload["messages"]
        assert (m["id"], m["body"], m["attempt"], f.status) == (1, b"one", 1, Status.OK)
        assert _ask(s, C, 3, {"queue": "q", "max": 1, "wait_ms": 0}).payload == {"messages": []}
        s.sendall(encode_request(C, 4, {"queue": "q", "max": 1, "wait_ms": 10_000}))  # waits ...
        assert _ask(other, P, 1, {"queue": "q", "body": b"two"}).payload == {"id": 2}  # ... for this one
        (f,) = _read_frames(s)
        (m2,) = f.payload["messages"]
        assert (f.msg_id, m2["id"], m2["body"]) == (4, 2, b"two")
        assert _ask(s, A, 5, {"queue": "q", "deliveries": [m["delivery"], m2["delivery"]]}).payload == {"acked": 2}
        f = _ask(s, A, 6, {"queue": "q", "deliveries": [m["delivery"]]})  # settled already
        assert f.status == Status.UNKNOWN_DELIVERY and "unknown deliveries" in f.payload["error"]
        f = _ask(other, A, 2, {"queue": "q", "deliveries": []})
        assert (f.status, f.payload) == (Status.OK, {"acked": 0})
        f = _ask(s, P, 7, {"queue": "nope", "body": b"x"})
        assert f.status == Status.NO_SUCH_QUEUE and "nope" in f.payload["error"]
        f = _ask(s, C, 8, {"queue": "q", "max": 1, "wait_ms": -5})
        assert (f.status, f.payload["error"]) == (
            Status.BAD_REQUEST, "CONSUME: field 'wait_ms' must be a non-negative integer, not -5")
        f = _ask(s, P, 9, {"queue": "q", "body": "text"})
        assert f.status == Status.BAD_REQUEST and f.payload["error"].startswith("PRODUCE: field 'body' must be a msgpack bin")
    finally:
        s.close()
        other.close()
    st_ = broker.queue("q").stats()
    assert (st_.ready, st_.in_flight, st_.acked_total) == (0, 0, 2)


def test_a_plain_request_before_hello_is_unauthorized(broker):
    srv = ThreadedServer(broker.namespace, token="s3cret")
    try:
        broker.create_queue("q")
        s = _sock(srv.port, hello=False)
        s.sendall(encode_request(P, 1, {"queue": "q", "body": b"x"}))
        (f,) = _read_frames(s)
        assert (f.status, f.payload["error"]) == (Status.UNAUTHORIZED, "say HELLO with the token first")
        assert s.recv(100) == b""  # then it closes
        s.close()
        assert broker.queue("q").stats().ready == 0
    finally:
        srv.stop()


def _server_calls_per(srv, fn, n=300) -> float:
    """Python function calls the server's loop thread makes per ``fn()`` (sys.setprofile there)."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    def turn(on):
        done = threading.Event()

        def set_it():
            sys.setprofile(count if on else None)
            done.set()

        srv.loop.call_soon_threadsafe(set_it)
        assert done.wait(10)

    turn(True)
    try:
        for _ in range(n):
            fn()
    finally:
        turn(False)
    return calls / n


@pytest.fixture
def quiet_server(broker):
    """A server that never busy-polls: its loop's calls between requests are the spin's,
    not a request's cost."""
    srv = ThreadedServer(broker.namespace, limits=Limits(busy_poll_us=0))
    yield srv
    srv.stop()


def test_a_plain_request_costs_the_server_few_python_calls(quiet_server, broker):
    """Before the fast path: 43 Python calls per PRODUCE, 48 per CONSUME of one, 44 per ACK
    (the asyncio loop's included); with it 34, 36 and 38."""
    tcp_server = quiet_server
    broker.create_queue("q", max_bytes=2**24)
    s = _sock(tcp_server.port)
    ids = iter(range(1, 10**6))
    tags = []
    try:
        def put():
            assert _ask(s, P, next(ids), {"queue": "q", "body": b"x" * 64}).status == Status.OK

        def get():
            tags.append(_ask(s, C, next(ids), {"queue": "q", "max": 1, "wait_ms": 1000}).payload["messages"][0]["delivery"])

        def ack():
            assert _ask(s, A, next(ids), {"queue": "q", "deliveries": [tags.pop()]}).payload == {"acked": 1}

        put_calls = _server_calls_per(tcp_server, put)
        get_calls = _server_calls_per(tcp_server, get)
        ack_calls = _server_calls_per(tcp_server, ack)
        assert put_calls <= 38 and get_calls <= 40 and ack_calls <= 41, (put_calls, get_calls, ack_calls)
    finally:
        s.close()
    st_ = broker.queue("q").stats()
    assert (st_.ready, st_.in_flight, st_.acked_total) == (0, 0, 300)
