"""shmq.kafka, sans-IO: frames, requests, record batches, codecs, headers, SASL — and
the parser's promise (any bytes: a result or KafkaProtocolError), fuzzed."""

import gzip
import io
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_writer

from shmq.kafka import ErrorCode, FrameDecoder, KafkaProtocolError, frame, parse_request
from shmq.kafka.compression import CODECS, compress, decompress
from shmq.kafka.headers import to_kafka, to_native
from shmq.model.headers import decode_headers, encode_record_headers, header_pairs
from shmq.kafka import records as records_module
from shmq.kafka.records import Record, decode_batches, encode_batch
from shmq.kafka.sasl import parse_plain
from shmq.server.kafka.handlers import VERSIONS
from shmq.server.kafka.produce import Sequences


def _metadata_request(topics=("a", "b")) -> bytes:
    out = io.BytesIO()
    entity_writer(RequestHeader)(out, RequestHeader(request_api_key=3, request_api_version=12, correlation_id=7,
                                                    client_id="me"))
    entity_writer(MetadataRequest)(out, MetadataRequest(topics=tuple(MetadataRequestTopic(name=t, topic_id=None)
                                                                     for t in topics),
                                                        allow_auto_topic_creation=True,
                                                        include_topic_authorized_operations=False))
    return out.getvalue()


def test_frames_fed_one_byte_at_a_time():
    data = frame(b"abc") + frame(b"") + frame(b"x" * 300)
    d, got = FrameDecoder(1000), []
    for i in range(len(data)):
        d.receive_data(data[i:i + 1])
        while (f := d.next_frame()) is not None:
            got.append(f)
    assert got == [b"abc", b"", b"x" * 300]
    assert d.buffered == 0


def test_scan_tells_the_open_frame_and_the_frames_ended_one_byte_at_a_time():
    """What the frame timeout reads: bytes of a frame still open, frames made whole since
    the last scan, whether frames are taken meanwhile or not."""
    data = frame(b"abc") + frame(b"") + frame(b"x" * 70_000) + frame(b"yz")
    ends = {7, 11, 70_015, 70_021}  # where each frame ends in ``data``
    for take in (False, True):
        d, ended, got = FrameDecoder(100_000), 0, []
        for i in range(len(data)):
            d.receive_data(data[i:i + 1])
            open_bytes, n = d.scan()
            start = max([e for e in ends if e <= i + 1], default=0)
            assert (open_bytes, n) == (i + 1 - start, int(i + 1 in ends)), i
            ended += n
            while take and (f := d.next_frame()) is not None:
                got.append(f)
        assert ended == 4 and d.scan() == (0, 0)
        assert got == ([b"abc", b"", b"x" * 70_000, b"yz"] if take else [])


def test_a_frame_over_the_limit_is_refused_at_its_size():
    d = FrameDecoder(100)
    d.receive_data(struct.pack(">i", 101))
    with pytest.raises(KafkaProtocolError, match="a frame of 101 bytes; this port takes 0..100"):
        d.next_frame()
    d = FrameDecoder(100)
    d.receive_data(struct.pack(">i", -5))
    with pytest.raises(KafkaProtocolError, match="a frame of -5 bytes"):
        d.next_frame()


def test_a_request_parses_with_its_header():
    req = parse_request(_metadata_request(), VERSIONS)
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (3, 12, 7, "me")
    assert [t.name for t in req.body.topics] == ["a", "b"]


def test_unsupported_versions_and_keys_say_what_to_answer():
    data = bytearray(_metadata_request())
    struct.pack_into(">h", data, 2, 99)
    with pytest.raises(KafkaProtocolError, match="Metadata v99 is not supported here") as e:
        parse_request(bytes(data), VERSIONS)
    assert (e.value.code, e.value.request) == (ErrorCode.unsupported_version, (3, 99, 7))
    struct.pack_into(">hh", data, 0, 24, 0)  # AddPartitionsToTxn: not served
    with pytest.raises(KafkaProtocolError, match="AddPartitionsToTxn v0 is not supported here"):
        parse_request(bytes(data), VERSIONS)


