"""The error texts a server sends speak of the wire's types — msgpack's nil, bool, int, float,
str, bin, array, map, ext — never of the Python objects the codec made of them (NoneType,
bytes, list, dict, ExtType, a repr's b'...'), and say what is wrong (docs/PROTOCOL.md,
Errors). A real server gets a request with a value of each wrong type in each field of every
request type, and frames whose payload is not msgpack at all; every reply is read."""

import math
import re
import socket

import msgpack
import pytest

from shmq.protocol import REQUEST_FIELDS, FrameDecoder, MsgType, Status, encode_request, pack_header

# A value of each msgpack type (and of a few shapes) for each field; those its check refuses
# are sent.
BAD_VALUES = [None, True, False, 0, -1, 2**64 - 1, 1.5, math.nan, math.inf, "", "x", "1h", b"", b"x", b"\x00\xff",
              [], [None], [True], ["x"], [b"x"], [1.5], [[]], [[None, None]], [{}], [{"body": None}],
              [{"value": "x"}], [{"value": b"", "headers": {"k": None}}], [{"value": None, "headers": [["k", []]]}],
              {}, {"k": None}, {"k": []}, {"k": {}}, {"k": msgpack.ExtType(5, b"x")},
              msgpack.ExtType(5, b"x"), msgpack.Timestamp(1, 0), [msgpack.ExtType(5, b"")]]

# Good values to build each request from, so that the field under test is the one refused.
_GOOD = ["s", 1, 0, True, 1.5, b"\x00" * 16, [], [["s", 1]], ["s", 1, 0], None]

# Words of Python's, not msgpack's: a type's name, a constant, a repr's bytes prefix, the
# decoder's own words.
_PYTHON = re.compile(r"NoneType|\bNone\b|\bTrue\b|\bFalse\b|ExtType|Timestamp\(|\bdict\b|\blist\b|\btuple\b|"
                     r"bytearray|memoryview|\bb'|\bb\"|strict_map_key|unpack\(|Unpack failed|codec can't|"
                     r"unhashable|__|\bPython\b|(?<![\d] )\bbytes\b")


def python_words(text: str) -> list:
    """The Python words in an error text (``bytes`` only as a count's unit is English)."""
    return _PYTHON.findall(text)


def test_the_words_are_found_where_they_should_be():
    for text in ("must be bytes (msgpack bin), not 'x'", "not None", "holds NoneType", "a list of integers",
                 "not b'q'", "Unpack failed: incomplete input", "item 0 is bytes", "not True"):
        assert python_words(text), text
    for text in ("must be a msgpack bin, not a bin of 3 bytes", "a msgpack bin of 16 bytes", "not nil",
                 "frame payload of 20 bytes exceeds max_frame_bytes=16", "an array of integers (item 1 is bool)",
                 "not true", 'compression must be "zstd", not "lz4"', "bytes_used"):
        assert not python_words(text), text


def _good(check):
    return next(v for v in _GOOD if check(v) is None)


def malformed_requests():
    """(label, frame) of every request type with each refused value in each of its fields."""
    out, msg_id = [], 1
    for msg_type, fields in REQUEST_FIELDS.items():
        base = {f.name: _good(f.check) for f in fields if f.required}
        for f in fields:
            for value in BAD_VALUES:
                try:
                    if f.check(value) is None:
                        continue  # a value of a type it takes
                except Exception:
                    pass  # (a check that cannot even look at it refuses it: the server says so)
                out.append((f"{MsgType(msg_type).name}.{f.name}={value!r}", encode_request(msg_type, msg_id,
                                                                                        {**base, f.name: value})))
                msg_id += 1
    return out


# payloads that are not one msgpack map of str keys
BAD_PAYLOADS = [b"\xc1", b"\x82\xa5queue\xa1q\xa4body\xc4\x10abc", b"\x80\x80", b"\x81\xa5queue\xa2\xff\xfe",
                msgpack.packb([1, 2]), msgpack.packb("q"), msgpack.packb(None), msgpack.packb(1.5),
                msgpack.packb({1: "a"}), msgpack.packb({b"queue": "q"}, use_bin_type=True),
                msgpack.packb({"headers": {1: 2}}), b"\x81\x81\xa1a\x01\x01", b"\x81\x91\x01\x01", b"\x81\xc0\x01",
                b"\x81\xc3\x01", b"\x81\xca\x00\x00\x00\x00\x01", b"\x81\xd4\x05\x01\x01", b"\xdd\xff\xff\xff\xff",
                b"\xdf\xff\xff\xff\xff", b"\x81\xa1t\xdb\xff\xff\xff\xff", b"\x81\xa1t\xd5\xff\x00\x00",
                b"\x81\xa1t\xc7\x0c\xff" + b"\xff" * 4 + b"\x00" * 8, b"\x91" * 3000 + b"\x01", b"\x81\xa1", b"\xa1",
                msgpack.packb(msgpack.ExtType(3, b"ab")), msgpack.packb(msgpack.Timestamp(1, 0))]


