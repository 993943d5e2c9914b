"""Topic configs and partitions through a real ``shmq server --kafka-port`` with real
clients (confluent-kafka's and kafka-python's admin clients): CreatePartitions, then a
producer and a consumer on the new partition; DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs round trips, seen natively too; an unknown config refused,
named; LogAppendTime stamped by the listener; compression.type served in its codec."""

import time
import warnings

import pytest

from shmq.kafka.compression import LZ4, NONE
from shmq.kafka.records import LOG_APPEND_TIME, Record, decode_batches, encode_batch
from tests.kafka.groups_wire import Wire, fetch_records, produce
from tests.kafka.test_clients import _ck_consume

pytestmark = pytest.mark.slow

PAST = 1_600_000_000_000  # 2020-09-13, in ms: no clock gives this by chance
# what DescribeConfigs shows of a topic made with no configs
KAFKA_DEFAULTS = {"cleanup.policy": "delete", "compression.type": "producer", "delete.retention.ms": "86400000",
                  "file.delete.delay.ms": "60000", "max.compaction.lag.ms": "9223372036854775807",
                  "max.message.bytes": "1048576", "message.timestamp.type": "CreateTime",
                  "min.cleanable.dirty.ratio": "0.5", "min.compaction.lag.ms": "0", "retention.bytes": "-1",
                  "retention.ms": "-1", "segment.bytes": "1073741824", "segment.ms": "604800000"}
TAKEN_NOT_KEPT = {"file.delete.delay.ms", "min.compaction.lag.ms", "segment.ms"}  # read-only: no stream setting


def _admin(srv):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": srv.bootstrap})


def _configs(admin, topic) -> dict:
    from confluent_kafka.admin import ConfigResource

    (future,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {k: e.value for k, e in future.result(30).items()}


def _alter(admin, topic, configs):
    """A legacy AlterConfigs (which confluent-kafka deprecates for the incremental one):
    its future."""
    from confluent_kafka.admin import ConfigResource

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        (f,) = admin.alter_configs([ConfigResource("topic", topic, set_config=configs)]).values()
    return f


def _consume(srv, topic, partition, n):
    return _ck_consume(srv.bootstrap, topic, n, partition)


def test_confluent_admin_adds_partitions_a_producer_writes_there_a_consumer_reads_it(shared_kafka, names):
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import NewPartitions

    topic = names("topic")
    s = shared_kafka.broker.create_stream(topic, partitions=1)
    admin = _admin(shared_kafka)
    (future,) = admin.create_partitions([NewPartitions(topic, 3)]).values()
    assert future.result(30) is None
    assert s.partitions == 3  # the handle made before sees the new count
    md = admin.list_topics(topic=topic, timeout=10)
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]
    (fewer,) = admin.create_partitions([NewPartitions(topic, 3)]).values()
    with pytest.raises(KafkaException, match="INVALID_PARTITIONS") as e:
        fewer.result(30)
    assert "has 3 partitions: the count asked (3) must be more" in e.value.args[0].str()
    p = Producer({"bootstrap.servers": shared_kafka.bootstrap})
    for i in range(5):
        p.produce(topic, value=b"v%d" % i, partition=2)
    assert p.flush(30) == 0
    got = _consume(shared_kafka, topic, 2, 5)
    assert [(m.partition(), m.offset(), m.value()) for m in got] == [(2, i, b"v%d" % i) for i in range(5)]
    assert [s.offsets(q) for q in range(3)] == [(0, 0), (0, 0), (0, 5)]
    s.close()


