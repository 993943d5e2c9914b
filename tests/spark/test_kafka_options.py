"""The "shmq" source under Kafka's source's option names (shmq.spark.options, reader):
subscribe and subscribePattern name the one stream, startingOffsets / endingOffsets as
Kafka's per-stream JSON, maxOffsetsPerTrigger and minOffsetsPerTrigger honoured as ours;
planning checked in this process, then Spark queries with exact contents and, under
maxOffsetsPerTrigger, exact micro-batch sizes (never more than the limit)."""

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows
from pyspark.sql.types import BinaryType, StructField, StructType

from shmq.spark.options import Options, SpecError
from shmq.spark.reader import BatchReader, StreamReader
from shmq.spark.staging import staging_name
from shmq.spark.writer import StreamWriter
from tests._wait import wait_for
from tests.spark.test_source import QUERY_TIMEOUT, expected, fill, rows_of

def reader(broker, cls=StreamReader, **options):
    return cls(Options({"namespace": broker.namespace, **options}), None)


# ---------------------------------------------------------------- planning, in this process

def test_max_and_min_offsets_per_trigger_are_the_read_limits(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [9, 3])
    r = reader(broker, subscribe="events", maxOffsetsPerTrigger="5")
    assert r.getDefaultReadLimit() == ReadMaxRows(5)
    assert r.latestOffset({"0": 0, "1": 0}, r.getDefaultReadLimit()) == {"0": 3, "1": 2}  # 5 of 12, by share
    held = reader(broker, subscribe="events", minOffsetsPerTrigger="20", maxTriggerDelay="1h",
                  maxOffsetsPerTrigger="25")
    assert held.getDefaultReadLimit() == ReadMinRows(20)
    start = {"0": 0, "1": 0}
    assert held.latestOffset(start, held.getDefaultReadLimit()) == start  # 12 waiting: no batch yet
    fill(s, [10, 0])
    assert held.latestOffset(start, held.getDefaultReadLimit()) == {"0": 19, "1": 3}  # 22 waiting, 25 at most
    with pytest.raises(SpecError, match="^give option maxRecordsPerTrigger or Kafka's name for it, "
                                        "maxOffsetsPerTrigger, not both$"):
        reader(broker, stream="events", maxRecordsPerTrigger="5", maxOffsetsPerTrigger="5")
    with pytest.raises(SpecError, match="^option maxOffsetsPerTrigger must be >= 1, not 0$"):
        reader(broker, stream="events", maxOffsetsPerTrigger="0")
    with pytest.raises(SpecError, match="^option minOffsetsPerTrigger \\(9\\) is more than maxRecordsPerTrigger "
                                        "\\(5\\)$"):
        reader(broker, stream="events", maxRecordsPerTrigger="5", minOffsetsPerTrigger="9")
    with pytest.raises(SpecError, match="^the shmq batch source has no option maxoffsetspertrigger \\(an option "
                                        "of the shmq streaming source\\)"):
        reader(broker, BatchReader, stream="events", maxOffsetsPerTrigger="5")


def test_subscribe_names_one_stream(broker):
    broker.create_stream("events", partitions=1).close()
    assert reader(broker, subscribe=" events ")._stream_name() == "events"
    with pytest.raises(SpecError, match="^option subscribe must name one stream, not 'events,clicks': a shmq "
                                        "source reads one stream \\(start a query per stream"):
        reader(broker, subscribe="events,clicks")
    with pytest.raises(SpecError, match="needs exactly one of .* not stream and subscribe$"):
        Options({"stream": "events", "subscribe": "events"})
    with pytest.raises(SpecError, match="^the shmq sink has no option subscribe \\(an option of the shmq streaming "
                                        "source and the shmq batch source\\)"):
        StreamWriter(Options({"namespace": broker.namespace, "subscribe": "events"}),
                     StructType([StructField("value", BinaryType())]), False)