def test_a_request_cut_short_does_not_parse():
    with pytest.raises(KafkaProtocolError, match="Metadata v12: the request does not parse"):
        parse_request(_metadata_request()[:-3], VERSIONS)
    with pytest.raises(KafkaProtocolError, match="too short for a request header"):
        parse_request(b"\x00\x03", VERSIONS)


RECORDS = [Record(5 + i, 1_700_000_000_000 + 3 * i, b"k%d" % i if i % 3 else None, b"value %d" % i * (i + 1),
                  (("h", b"1"), ("h", None))) for i in range(40)]


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_record_batches_round_trip_with_every_codec(codec):
    data = encode_batch(RECORDS, CODECS[codec], producer_id=9, producer_epoch=1, base_sequence=3)
    (b,) = decode_batches(data, 2**20)
    assert b.records == RECORDS
    assert (b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence) == (9, 1, 3, 42)
    assert b.attributes & 7 == CODECS[codec]


def test_a_wrong_crc_is_a_corrupt_message():
    data = bytearray(encode_batch(RECORDS))
    data[-1] ^= 1
    with pytest.raises(KafkaProtocolError, match="a record batch with a wrong CRC-32C") as e:
        decode_batches(bytes(data), 2**20)
    assert e.value.code == ErrorCode.corrupt_message


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_is_bounded(codec):
    bomb = compress(CODECS[codec], bytes(10 * 2**20))
    with pytest.raises(KafkaProtocolError, match=f"a {codec} batch that decompresses to more than 65536 bytes"):
        decompress(CODECS[codec], bomb, 65536)
    assert decompress(CODECS[codec], bomb, 10 * 2**20) == bytes(10 * 2**20)


def test_snappy_raw_and_gzip_as_other_clients_write_them():
    import snappy

    assert decompress(CODECS["snappy"], snappy.compress(b"raw" * 100), 1000) == b"raw" * 100
    assert decompress(CODECS["gzip"], gzip.compress(b"g" * 100), 1000) == b"g" * 100
    with pytest.raises(KafkaProtocolError, match="a zstd batch that does not decompress"):
        decompress(CODECS["zstd"], b"not zstd at all", 1000)


def test_headers_both_ways():
    """Kafka's headers keep their shape: a dict when it can hold them, else every pair in
    order (a repeated key, a null value), and back to Kafka as they came."""
    kafka = (("a", b"1"), ("a", b"2"), ("n", None), ("e", b""))
    assert to_native(kafka) == [("a", b"1"), ("a", b"2"), ("n", None), ("e", b"")]
    assert to_kafka(to_native(kafka)) == kafka
    assert to_native((("b", b"2"), ("a", b""))) == {"b": b"2", "a": b""}
    assert list(to_native((("b", b"2"), ("a", b"")))) == ["b", "a"]  # in order
    assert to_native((("n", None),)) == [("n", None)]
    assert to_native(()) is None
    assert to_kafka({"s": "é", "b": b"\x00", "i": -3, "f": 0.25, "t": True}) == \
        (("s", "é".encode()), ("b", b"\x00"), ("i", b"-3"), ("f", b"0.25"), ("t", b"true"))
    assert to_kafka([("a", "x"), ("a", 1), ("n", None)]) == (("a", b"x"), ("a", b"1"), ("n", None))


def test_sasl_plain():
    assert parse_plain(b"\0user\0pass") == ("user", "pass")
    assert parse_plain(b"authz\0user\0") == ("user", "")
    with pytest.raises(KafkaProtocolError, match="authzid NUL user NUL password"):
        parse_plain(b"userpass")


def test_idempotent_sequences():
    seq = Sequences()
    pid, epoch = seq.init(-1, -1)
    assert seq.init(pid, epoch) == (pid, epoch + 1)
    key = (pid, "t", 1.0, 0)
    assert seq.check(key, 0, 0, 4) is None
    seq.record(key, 0, 0, 4, 100)
    assert seq.check(key, 0, 0, 4) == 100  # a retry: the first offset again, nothing appended
    with pytest.raises(KafkaProtocolError, match="sequence 7 where 5 was expected") as e:
        seq.check(key, 0, 7, 9)
    assert e.value.code == ErrorCode.out_of_order_sequence_number
    assert seq.check(key, 0, 5, 9) is None
    with pytest.raises(KafkaProtocolError, match="sequence 3 from a producer") as e:
        seq.check((pid + 1, "t", 1.0, 0), 0, 3, 3)
    assert e.value.code == ErrorCode.unknown_producer_id
    seq.record(key, 1, 0, 0, 200)  # a new epoch starts at 0
    with pytest.raises(KafkaProtocolError, match="producer epoch 0 is older than 1") as e:
        seq.check(key, 0, 1, 1)
    assert e.value.code == ErrorCode.invalid_producer_epoch


