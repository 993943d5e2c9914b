"""The "shmq" sink: rows placed as Kafka's sink places them, a micro-batch published once
per batch id (replayed commits append nothing), nothing left staged, clear errors."""

import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from shmq.engine.streams.partitioner import partition_of
from shmq.engine.shm.segment import namespace_entries
from shmq.errors import ShmqError
from shmq.spark import arrow
from shmq.spark.options import Options, SpecError
from shmq.spark.staging import staged_by_writer
from shmq.spark.writer import StreamWriter
from tests.conftest import ThreadedServer

QUERY_TIMEOUT = 120


def everything(s):
    return {p: [(r.key, r.value, r.headers) for r in s.read(p, 0, max_records=100_000)] for p in range(s.partitions)}


def test_a_batch_write_places_rows_by_partition_key_or_task_and_leaves_no_staging(spark, broker, sink):
    out = broker.create_stream("out", partitions=3)
    rows = [("k%d" % i, b"v%d" % i, {"n": str(i)}, None) for i in range(30)] + [(None, b"p1", None, 1)]
    df = spark.createDataFrame(rows, "key string, value binary, headers map<string,string>, partition int")
    df.write.format(sink).option("stream", "out").option("namespace", broker.namespace).mode("append").save()
    got = everything(out)
    for i in range(30):
        p = partition_of(b"k%d" % i, 3)
        assert (b"k%d" % i, b"v%d" % i, {"n": str(i)}) in got[p]
    assert (None, b"p1", {}) in got[1]
    assert sum(map(len, got.values())) == 31
    assert broker.list_streams() == ["out"]  # the job's staging stream is gone


def test_binary_keys_and_values_arrive_byte_for_byte_empty_and_large_ones_too(spark, broker, sink):
    """Binary columns of rows a projection made (the JVM sink copies them from the row's own memory)."""
    out = broker.create_stream("out", partitions=2)
    df = spark.range(120).selectExpr(
        "case when id % 3 = 0 then null else cast(cast(id as string) as binary) end as key",
        "unhex(repeat(lpad(hex(id % 256), 2, '0'), case when id = 7 then 70000 else id * 37 % 300 end)) as value")
    df.write.format(sink).option("stream", "out").option("namespace", broker.namespace).mode("append").save()
    got = sorted(((k, v) for rows in everything(out).values() for k, v, _h in rows), key=lambda kv: (len(kv[1]), kv[1]))
    want = sorted(((None if i % 3 == 0 else str(i).encode(), bytes([i % 256]) * (70000 if i == 7 else i * 37 % 300))
                   for i in range(120)), key=lambda kv: (len(kv[1]), kv[1]))
    assert got == want


def test_a_streaming_query_into_a_stream_keeps_per_key_order_and_reclaims_its_staging(spark, broker, sink, tmp_path):
    src = broker.create_stream("in", partitions=2)
    out = broker.create_stream("out", partitions=2)
    for seq in range(100):
        src.append_many([b"%d" % seq] * 4, keys=[b"a", b"b", b"c", b"d"])
    q = (spark.readStream.format("shmq").option("stream", "in").option("namespace", broker.namespace)
         .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 150).load()
         .selectExpr("key", "cast(value as string) as value")
         .writeStream.format(sink).option("stream", "out").option("namespace", broker.namespace)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT)
    by_key = {}
    for rows in everything(out).values():
        for key, value, _h in rows:
            by_key.setdefault(key, []).append(int(value))
    assert by_key == {k: list(range(100)) for k in (b"a", b"b", b"c", b"d")}
    assert staged_by_writer(broker, "out", broker.list_streams()) == {}  # the staging stream went with the commit
    assert broker.list_streams() == ["in", "out"]


def test_over_tcp_the_sink_publishes_inside_the_server(spark, broker, sink, tmp_path):
    out = broker.create_stream("out", partitions=1)
    srv = ThreadedServer(broker.namespace)
    try:
        df = spark.createDataFrame([(b"x%d" % i,) for i in range(20)], "value binary")
        df.write.format(sink).option("stream", "out").option("url", srv.url).mode("append").save()
    finally:
        srv.stop()
    assert [v for _k, v, _h in everything(out)[0]] == [b"x%d" % i for i in range(20)]


def test_a_queue_sink_puts_each_row(spark, broker, sink):
    q = broker.create_queue("jobs")
    spark.createDataFrame([("j%d" % i,) for i in range(10)], "value string").write.format(sink) \
        .option("queue", "jobs").option("namespace", broker.namespace).mode("append").save()
    assert sorted(d.body for d in q.get_many(20)) == sorted(b"j%d" % i for i in range(10))