def test_describe_alter_and_incremental_alter_round_trip(shared_kafka, names):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    topic = names("topic")
    s = shared_kafka.broker.create_stream(topic, partitions=1)
    admin = _admin(shared_kafka)
    before = _configs(admin, topic)
    assert before == KAFKA_DEFAULTS

    def incremental(*entries):
        (f,) = admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=list(
            entries))]).values()
        return f.result(30)

    set_ = AlterConfigOpType.SET
    incremental(ConfigEntry("retention.ms", "60000", incremental_operation=set_),
                ConfigEntry("max.message.bytes", "4096", incremental_operation=set_),
                ConfigEntry("compression.type", "zstd", incremental_operation=set_),
                ConfigEntry("segment.bytes", "2000000", incremental_operation=set_))
    assert _configs(admin, topic) == {**before, "retention.ms": "60000", "max.message.bytes": "4096",
                                      "compression.type": "zstd", "segment.bytes": "2000000"}
    assert (s.retention_seconds, s.max_message_bytes, s.compression, s.segment_bytes) == (60.0, 4096, "zstd", 2000000)
    incremental(ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE))  # the default
    assert _configs(admin, topic)["retention.ms"] == "-1" and s.retention_seconds is None
    with pytest.raises(KafkaException, match="INVALID_CONFIG") as e:
        incremental(ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND))
    assert "config retention.ms=1: APPEND is not taken (retention.ms is not a list)" in e.value.args[0].str()
    # AlterConfigs replaces the whole set: what it does not name goes back to its default
    assert _alter(admin, topic, {"retention.bytes": "500000"}).result(30) is None
    assert _configs(admin, topic) == {**before, "retention.bytes": "500000"}
    assert (s.retention_bytes, s.max_message_bytes, s.compression) == (500000, 2**20, "producer")
    s.close()


def test_an_unknown_config_or_value_is_refused_naming_it_and_nothing_changes(shared_kafka, names):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    topic = names("topic")
    s = shared_kafka.broker.create_stream(topic, partitions=1, retention_seconds=30)
    admin = _admin(shared_kafka)
    for configs, why in (({"retention.ms": "1000", "min.insync.replicas": "2"},
                          "config min.insync.replicas=2: not taken here (the topic configs are cleanup.policy, "),
                         ({"cleanup.policy": "compact,forever"}, "config cleanup.policy=compact,forever: takes compact, delete or both"),
                         ({"retention.ms": "soon"}, "config retention.ms=soon: takes not a number")):
        with pytest.raises(KafkaException, match="INVALID_CONFIG") as e:
            _alter(admin, topic, configs).result(30)
        assert why in e.value.args[0].str()
    assert s.retention_seconds == 30.0  # all or nothing: the good one of the first was not made either
    other = names("topic")
    (f,) = admin.create_topics([NewTopic(other, 1, 1, config={"unclean.leader.election.enable": "true"})]).values()
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        f.result(30)
    assert other not in shared_kafka.broker.list_streams()
    s.close()


def test_kafka_python_admin_alters_describes_and_adds_partitions(shared_kafka, names):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions, NewTopic

    topic = names("topic")
    kp = KafkaAdminClient(bootstrap_servers=shared_kafka.bootstrap)
    try:
        kp.create_topics([NewTopic(topic, 2, 1, topic_configs={"retention.bytes": "1000000"})])
        s = shared_kafka.broker.stream(topic)
        assert (s.partitions, s.retention_bytes) == (2, 1000000)
        kp.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"message.timestamp.type": "LogAppendTime",
                                                                         "retention.bytes": "1000000"})])
        got = kp.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                  ["message.timestamp.type", "retention.bytes"])],
                                  config_filter="all")
        assert {k: v["value"] for k, v in got["topic"][topic].items()} == {
            "message.timestamp.type": "LogAppendTime", "retention.bytes": "1000000"}
        kp.create_partitions({topic: NewPartitions(5)})
        assert (s.partitions, s.timestamp_type) == (5, "log_append_time")
    finally:
        kp.close()
    s.close()


