"""The wire codec (shmq/protocol.py): framing, decoding errors, request validation.

Pure: no sockets, no processes, no sleeps. The Hypothesis properties hold the
decoder to its promise: it parses, or it raises ProtocolError.
"""

import dataclasses
import re

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq.errors import MessageTooLarge, ProtocolError
from shmq.protocol import compression
from shmq.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    MAGIC,
    REPLY_BIT,
    REQUEST_FIELDS,
    VERSION,
    Frame,
    FrameDecoder,
    MsgType,
    Status,
    encode_error,
    encode_frame,
    encode_reply,
    encode_request,
    pack_header,
    unpack_header,
    validate_request,
)
from shmq.protocol.requests import _walk, check_request

ALL_BYTES = bytes(range(256))
HEADERS = {"trace": "abc-123", "attempt": 3, "ratio": 0.5, "urgent": True, "sig": b"\x00\xff", "neg": -(2**63)}

STREAM_INFO = {"stream": "events", "partitions": 8, "max_bytes": 2**26, "max_message_bytes": 2**20,
               "retention": "drop", "retention_bytes": None, "retention_seconds": None, "group_idle_timeout": 300.0,
               "durability": "snapshot", "created_at": 1.7e9}

# A realistic request and reply payload for every type.
EXCHANGES = {
    MsgType.HELLO: (
        {"client": "shmq-py/0.1.0", "token": "s3cret"},
        {"server": "shmq", "version": "0.1.0", "max_frame_bytes": DEFAULT_MAX_FRAME_BYTES},
    ),
    MsgType.CREATE: (
        {
            "queue": "orders",
            "max_bytes": 64 * 2**20,
            "max_message_bytes": 2**20,
            "visibility_timeout_ms": 30_000,
            "max_deliveries": 5,
            "dead_letter_queue": "orders.dlq",
            "exist_ok": True,
            "priorities": 3,
            "message_ttl": 3600,
            "dedup_window": 300.0,
            "retry_delay": 0.5,
            "retry_backoff": 2.0,
            "retry_delay_max": 60.0,
            "priority_aging": None,
        },
        {},
    ),
    MsgType.DELETE: ({"queue": "orders"}, {}),
    MsgType.LIST: ({}, {"queues": ["orders", "orders.dlq", "q:π"]}),
    MsgType.STATS: (
        {"queue": "orders"},
        {
            "ready": 3,
            "in_flight": 1,
            "oldest_ready_age_ms": 1250,
            "bytes_used": 4096,
            "max_bytes": 64 * 2**20,
            "enqueued_total": 2**40,
            "acked_total": 2**40 - 4,
            "redelivered_total": 7,
            "dead_lettered_total": 0,
            "expired_total": 2,
            "ready_by_priority": [1, 0, 2],
            "groups_in_flight": 1,
            "dead_letter_depth": None,
        },
    ),
    MsgType.PURGE: ({"queue": "orders", "delayed": True}, {"purged": 12}),
    MsgType.PING: ({}, {}),
    MsgType.BACKUP: ({"dest": "/var/backups/shmq-π"}, {"dest": "/var/backups/shmq-π", "queues": 2, "messages": 95,
                                                     "streams": 1, "partitions": 4, "records": 1000, "log_files": 0,
                                                     "exchanges": 1, "bytes": 65536, "kafka_state": False,
                                                     "skipped": []}),
    MsgType.CONSUMER_ADD: ({"queue": "orders"}, {"consumers": 1}),
    MsgType.CONSUMER_REMOVE: ({"queue": "orders"}, {"consumers": 0}),
    MsgType.PRODUCE: ({"queue": "orders", "body": ALL_BYTES, "headers": HEADERS, "priority": 2, "delay_ms": 1500,
                       "ttl_ms": 60_000, "group": "customer-7", "dedup_id": "order-42"}, {"id": 2**63 + 5}),
    MsgType.PRODUCE_BATCH: (
        {
            "queue": "orders",
            "messages": [{"body": ALL_BYTES, "headers": HEADERS}, {"body": b""}, {"body": ALL_BYTES[::-1]}],
            "priority": 1,
            "delay_ms": 0,
            "ttl_ms": 2**32,
        },
        {"ids": [1, 2, 3]},
    ),
    MsgType.CONSUME: (
        {"queue": "orders", "max": 10, "wait_ms": 5000, "visibility_ms": 60_000},
        {
            "messages": [
                {"id": 1, "delivery": 2**64 - 1, "body": ALL_BYTES, "headers": HEADERS, "attempt": 1,
                 "enqueued_at": 1.7e9 + 0.125, "priority": 2, "group": "customer-7"},
                {"id": 2, "delivery": 17, "body": b"", "headers": {}, "attempt": 3, "enqueued_at": 1.7e9},
            ]
        },
    ),
    MsgType.ACK: ({"queue": "orders", "deliveries": [17, 2**64 - 1]}, {"acked": 2}),
    MsgType.NACK: ({"queue": "orders", "deliveries": [17], "requeue": False, "delay_ms": 250}, {}),
    MsgType.EXTEND: ({"queue": "orders", "deliveries": [17, 18], "visibility_ms": 90_000}, {}),
    MsgType.REJECT: ({"queue": "orders", "deliveries": [17]}, {}),
    MsgType.PEEK: (
        {"queue": "orders", "max": 2},
        {"messages": [{"id": 1, "body": ALL_BYTES, "headers": HEADERS, "attempt": 0, "enqueued_at": 1.7e9,
                       "priority": 2, "group": "customer-7"},
                      {"id": 2, "body": b"", "headers": {}, "attempt": 1, "enqueued_at": 1.7e9 + 1}]},
    ),
    MsgType.REDRIVE: ({"queue": "orders.dlq", "to": "orders", "max": 100}, {"redriven": 12}),
    MsgType.SUBSCRIBE: ({"queue": "orders", "prefetch": 100, "visibility_ms": 30000}, {"subscription": 3}),
    MsgType.CANCEL: ({"subscription": 3, "delivered": 41}, {"released": 7}),
    MsgType.STREAM_CREATE: (
        {"stream": "events", "partitions": 8, "max_bytes": 2**26, "max_message_bytes": 2**20, "retention": "drop",
         "retention_bytes": 2**30, "retention_seconds": 86400.5, "group_idle_timeout": 300.0,
         "durability": "snapshot", "exist_ok": True},
        STREAM_INFO,
    ),
    MsgType.STREAM_DELETE: ({"stream": "events"}, {}),
    MsgType.STREAM_LIST: ({}, {"streams": ["events", "clicks"]}),
    MsgType.STREAM_INFO: ({"stream": "events"}, STREAM_INFO),
    MsgType.STREAM_STATS: (
        {"stream": "events"},
        {"stream": "events", "retention": "drop", "durability": "snapshot",
         "partitions": [{"partition": 0, "earliest": 3, "end": 2**40, "bytes": 4096, "max_bytes": 2**26,
                         "appended_total": 2**40, "dropped_total": 3}],
         "groups": {"billing": {"members": 2, "lag": [[0, 5]], "committed": [[0, 2**40 - 5]]}}},
    ),
    MsgType.APPEND: (
        {"stream": "events", "value": ALL_BYTES, "key": b"user-1", "headers": HEADERS, "partition": 255},
        {"partition": 255, "offset": 2**63, "timestamp": 1.7e9 + 0.25},
    ),
    MsgType.APPEND_BATCH: (
        {"stream": "events", "records": [{"value": ALL_BYTES, "key": b"k", "headers": HEADERS}, {"value": b""},
                                         {"value": None, "key": b"k", "headers": [["a", b"1"], ["a", None]]}],
         "partition": 3},
        {"records": [[3, 10, 1.7e9], [3, 11, 1.7e9], [3, 12, 1.7e9]]},
    ),
    MsgType.READ: (
        {"stream": "events", "partition": 3, "offset": 10, "max": 100_000, "wait_ms": 5000},
        {"records": [{"partition": 3, "offset": 10, "value": ALL_BYTES, "key": b"k", "headers": HEADERS,
                      "timestamp": 1.7e9}, {"partition": 3, "offset": 11, "value": b"", "timestamp": 1.7e9},
                     {"partition": 3, "offset": 12, "value": None, "headers": [["a", b"1"], ["a", None]],
                      "timestamp": 1.7e9}]},
    ),
    MsgType.OFFSETS: ({"stream": "events", "partition": 0}, {"earliest": 0, "end": 2**64 - 1}),
    MsgType.PUBLISH: ({"stream": "out", "staging": "out:staging:q", "ranges": [[0, 0, 10, 20], [1, 1, 0, 5]],
                       "txn": bytes(range(16)), "batch": 3}, {"first": [[0, 100], [1, None]]}),
    MsgType.PUBLISHED: ({"stream": "out", "txn": bytes(range(16))}, {"published": [[0, 3], [1, -1]]}),
    MsgType.DELETE_RECORDS: ({"stream": "out", "offsets": [[0, 20]]}, {"deleted": 10}),
    MsgType.JOIN: ({"stream": "events", "group": "billing", "auto_offset_reset": "latest"},
                   {"member": 7, "partitions": [0, 2]}),
    MsgType.POLL: ({"stream": "events", "member": 7, "max": 500, "wait_ms": 1000}, {"records": []}),
    MsgType.POLL_MANY: ({"members": [["events", 7], ["audit", 8]], "max": 500, "wait_ms": 1000},
                        {"polls": [{"records": []}, {"records": [], "gone": True, "revoked": [[0, 3]]}]}),
    MsgType.COMMIT: ({"stream": "events", "member": 7, "offsets": [[0, 12], [2, 0]], "revoked": False}, {}),
    MsgType.LEAVE: ({"stream": "events", "member": 7}, {}),
    MsgType.SEEK: ({"stream": "events", "member": 7, "partitions": [0, 2], "to": "end"}, {}),
    MsgType.PAUSE: ({"stream": "events", "member": 7, "partitions": [2], "paused": True}, {"paused": [2]}),
    MsgType.ASSIGNMENT: ({"stream": "events", "member": 7}, {"partitions": [0, 2], "positions": [[0, 12], [2, 0]]}),
    MsgType.GROUPS: ({"stream": "events"}, {"groups": ["audit", "billing"]}),
    MsgType.COMMITTED: ({"stream": "events", "group": "billing"}, {"committed": [[0, 12]]}),
    MsgType.LAG: ({"stream": "events", "group": "billing"}, {"lag": [[0, 3], [1, 0]]}),
    MsgType.RESET: ({"stream": "events", "group": "billing", "offsets": [[0, 2]], "to": "earliest"}, {}),
    MsgType.TXN_INIT: ({"transactional_id": "etl-1", "timeout_ms": 60000}, {"producer_id": 1838686279461889,
                                                                            "epoch": 3}),
    MsgType.TXN_OFFSETS: ({"transactional_id": "etl-1", "producer_id": 1838686279461889, "epoch": 3,
                           "stream": "events", "group": "g", "member_id": 4, "generation": 9, "owned": [0, 2],
                           "offsets": [[0, 12], [2, 7]]}, {}),
    MsgType.TXN_END: ({"transactional_id": "etl-1", "producer_id": 1838686279461889, "epoch": 3, "commit": True}, {}),
    MsgType.X_CREATE: ({"exchange": "events", "type": "topic", "exist_ok": True}, {}),
    MsgType.X_DELETE: ({"exchange": "events"}, {}),
    MsgType.X_LIST: ({"exchange": "events"}, {"name": "events", "type": "topic", "bindings": [
        {"target": "audit", "kind": "queue", "pattern": "orders.#"}]}),
    MsgType.X_BIND: ({"exchange": "events", "target": "audit", "pattern": "orders.*"}, {}),
    MsgType.X_UNBIND: ({"exchange": "events", "target": "audit", "pattern": "orders.*"}, {"unbound": 1}),
    MsgType.X_PUBLISH: ({"exchange": "events", "body": ALL_BYTES, "routing_key": "orders.eu", "headers": HEADERS,
                         "dedup_id": "o-1"}, {"targets": 3}),
    MsgType.REQUEST: ({"queue": "rpc", "body": b"2+2", "headers": HEADERS, "timeout_ms": 5000},
                      {"body": b"4", "headers": {"k": "v"}}),
    MsgType.KV_OPEN: ({"store": "results"}, {}),
    MsgType.KV_LIST: ({}, {"stores": ["default", "results"]}),
    MsgType.KV_DROP: ({"store": "results"}, {"deleted": True}),
    MsgType.KV_SET: ({"store": "results", "key": "task-π", "value": ALL_BYTES, "ttl": 86400.0, "only_new": True},
                     {"set": True}),
    MsgType.KV_GET: ({"store": "results", "key": "task-π", "wait_ms": 5000}, {"value": ALL_BYTES}),
    MsgType.KV_GET_MANY: ({"store": "results", "keys": ["a", "b"]}, {"values": [b"1", None]}),
    MsgType.KV_DELETE: ({"store": "results", "keys": ["a", "b"]}, {"deleted": 1}),
    MsgType.KV_INCR: ({"store": "results", "key": "n", "by": -3, "ttl": None}, {"value": -2}),
    MsgType.KV_ADD: ({"store": "results", "key": "chord", "member": "t1", "ttl": 60}, {"size": 1}),
    MsgType.KV_MEMBERS: ({"store": "results", "key": "chord"}, {"members": ["t1", "t2"]}),
    MsgType.KV_EXPIRE: ({"store": "results", "key": "chord", "ttl": 0.5}, {"found": True}),
    MsgType.KV_TTL: ({"store": "results", "key": "chord"}, {"ttl": 0.25}),
    MsgType.KV_KEYS: ({"store": "results", "prefix": "celery-task-meta-"}, {"keys": ["celery-task-meta-1"]}),
    MsgType.KV_CLEAR: ({"store": "results"}, {"cleared": 3}),
    MsgType.KV_SWEEP: ({"store": "results"}, {"swept": 0}),
}