def test_clear_errors_for_a_missing_stream_or_columns(spark, broker, sink):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="writes to an existing stream: create stream 'nowhere' first"):
        df.write.format(sink).option("stream", "nowhere").option("namespace", broker.namespace) \
            .mode("append").save()
    broker.create_stream("out", partitions=1)
    with pytest.raises(Exception, match="needs a 'value' column"):
        spark.createDataFrame([("v",)], "body string").write.format(sink).option("stream", "out") \
            .option("namespace", broker.namespace).mode("append").save()
    with pytest.raises(Exception, match="'key' column must be binary or string, not int"):
        spark.createDataFrame([(1, "v")], "key int, value string").write.format(sink).option("stream", "out") \
            .option("namespace", broker.namespace).mode("append").save()
    with pytest.raises(Exception, match="the shmq sink has no option startingoffsets \\(an option of the shmq "
                                        "streaming source and the shmq batch source\\); its options are stream, "
                                        "queue, namespace, url, token, maxOutage, sinkStagingMaxBytes, "
                                        "checkpointLocation, queryName"):
        df.write.format(sink).option("stream", "out").option("namespace", broker.namespace) \
            .option("startingOffsets", "earliest").mode("append").save()


def test_an_option_the_sink_does_not_read_is_refused_and_sparks_own_are_taken(broker):
    broker.create_stream("out", partitions=1).close()
    schema = StructType([StructField("value", StringType())])
    opts = {"stream": "out", "namespace": broker.namespace}
    with pytest.raises(SpecError, match=r"^the shmq sink has no option maxrecordspertrigger \(an option of the shmq "
                                        r"streaming source\); its options are stream, "):
        StreamWriter(Options({**opts, "maxRecordsPerTrigger": "10"}), schema, False)
    with pytest.raises(SpecError, match=r"^the shmq sink has no option stagingbytes \(did you mean "
                                        r"sinkStagingMaxBytes\?\); its options"):
        StreamWriter(Options({**opts, "stagingBytes": "65536"}), schema, False)
    # what Spark hands a streaming sink of its own (checkpointLocation, queryName), as it hands them
    StreamWriter(Options({**opts, "sinkstagingmaxbytes": "65536", "checkpointlocation": "/ck", "queryname": "q"}),
                 schema, False)


def test_a_staging_stream_left_with_other_settings_is_taken_as_it_is(broker):
    """A run killed before its commit leaves its staging stream; the query, restarted with
    another sinkStagingMaxBytes, stages into that one (the settings check of create's
    exist_ok must not fail the task)."""
    out = broker.create_stream("out", partitions=2)
    left = broker.create_stream("out:staging:q", partitions=2, max_bytes=1 << 16, durability="memory")
    left.append(b"left", partition=0)
    schema = StructType([StructField("value", StringType())])
    w = StreamWriter(Options({"stream": "out", "namespace": broker.namespace, "sinkStagingMaxBytes": "131072"}),
                     schema, False)
    staged = w._stage("q", [pa.RecordBatch.from_pydict({"value": ["x"]})], 1)
    assert staged.ranges == {1: [(0, 1)]}
    assert broker.stream("out:staging:q").max_bytes == 1 << 16 and out.partitions == 2


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
    assert staged_by_writer(broker, "out", broker.list_streams()) == {}
    w.commit([stage(0)], 8)  # the next batch goes in
    assert sorted(v for rows in everything(out).values() for _k, v, _h in rows) == [b"1", b"1", b"2", b"2", b"3",
                                                                                    b"3"]
    with pytest.raises(SpecError, match="use mode\\('append'\\)"):
        StreamWriter(Options({"stream": "out", "namespace": broker.namespace}), schema, True)


def test_a_namespace_that_does_not_exist_is_named_not_made(spark, broker, sink):
    ns = broker.namespace + "x"
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match=f"there is no shmq namespace '{ns}' on this host"):
        df.write.format(sink).option("stream", "out").option("namespace", ns).mode("append").save()
    with pytest.raises(Exception, match=f"there is no shmq namespace '{ns}' on this host"):
        spark.read.format("shmq").option("stream", "events").option("namespace", ns).load().collect()
    assert namespace_entries(ns) == []


