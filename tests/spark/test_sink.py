"""The "shmq" sink: rows placed as Kafka's sink places them, a micro-batch published once
per batch id (replayed commits append nothing), nothing left staged, clear errors."""

import uuid
import zlib

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from shmq.engine.segment import namespace_entries
from shmq.spark.options import Options, SpecError
from shmq.spark.staging import staged_by_writer
from shmq.spark.writer import StreamWriter
from tests.conftest import ThreadedServer

QUERY_TIMEOUT = 120


def everything(s):
    return {p: [(r.key, r.value, r.headers) for r in s.read(p, 0, max_records=100_000)] for p in range(s.partitions)}


def test_a_batch_write_places_rows_by_partition_key_or_task_and_leaves_no_staging(spark, broker):
    out = broker.create_stream("out", partitions=3)
    rows = [("k%d" % i, b"v%d" % i, {"n": str(i)}, None) for i in range(30)] + [(None, b"p1", None, 1)]
    df = spark.createDataFrame(rows, "key string, value binary, headers map<string,string>, partition int")
    df.write.format("shmq").option("stream", "out").option("namespace", broker.namespace).mode("append").save()
    got = everything(out)
    for i in range(30):
        p = zlib.crc32(b"k%d" % i) % 3
        assert (b"k%d" % i, b"v%d" % i, {"n": str(i)}) in got[p]
    assert (None, b"p1", {}) in got[1]
    assert sum(map(len, got.values())) == 31
    assert broker.list_streams() == ["out"]  # the job's staging stream is gone


def test_a_streaming_query_into_a_stream_keeps_per_key_order_and_reclaims_its_staging(spark, broker, tmp_path):
    src = broker.create_stream("in", partitions=2)
    out = broker.create_stream("out", partitions=2)
    for seq in range(100):
        src.append_many([b"%d" % seq] * 4, keys=[b"a", b"b", b"c", b"d"])
    q = (spark.readStream.format("shmq").option("stream", "in").option("namespace", broker.namespace)
         .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 150).load()
         .selectExpr("key", "cast(value as string) as value")
         .writeStream.format("shmq").option("stream", "out").option("namespace", broker.namespace)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT)
    by_key = {}
    for rows in everything(out).values():
        for key, value, _h in rows:
            by_key.setdefault(key, []).append(int(value))
    assert by_key == {k: list(range(100)) for k in (b"a", b"b", b"c", b"d")}
    assert staged_by_writer(broker, "out", broker.list_streams()) == {q.id: 0}


def test_over_tcp_the_sink_publishes_inside_the_server(spark, broker, tmp_path):
    out = broker.create_stream("out", partitions=1)
    srv = ThreadedServer(broker.namespace)
    try:
        df = spark.createDataFrame([(b"x%d" % i,) for i in range(20)], "value binary")
        df.write.format("shmq").option("stream", "out").option("url", srv.url).mode("append").save()
    finally:
        srv.stop()
    assert [v for _k, v, _h in everything(out)[0]] == [b"x%d" % i for i in range(20)]


def test_a_queue_sink_puts_each_row(spark, broker):
    q = broker.create_queue("jobs")
    spark.createDataFrame([("j%d" % i,) for i in range(10)], "value string").write.format("shmq") \
        .option("queue", "jobs").option("namespace", broker.namespace).mode("append").save()
    assert sorted(d.body for d in q.get_many(20)) == sorted(b"j%d" % i for i in range(10))


def test_clear_errors_for_a_missing_stream_or_columns(spark, broker):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="writes to an existing stream: create stream 'nowhere' first"):
        df.write.format("shmq").option("stream", "nowhere").option("namespace", broker.namespace) \
            .mode("append").save()
    broker.create_stream("out", partitions=1)
    with pytest.raises(Exception, match="needs a 'value' column"):
        spark.createDataFrame([("v",)], "body string").write.format("shmq").option("stream", "out") \
            .option("namespace", broker.namespace).mode("append").save()
    with pytest.raises(Exception, match="'key' column must be binary or string, not int"):
        spark.createDataFrame([(1, "v")], "key int, value string").write.format("shmq").option("stream", "out") \
            .option("namespace", broker.namespace).mode("append").save()


def test_a_replayed_commit_appends_nothing_and_finishes_a_partial_publish(broker):
    """The driver's side without Spark: tasks' staging, then commits of the same batch
    id — the replay after a crash in the middle of the first one."""
    out = broker.create_stream("out", partitions=2)
    schema = StructType([StructField("key", BinaryType()), StructField("value", StringType())])
    w = StreamWriter(Options({"stream": "out", "namespace": broker.namespace}), schema, False)
    query = str(uuid.uuid4())

    def stage(task):
        batch = pa.RecordBatch.from_pydict({"key": [b"a", b"b", b"c"], "value": ["1", "2", "3"]})
        return w._stage(query, [batch], task)

    first = stage(0)
    staging = broker.stream(f"out:staging:{query}")
    # a crash after one partition of batch 7 was published: publish it alone
    p0 = min(first.ranges)
    out.publish(staging, {p0: [(p0, a, b) for a, b in first.ranges[p0]]}, uuid.UUID(query).bytes, 7)
    replay = stage(0)  # the replayed batch stages its rows again
    w.commit([replay], 7)
    w.commit([stage(0)], 7)  # and a third time: nothing
    assert sorted(v for rows in everything(out).values() for _k, v, _h in rows) == [b"1", b"2", b"3"]
    assert staged_by_writer(broker, "out", broker.list_streams()) == {query: 0}
    w.commit([stage(0)], 8)  # the next batch goes in
    assert sorted(v for rows in everything(out).values() for _k, v, _h in rows) == [b"1", b"1", b"2", b"2", b"3",
                                                                                    b"3"]
    with pytest.raises(SpecError, match="use mode\\('append'\\)"):
        StreamWriter(Options({"stream": "out", "namespace": broker.namespace}), schema, True)


def test_a_namespace_that_does_not_exist_is_named_not_made(spark, broker):
    ns = broker.namespace + "x"
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=f"there is no shmq namespace '{ns}' on this host"):
        df.write.format("shmq").option("stream", "out").option("namespace", ns).mode("append").save()
    with pytest.raises(Exception, match=f"there is no shmq namespace '{ns}' on this host"):
        spark.read.format("shmq").option("stream", "events").option("namespace", ns).load().collect()
    assert namespace_entries(ns) == []