# ---------------------------------------------------------------------------- the parser's promise
VALID = [_metadata_request(), encode_batch(RECORDS), encode_batch(RECORDS, CODECS["gzip"])]


def _mutate(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for pos, value in edits:
        if b:
            b[pos % len(b)] = value
    return bytes(b)


def _with_crc(data: bytes) -> bytes:
    """A mutated batch with its CRC made right again: the parse goes past the check."""
    from crc32c import crc32c

    if len(data) < 61:
        return data
    b = bytearray(data)
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID[1:]), st.lists(st.tuples(st.integers(21, 10**6), st.integers(0, 255)), min_size=1,
                                            max_size=4))
def test_batches_mutated_past_their_crc_decode_or_raise(data, edits):
    try:
        decode_batches(_with_crc(_mutate(data, edits)), 2**16)
    except KafkaProtocolError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=512),
                 st.tuples(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                            max_size=6), st.integers(0, 4096))
                 .map(lambda t: _mutate(t[0], t[1])[:len(t[0]) - t[2] % 8 if t[2] % 3 == 0 else None])))
def test_any_bytes_parse_or_raise_kafka_protocol_error(data):
    d = FrameDecoder(4096)
    d.receive_data(frame(data) if len(data) % 2 else data)
    try:
        while d.next_frame() is not None:
            pass
    except KafkaProtocolError:
        pass
    assert d.buffered <= len(data) + 4
    for parse in (lambda: parse_request(data, VERSIONS), lambda: decode_batches(data, 2**16)):
        try:
            parse()
        except KafkaProtocolError:
            pass


# ---------------------------------------------------------------------------- the records' C twin
def _records_part(records) -> tuple[bytes, int, int]:
    """(the records part, count, base timestamp) of an uncompressed batch of ``records``."""
    data = encode_batch(records)
    count, base_ts = struct.unpack_from(">i", data, 57)[0], struct.unpack_from(">q", data, 27)[0]
    return data[61:], count, base_ts


def _decoded(decode, buf, count, base_ts):
    """What ``decode`` (a twin) makes of the records: the columns, or the error's words."""
    try:
        return decode(buf, count, base_ts)
    except KafkaProtocolError as e:
        assert e.code == ErrorCode.corrupt_message
        return str(e)


def _both(buf, count, base_ts):
    """The Python twin's and the C one's outcome (ValueError's words: records.py makes them
    KafkaProtocolError with "a record batch " before them)."""
    py = _decoded(records_module._decode_records_py, buf, count, base_ts)
    try:
        c = records_module._c.decode_records(buf, count, base_ts)
    except ValueError as e:
        c = f"a record batch {e}"
    return py, c


_needs_c = pytest.mark.skipif(records_module._c is None, reason="the records' C twin is not built "
                                                                 "(or SHMQ_PURE_PYTHON is set)")
_VARINT_EDGES = st.sampled_from([0, 1, -1, 63, 64, -64, -65, 8191, 8192, 2**31 - 1, -2**31, 2**61, -2**61])
_FIELD = st.one_of(st.none(), st.binary(max_size=300))


@_needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_VARINT_EDGES | st.integers(-2**40, 2**40), _FIELD, _FIELD,
                          st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=20)), max_size=3)),
                min_size=1, max_size=30), st.integers(0, 2**40))
def test_the_c_records_twin_reads_what_the_python_one_reads(rows, base):
    """Records of every shape (no key, empty key, tombstones, headers with None values,
    timestamps far from the base, lengths of one, two and more varint bytes) decode alike."""
    records = [Record(i, base + dt, k, v, tuple(h)) for i, (dt, k, v, h) in enumerate(rows)]
    buf, count, base_ts = _records_part(records)
    py, c = _both(buf, count, base_ts)
    assert not isinstance(py, str) and py == c
    assert [list(x) for x in c] == [[r.timestamp for r in records], list(range(len(records))),
                                    [r.key for r in records], [r.value for r in records],
                                    [r.headers for r in records]]