def test_a_task_routes_an_arrow_batch_as_kafkas_sink_and_stages_its_buffers(broker):
    """Without Spark: a batch (sliced, as Spark's may be) cut by partition — the partition
    column, else the key's hash, else the task's own — and each part appended from its
    buffers; what lands is the rows, keys and headers, in order per partition."""
    n = 40
    keys = [None if i % 3 == 0 else b"k%d" % i for i in range(n)]
    parts = [i % 4 if i % 5 == 0 else None for i in range(n)]
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array(keys, pa.binary()), "value": [f"v{i}" for i in range(n)],
        "partition": pa.array(parts, pa.int32()),
        "headers": pa.array([[("i", str(i))] if i % 2 else None for i in range(n)], pa.map_(pa.string(), pa.string()))})
    part = batch.slice(7, 30)
    want = {}
    for i in range(7, 37):
        p = parts[i] if parts[i] is not None else 1 if keys[i] is None else partition_of(keys[i], 4)
        want.setdefault(p, []).append((keys[i], b"v%d" % i, {"i": str(i)} if i % 2 else {}))
    s = broker.create_stream("s", partitions=4)
    for p, values, ks, hs in arrow.route(part, 4, 1, "s"):
        assert s.append_columns(arrow.chunk(values, ks, hs), p) == 0
    assert everything(s) == {p: want.get(p, []) for p in range(4)}
    whole = arrow.route(pa.RecordBatch.from_pydict({"value": [b"a", b"b"]}), 4, 2, "s")
    assert [p for p, *_ in whole] == [2]  # no key, no partition: the task's own, the columns uncopied
    with pytest.raises(arrow.SinkError, match="partitions 0..3, not 4"):
        arrow.route(pa.RecordBatch.from_pydict({"value": [b"a"], "partition": pa.array([4], pa.int32())}), 4, 0, "s")
    with pytest.raises(arrow.SinkError, match="value column is null in 1 row"):
        arrow.route(pa.RecordBatch.from_pydict({"value": pa.array([b"a", None], pa.binary())}), 4, 0, "s")


def test_the_staging_stream_goes_with_each_commit_and_a_deleted_one_fails_the_commit_loudly(broker):
    """The driver's side without Spark: a commit deletes the batch's staging stream (the
    next batch's tasks make it again), an abort too; a commit whose staged rows were
    deleted under it fails, publishing nothing, so the batch runs again."""
    broker.create_stream("out", partitions=2)
    schema = StructType([StructField("value", StringType())])
    w = StreamWriter(Options({"stream": "out", "namespace": broker.namespace}), schema, False)
    query = str(uuid.uuid4())

    def stage(rows):
        return w._stage(query, [pa.RecordBatch.from_pydict({"value": rows})], 0)

    assert stage([]).ranges == {} and broker.list_streams() == ["out"]  # no rows: no staging stream
    w.commit([stage(["a", "b"])], 0)
    assert broker.list_streams() == ["out"]
    staged = stage(["c"])
    assert broker.list_streams() == ["out", f"out:staging:{query}"]
    w.abort([staged, None], 1)  # Spark passes None for a failed task
    assert broker.list_streams() == ["out"]
    staged = stage(["d"])
    broker.delete_stream(f"out:staging:{query}")  # e.g. reclaimed by hand while the query ran
    with pytest.raises(ShmqError, match=f"cannot commit batch 1 into stream 'out': its staging stream "
                                        f"'out:staging:{query}' was deleted"):
        w.commit([staged], 1)
    w.commit([stage(["d"])], 1)  # the batch run again
    assert sorted(v for rows in everything(broker.stream("out")).values() for _k, v, _h in rows) == [b"a", b"b",
                                                                                                   b"d"]


def test_the_renamed_staging_options_are_refused_naming_the_new_ones(broker):
    with pytest.raises(SpecError, match="option stagingMaxBytes is now sinkStagingMaxBytes"):
        Options({"stream": "out", "stagingMaxBytes": "1000000"})
    with pytest.raises(SpecError, match="option stageMaxBytes is now queueStageMaxBytes"):
        Options({"queue": "jobs", "stagemaxbytes": "1000000"})  # as Spark hands options: lower-cased
    out = broker.create_stream("out", partitions=1, max_bytes=1 << 20)
    schema = StructType([StructField("value", StringType())])
    w = StreamWriter(Options({"stream": "out", "namespace": broker.namespace, "sinkStagingMaxBytes": "65536"}),
                     schema, False)
    w._stage("q", [pa.RecordBatch.from_pydict({"value": ["x"]})], 0)
    assert broker.stream("out:staging:q").max_bytes == 65536 and out.max_bytes == 1 << 20