def decode_all(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> list:
    dec = FrameDecoder(max_frame_bytes)
    dec.feed(data)
    frames = list(dec.frames())
    assert dec.buffered == 0
    return frames


def decode_bytewise(data: bytes) -> list:
    dec = FrameDecoder()
    frames = []
    for i in range(len(data)):
        dec.feed(data[i : i + 1])
        frames.extend(dec.frames())
    assert dec.buffered == 0
    return frames


def all_exchanges(msg_id_base: int = 1) -> tuple[bytes, list]:
    """Every request and its reply, back to back, with the frames they should decode to."""
    data, expected = b"", []
    for i, (msg_type, (request, reply)) in enumerate(EXCHANGES.items()):
        msg_id = msg_id_base + i
        data += encode_request(msg_type, msg_id, request)
        data += encode_reply(msg_type, msg_id, reply)
        expected += [Frame(msg_type, msg_id, request), Frame(msg_type | REPLY_BIT, msg_id, reply)]
    return data, expected


def raises_protocol(dec: FrameDecoder) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        dec.next_frame()
    return info.value


# ---------------------------------------------------------------------------- framing


def test_exchanges_cover_every_type():
    assert set(EXCHANGES) == set(MsgType) == set(REQUEST_FIELDS)


def test_header_layout_is_network_order():
    header = pack_header(0x0102, MsgType.PRODUCE, 0, 0xA1B2C3D4)
    assert header == bytes.fromhex("DEADBEEF 00000102 10 01 0000 A1B2C3D4")
    assert unpack_header(header) == (MAGIC, 0x0102, 0x10, VERSION, 0, 0xA1B2C3D4)
    h = unpack_header(b"xx" + header, 2)
    assert (h.magic, h.length, h.type, h.version, h.status, h.msg_id) == (MAGIC, 0x102, 0x10, 1, 0, 0xA1B2C3D4)
    reply = pack_header(5, MsgType.CONSUME | REPLY_BIT, Status.QUEUE_FULL, 7, version=1)
    assert reply.hex() == "deadbeef000000059201000600000007"


def test_header_fields_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        pack_header(2**32, 1, 0, 1)
    with pytest.raises(ValueError, match="out of range"):
        encode_request(MsgType.PING, 2**32)
    with pytest.raises(ValueError, match="out of range"):
        encode_request(MsgType.PING, -1)
    with pytest.raises(ValueError, match="16 bytes"):
        unpack_header(b"\xde\xad\xbe\xef")


def test_empty_payload_is_zero_bytes():
    data = encode_request(MsgType.PING, 9)
    assert len(data) == HEADER_SIZE
    assert unpack_header(data).length == 0
    assert decode_all(data) == [Frame(MsgType.PING, 9, {})]
    assert encode_reply(MsgType.PING, 9) == encode_reply(MsgType.PING, 9, {}) == pack_header(0, 0x87, 0, 9)
    # an explicit msgpack empty map (0x80) decodes to {} as well
    assert decode_all(pack_header(1, MsgType.LIST, 0, 3) + b"\x80") == [Frame(MsgType.LIST, 3, {})]


@pytest.mark.parametrize("msg_type", list(MsgType), ids=lambda t: t.name)
def test_request_and_reply_round_trip(msg_type):
    request, reply = EXCHANGES[msg_type]
    data = encode_request(msg_type, 42, request) + encode_reply(msg_type, 42, reply)
    req_frame, reply_frame = decode_all(data)
    assert req_frame == Frame(msg_type, 42, request, status=0, version=VERSION)
    assert not req_frame.is_reply and req_frame.request_type == msg_type
    assert reply_frame == Frame(msg_type | REPLY_BIT, 42, reply)
    assert reply_frame.is_reply and reply_frame.request_type == msg_type
    assert reply_frame.type == msg_type | 0x80
    assert validate_request(req_frame) == request  # every field given: nothing added or dropped


def test_bodies_and_headers_keep_their_types():
    (frame,) = decode_all(encode_request(MsgType.PRODUCE, 1, EXCHANGES[MsgType.PRODUCE][0]))
    assert type(frame.payload["body"]) is bytes and frame.payload["body"] == ALL_BYTES
    assert frame.payload["headers"] == HEADERS
    assert type(frame.payload["headers"]["sig"]) is bytes
    assert type(frame.payload["headers"]["trace"]) is str
    assert frame.payload["headers"]["urgent"] is True
    # bin on the wire, not str: 0xc5 = bin 16 with a 2-byte length of 256
    assert b"\xc5\x01\x00" + ALL_BYTES in encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": ALL_BYTES})


def test_error_reply():
    data = encode_error(MsgType.STATS, 77, Status.NO_SUCH_QUEUE, "no queue 'nope'")
    (frame,) = decode_all(data)
    assert frame == Frame(MsgType.STATS | REPLY_BIT, 77, {"error": "no queue 'nope'"}, status=Status.NO_SUCH_QUEUE)
    assert frame.is_reply and frame.request_type == MsgType.STATS
    with pytest.raises(ValueError, match="non-zero status"):
        encode_error(MsgType.STATS, 1, Status.OK, "fine")


def test_encode_frame_needs_a_dict():
    with pytest.raises(TypeError, match="must be a dict"):
        encode_frame(Frame(MsgType.PING, 1, [1, 2]))
    frame = Frame(MsgType.ACK, 5, {"queue": "q", "deliveries": [1]}, status=0, version=1)
    assert decode_all(encode_frame(frame)) == [frame]


def test_byte_at_a_time_equals_whole():
    data, expected = all_exchanges()
    assert decode_all(data) == expected
    assert decode_bytewise(data) == expected


def test_partial_frames_wait_for_more():
    data = encode_request(MsgType.PRODUCE, 3, {"queue": "q", "body": b"x" * 100})
    dec = FrameDecoder()
    dec.feed(data[:7])
    assert dec.next_frame() is None
    assert dec.buffered == 7  # a stalled half header is visible
    dec.feed(data[7:HEADER_SIZE])
    assert dec.next_frame() is None
    assert dec.buffered == HEADER_SIZE
    dec.feed(data[HEADER_SIZE:-1])
    assert dec.next_frame() is None
    assert dec.buffered == len(data) - 1
    dec.feed(data[-1:] + data[:3])  # the end of one frame and the start of the next
    assert dec.next_frame() == Frame(MsgType.PRODUCE, 3, {"queue": "q", "body": b"x" * 100})
    assert dec.next_frame() is None
    assert dec.buffered == 3


def test_feed_accepts_bytes_like():
    data = encode_request(MsgType.PURGE, 8, {"queue": "q"})
    dec = FrameDecoder()
    dec.feed(bytearray(data[:10]))
    dec.feed(memoryview(data)[10:])
    assert list(dec.frames()) == [Frame(MsgType.PURGE, 8, {"queue": "q"})]


def test_large_frame_fed_one_byte_at_a_time():
    body = ALL_BYTES * 1024  # 256 KiB: quadratic buffering would take minutes
    data = encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": body}) + encode_request(MsgType.PING, 2)
    dec = FrameDecoder()
    frames = []
    for i in range(len(data)):
        dec.feed(data[i : i + 1])
        frames.extend(dec.frames())
    assert frames == [Frame(MsgType.PRODUCE, 1, {"queue": "q", "body": body}), Frame(MsgType.PING, 2, {})]
    assert dec.buffered == 0


def test_many_frames_in_one_chunk_compact_the_buffer():
    one = encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"y" * 1000})
    dec = FrameDecoder()
    dec.feed(one * 500 + one[:10])
    assert len(list(dec.frames())) == 500
    assert dec.buffered == 10
    assert len(dec._buf) < 100 * 1024  # consumed bytes were dropped, not kept