def test_subscribe_pattern_matches_exactly_one_stream_by_its_whole_name(broker, tcp_server):
    for name in ("events", "events-old", staging_name("events", "q1"), "orders:stage"):
        broker.create_stream(name, partitions=1).close()
    r = reader(broker, subscribePattern="ev.nts")
    assert r._stream_name() == "events"
    with pytest.raises(SpecError, match="^option subscribePattern 'orders.*' matches no stream"):
        reader(broker, BatchReader, subscribePattern="orders.*")  # a queue's stage is the queue source's
    with pytest.raises(SpecError, match=f"^option subscribePattern 'ev.*' matches 2 streams \\(events, events-old\\) "
                                        f"in namespace '{broker.namespace}': a shmq source reads one stream$"):
        reader(broker, subscribePattern="ev.*")
    with pytest.raises(SpecError, match="^option subscribePattern 'vents' matches no stream in namespace"):
        reader(broker, subscribePattern="vents")  # a search would find "events": the whole name must match
    with pytest.raises(SpecError, match="^option subscribePattern is not a regular expression \\(.*\\): '\\(ev'$"):
        reader(broker, subscribePattern="(ev")
    assert StreamReader(Options({"url": tcp_server.url, "subscribePattern": "e.*s"}), None)._stream_name() == "events"


def test_offsets_json_keyed_by_the_stream_as_kafkas(broker):
    s = broker.create_stream("events", partitions=3, max_bytes=2**16)
    fill(s, [6, 6, 6])
    r = reader(broker, subscribe="events", startingOffsets='{"events": {"0": 4, "1": -1}}')
    assert r.initialOffset() == {"0": 4, "1": 6, "2": 0}
    batch = reader(broker, BatchReader, subscribe="events", startingOffsets='{"events": {"0": 1}}',
                   endingOffsets='{"events": {"0": 3, "2": -2}}')
    assert [(g.partition, g.start, g.end) for g in batch.partitions()] == [(0, 1, 3), (1, 0, 6)]
    with pytest.raises(SpecError, match="^option startingOffsets names stream 'clicks', but this query reads "
                                        "stream 'events'"):
        reader(broker, stream="events", startingOffsets='{"clicks": {"0": 1}}').initialOffset()
    with pytest.raises(SpecError, match="^option endingOffsets: an offset is >= 0, or -2 \\(earliest\\) or -1"):
        reader(broker, BatchReader, stream="events", endingOffsets='{"events": {"0": -3}}')


# ---------------------------------------------------------------- Spark queries

@pytest.mark.slow
def test_a_trigger_never_reads_more_than_max_offsets_per_trigger(spark, broker, tmp_path, source):
    """A processing-time query (the trigger a rate limit is for), the stream named by a
    pattern, Kafka's JSON starting offsets: 25 records waiting, batches of exactly 7, 7,
    7, 4, every record once. (The JVM source hands subscribePattern to the Python one.)"""
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [16, 11])
    batches = []
    q = (spark.readStream.format(source).option("namespace", broker.namespace).option("subscribePattern", "ev.*")
         .option("startingOffsets", '{"events": {"0": 2, "1": -2}}').option("maxOffsetsPerTrigger", 7).load()
         .writeStream.foreachBatch(lambda df, bid: batches.append((bid, rows_of(df))))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="0 seconds").start())
    try:
        wait_for(lambda: sum(len(rows) for _, rows in batches) >= 25, QUERY_TIMEOUT, "25 rows read")
    finally:
        q.stop()
    sizes = [len(rows) for _, rows in sorted(batches) if rows]
    assert sizes == [7, 7, 7, 4]
    assert sorted(r for _, rows in batches for r in rows) == expected(s, {0: (2, 16), 1: (0, 11)})


@pytest.mark.slow
def test_a_batch_read_under_kafkas_names(spark, broker, source):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [5, 5])
    df = (spark.read.format(source).option("namespace", broker.namespace).option("subscribe", "events")
          .option("startingOffsets", '{"events": {"0": 1, "1": -2}}').option("endingOffsets", '{"events": {"1": 2}}')
          .load())
    assert rows_of(df) == expected(s, {0: (1, 5), 1: (0, 2)})