def _varint_bytes(n: int) -> bytes:
    """A zigzag varint of any size (long ones: what a client that lies sends)."""
    z, out = (n << 1) ^ (n >> 127) if n < 0 else n << 1, bytearray()
    z &= (1 << 140) - 1
    while True:
        out.append((z & 0x7F) | (0x80 if z >> 7 else 0))
        z >>= 7
        if not z:
            return bytes(out)


_LONG_VARINTS = st.sampled_from([2**62, -2**62 - 1, 2**63, -2**63 - 1, 2**68, 2**69 - 1, -2**69, 2**69, 2**70])


@_needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=200).map(lambda b: (b, None)),
    st.tuples(st.sampled_from([RECORDS[:3], RECORDS[10:12], RECORDS]),
              st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
              st.integers(0, 9)).map(lambda t: (_mutate(_records_part(t[0])[0], t[1]), len(t[0]) + t[2] - 4)),
    st.lists((st.integers(-2**75, 2**75) | _LONG_VARINTS).map(_varint_bytes), max_size=12).map(lambda vs: (b"".join(vs), None))),
    st.integers(0, 40), st.integers(-2**63, 2**63 - 1))
def test_the_c_records_twin_fails_as_the_python_one_on_any_bytes(case, count, base_ts):
    """Random bytes, mutated records, counts that lie and varints of up to 11 bytes (past
    64 bits): the same columns or the same error's words, and never a crash."""
    buf, said = case
    n = max(said, 0) if said is not None else count
    py, c = _both(buf, n, base_ts)
    assert py == c


_HEADER_KEYS = st.text(max_size=8)  # (UTF-8 of any code point: surrogates refused by both twins alike)


@_needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_VARINT_EDGES | st.integers(-2**40, 2**40), _FIELD, _FIELD,
                          st.lists(st.tuples(_HEADER_KEYS, st.none() | st.binary(max_size=20)), max_size=3)),
                min_size=1, max_size=30), st.integers(0, 2**40), st.integers(0, 2**40))
def test_the_c_records_twin_writes_what_the_python_one_writes(rows, base, first):
    """encode_batch's records part, byte for byte, for records of every shape; and read back."""
    records = [Record(first + i * 3, base + dt, k, v, tuple(h)) for i, (dt, k, v, h) in enumerate(rows)]

    def written(encode):
        try:
            return bytes(encode(records, first, records[0].timestamp))
        except UnicodeEncodeError as e:  # a lone surrogate in a header key
            return type(e)

    c = written(records_module._c.encode_records)
    assert c == written(records_module._encode_records_py)
    if type(c) is bytes:
        (b,) = decode_batches(encode_batch(records), 2**20)
        assert b.records == records


@_needs_c
@pytest.mark.parametrize("bad", [[object()], [Record(0, 0, "str key", b"v")], [Record(0, 0, None, b"v", ((1, b""),))],
                                 [Record(0, 0, None, b"v", (("k", 5),))], [Record(2**63 - 1, 0, None, b"v")], None])
def test_the_c_records_twin_refuses_what_is_not_records(bad):
    """Not a Record, a key that is not bytes, a header that is not (str, bytes): a TypeError
    (or OverflowError), never a crash or a batch."""
    with pytest.raises((TypeError, AttributeError, OverflowError)):
        records_module._c.encode_records(bad, -1 if bad and type(bad[0]) is Record and bad[0].offset else 0, 0)


def _native_column(column, headers):
    """``column``'s (data, offsets), or the type of what it raised."""
    try:
        data, offsets = column(headers)
        return data, offsets.tolist()
    except Exception as e:  # noqa: BLE001 - the twins must fail alike
        return type(e)


_HEADER_VALUE = st.one_of(st.none(), st.binary(max_size=40),
                          st.sampled_from([255, 256, 65535, 65536, 70000]).map(lambda n: b"v" * n))