def test_frame_of_exactly_max_frame_bytes_is_accepted():
    data = encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"z" * 100})
    limit = len(data) - HEADER_SIZE
    assert len(decode_all(data, max_frame_bytes=limit)) == 1
    dec = FrameDecoder(max_frame_bytes=limit - 1)
    dec.feed(data)
    assert raises_protocol(dec).status == Status.TOO_LARGE


def test_max_frame_bytes_must_be_an_int():
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes=-1)
    with pytest.raises(ValueError):
        FrameDecoder(max_frame_bytes="big")


# ----------------------------------------------------------------------------- errors


def test_bad_magic_is_fatal_bad_frame():
    dec = FrameDecoder()
    dec.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    err = raises_protocol(dec)
    assert (err.status, err.fatal, err.msg_id) == (Status.BAD_FRAME, True, 0)
    assert "bad magic 0x47455420" in str(err)
    assert err.msg_type == 0
    # the decoder stays failed and holds nothing more
    dec.feed(encode_request(MsgType.PING, 1))
    assert dec.buffered == 0
    assert raises_protocol(dec) is err


def test_bad_magic_needs_only_the_header():
    dec = FrameDecoder()
    dec.feed(b"\x00" * 15)
    assert dec.next_frame() is None
    dec.feed(b"\x00")
    assert raises_protocol(dec).status == Status.BAD_FRAME


