"""Producers' timestamps (CreateTime) kept through a real ``shmq server --kafka-port``:
what a Kafka consumer, a native reader and ListOffsets by time see; the topic config
that says so; and the batches kept as producers sent them (``batches.Batches``), served
to fetches exactly as records encoded anew would be."""

import datetime
import struct
import time

import pytest
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from shmq.kafka.records import Record, decode_batches, encode_batch
from shmq.server.kafka.batches import Batches
from tests.kafka.groups_wire import Wire, fetch_records, produce
from tests.kafka.test_configs import KAFKA_DEFAULTS, TAKEN_NOT_KEPT

PAST = 1_600_000_000_000  # 2020-09-13, in ms: no clock gives this by chance
STAMPS = [PAST + 5_000, PAST, PAST + 10_000, PAST + 2_000, PAST + 2_000]  # not in offset order
CREATE_TOPICS, LIST_OFFSETS = 19, 2
SECONDS_30 = datetime.timedelta(seconds=30)


def _native_ms(broker, topic, n):
    rows = broker.stream(topic).read_raw(0, 0, 100)
    assert len(rows) == n
    assert all(ts_ns % 1_000_000 == 0 for _o, ts_ns, _k, _h, _v in rows)  # ms, as produced: exact
    return [ts_ns // 1_000_000 for _o, ts_ns, _k, _h, _v in rows]


@pytest.mark.slow
def test_confluent_kafka_timestamps_seen_by_consumers_native_readers_and_list_offsets(kafka_server, broker):
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer, TopicPartition

    srv = kafka_server()
    p = Producer({"bootstrap.servers": srv.bootstrap, "linger.ms": 50})
    reports = []
    for i, ts in enumerate(STAMPS):
        p.produce("ts", value=b"v%d" % i, timestamp=ts, partition=0,
                  on_delivery=lambda err, m: reports.append((err, m.offset(), m.timestamp())))
    assert p.flush(30) == 0
    assert sorted(reports) == [(None, i, (TIMESTAMP_CREATE_TIME, ts)) for i, ts in enumerate(STAMPS)]
    assert _native_ms(broker, "ts", 5) == STAMPS
    assert [r.timestamp for r in broker.stream("ts").read(0, 0, 10)] == [ts / 1000 for ts in STAMPS]

    c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("ts", 0, 0)])
        got, deadline = [], time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.offset(), m.value(), m.timestamp()))
        assert got == [(i, b"v%d" % i, (TIMESTAMP_CREATE_TIME, ts)) for i, ts in enumerate(STAMPS)]
        # the first offset stamped at or after each time, in offset order (Kafka's time index)
        asked = [PAST - 1, PAST + 1, PAST + 5_001, PAST + 10_000, PAST + 10_001]
        found = [c.offsets_for_times([TopicPartition("ts", 0, t)], 30)[0].offset for t in asked]
        assert found == [0, 0, 2, 2, -1]
    finally:
        c.close()


