"""The codec's C half for the clients (``protocol/_wire.c``, issue 44 item 2) against the
Python codec it stands in for: a shape's frame packs to the same bytes, a CONSUME reply's
bytes read into the same deliveries, a client's read of reply frames leaves its connection
state (replies, requests still waited for, deferred errors, pushes, its end) as the Python
loop does — on random values, replies and chunkings, and on mutated bytes, which the C half
may only refuse (None: Python reads them) or read exactly as Python does.
"""

from types import SimpleNamespace

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq.client import connection
from shmq.client.connection import ClientCore
from shmq.client.remote import RemoteDelivery
from shmq.protocol import MsgType, PushType, Status, cwire, encode_reply, encode_request
from shmq.protocol.frames import decode_payload
from shmq.protocol.shapes import Shape, ack_shape, acks_shape, consume_shape, produce_batch_shape, produce_shape

pytestmark = pytest.mark.skipif(not cwire.BUILT, reason="the C extension shmq.protocol._wire is not built")


# ---------------------------------------------------------------- frames
def _python_frame(shape, msg_id, value):
    return encode_request(shape.msg_type, msg_id, shape.payload(value))


_scalars = st.one_of(st.binary(max_size=300), st.integers(0, 2**64 - 1), st.integers(-2**63, -1),
                     st.integers(2**64, 2**70), st.booleans(), st.none(), st.text(max_size=3), st.floats())
_values = st.one_of(_scalars, st.lists(_scalars, max_size=70), st.lists(st.lists(st.integers(0, 3), max_size=2),
                                                                         max_size=3))
_shapes = st.one_of(st.builds(produce_shape, st.text(min_size=1, max_size=40)),
                    st.builds(consume_shape, st.text(min_size=1, max_size=3)),
                    st.builds(ack_shape, st.sampled_from(["q", "a-queue"])),
                    st.builds(acks_shape, st.just("q")), st.builds(produce_batch_shape, st.just("q")),
                    st.builds(Shape, st.sampled_from([0x10, 0x12, 0x7F]),
                              st.dictionaries(st.sampled_from(["queue", "max", "rows"]),
                                              st.one_of(st.integers(0, 500), st.booleans(), st.text(max_size=2)),
                                              max_size=3), st.just("last")))


@settings(max_examples=2000, deadline=None)
@given(_shapes, st.integers(0, 2**32 - 1), _values)
def test_a_frame_packs_as_python_packs_it_or_is_left_to_python(shape, msg_id, value):
    data = cwire.frame(shape._prefix, shape.msg_type, msg_id, value)
    plain = type(value) is bytes or (type(value) is int and 0 <= value < 2**64) or (
        type(value) is list and all(type(v) is bytes or (type(v) is int and 0 <= v < 2**64) for v in value))
    if data is None:
        assert not plain, value  # (the clients' values are always packed in C)
        return
    assert plain
    assert data == _python_frame(shape, msg_id, value)


def test_a_frame_out_of_the_headers_range_is_left_to_python():
    shape = produce_shape("q")
    assert cwire.frame(shape._prefix, shape.msg_type, 2**32, b"x") is None
    assert cwire.frame(shape._prefix, 256, 1, b"x") is None


# ---------------------------------------------------------------- deliveries
class Handle:
    _delivery_class = RemoteDelivery

    def __init__(self, core):
        self._broker = SimpleNamespace(_core=core)


def _fields(d):
    return (type(d), d.id, d._tag, d.body, d.headers, d.attempt, d.priority, d.enqueued_at, d.group, d._q, d._conn,
            d._sub, d._settled, hasattr(d, "_raw"))


def _row(m, rows):
    if rows:
        row = [m["id"], m["delivery"], m["body"], m["attempt"], m["enqueued_at"]]
        if m.get("headers") or m.get("priority") or m.get("group") is not None:
            row += [m.get("headers") or {}, m.get("priority", 0), m.get("group")]
        return row
    return m