def test_huge_length_is_too_large_after_exactly_16_bytes():
    header = pack_header(2**32 - 1, MsgType.PRODUCE, 0, 0x01020304)
    dec = FrameDecoder()  # 16 MiB
    dec.feed(header[:15])
    assert dec.next_frame() is None
    dec.feed(header[15:])
    err = raises_protocol(dec)
    assert (err.status, err.fatal, err.msg_id, err.msg_type) == (Status.TOO_LARGE, True, 0x01020304, MsgType.PRODUCE)
    assert "4294967295" in str(err) and str(DEFAULT_MAX_FRAME_BYTES) in str(err)
    assert dec.buffered == 0 and len(dec._buf) == 0  # nothing allocated for the payload
    dec.feed(b"\x00" * 4096)
    assert dec.buffered == 0
    assert raises_protocol(dec).status == Status.TOO_LARGE


def test_other_version_is_skipped_and_the_stream_goes_on():
    payload = {"queue": "q", "body": b"v2 body"}
    v2 = encode_frame(Frame(MsgType.PRODUCE, 5, payload, version=2))
    after = encode_request(MsgType.PING, 6)
    dec = FrameDecoder()
    dec.feed(v2 + after)
    err = raises_protocol(dec)
    assert (err.status, err.fatal, err.msg_id, err.msg_type) == (Status.UNSUPPORTED_VERSION, False, 5, MsgType.PRODUCE)
    assert "version 2" in str(err)
    assert list(dec.frames()) == [Frame(MsgType.PING, 6, {})]
    assert dec.buffered == 0


def test_other_version_payload_arriving_later_is_skipped_unbuffered():
    v2 = pack_header(10_000, MsgType.PRODUCE, 0, 5, version=2) + b"\xc1" * 10_000  # 0xc1: never valid msgpack
    after = encode_request(MsgType.PING, 6)
    dec = FrameDecoder()
    dec.feed(v2[:20])
    assert raises_protocol(dec).status == Status.UNSUPPORTED_VERSION
    assert dec.next_frame() is None
    for i in range(20, len(v2), 1000):
        dec.feed(v2[i : i + 1000])
        assert dec.buffered == 0  # the rest of the rejected frame is dropped as it comes
        assert dec.next_frame() is None
    dec.feed(after[:5])
    assert dec.next_frame() is None
    dec.feed(after[5:])
    assert dec.next_frame() == Frame(MsgType.PING, 6, {})


def test_other_version_tail_and_next_frame_in_one_chunk():
    v2 = pack_header(6, MsgType.ACK, 0, 1, version=0) + b"abcdef"
    after = encode_request(MsgType.ACK, 2, {"queue": "q", "deliveries": [3]})
    dec = FrameDecoder()
    dec.feed(v2[:18])
    assert raises_protocol(dec).status == Status.UNSUPPORTED_VERSION
    dec.feed(v2[18:] + after)
    assert list(dec.frames()) == [Frame(MsgType.ACK, 2, {"queue": "q", "deliveries": [3]})]


BAD_PAYLOADS = {
    "not msgpack": b"\xc1",
    "truncated bin": b"\x82\xa5queue\xa1q\xa4body\xc4\x10abc",
    "two objects": b"\x80\x80",
    "bad utf-8 str": b"\x81\xa5queue\xa2\xff\xfe",
    "a list": msgpack.packb([1, 2, 3]),
    "a str": msgpack.packb("queue"),
    "nil": msgpack.packb(None),
    "int keys": msgpack.packb({1: "a"}),
    "bin keys": msgpack.packb({b"queue": "q"}, use_bin_type=True),
    "nested int keys": msgpack.packb({"headers": {1: 2}}),
    "map key is a map": b"\x81\x81\xa1a\x01\x01",
    "huge declared array": b"\xdd\xff\xff\xff\xff",
    "bad timestamp length": b"\x81\xa1t\xd5\xff\x00\x00",
    "bad timestamp nanoseconds": b"\x81\xa1t\xc7\x0c\xff" + b"\xff" * 4 + b"\x00" * 8,
}


