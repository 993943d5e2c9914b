"""Compacted topics (cleanup.policy=compact) through a real ``shmq server --kafka-port``
with confluent-kafka's clients: the compaction configs created, described and altered;
the server's housekeeping compacting what producers wrote, after which a consumer from
the start sees the latest record of each key at the offset it was produced at (a
tombstone while delete.retention.ms lasts), the partition's start (the log start offset)
unmoved, so consumers positioned in what a run took read on; a topic made compact later served from the
stream, not from the batches kept as sent; a record without a key refused as Kafka
refuses it, nothing appended; transactions read_committed."""

import datetime
import time
import warnings

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic
from kio.schema.errors import ErrorCode

from shmq.kafka.records import Record, decode_batches, encode_batch
from tests._wait import wait_for
from tests.kafka.clients import read_all
from tests.kafka.groups_wire import Wire, fetch_records, produce
from tests.kafka.test_configs import KAFKA_DEFAULTS, TAKEN_NOT_KEPT

HOUR_MS = 3_600_000


def _admin(srv):
    return AdminClient({"bootstrap.servers": srv.bootstrap})


def _create(srv, topic, **configs):
    admin = _admin(srv)
    (f,) = admin.create_topics([NewTopic(topic, 1, 1, config=configs)]).values()
    assert f.result(30) is None


def _described(admin, topic) -> dict:
    (f,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return f.result(30)


def _incremental(admin, topic, *ops):
    """IncrementalAlterConfigs of (name, operation, value) on ``topic``: its future."""
    entries = [ConfigEntry(name, value, incremental_operation=getattr(AlterConfigOpType, op)) for name, op, value in ops]
    (f,) = admin.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=entries)]).values()
    return f


def _refused(future) -> str:
    with pytest.raises(KafkaException, match="INVALID_CONFIG") as e:
        future.result(30)
    return e.value.args[0].str()


def _produced(srv, topic, records) -> list:
    """(offset, key, value) of each of ``records`` ((key, value, timestamp ms or 0)), produced
    to partition 0 in order, from the delivery reports."""
    out = []
    p = Producer({"bootstrap.servers": srv.bootstrap, "linger.ms": 5})
    for key, value, ts in records:
        p.produce(topic, value=value, key=key, partition=0, timestamp=ts,
                  on_delivery=lambda err, m: out.append((err, m.offset(), m.key(), m.value())))
    assert p.flush(30) == 0
    assert all(err is None for err, *_ in out), out
    return sorted(r[1:] for r in out)


def _compacted(s, p=0, timeout=10.0):
    """Wait until housekeeping compacted all ``s``'s partition ``p`` holds (a run done,
    nothing appended since left uncleaned)."""
    def done():
        st = s.stats()["partitions"][p]
        return st["compactions_total"] >= 1 and st["dirty_ratio"] == 0.0
    wait_for(done, timeout, f"the compaction of {s.name} partition {p}")


def _read(srv, topic, isolation="read_uncommitted") -> list:
    """(offset, key, value) of partition 0 from its earliest offset to its end."""
    return read_all(srv.bootstrap, topic, isolation, keys=True)


def _latest(rows, tombstones: bool) -> list:
    """The latest row of each key, in offset order (a tombstone only if ``tombstones``),
    with every keyless one."""
    last = {}
    for off, key, value in rows:
        last[key if key is not None else ("keyless", off)] = (off, key, value)
    return sorted(r for r in last.values() if tombstones or r[2] is not None)