_message = st.fixed_dictionaries(
    {"id": st.integers(1, 2**63), "delivery": st.integers(1, 2**63), "body": st.binary(max_size=200),
     "attempt": st.integers(1, 1000), "enqueued_at": st.floats(0, 2e9),
     "headers": st.one_of(st.just({}), st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2))},
    optional={"priority": st.integers(0, 9), "group": st.text(max_size=3)})


@settings(max_examples=1000, deadline=None)
@given(st.lists(_message, max_size=70), st.booleans())
def test_a_consume_reply_reads_into_the_deliveries_python_makes(messages, rows):
    core = ClientCore("test")
    q = Handle(core)
    payload = msgpack.packb({"messages": [_row(m, rows) for m in messages]}, use_bin_type=True)
    got = cwire.leased(payload, RemoteDelivery, q, core)
    want = [RemoteDelivery(q, m) for m in decode_payload(payload)["messages"]]
    if rows:  # a row of five items is a plain message, whatever map it came from
        plain = all(not m["headers"] and not m.get("priority") and m.get("group") is None for m in messages)
    else:  # a map with headers, a priority or a group is Python's
        plain = all(not m["headers"] and "priority" not in m and "group" not in m for m in messages)
    assert (got is not None) == plain
    if got is not None:
        assert list(map(_fields, got)) == list(map(_fields, want))


@settings(max_examples=1500, deadline=None)
@given(st.lists(_message, min_size=1, max_size=5), st.booleans(),
       st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=4), st.integers(0, 2000))
def test_mutated_reply_bytes_are_refused_or_read_as_python_reads_them(messages, rows, flips, cut):
    core = ClientCore("test")
    q = Handle(core)
    payload = bytearray(msgpack.packb({"messages": [_row(m, rows) for m in messages]}, use_bin_type=True))
    for at, value in flips:
        payload[at % len(payload)] = value
    payload = bytes(payload[:max(1, cut % (len(payload) + 1))])
    got = cwire.leased(payload, RemoteDelivery, q, core)
    if got is None:
        return
    want = [RemoteDelivery(q, m) for m in decode_payload(payload)["messages"]]
    assert list(map(_fields, got)) == list(map(_fields, want))


def test_a_class_with_fields_of_its_own_is_refused():
    class Fat(RemoteDelivery):
        __slots__ = ("extra",)

    with pytest.raises(TypeError):
        cwire.leased(msgpack.packb({"messages": []}), Fat, None, None)


def test_a_delivery_made_in_c_behaves_as_one_made_in_python():
    core = ClientCore("test")
    q = Handle(core)
    (d,) = cwire.leased(msgpack.packb({"messages": [[1, 2, b"x", 1, 1.5]]}, use_bin_type=True), RemoteDelivery, q,
                        core)
    assert d.headers == {} and d.headers is d.headers  # its own map, made once
    d.headers["k"] = 1
    assert d.headers == {"k": 1}
    with pytest.raises(AttributeError):
        d._raw  # noqa: B018  (unset, as the slot of a Python-made one)
    d._raw = b"raw"
    d.body = "loaded"
    assert (d._raw, d.body) == (b"raw", "loaded")
    with pytest.raises(AttributeError):
        d.extra = 1  # no __dict__


# ---------------------------------------------------------------- a client's read
def _reply(msg_type, msg_id, payload, status=Status.OK):
    return encode_reply(msg_type, msg_id, payload, status)


def _state(core):
    def norm(parts):
        return parts[:2] + (parts[2] if type(parts[2]) is not bytes else ("raw", parts[2]),) + parts[3:]

    return ({k: norm(v) for k, v in core._replies.items()}, sorted(core._waiting), dict(core._unwaited),
            sorted(core._raw), repr(core._deferred), core.failed, core.failed and repr(core.ended_error()),
            {sid: list(map(repr, buf)) for sid, buf in core._pushes.items()}, dict(core._abandoned),
            core._outbox[:])


_events = st.lists(st.one_of(
    st.tuples(st.just("reply"), st.integers(0, 11), st.sampled_from([Status.OK, Status.QUEUE_FULL])),
    st.tuples(st.just("stray"), st.integers(100, 103)),
    st.tuples(st.just("push"), st.integers(0, 2)),
    st.tuples(st.just("end"),),
    st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=20)),
), max_size=14)