def test_log_append_time_stamps_the_append_and_says_so(shared_kafka, names):
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Producer
    from confluent_kafka.admin import NewTopic

    topic = names("topic")
    admin = _admin(shared_kafka)
    (f,) = admin.create_topics([NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})]).values()
    assert f.result(30) is None
    p = Producer({"bootstrap.servers": shared_kafka.bootstrap, "linger.ms": 20})
    reports = []
    before = time.time_ns() // 1_000_000
    for i in range(3):
        p.produce(topic, value=b"v%d" % i, timestamp=PAST + i, partition=0,
                  on_delivery=lambda err, m: reports.append((err, m.offset(), m.timestamp())))
    assert p.flush(30) == 0
    after = time.time_ns() // 1_000_000
    assert [(err, o, kind) for err, o, (kind, _t) in sorted(reports)] == [
        (None, i, TIMESTAMP_LOG_APPEND_TIME) for i in range(3)]
    stamped = [t for _e, _o, (_k, t) in sorted(reports)]  # each batch's append time (one batch, mostly)
    assert all(before <= t <= after for t in stamped), (before, stamped, after)
    got = _consume(shared_kafka, topic, 0, 3)
    assert [(m.value(), m.timestamp()) for m in got] == [(b"v%d" % i, (TIMESTAMP_LOG_APPEND_TIME, stamped[i]))
                                                         for i in range(3)]
    s = shared_kafka.broker.stream(topic)
    assert [ts // 1_000_000 for _o, ts, _k, _h, _v in s.read_raw(0, 0, 10)] == stamped  # stored so too
    s.append(b"native")  # a native record: its append time, and the topic says LogAppendTime of it too
    with Wire(shared_kafka.port) as w:
        part = produce(w, topic, encode_batch([Record(0, PAST, None, b"wire", ())]))
        assert part.error_code == 0 and before <= part.log_append_time.timestamp() * 1000 <= time.time() * 1000 + 1
        batches = decode_batches(fetch_records(w, topic, 0).records, 2**20)
    assert all(b.attributes & LOG_APPEND_TIME for b in batches)
    assert [r.value for b in batches for r in b.records] == [b"v0", b"v1", b"v2", b"native", b"wire"]
    # back to CreateTime, live: a producer's time is kept again
    shared_kafka.broker.update_stream(topic, timestamp_type="create_time")
    reports.clear()
    p.produce(topic, value=b"late", timestamp=PAST, partition=0,
              on_delivery=lambda err, m: reports.append((err, m.offset(), m.timestamp())))
    assert p.flush(30) == 0
    assert reports == [(None, 5, (TIMESTAMP_CREATE_TIME, PAST))]
    s.close()


def test_compression_type_lz4_serves_lz4_batches_that_decode(shared_kafka, names):
    from confluent_kafka import Producer

    topic = names("topic")
    s = shared_kafka.broker.create_stream(topic, partitions=1, compression="lz4")
    p = Producer({"bootstrap.servers": shared_kafka.bootstrap, "compression.type": "none"})
    for i in range(20):
        p.produce(topic, value=b"kafka %d " % i * 20, partition=0)
    assert p.flush(30) == 0
    s.append_many([b"native %d " % i * 20 for i in range(10)], partition=0)
    with Wire(shared_kafka.port) as w:
        batches = decode_batches(fetch_records(w, topic, 0).records, 2**20)
    assert batches and {b.attributes & 0x07 for b in batches} == {LZ4}  # the producer's were uncompressed
    want = [b"kafka %d " % i * 20 for i in range(20)] + [b"native %d " % i * 20 for i in range(10)]
    assert [r.value for b in batches for r in b.records] == want
    assert [m.value() for m in _consume(shared_kafka, topic, 0, 30)] == want  # librdkafka decodes them
    assert [r.value for r in s.read(0, 0, 100)] == want  # stored as records, whatever the codec served
    shared_kafka.broker.update_stream(topic, compression="producer")  # as the producers sent them again
    with Wire(shared_kafka.port) as w:
        batches = decode_batches(fetch_records(w, topic, 0).records, 2**20)
    assert {b.attributes & 0x07 for b in batches} == {NONE}
    s.close()