_HEADER_KEY = st.one_of(st.text(max_size=6), st.sampled_from(["k", "a"]), st.sampled_from([31, 32, 255, 256, 300])
                        .map(lambda n: "é" * (n // 2) + "x" * (n % 2)))


@_needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.just(()), st.lists(st.tuples(_HEADER_KEY, _HEADER_VALUE), min_size=1, max_size=20)
                          .map(tuple)), min_size=1, max_size=12))
@example([tuple((f"k{i}", b"v") for i in range(20)), (), tuple((f"k{i % 3}", b"v") for i in range(18))])  # 16 on
def test_the_c_headers_column_is_the_python_ones(headers):
    """A Produce's headers as the native column (map or array form, repeated keys, null
    values, str8/16 keys, bin8/16/32 values, 16 headers and more, over the 64 KiB limit):
    C's bytes and offsets, or the Python twin's error where C leaves it to Python."""
    from shmq.kafka.headers import native_column, native_column_py

    got = _native_column(native_column, headers)
    assert got == _native_column(native_column_py, headers)
    if type(got) is tuple:
        assert records_module._c.headers_column(headers, 2**16) is not None or any(
            len(encode_record_headers(to_native(h))) > 2**16 for h in headers if h)


@_needs_c
@pytest.mark.parametrize("bad", [[None], [(("k", "str value"),)], [((b"k", b"v"),)], [(("k", b"v", 1),)], [[]]])
def test_the_c_headers_column_leaves_what_is_not_kafka_headers_to_python(bad):
    assert records_module._c.headers_column(bad, 2**16) is None


def _stored_as_kafka(raw):
    """What the Python twin makes of stored headers ``raw``, or the type of what it raised."""
    try:
        return to_kafka(decode_headers(raw))
    except Exception as e:  # noqa: BLE001 - the C twin must then leave it to Python
        return type(e)


_NATIVE_VALUE = st.one_of(st.none(), st.binary(max_size=20), st.text(max_size=20), st.integers(-2**63, 2**63),
                          st.booleans(), st.floats(allow_nan=False),
                          st.sampled_from([300, 5000]).map(lambda n: b"v" * n))  # (stored: 64 KiB in all)


@_needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.dictionaries(_HEADER_KEY, _NATIVE_VALUE.filter(lambda v: v is not None), min_size=1, max_size=20)
    .map(lambda h: (encode_record_headers(h), True)),
    st.lists(st.tuples(_HEADER_KEY, _NATIVE_VALUE), min_size=1, max_size=20)
    .map(lambda h: (encode_record_headers(h), True)),
    st.binary(min_size=1, max_size=60).map(lambda b: (b, False)),
    st.tuples(st.lists(st.tuples(_HEADER_KEY, st.none() | st.binary(max_size=9)), min_size=1, max_size=5)
              .map(encode_record_headers), st.lists(st.tuples(st.integers(0, 99), st.integers(0, 255)), max_size=3))
    .map(lambda t: (_mutate(t[0], t[1]), False))))
@example((bytes([0x82, 0xa1, 0x6b, 0xc4, 1, 0x31, 0xa1, 0x6b, 0xc4, 1, 0x32]), False))  # a key twice in a map
@example((bytes([0x91, 0x92, 0xa1, 0x6b, 0xc0]) + b"\0", False))  # bytes after the headers
@example((msgpack.packb({"k": b"v" * 70000, "s": "x" * 70000}, use_bin_type=True), False))  # bin32, str32
def test_the_c_stored_headers_twin_reads_what_the_python_one_reads(case):
    """Stored headers (maps, pair lists with nulls and repeated keys, values of every native
    type, random and mutated bytes) as Kafka's pairs: C's equal the Python twin's, or C
    leaves them to it (ints, floats and bools are written by ``repr``; anything it would
    refuse). Headers a native append stored whose values are null, bytes or str, C reads."""
    from shmq.kafka.headers import stored_to_kafka

    raw, stored = case
    c = records_module._c.kafka_headers(raw)
    want = _stored_as_kafka(raw)
    if c is not None:
        assert c == want
    assert _stored_as_kafka(raw) == (stored_to_kafka(raw) if type(want) is tuple else want)
    if stored and all(v is None or type(v) in (bytes, str) for _k, v in header_pairs(decode_headers(raw))):
        assert c is not None  # (what C reads, it reads itself)