def _requests(core):
    """Requests of every kind the reads answer: waited for (one kept raw), posted, posted puts,
    abandoned; their msg ids in order."""
    ids = []
    for i in range(12):
        kind = i % 6
        if kind == 0:
            ids.append(core.send_shaped(consume_shape("q"), 0, raw=True)[0])
        elif kind == 1:
            ids.append(core.send(MsgType.PING)[0])
        elif kind == 2:
            core.post_shaped(ack_shape("q"), 5)
            ids.append(core._last_id)
        elif kind == 3:
            core._batch = None
            core.gathers = True
            core.post(MsgType.PRODUCE, {"queue": "q", "body": b"x"})
            core.batched()
            ids.append(core._last_id)
        elif kind == 4:
            msg_id = core.send(MsgType.CONSUME, {"queue": "q"})[0]
            core.forget(msg_id, MsgType.CONSUME, {"queue": "q"})
            ids.append(msg_id)
        else:
            ids.append(core.send_shaped(produce_shape("q"), b"y")[0])
    return ids


def _bytes_of(events, ids):
    out = []
    for e in events:
        if e[0] == "reply":
            msg_id = ids[e[1]]
            payload = {"messages": [[1, 2, b"b", 1, 1.0]]} if e[1] % 6 in (0, 4) else \
                {"refused": [[0, Status.QUEUE_FULL, "full"]], "ids": [None]} if e[1] % 6 == 3 else {"acked": 1}
            out.append(_reply(MsgType.CONSUME, msg_id, payload if e[2] == Status.OK else {"error": "no"}, e[2]))
        elif e[0] == "stray":
            out.append(_reply(MsgType.PING, e[1], {}))
        elif e[0] == "push":
            out.append(encode_reply(PushType.DELIVER, 0, {"subscription": e[1], "messages": [1]}))
        elif e[0] == "end":
            out.append(_reply(0, 0, {"error": "bye"}, Status.LIMIT_EXCEEDED))
        else:
            out.append(e[1])
    return b"".join(out)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_events, st.lists(st.integers(1, 200), max_size=6))
def test_a_read_leaves_the_connection_as_the_python_loop_does(monkeypatch, events, cuts):
    cores = []
    for in_c in (True, False):
        core = ClientCore("test")
        ids = _requests(core)
        data = _bytes_of(events, ids)
        with monkeypatch.context() as mp:
            if not in_c:
                mp.setattr(connection, "_c_replies", None)
            done, at = [], 0
            for n in cuts + [len(data)]:
                chunk = data[at:at + n]
                at += len(chunk)
                if chunk:
                    done += core.receive_data(chunk)
        cores.append((done, _state(core)))
    assert cores[0] == cores[1]


# ---------------------------------------------------------------- a plain ack_many's tags
class _Queue:
    """What ``PlainQueueCalls._plain_tags`` reads of its handle."""

    _delivery_class = RemoteDelivery
    closed = False
    _plain_tags = None  # (set below: the method under test)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1), st.integers(0, 1)), max_size=6), st.booleans())
def test_a_plain_ack_manys_tags_are_pythons(monkeypatch, shape, a_tuple):
    """Deliveries of another class, handle or connection, or not a list: None, as Python's
    passes say; else the same tags."""
    from shmq.client import plain

    class Other(RemoteDelivery):
        __slots__ = ()

    cores, handles = [ClientCore("a"), ClientCore("b")], [_Queue(), _Queue()]
    for h in handles:
        h._broker = SimpleNamespace(_core=cores[0])
    ds = []
    for i, (other_class, h, c) in enumerate(shape):
        cls = Other if other_class else RemoteDelivery
        (d,) = cwire.leased(msgpack.packb({"messages": [[i + 1, 100 + i, b"x", 1, 1.0]]}), cls, handles[h], cores[c])
        ds.append(d)
    value = tuple(ds) if a_tuple else ds
    got = plain.PlainQueueCalls._plain_tags(handles[0], value, cores[0])
    monkeypatch.setattr(plain, "_c_tags", None)
    want = plain.PlainQueueCalls._plain_tags(handles[0], value, cores[0])
    assert got == want