@pytest.mark.slow
def test_kafka_python_timestamps_are_create_time(kafka_server, broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    srv = kafka_server()
    p = KafkaProducer(bootstrap_servers=srv.bootstrap, linger_ms=50)
    metas = [p.send("kt", value=b"v%d" % i, timestamp_ms=ts, partition=0) for i, ts in enumerate(STAMPS)]
    p.flush(30)
    assert [(m.get(timeout=1).offset, m.get(timeout=1).timestamp) for m in metas] == list(enumerate(STAMPS))
    p.close()
    assert _native_ms(broker, "kt", 5) == STAMPS
    c = KafkaConsumer(bootstrap_servers=srv.bootstrap, enable_auto_commit=False, consumer_timeout_ms=15000)
    try:
        tp = TopicPartition("kt", 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = []
        for m in c:
            got.append((m.offset, m.timestamp, m.timestamp_type))
            if len(got) == 5:
                break
        assert got == [(i, ts, 0) for i, ts in enumerate(STAMPS)]  # 0: CreateTime
        t = c.offsets_for_times({tp: PAST + 3_000})[tp]
        assert (t.offset, t.timestamp) == (0, PAST + 5_000)
    finally:
        c.close()


def _produce(w, topic, batches):
    part = produce(w, topic, b"".join(batches))
    assert part.error_code == ErrorCode.none, part
    assert part.log_append_time is None  # CreateTime: no append time in the answer
    return part.base_offset


def _fetch(w, topic, offset, max_bytes=2**20):
    part = fetch_records(w, topic, offset, max_bytes)
    assert part.error_code == ErrorCode.none, part
    return part.records


def _marked(batch: bytes) -> bytes:
    """``batch`` with a max timestamp of its own (a re-encoding would compute the true
    one), its CRC made right: a fetch that returns it returned the bytes as sent."""
    b = bytearray(batch)
    struct.pack_into(">q", b, 35, PAST + 999_999)
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


def _at(batch: bytes, offset: int) -> bytes:
    return struct.pack(">q", offset) + batch[8:]


def _records(data):
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for b in decode_batches(data, 2**24) for r in b.records]


def test_fetched_batches_as_producers_sent_them_and_as_encoded(kafka_server, broker):
    srv = kafka_server()
    s = broker.create_stream("kb", partitions=1)
    sent = [Record(i, PAST + 3 * i, b"k" if i % 2 else None, b"value %d" % i, (("h", b"%d" % i),))
            for i in range(6)]
    odd = [Record(0, PAST, None, None, ()), Record(1, PAST, None, b"x", (("a", b"1"), ("a", b"2"), ("n", None)))]
    first = _marked(encode_batch(sent[:3]))
    tombstones = _marked(encode_batch(odd))
    second = _marked(encode_batch([Record(i, r.timestamp, r.key, r.value, r.headers) for i, r in enumerate(sent[3:])]))
    with Wire(srv.port) as w:
        assert _produce(w, "kb", [first, second]) == 0
        s.append(b"native", headers={"n": 1})  # offset 6, between the Kafka batches
        assert _produce(w, "kb", [tombstones]) == 7  # a null value, repeated and null headers: they round-trip
        native_ms = s.read_raw(0, 6, 1)[0][1] // 1_000_000
        want = [(i, PAST + 3 * i, b"k" if i % 2 else None, b"value %d" % i, (("h", b"%d" % i),)) for i in range(6)]
        want += [(6, native_ms, None, b"native", (("n", b"1"),)),
                 (7, PAST, None, None, ()), (8, PAST, None, b"x", (("a", b"1"), ("a", b"2"), ("n", None)))]
        whole = _fetch(w, "kb", 0)
        assert _records(whole) == want
        assert whole.startswith(first + _at(second, 3))  # kept as sent (their max timestamps say so)
        assert whole.endswith(_at(tombstones, 7))
        assert s.read_raw(0, 7, 2)[0][4] is None  # a tombstone in the stream too
        # from inside a kept batch: the whole batch, as a broker sends it (the client skips below its offset)
        assert _records(_fetch(w, "kb", 4)) == want[3:]
        assert _records(_fetch(w, "kb", 7)) == want[7:]
        assert _records(_fetch(w, "kb", 9)) == []
        # the first batch however big the budget, nothing past it
        assert _records(_fetch(w, "kb", 0, max_bytes=10)) == want[:3]


def test_the_kept_batches_are_bounded_and_told_apart_by_stream():
    class S:
        def __init__(self, name, created_at):
            self.name, self.created_at = name, created_at

    raw = encode_batch([Record(0, PAST, None, b"x" * 100, ())])
    kept = Batches(max_bytes=len(raw) * 4 + 10)
    a, again = S("a", 1.0), S("a", 2.0)
    for offset in range(10):
        kept.put(a, 0, offset * 3, raw, 1)
    assert kept.bytes == len(raw) * 4  # the oldest went first
    assert kept.find(a, 0, 0) == (None, 18)  # evicted: the next kept one starts at 18
    data, after = kept.find(a, 0, 27)
    assert (data[:8], after) == ((27).to_bytes(8, "big"), 28)
    assert data[12:] == raw[12:]  # the leader epoch is 0, as encode_batch writes it; the rest as sent
    assert kept.find(a, 0, 28) == (None, None)
    assert kept.find(again, 0, 27) == (None, None)  # a stream made again under the same name
    assert kept.find(a, 1, 27) == (None, None)


def test_create_topics_answers_the_topics_configs(kafka_server, broker):
    srv = kafka_server()
    with Wire(srv.port) as w:
        r = w.call(CREATE_TOPICS, 7, timeout=SECONDS_30, validate_only=False, topics=[
            {"name": "ct", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": [{"name": "message.timestamp.type", "value": "CreateTime"}]}])
        (t,) = r.topics
        assert t.error_code == ErrorCode.none
        assert {c.name: (c.value, c.read_only) for c in t.configs} == {
            name: (value, name in TAKEN_NOT_KEPT) for name, value in KAFKA_DEFAULTS.items()}
        r = w.call(CREATE_TOPICS, 7, timeout=SECONDS_30, validate_only=False, topics=[
            {"name": "lat", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": [{"name": "message.timestamp.type", "value": "LogAppendTime"}]}])
        assert r.topics[0].error_code == ErrorCode.none
        assert broker.stream("lat").timestamp_type == "log_append_time"
        r = w.call(CREATE_TOPICS, 7, timeout=SECONDS_30, validate_only=False, topics=[
            {"name": "cmp", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": [{"name": "cleanup.policy", "value": "compact,forever"}]}])
        assert r.topics[0].error_code == ErrorCode.invalid_config
        assert r.topics[0].error_message == "config cleanup.policy=compact,forever: takes compact, delete or both (compact,delete)"
        assert broker.list_streams() == ["ct", "lat"]


def test_list_offsets_max_timestamp_is_the_greatest_not_the_last(kafka_server, broker):
    srv = kafka_server()
    broker.create_stream("mx", partitions=1)
    with Wire(srv.port) as w:
        _produce(w, "mx", [encode_batch([Record(i, ts, None, b"v", ()) for i, ts in enumerate(STAMPS)])])
        r = w.call(LIST_OFFSETS, 9, replica_id=-1, isolation_level=0, topics=[
            {"name": "mx", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": t}
                                          for t in (-3, -2, -1, PAST + 2_000)]}])
        assert [(p.offset, p.timestamp) for p in r.topics[0].partitions] == [
            (2, PAST + 10_000), (0, -1), (5, -1), (0, PAST + 5_000)]


def test_a_record_without_a_timestamp_takes_the_append_time_one_past_ns_is_refused(kafka_server, broker):
    srv = kafka_server()
    s = broker.create_stream("nt", partitions=1)
    with Wire(srv.port) as w:
        before = time.time_ns() // 1_000_000
        assert _produce(w, "nt", [encode_batch([Record(0, -1, None, b"a", ()), Record(1, -1, None, b"b", ())])]) == 0
        after = time.time_ns() // 1_000_000
        stamps = [ts // 1_000_000 for _o, ts, _k, _h, _v in s.read_raw(0, 0, 10)]
        assert len(stamps) == 2 and all(before <= t <= after for t in stamps), (before, stamps, after)
        part = produce(w, "nt", encode_batch([Record(0, 2**62, None, b"far", ())]))
        assert part.error_code == ErrorCode.invalid_timestamp
        assert part.error_message == f"a record timestamp of {2**62} ms: at most {(2**63 - 1) // 1_000_000}"
        assert s.offsets(0) == (0, 2)  # nothing appended


@pytest.mark.slow
def test_admin_clients_describe_a_topics_configs(kafka_server, broker):
    from confluent_kafka.admin import AdminClient, ConfigResource
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    srv = kafka_server()
    broker.create_stream("dc", partitions=1, max_message_bytes=4096, retention_bytes=2**20)
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    (future,) = admin.describe_configs([ConfigResource("topic", "dc")]).values()
    got = {k: (e.value, e.is_read_only, e.is_default) for k, e in future.result(30).items()}
    assert got == {**{name: (value, name in TAKEN_NOT_KEPT, True) for name, value in KAFKA_DEFAULTS.items()},
                   "retention.bytes": (str(2**20), False, False), "max.message.bytes": ("4096", False, False)}
    (missing,) = admin.describe_configs([ConfigResource("topic", "nope")]).values()
    with pytest.raises(Exception, match="UNKNOWN_TOPIC_OR_PART"):
        missing.result(30)
    kp = KafkaAdminClient(bootstrap_servers=srv.bootstrap)
    try:
        got = kp.describe_configs([KpResource(ConfigResourceType.TOPIC, "dc", ["message.timestamp.type"])],
                                  config_filter="all")
        assert {k: v["value"] for k, v in got["topic"]["dc"].items()} == {"message.timestamp.type": "CreateTime"}
    finally:
        kp.close()