def test_compaction_configs_created_described_and_altered(shared_kafka, names):
    topic = names("topic")
    admin = _admin(shared_kafka)
    _create(shared_kafka, topic, **{"cleanup.policy": "compact", "delete.retention.ms": "1000",
                                    "min.cleanable.dirty.ratio": "0.01", "max.compaction.lag.ms": "100",
                                    "min.compaction.lag.ms": "0", "segment.ms": "500", "segment.bytes": "1048576",
                                    "file.delete.delay.ms": "10000"})
    s = shared_kafka.broker.stream(topic)
    assert (s.compact, s.delete_retention_seconds, s.min_cleanable_dirty_ratio, s.max_compaction_lag_seconds) == (
        True, 1.0, 0.01, 0.1)
    entries = _described(admin, topic)
    mine = {"cleanup.policy": "compact", "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.01",
            "max.compaction.lag.ms": "100", "segment.bytes": "1048576"}
    assert {k: e.value for k, e in entries.items()} == {**KAFKA_DEFAULTS, **mine}  # segment.ms and the delay: not kept
    assert {k for k, e in entries.items() if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value} == set(mine)
    assert {k for k, e in entries.items() if e.is_read_only} == TAKEN_NOT_KEPT

    assert _incremental(admin, topic, ("cleanup.policy", "SUBTRACT", "compact")).result(30) is None
    assert not s.compact and _described(admin, topic)["cleanup.policy"].value == "delete"
    assert _incremental(admin, topic, ("cleanup.policy", "APPEND", "delete")).result(30) is None  # it is already
    assert not s.compact
    assert _incremental(admin, topic, ("cleanup.policy", "APPEND", "compact"),
                        ("retention.ms", "SET", "60000")).result(30) is None
    assert s.compact and _described(admin, topic)["cleanup.policy"].value == "compact,delete"  # retention acts
    # delete cannot be taken away (it is the retention bounds): refused, and the other change of the request not made
    why = _refused(_incremental(admin, topic, ("delete.retention.ms", "SET", "5000"),
                                ("cleanup.policy", "SUBTRACT", "delete")))
    assert "config cleanup.policy=delete: SUBTRACT delete is not taken: delete is what retention.ms and " \
           "retention.bytes do" in why
    assert (s.compact, s.delete_retention_seconds, s.retention_seconds) == (True, 1.0, 60.0)
    assert _incremental(admin, topic, ("retention.ms", "DELETE", None)).result(30) is None
    assert _incremental(admin, topic, ("cleanup.policy", "SUBTRACT", "delete")).result(30) is None  # none shown
    assert s.compact and _described(admin, topic)["cleanup.policy"].value == "compact"

    for name, value, said in (("min.compaction.lag.ms", "5", "takes 0 only"),
                              ("min.cleanable.dirty.ratio", "1.5", "takes a number from 0 to 1"),
                              ("max.compaction.lag.ms", "0", "takes a number of ms from 1 to"),
                              ("cleanup.policy", "compact,forever", "takes compact, delete or both")):
        assert f"config {name}={value}: {said}" in _refused(_incremental(admin, topic, (name, "SET", value)))
    # AlterConfigs replaces the whole set: compact,delete is compact, the rest back to Kafka's defaults
    with warnings.catch_warnings():  # (confluent-kafka deprecates AlterConfigs for the incremental one)
        warnings.simplefilter("ignore", DeprecationWarning)
        (f,) = admin.alter_configs([ConfigResource("topic", topic, set_config={"cleanup.policy": "compact,delete"})
                                    ]).values()
    assert f.result(30) is None
    assert {k: e.value for k, e in _described(admin, topic).items()} == {**KAFKA_DEFAULTS, "cleanup.policy": "compact"}
    assert (s.compact, s.delete_retention_seconds, s.max_compaction_lag_seconds) == (True, 86400.0, None)
    s.close()


@pytest.mark.parametrize("delete_retention_ms,tombstones", [(60_000, False), (None, True)],
                         ids=["tombstones-expired", "tombstones-kept"])
def test_a_consumer_sees_the_latest_record_of_each_key_at_its_offset(shared_kafka, names, delete_retention_ms,
                                                                     tombstones):
    """Tombstones stamped an hour ago: gone where delete.retention.ms is a minute, kept
    (null values) with Kafka's default of a day. A native record without a key stays."""
    topic = names("topic")
    configs = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    if delete_retention_ms is not None:
        configs["delete.retention.ms"] = str(delete_retention_ms)
    _create(shared_kafka, topic, **configs)
    s = shared_kafka.broker.stream(topic)
    old = int(time.time() * 1000) - HOUR_MS
    rows = _produced(shared_kafka, topic, [(b"a", b"a1", 0), (b"b", b"b1", 0), (b"a", b"a2", 0), (b"c", b"c1", 0),
                                           (b"b", None, old), (b"d", None, old), (b"a", b"a3", 0)])
    native = s.append(b"native, no key", partition=0).offset  # (a Kafka producer's would be refused)
    rows += [(native, None, b"native, no key")]
    rows += _produced(shared_kafka, topic, [(b"e", b"e1", 0), (b"c", b"c2", 0), (b"d", b"d2", 0), (b"e", b"e2", 0),
                                            (b"f", b"f1", 0)])
    assert [r[0] for r in rows] == list(range(13))
    _compacted(s)
    want = _latest(rows, tombstones)
    assert want[0][0] == (4 if tombstones else 6)  # b's tombstone, or a3, is the first record kept
    assert _read(shared_kafka, topic) == want
    assert s.offsets(0) == (0, 13)  # the start stays where it was (Kafka's cleaner never moves it)
    assert [(o, k, v) for o, _ts, k, _h, v in s.read_raw(0, 0, 100)] == want  # natively, the same records
    s.close()