@pytest.mark.parametrize("payload", BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_bad_payload_is_bad_request_and_the_stream_goes_on(payload):
    data = pack_header(len(payload), MsgType.PRODUCE, 0, 0xCAFE) + payload + encode_request(MsgType.PING, 0xCAFF)
    dec = FrameDecoder()
    dec.feed(data)
    err = raises_protocol(dec)
    assert (err.status, err.fatal, err.msg_id, err.msg_type) == (Status.BAD_REQUEST, False, 0xCAFE, MsgType.PRODUCE)
    assert dec.next_frame() == Frame(MsgType.PING, 0xCAFF, {})
    assert dec.next_frame() is None and dec.buffered == 0


def test_bad_payload_messages_are_readable():
    def error_for(payload):
        dec = FrameDecoder()
        dec.feed(pack_header(len(payload), MsgType.STATS, 0, 1) + payload)
        return str(raises_protocol(dec))

    assert "must be a msgpack map, not array" in error_for(BAD_PAYLOADS["a list"])
    assert "keys must be strings (msgpack str), not a bin of 5 bytes" in error_for(BAD_PAYLOADS["bin keys"])
    assert "malformed msgpack payload: the byte 0xc1" in error_for(BAD_PAYLOADS["not msgpack"])


# ------------------------------------------------------------------------- validation


def bad_request(msg_type, payload, msg_id=11, **frame_args) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        validate_request(Frame(msg_type, msg_id, payload, **frame_args))
    err = info.value
    assert (err.status, err.fatal, err.msg_id) == (Status.BAD_REQUEST, False, msg_id)
    return err


def test_defaults_are_filled_in():
    assert validate_request(Frame(MsgType.CONSUME, 1, {"queue": "q"})) == {"queue": "q", "max": 1, "wait_ms": 0}
    assert validate_request(Frame(MsgType.NACK, 1, {"queue": "q", "deliveries": [4]})) == {
        "queue": "q",
        "deliveries": [4],
        "requeue": True,
    }  # no delay_ms: the queue's retry policy
    assert validate_request(Frame(MsgType.PEEK, 1, {"queue": "q"})) == {"queue": "q", "max": 10}
    assert validate_request(Frame(MsgType.REDRIVE, 1, {"queue": "dlq"})) == {"queue": "dlq"}
    assert validate_request(Frame(MsgType.PRODUCE, 1, {"queue": "q", "body": b""})) == {"queue": "q", "body": b""}
    assert validate_request(Frame(MsgType.CREATE, 1, {"queue": "q"})) == {"queue": "q", "exist_ok": False}
    assert validate_request(Frame(MsgType.PING, 1, {})) == {}
    assert validate_request(Frame(MsgType.HELLO, 1, {})) == {}


def test_unknown_fields_are_ignored_and_dropped():
    frame = Frame(MsgType.PURGE, 1, {"queue": "q", "future_option": [1, {"x": None}]})
    assert validate_request(frame) == {"queue": "q"}
    frame = Frame(MsgType.PRODUCE_BATCH, 1, {"queue": "q", "messages": [{"body": b"a", "priority": 9}]})
    assert validate_request(frame) == {"queue": "q", "messages": [{"body": b"a"}]}


def test_validate_does_not_change_the_frame():
    payload = {"queue": "q", "extra": 1}
    validate_request(Frame(MsgType.CONSUME, 1, payload))
    assert payload == {"queue": "q", "extra": 1}


def test_missing_queue():
    for msg_type in (MsgType.CREATE, MsgType.DELETE, MsgType.STATS, MsgType.PURGE, MsgType.PRODUCE, MsgType.CONSUME):
        err = bad_request(msg_type, {"body": b"x"})
        assert str(err) == f"{msg_type.name}: missing required field 'queue'"


def test_missing_required_fields():
    assert "missing required field 'body'" in str(bad_request(MsgType.PRODUCE, {"queue": "q"}))
    assert "missing required field 'messages'" in str(bad_request(MsgType.PRODUCE_BATCH, {"queue": "q"}))
    assert "missing required field 'deliveries'" in str(bad_request(MsgType.ACK, {"queue": "q"}))
    err = bad_request(MsgType.EXTEND, {"queue": "q", "deliveries": [1]})
    assert "missing required field 'visibility_ms'" in str(err)


@pytest.mark.parametrize(
    "msg_type, payload, field, words",
    [
        (MsgType.CONSUME, {"queue": "q", "max": True}, "max", "a positive integer, not true"),
        (MsgType.CONSUME, {"queue": "q", "max": 0}, "max", "a positive integer, not 0"),
        (MsgType.CONSUME, {"queue": "q", "max": 1.0}, "max", "a positive integer"),
        (MsgType.CONSUME, {"queue": "q", "wait_ms": -1}, "wait_ms", "a non-negative integer, not -1"),
        (MsgType.CONSUME, {"queue": "q", "wait_ms": False}, "wait_ms", "a non-negative integer, not false"),
        (MsgType.CONSUME, {"queue": "q", "visibility_ms": "1000"}, "visibility_ms", "a non-negative integer"),
        (MsgType.PRODUCE, {"queue": "q", "body": "text"}, "body", "a msgpack bin, not \"text\""),
        (MsgType.PRODUCE, {"queue": b"q", "body": b"x"}, "queue", "a string, not a bin of 1 byte"),
        (MsgType.PRODUCE, {"queue": 7, "body": b"x"}, "queue", "a string, not 7"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "headers": [1]}, "headers", "a map"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "headers": {b"k": 1}}, "headers", "string keys"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "headers": {"k": [1]}}, "headers", "holds array"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "headers": {"k": None}}, "headers", "holds nil"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": {"body": b"x"}}, "messages", "an array of maps"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [b"x", {"body": b"y"}]}, "messages", "item 0 is bin"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [{"body": b"x"}, {}]}, "messages", "item 1 has none"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [{"body": "x"}]},
         "messages", "body is a msgpack bin (item 0: str)"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [{"body": b"", "headers": 3}]}, "messages", "headers are"),
        (MsgType.ACK, {"queue": "q", "deliveries": 5}, "deliveries", "an array of integers, not 5"),
        (MsgType.ACK, {"queue": "q", "deliveries": [5, True]}, "deliveries", "item 1 is bool"),
        (MsgType.ACK, {"queue": "q", "deliveries": [5, "6"]}, "deliveries", "item 1 is str"),
        (MsgType.NACK, {"queue": "q", "deliveries": [1], "requeue": 1}, "requeue", "a boolean, not 1"),
        (MsgType.NACK, {"queue": "q", "deliveries": [1], "delay_ms": -5}, "delay_ms", "a non-negative integer"),
        (MsgType.EXTEND, {"queue": "q", "deliveries": [1], "visibility_ms": None}, "visibility_ms", "not nil"),
        (MsgType.CREATE, {"queue": "q", "max_bytes": 0}, "max_bytes", "a positive integer"),
        (MsgType.CREATE, {"queue": "q", "exist_ok": "yes"}, "exist_ok", "a boolean"),
        (MsgType.CREATE, {"queue": "q", "dead_letter_queue": 1}, "dead_letter_queue", "a string"),
        (MsgType.CREATE, {"queue": "q", "priorities": 2.0}, "priorities", "an integer, not 2.0"),
        (MsgType.CREATE, {"queue": "q", "priorities": True}, "priorities", "an integer, not true"),
        (MsgType.CREATE, {"queue": "q", "message_ttl": "1h"},
         "message_ttl", "a msgpack float or int, or nil, not \"1h\""),
        (MsgType.CREATE, {"queue": "q", "dedup_window": None}, "dedup_window", "a msgpack float or int, not nil"),
        (MsgType.CREATE, {"queue": "q", "retry_delay": False}, "retry_delay", "a msgpack float or int, not false"),
        (MsgType.CREATE, {"queue": "q", "retry_backoff": [2]},
         "retry_backoff", "a msgpack float or int, not an array of 1"),
        (MsgType.CREATE, {"queue": "q", "retry_delay_max": b"1"},
         "retry_delay_max", "a msgpack float or int, or nil, not a bin of 1 byte"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "priority": "high"}, "priority", "an integer, not \"high\""),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "priority": 1.0}, "priority", "an integer"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "delay_ms": -1}, "delay_ms", "a non-negative integer"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "delay_ms": 0.5}, "delay_ms", "a non-negative integer"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "ttl_ms": -5}, "ttl_ms", "a non-negative integer, not -5"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "group": 7}, "group", "a string, not 7"),
        (MsgType.PRODUCE, {"queue": "q", "body": b"x", "dedup_id": 42},
         "dedup_id", "a string or a msgpack bin, not 42"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [], "priority": None}, "priority", "an integer"),
        (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [], "ttl_ms": "1"}, "ttl_ms", "a non-negative"),
        (MsgType.PEEK, {"max": 1}, "queue", None),
        (MsgType.PEEK, {"queue": "q", "max": 0}, "max", "a positive integer, not 0"),
        (MsgType.REDRIVE, {"queue": "q", "to": 5}, "to", "a string, not 5"),
        (MsgType.REDRIVE, {"queue": "q", "max": -1}, "max", "a positive integer, not -1"),
        (MsgType.SUBSCRIBE, {"queue": "q"}, "prefetch", None),
        (MsgType.SUBSCRIBE, {"queue": "q", "prefetch": 0}, "prefetch", "a positive integer, not 0"),
        (MsgType.CANCEL, {"subscription": "1"}, "subscription", "a positive integer, not \"1\""),
        (MsgType.CANCEL, {"subscription": 1, "delivered": -1}, "delivered", "a non-negative integer, not -1"),
        (MsgType.HELLO, {"token": b"s3cret"}, "token", "a string"),
        (MsgType.STREAM_CREATE, {"queue": "events"}, "stream", None),
        (MsgType.STREAM_CREATE, {"stream": "s", "partitions": "4"}, "partitions", "an integer, not \"4\""),
        (MsgType.STREAM_CREATE, {"stream": "s", "max_bytes": 1.5}, "max_bytes", "an integer, not 1.5"),
        (MsgType.STREAM_CREATE, {"stream": "s", "retention_seconds": True},
         "retention_seconds", "a msgpack float or int, not true"),
        (MsgType.STREAM_CREATE, {"stream": "s", "retention": 1}, "retention", "a string"),
        (MsgType.APPEND, {"stream": "s", "value": "text"}, "value",
         "a msgpack bin, or nil (a tombstone), not \"text\""),
        (MsgType.APPEND, {"stream": "s", "value": None, "headers": [["a"]]}, "headers",
         "an array of [string key, value] pairs (found [\"a\"])"),
        (MsgType.APPEND, {"stream": "s", "value": None, "headers": [["a", []]]}, "headers", "key \"a\" holds array"),
        (MsgType.APPEND, {"stream": "s", "value": b"x", "key": "k"}, "key", "a msgpack bin, not \"k\""),
        (MsgType.APPEND, {"stream": "s", "value": b"x", "partition": -1}, "partition", "an integer 0..255, not -1"),
        (MsgType.APPEND, {"stream": "s", "value": b"x", "partition": 256}, "partition", "an integer 0..255"),
        (MsgType.APPEND, {"stream": "s", "value": b"x", "partition": True}, "partition", "an integer 0..255, not true"),
        (MsgType.APPEND, {"stream": "s", "value": b"x", "headers": {"k": [1]}}, "headers", "holds array"),
        (MsgType.APPEND_BATCH, {"stream": "s", "records": {"value": b"x"}}, "records", "an array of maps"),
        (MsgType.APPEND_BATCH, {"stream": "s", "records": [b"x"]}, "records", "item 0 is bin"),
        (MsgType.APPEND_BATCH, {"stream": "s", "records": [{"value": b"x"}, {}]}, "records", "item 1 has none"),
        (MsgType.APPEND_BATCH, {"stream": "s", "records": [{"value": "x"}]}, "records", "value is a msgpack bin"),
        (MsgType.APPEND_BATCH, {"stream": "s", "records": [{"value": b"", "key": 1}]},
         "records", "key is a msgpack bin"),
        (MsgType.APPEND_BATCH, {"stream": "s", "records": [{"value": b"", "headers": 3}]}, "records", "headers are"),
        (MsgType.APPEND_BATCH, {"stream": "s", "data": "zstd"}, "data", "a msgpack bin, not \"zstd\""),
        (MsgType.READ, {"stream": "s", "offset": 0}, "partition", None),
        (MsgType.READ, {"stream": "s", "partition": 0}, "offset", None),
        (MsgType.READ, {"stream": "s", "partition": 0, "offset": -1}, "offset", "a non-negative integer, not -1"),
        (MsgType.READ, {"stream": "s", "partition": 0, "offset": 0, "max": 0}, "max", "an integer 1..100000, not 0"),
        (MsgType.READ, {"stream": "s", "partition": 0, "offset": 0, "max": 100_001}, "max", "an integer 1..100000"),
        (MsgType.READ, {"stream": "s", "partition": 0, "offset": 0, "wait_ms": -1}, "wait_ms", "a non-negative"),
        (MsgType.OFFSETS, {"stream": "s", "partition": "0"}, "partition", "an integer 0..255, not \"0\""),
        (MsgType.PUBLISH, {"stream": "s", "staging": "t", "ranges": [[0, 0, 5, 4]], "txn": bytes(16), "batch": 0},
         "ranges", "end offset >= first] arrays (item 0 is [0, 0, 5, 4])"),
        (MsgType.PUBLISH, {"stream": "s", "staging": "t", "ranges": [], "txn": b"short", "batch": 0},
         "txn", "a msgpack bin of 16 bytes, not a bin of 5 bytes"),
        (MsgType.DELETE_RECORDS, {"stream": "s", "offsets": [[0, -1]]}, "offsets", "offset >= 0] pairs"),
        (MsgType.JOIN, {"stream": "s", "group": b"g"}, "group", "a string, not a bin of 1 byte"),
        (MsgType.JOIN, {"stream": "s", "group": "g", "auto_offset_reset": None},
         "auto_offset_reset", "a string, not nil"),
        (MsgType.POLL, {"stream": "s", "member": 0}, "member", "a positive integer, not 0"),
        (MsgType.POLL, {"stream": "s", "member": 1, "max": 10**6}, "max", "an integer 1..100000"),
        (MsgType.COMMIT, {"stream": "s", "member": 1, "offsets": {"0": 1}}, "offsets", "an array of [partition"),
        (MsgType.COMMIT, {"stream": "s", "member": 1, "offsets": [[0, -1]]}, "offsets", "item 0 is [0, -1]"),
        (MsgType.COMMIT, {"stream": "s", "member": 1, "offsets": [[0, 1, 2]]}, "offsets", "item 0"),
        (MsgType.COMMIT, {"stream": "s", "member": 1, "offsets": [[300, 1]]}, "offsets", "item 0"),
        (MsgType.RESET, {"stream": "s", "group": "g", "to": 5}, "to", "a string, not 5"),
        (MsgType.SEEK, {"stream": "s", "member": 1, "partitions": [0, 300]}, "partitions", "an array of partitions"),
        (MsgType.PAUSE, {"stream": "s", "member": 1, "paused": 1}, "paused", "a boolean"),
        (MsgType.POLL_MANY, {"members": []}, "members", "an array of 1..4096 [stream name, member id >= 1] pairs"),
        (MsgType.POLL_MANY, {"members": [["s", 1], ["s", 0]]}, "members", "item 1 is [\"s\", 0])"),
        (MsgType.LAG, {"stream": "s"}, "group", None),
        (MsgType.TXN_INIT, {}, "transactional_id", None),
        (MsgType.TXN_INIT, {"transactional_id": "t", "timeout_ms": 0}, "timeout_ms", "a positive integer"),
        (MsgType.TXN_END, {"transactional_id": "t", "producer_id": 1, "epoch": 0}, "commit", None),
        (MsgType.TXN_OFFSETS, {"transactional_id": "t", "producer_id": -1, "epoch": 0, "stream": "s"},
         "producer_id", "a non-negative integer"),
        (MsgType.APPEND, {"stream": "s", "value": b"", "txn": ["t", 1]}, "txn",
         "[transactional id (a string), producer id >= 0, epoch >= 0]"),
        (MsgType.KV_SET, {"store": "s", "key": "k"}, "value", None),
        (MsgType.KV_SET, {"store": "s", "key": "k", "value": "text"}, "value", "a msgpack bin, not \"text\""),
        (MsgType.KV_SET, {"store": "s", "key": 1, "value": b""}, "key", "a string, not 1"),
        (MsgType.KV_SET, {"store": "s", "key": "k", "value": b"", "ttl": "1h"},
         "ttl", "a msgpack float or int, or nil, not \"1h\""),
        (MsgType.KV_SET, {"store": "s", "key": "k", "value": b"", "only_new": 1}, "only_new", "a boolean"),
        (MsgType.KV_GET, {"key": "k"}, "store", None),
        (MsgType.KV_GET, {"store": "s", "key": "k", "wait_ms": -1}, "wait_ms", "a non-negative integer"),
        (MsgType.KV_GET_MANY, {"store": "s", "keys": ["a", 2]}, "keys", "an array of strings"),
        (MsgType.KV_DELETE, {"store": "s", "keys": "a"}, "keys", "an array of strings, not \"a\""),
        (MsgType.KV_INCR, {"store": "s", "key": "n", "by": 1.5}, "by", "an integer, not 1.5"),
        (MsgType.KV_ADD, {"store": "s", "key": "c"}, "member", None),
        (MsgType.KV_EXPIRE, {"store": "s", "key": "c"}, "ttl", None),
        (MsgType.KV_KEYS, {"store": "s", "prefix": None}, "prefix", "a string, not nil"),
    ],
)
def test_ill_typed_fields(msg_type, payload, field, words):
    message = str(bad_request(msg_type, payload))
    if words is None:  # a required field left out
        assert message == f"{msg_type.name}: missing required field {field!r}"
        return
    assert message.startswith(f"{msg_type.name}: field {field!r} must be ")
    assert words in message