def _replies(port, frames) -> list:
    """Send ``frames`` (pipelined) and read as many replies."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"".join(frames))
        dec, out = FrameDecoder(max_frame_bytes=1 << 24), []
        while len(out) < len(frames):
            chunk = s.recv(1 << 20)
            assert chunk, f"the server closed the connection after {len(out)} replies"
            dec.feed(chunk)
            out.extend(dec.frames())
    return out


def _check(labels, replies):
    bad = []
    for label, f in zip(labels, replies):
        error = f.payload.get("error")
        if f.status == Status.OK or not isinstance(error, str):
            bad.append(f"{label}: no error text ({f.status}, {f.payload!r:.80})")
        elif python_words(error) or error.rstrip().endswith(":") or not error.strip():
            bad.append(f"{label}: {error}")
    assert bad == [], "error texts in Python's words, or saying nothing:\n" + "\n".join(bad)


def test_ill_typed_fields_are_refused_in_msgpack_s_words(tcp_server):
    cases = malformed_requests()
    assert len(cases) > 1000
    replies = _replies(tcp_server.port, [frame for _, frame in cases])
    assert {f.status for f in replies} == {Status.BAD_REQUEST}
    _check([label for label, _ in cases], replies)


def test_payloads_msgpack_cannot_read_are_refused_saying_what_is_wrong(tcp_server):
    frames = [pack_header(len(p), MsgType.PRODUCE, 0, i) + p for i, p in enumerate(BAD_PAYLOADS, 1)]
    replies = _replies(tcp_server.port, frames)
    assert [f.msg_id for f in replies] == list(range(1, len(frames) + 1))
    assert {f.status for f in replies} == {Status.BAD_REQUEST}
    _check([p[:12].hex(" ") for p in BAD_PAYLOADS], replies)
    texts = [f.payload["error"] for f in replies]
    assert all(not t.startswith("malformed msgpack payload") or len(t) > len("malformed msgpack payload: ") + 10
               for t in texts)
    assert texts[0] == ("malformed msgpack payload: the byte 0xc1, which starts no msgpack value (msgpack never "
                        "uses it)")
    assert texts[2] == ("malformed msgpack payload: 1 byte after the first msgpack value: a payload is exactly one "
                        "map, as long as the frame says")
    assert texts[4] == "the payload must be a msgpack map, not array"
    assert texts[9] == "payload keys must be strings (msgpack str), not a bin of 5 bytes"


def test_what_a_handler_refuses_is_said_in_msgpack_s_words_too(tcp_server, broker):
    broker.create_stream("s", partitions=2).close()
    cases = [
        ("append_batch lz4", MsgType.APPEND_BATCH, {"stream": "s", "compression": "lz4", "data": b""}),
        ("append_batch garbage", MsgType.APPEND_BATCH, {"stream": "s", "compression": "zstd", "data": b"\x00" * 8}),
        ("join", MsgType.JOIN, {"stream": "s", "group": "g"}),
        ("seek", MsgType.SEEK, {"stream": "s", "member": 1, "partitions": [0, 1]}),
        ("consumer_remove", MsgType.CONSUMER_REMOVE, {"queue": "nope"}),
        ("clear", MsgType.CREATE, {"queue": "q", "update": True, "clear": ["lanes"]}),
    ]
    replies = _replies(tcp_server.port, [encode_request(t, i, p) for i, (_, t, p) in enumerate(cases, 1)])
    got = dict(zip([c[0] for c in cases], replies))
    member = got.pop("join").payload["member"]
    assert member
    _check(list(got), list(got.values()))


def test_the_error_of_a_seek_names_what_it_got(tcp_server, broker):
    broker.create_stream("s", partitions=2).close()
    with socket.create_connection(("127.0.0.1", tcp_server.port), timeout=30) as s:
        s.sendall(encode_request(MsgType.JOIN, 1, {"stream": "s", "group": "g"}))
        dec = FrameDecoder()
        while (f := dec.next_frame()) is None:
            dec.feed(s.recv(65536))
        s.sendall(encode_request(MsgType.SEEK, 2, {"stream": "s", "member": f.payload["member"], "partitions": [0]}))
        while (f := dec.next_frame()) is None:
            dec.feed(s.recv(65536))
    assert (f.status, f.payload["error"]) == (Status.BAD_REQUEST, (
        'a SEEK takes one partition and an offset, or partitions and to: "beginning" or "end", not partitions [0], '
        "offset nil, to nil"))


@pytest.mark.parametrize("value, said", [
    (None, "nil"), (True, "true"), (False, "false"), (-7, "-7"), (1.5, "1.5"), (math.nan, "NaN"),
    (-math.inf, "-Infinity"), ("a\"b", '"a\\"b"'), ("x" * 100, '"' + "x" * 37 + '..."'), (b"", "a bin of 0 bytes"),
    (b"q", "a bin of 1 byte"), ([1, 2], "an array of 2"), ({"a": 1}, "a map of 1"),
    (msgpack.ExtType(5, b"ab"), "an ext of type 5 (2 bytes)"), (msgpack.Timestamp(1, 0), "a timestamp (ext type -1)"),
])
def test_a_value_is_described_in_msgpack_s_words(value, said):
    from shmq.protocol.frames import describe, kind

    assert describe(value) == said
    assert kind(value) in ("nil", "bool", "int", "float", "str", "bin", "array", "map", "ext", "timestamp")