def _consumed(config, topic, assign_at=None, timeout=30.0) -> list:
    """(offset, key, value) a confluent-kafka consumer of ``config`` (bootstrap added; EOF
    told) reads of ``topic``'s partition 0 until its end: assigned at ``assign_at``, or
    subscribed in its group."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**config, "enable.partition.eof": True})
    try:
        if assign_at is None:
            c.subscribe([topic])
        else:
            c.assign([TopicPartition(topic, 0, assign_at)])
        got, deadline = [], time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"no end of {topic} within {timeout} s: {got}"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return got
            got.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()


def test_consumers_at_offsets_compaction_took_read_every_live_key(shared_kafka, names):
    """Kafka's cleaner never moves a partition's log start offset: after compaction took
    offsets 0..189, ListOffsets earliest and Fetch's log start still say 0, a Fetch at 0
    answers the next records kept, and consumers with default settings
    (auto.offset.reset=latest) positioned in what compaction took -- assigned at 0 (a state
    store restoring its changelog), or a group whose commit (2) came before the run -- read
    every live key, not OFFSET_OUT_OF_RANGE and a reset to the end; so does a new group
    reset to the earliest offset."""
    from confluent_kafka import Consumer, TopicPartition

    topic, committed, fresh = names("topic"), names("group"), names("group")
    _create(shared_kafka, topic, **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    s = shared_kafka.broker.stream(topic)
    bootstrap = {"bootstrap.servers": shared_kafka.bootstrap}
    c = Consumer({**bootstrap, "group.id": committed})
    c.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)  # (no member: a manual commit)
    c.close()
    rows = _produced(shared_kafka, topic, [(b"k%d" % (i % 10), b"v%d" % i, 0) for i in range(200)])
    _compacted(s)
    want = rows[190:]
    assert [r[0] for r in want] == list(range(190, 200)) and s.committed(committed) == {0: 2}
    c = Consumer({**bootstrap, "group.id": fresh})
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False) == (0, 200)  # ListOffsets
    c.close()
    with Wire(shared_kafka.port) as w:
        part = fetch_records(w, topic, 0)
        assert (part.error_code, part.log_start_offset, part.high_watermark) == (ErrorCode.none, 0, 200)
        assert [(r.offset, r.key, r.value) for b in decode_batches(part.records, 2**20) for r in b.records] == want
    assert _consumed({**bootstrap, "group.id": fresh, "enable.auto.commit": False}, topic, assign_at=0) == want
    assert _consumed({**bootstrap, "group.id": committed}, topic) == want  # from its commit, 2
    assert _consumed({**bootstrap, "group.id": fresh, "auto.offset.reset": "earliest"}, topic) == want
    assert s.offsets(0) == (0, 200)  # natively the same start
    s.close()


def test_a_topic_made_compact_later_is_served_from_the_stream_not_the_kept_batches(shared_kafka, names):
    topic = names("topic")
    _create(shared_kafka, topic)
    s = shared_kafka.broker.stream(topic)
    rows = _produced(shared_kafka, topic, [(b"k%d" % (i % 3), b"v%d" % i, 0) for i in range(12)])
    admin = _admin(shared_kafka)
    assert _incremental(admin, topic, ("cleanup.policy", "APPEND", "compact"),
                        ("min.cleanable.dirty.ratio", "SET", "0")).result(30) is None
    _compacted(s)
    want = [(9, b"k0", b"v9"), (10, b"k1", b"v10"), (11, b"k2", b"v11")]
    assert _latest(rows, True) == want
    with Wire(shared_kafka.port) as w:  # the batch the producer sent (offsets 0..11) is kept, not served
        batches = decode_batches(fetch_records(w, topic, 9).records, 2**20)
    assert [(r.offset, r.key, r.value) for b in batches for r in b.records] == want
    assert _read(shared_kafka, topic) == want
    s.close()


def test_a_record_without_a_key_is_refused_and_nothing_is_appended(shared_kafka, names):
    topic = names("topic")
    _create(shared_kafka, topic, **{"cleanup.policy": "compact"})
    s = shared_kafka.broker.stream(topic)
    why = f"Compacted topic cannot accept message without key in topic partition {topic}-0."
    batch = encode_batch([Record(i, 0, None if i % 2 else b"k%d" % i, b"v%d" % i, ()) for i in range(4)])
    with Wire(shared_kafka.port) as w:
        part = produce(w, topic, batch)  # Produce v9: the batch index of each record without a key
        assert (part.error_code, part.base_offset) == (ErrorCode.invalid_record, -1)
        assert [(e.batch_index, e.batch_index_error_message) for e in part.record_errors] == [(1, why), (3, why)]
        assert part.error_message == f"{why} (2 of a batch's 4 records have none: none of this partition's " \
                                     "records was appended)"
        old = w.call(0, 3, transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30), topic_data=[
            {"name": topic, "partition_data": [{"index": 0, "records": batch}]}])  # v3: the code alone
        assert old.responses[0].partition_responses[0].error_code == ErrorCode.invalid_record
    assert s.offsets(0) == (0, 0)
    reports = []
    # a linger longer than the test, so that the flush sends them: one batch, as a rule (a loaded machine has had
    # librdkafka send the first records in a batch of their own all the same, twice in CI)
    p = Producer({"bootstrap.servers": shared_kafka.bootstrap, "linger.ms": 60_000})
    for i in range(6):  # the keyless ones fail INVALID_RECORD, the others beside them too
        p.produce(topic, value=b"v%d" % i, key=None if i in (2, 4) else b"k%d" % i, partition=0,
                  on_delivery=lambda err, m: reports.append((m.value(), None if err is None else err.code())))
    p.flush(30)
    codes = dict(reports)
    assert len(reports) == 6 and (codes[b"v2"], codes[b"v4"]) == (KafkaError.INVALID_RECORD,) * 2
    landed = [v for v, code in sorted(reports) if code is None]  # keyed records of a batch without a keyless one
    assert all(code == KafkaError._INVALID_DIFFERENT_RECORD for v, code in reports
               if v not in landed + [b"v2", b"v4"]), sorted(reports)  # (the codes, where a run meets another case)
    assert s.offsets(0) == (0, len(landed))  # every refused record's whole batch appended nothing
    assert _produced(shared_kafka, topic, [(b"k", b"kept", 0)]) == [(len(landed), b"k", b"kept")]  # keyed: taken
    s.close()


def test_read_committed_after_compaction_took_an_aborted_transaction(shared_kafka, names):
    topic = names("topic")
    _create(shared_kafka, topic, **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    s = shared_kafka.broker.stream(topic)
    p = Producer({"bootstrap.servers": shared_kafka.bootstrap, "transactional.id": names("txn"), "linger.ms": 1})
    p.init_transactions(30)
    for values, commit in (({b"a": b"a1", b"b": b"b1"}, True), ({b"a": b"a-aborted", b"c": b"c-aborted"}, False),
                           ({b"b": b"b2", b"d": b"d1"}, True)):
        p.begin_transaction()
        for k, v in values.items():
            p.produce(topic, key=k, value=v, partition=0)
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    # offsets: a1 0, b1 1, COMMIT 2, a-aborted 3, c-aborted 4, ABORT 5, b2 6, d1 7, COMMIT 8
    _compacted(s)
    want = [(0, b"a", b"a1"), (6, b"b", b"b2"), (7, b"d", b"d1")]  # the aborted a is not a's latest: a1 is
    assert _read(shared_kafka, topic, "read_committed") == want
    assert _read(shared_kafka, topic) == want  # the aborted records are gone for every reader
    assert s.offsets(0) == (0, 9)
    s.close()