def test_long_bad_values_are_shortened_in_messages():
    message = str(bad_request(MsgType.PRODUCE, {"queue": "q", "body": "x" * 10_000}))
    assert len(message) < 120
    message = str(bad_request(MsgType.ACK, {"queue": "q", "deliveries": {"a": 1}}))
    assert "not a map of 1" in message


def test_unknown_type_and_replies_are_bad_requests():
    err = bad_request(0x55, {"queue": "q"})
    assert str(err) == "type 0x55 is an unknown request type"
    assert err.msg_type == 0x55
    err = bad_request(MsgType.PING | REPLY_BIT, {})
    assert str(err) == "type 0x87 is a reply"


def test_requests_carry_status_zero():
    err = bad_request(MsgType.PING, {}, status=Status.INTERNAL)
    assert "status must be 0" in str(err)


def test_validate_after_decode():
    data, expected = all_exchanges()
    for frame in decode_all(data):
        if not frame.is_reply:
            assert validate_request(frame) == frame.payload
        else:
            with pytest.raises(ProtocolError):
                validate_request(frame)


# ------------------------------------------------------------------------- properties

HYPOTHESIS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HYPOTHESIS_STRUCTURED = settings(HYPOTHESIS, max_examples=100)  # generating nested values costs more

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=12,
)
payloads = st.dictionaries(st.text(max_size=12), msgpack_values, max_size=6)
frames = st.builds(
    Frame,
    type=st.integers(0, 255),
    msg_id=st.integers(0, 2**32 - 1),
    payload=payloads,
    status=st.integers(0, 2**16 - 1),
)


def chunked(data, cuts):
    """``data`` split at the (sorted) offsets in ``cuts``."""
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def drain(dec: FrameDecoder, out: list) -> bool:
    """next_frame until None; only Frames or ProtocolError allowed. False once fatal."""
    while True:
        try:
            frame = dec.next_frame()
        except ProtocolError as err:
            assert err.status in set(Status) and err.status != Status.OK
            if err.fatal:
                return False
            continue
        if frame is None:
            return True
        assert isinstance(frame, Frame) and isinstance(frame.payload, dict)
        assert all(isinstance(k, str) for k in frame.payload)
        out.append(frame)
        try:
            assert isinstance(validate_request(frame), dict)
        except ProtocolError as err:
            assert (err.status, err.fatal) == (Status.BAD_REQUEST, False)


def feed_and_drain(data, cuts, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES) -> list:
    dec = FrameDecoder(max_frame_bytes)
    out = []
    alive = True
    for chunk in chunked(data, cuts):
        dec.feed(chunk)
        alive = drain(dec, out)
        if not alive:
            break
    if not alive:  # a failed decoder keeps failing the same way
        with pytest.raises(ProtocolError) as info:
            dec.next_frame()
        assert info.value.fatal
    return out


@HYPOTHESIS
@given(data=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 2000), max_size=20))
def test_any_bytes_parse_or_raise_protocol_error(data, cuts):
    feed_and_drain(data, cuts)
    feed_and_drain(data, cuts, max_frame_bytes=64)


valid_headers = st.builds(
    lambda length, t, v, s, m: pack_header(length, t, s, m, version=v),
    length=st.integers(0, 400),
    t=st.sampled_from(list(MsgType)) | st.integers(0, 255),
    v=st.sampled_from([1, 1, 1, 2, 0, 255]),
    s=st.integers(0, 2**16 - 1),
    m=st.integers(0, 2**32 - 1),
)


@HYPOTHESIS
@given(
    parts=st.lists(
        st.tuples(valid_headers, st.binary(max_size=400) | payloads.map(lambda p: msgpack.packb(p, use_bin_type=True))),
        min_size=1,
        max_size=6,
    ),
    cuts=st.lists(st.integers(0, 5000), max_size=30),
)
def test_valid_headers_then_random_bytes_parse_or_raise_protocol_error(parts, cuts):
    data = b"".join(header + tail for header, tail in parts)
    feed_and_drain(data, cuts)
    feed_and_drain(data, cuts, max_frame_bytes=100)


@HYPOTHESIS_STRUCTURED
@given(
    requests=st.lists(
        st.builds(
            Frame,
            type=st.sampled_from(list(MsgType)),
            msg_id=st.integers(0, 2**32 - 1),
            payload=st.dictionaries(
                st.sampled_from(sorted({f.name for fields in REQUEST_FIELDS.values() for f in fields}))
                | st.text(max_size=5),
                msgpack_values,
                max_size=6,
            ),
        ),
        max_size=5,
    )
)
def test_validate_request_returns_a_dict_or_raises_bad_request(requests):
    for frame in requests:
        try:
            checked = validate_request(frame)
        except ProtocolError as err:
            assert (err.status, err.fatal, err.msg_id) == (Status.BAD_REQUEST, False, frame.msg_id)
            continue
        names = {f.name for f in REQUEST_FIELDS[frame.type]}
        assert set(checked) <= names
        assert all(checked[k] == v for k, v in frame.payload.items() if k in names and k not in ("messages", "records"))


# Candidate values for request fields: for each field of a type, a test draws one its
# check takes (most often), or any of these, or leaves the field out.
_CANDIDATES = ("q", "", b"", b"x" * 16, True, False, 0, 1, 7, -1, 2**40, 1.5, None, [], [3, 4], [True], [[0, 5]],
               [[0, 1, 0, 3]], [[0, 1, 4, 3]], [{"body": b"x"}, {"body": b"y", "headers": {"k": 1}}], [{"body": "s"}],
               [{"value": b"v", "key": b"k"}], {"trace": "t", "n": 1}, {"bad": [1]}, "earliest", "fanout")


@st.composite
def request_parts(draw):
    """(type, msg_id, payload, status): a known request type mostly (else any byte,
    replies included); each of its fields absent, a value its check takes, or any
    candidate; unknown fields too; status 0 mostly."""
    msg_type = draw(st.sampled_from(sorted(REQUEST_FIELDS)) if draw(st.integers(0, 9)) else st.integers(0, 255))
    payload = {}
    for field in REQUEST_FIELDS.get(msg_type, ()):
        how = draw(st.integers(0, 9))
        good = [v for v in _CANDIDATES if field.check(v) is None]
        if how < 7 and good:
            payload[field.name] = draw(st.sampled_from(good))
        elif how < 9:
            payload[field.name] = draw(st.sampled_from(_CANDIDATES) | msgpack_values)
    payload.update(draw(st.dictionaries(st.text(max_size=5), msgpack_values, max_size=2)))
    status = 0 if draw(st.integers(0, 9)) else draw(st.integers(1, 2**16 - 1))
    return msg_type, draw(st.integers(0, 2**32 - 1)), payload, status


def _verdict(check, parts):
    try:
        return "ok", check(*parts)
    except ProtocolError as err:
        return "bad", err.status, err.fatal, err.msg_id, err.msg_type, str(err)


@settings(HYPOTHESIS, max_examples=600)
@given(parts=request_parts())
def test_the_per_request_check_agrees_with_the_walk_of_the_table(parts):
    """``check_request`` (what the server runs per request: the payload's fields checked
    as they come) and ``_walk`` (REQUEST_FIELDS in order, which names the first bad
    field) give the same fields, or the same BAD_REQUEST, word for word."""
    assert _verdict(check_request, parts) == _verdict(_walk, parts)


def test_the_per_request_check_agrees_on_the_hot_requests():
    ok = [(MsgType.PING, {}), (MsgType.PRODUCE, {"queue": "q", "body": b"x", "priority": 2, "future": 1}),
          (MsgType.PRODUCE_BATCH, {"queue": "q", "messages": [{"body": b"a", "headers": {"h": 1}, "x": 0}]}),
          (MsgType.CONSUME, {"queue": "q", "max": 5, "wait_ms": 0}), (MsgType.ACK, {"queue": "q", "deliveries": [7]}),
          (MsgType.NACK, {"queue": "q", "deliveries": [7, 8], "delay_ms": 0})]
    for msg_type, payload in ok:
        parts = (msg_type, 3, payload, 0)
        assert _verdict(check_request, parts) == _verdict(_walk, parts) == ("ok", validate_request(Frame(*parts)))
    bad = [(MsgType.PRODUCE, {"queue": 1, "body": 2}, "PRODUCE: field 'queue' must be a string, not 1"),
           (MsgType.PRODUCE, {"body": True}, "PRODUCE: missing required field 'queue'"),
           (MsgType.CONSUME, {"queue": "q", "max": 0}, "CONSUME: field 'max' must be a positive integer, not 0"),
           (MsgType.ACK, {"queue": "q", "deliveries": [True]},
            "ACK: field 'deliveries' must be an array of integers (item 0 is bool), not an array of 1"),
           (MsgType.NACK, {"queue": "q", "deliveries": [1], "requeue": 1},
            "NACK: field 'requeue' must be a boolean, not 1")]
    for msg_type, payload, message in bad:
        for check in (check_request, _walk):
            with pytest.raises(ProtocolError, match=f"^{re.escape(message)}$"):
                check(msg_type, 3, payload, 0)


@given(value=st.text(max_size=5) | st.binary(max_size=5) | st.booleans())
def test_a_check_passes_every_value_of_the_type_it_is_marked_to_pass(value):
    marked = {f.check for fields in REQUEST_FIELDS.values() for f in fields if hasattr(f.check, "passes")}
    assert {c.passes for c in marked} == {str, bytes, bool}
    for check in marked:
        if type(value) is check.passes:
            assert check(value) is None


@HYPOTHESIS_STRUCTURED
@given(frame_list=st.lists(frames, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=40))
def test_any_frames_round_trip_in_any_chunking(frame_list, cuts):
    data = b"".join(encode_frame(f) for f in frame_list)
    dec = FrameDecoder()
    out = []
    for chunk in chunked(data, cuts):
        dec.feed(chunk)
        out.extend(dec.frames())
    assert out == frame_list
    assert dec.buffered == 0


def test_the_codec_makes_the_bytes_of_docs_protocol_md_s_produce_example():
    """The aside of docs/PROTOCOL.md says the codec makes its PRODUCE example's bytes."""
    from tests.test_protocol_doc import DOC, blocks

    (block,) = [b for b in blocks(DOC.read_text()) if b.name == "produce"]
    assert encode_request(MsgType.PRODUCE, 7, {"queue": "orders", "body": b"hello"}) == block.sent
    assert list(encode_reply(MsgType.PRODUCE, 7, {"id": 1})) == block.answer
    text = DOC.read_text()
    assert 'encode_request(MsgType.PRODUCE, 7, {"queue": "orders", "body": b"hello"})' in text
    assert 'encode_reply(MsgType.PRODUCE, 7, {"id": 1})' in text


# ------------------------------------------------------------------ compressed batches


@pytest.mark.skipif(compression.zstandard is None, reason="zstandard is not installed")
def test_compressed_records_round_trip_and_are_bounded_whatever_the_frame_claims():
    records = [{"value": ALL_BYTES, "key": b"k", "headers": HEADERS}, {"value": b""}]
    data = compression.compress(records, "zstd")
    assert compression.decompress(data, "zstd", 10_000) == records
    bomb = compression.zstandard.ZstdCompressor().compress(b"\x00" * 2**24)  # says 16 MiB in its header
    assert len(bomb) < 1000
    with pytest.raises(MessageTooLarge, match="decompress to at most 4096 bytes"):
        compression.decompress(bomb, "zstd", 4096)
    with pytest.raises(ValueError, match="compressed data cannot be read"):
        compression.decompress(b"\x28\xb5\x2f\xfd" + b"\xff" * 20, "zstd", 4096)
    with pytest.raises(ValueError, match="not a msgpack array of records: the byte 0xc1"):
        compression.decompress(compression.zstandard.ZstdCompressor().compress(b"\xc1"), "zstd", 4096)
    with pytest.raises(ValueError, match='compression must be "zstd", not "gzip"'):
        compression.decompress(data, "gzip", 4096)


# ------------------------------------------------------------------- work-queue forms (issue 13)
def test_a_put_s_options_are_left_out_at_their_defaults():
    from shmq.protocol.payloads import put_args, put_fields

    assert put_fields() == {} and put_fields(0, 0.0, None, None, None) == {}
    fields = put_fields(priority=2, delay=1.5, ttl=60, group="g", dedup_id=b"id")
    assert fields == {"priority": 2, "delay_ms": 1500, "ttl_ms": 60_000, "group": "g", "dedup_id": b"id"}
    assert put_args(fields) == {"priority": 2, "delay": 1.5, "ttl": 60.0, "group": "g", "dedup_id": b"id"}
    assert put_args({"queue": "q", "body": b""}) == {}  # the engine's defaults
    assert put_fields(ttl=0.0001) == {"ttl_ms": 1} and put_fields(ttl=0) == {"ttl_ms": 0}  # 0: the engine refuses
    plain = encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"x", **put_fields()})
    assert plain == encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"x"})  # no bigger than before
    for kwargs, error, match in [({"priority": "1"}, TypeError, "priority must be an int"),
                                 ({"priority": True}, TypeError, "priority must be an int"),
                                 ({"delay": -1}, ValueError, "delay must be >= 0"),
                                 ({"ttl": "1"}, TypeError, "ttl must be a number"),
                                 ({"group": 1}, TypeError, "group must be a str"),
                                 ({"dedup_id": 1}, TypeError, "dedup_id must be str or bytes")]:
        with pytest.raises(error, match=match):
            put_fields(**kwargs)


def test_create_fields_carry_the_options_and_their_nils():
    from shmq.protocol.payloads import create_args, create_fields

    fields = create_fields("q", 4096, None, 30, None, None, False, priorities=3, message_ttl=None, priority_aging=None,
                           retry_backoff=2.0)
    assert {k: fields[k] for k in ("priorities", "message_ttl", "priority_aging", "retry_backoff")} == {
        "priorities": 3, "message_ttl": None, "priority_aging": None, "retry_backoff": 2.0}
    checked = validate_request(Frame(MsgType.CREATE, 1, fields))
    args = create_args(checked)
    assert (args["priorities"], args["message_ttl"], args["priority_aging"], args["retry_backoff"]) == (3, None, None,
                                                                                                         2.0)
    assert "dedup_window" not in create_args(validate_request(Frame(MsgType.CREATE, 1, {"queue": "q"})))
    with pytest.raises(TypeError, match="message_ttl must be a number of seconds, not '1h'"):
        create_fields("q", 4096, None, 30, None, None, False, message_ttl="1h")
    with pytest.raises(TypeError, match="unexpected keyword argument 'priority'"):
        create_fields("q", 4096, None, 30, None, None, False, priority=1)


def test_stats_of_an_older_server_read_with_defaults():
    from shmq.protocol.payloads import stats_fields, stats_from_fields

    old = dict(EXCHANGES[MsgType.STATS][1])
    for key in ("expired_total", "ready_by_priority", "groups_in_flight", "dead_letter_depth"):
        del old[key]
    s = stats_from_fields(old)
    assert (s.expired_total, s.ready_by_priority, s.groups_in_flight, s.dead_letter_depth) == (0, (3,), 0, None)
    new = stats_from_fields(EXCHANGES[MsgType.STATS][1])
    assert (new.ready_by_priority, new.dead_letter_depth) == ((1, 0, 2), None)
    assert stats_from_fields(msgpack.unpackb(msgpack.packb(stats_fields(new)))) == new  # a tuple again


def test_peeked_and_consumed_messages_carry_priority_enqueued_at_and_group():
    from shmq.engine.queues.delivery import Message
    from shmq.protocol.payloads import message_from_fields, peeked_fields

    m = Message(id=3, body=b"b", headers={"k": 1}, attempt=1, priority=2, enqueued_at=1.7e9, group="g", queue="q")
    assert message_from_fields("q", peeked_fields(m)) == m
    plain = dataclasses.replace(m, priority=0, group=None)
    assert sorted(peeked_fields(plain)) == ["attempt", "body", "enqueued_at", "headers", "id"]  # defaults left out
    assert message_from_fields("q", peeked_fields(plain)) == plain
