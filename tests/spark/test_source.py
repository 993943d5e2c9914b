"""The "shmq" source (shmq.spark.reader): the reader's planning in this process (offsets,
read limits, availableNow, data loss, the driver's one connection), then Spark queries
end to end with exact contents (micro-batches under a read limit, starting offsets,
restarts from a checkpoint, a producer appending during an availableNow run, data loss
both ways, batch reads, headers, TCP, bad options), each on both sources: the Python one
("shmq_python") and the JVM one ("shmq", the ``source`` fixture). Every query runs with
trigger(availableNow=True) (one with a processing-time trigger) into a foreachBatch
sink that collects rows in this process, each with its own checkpoint; every query
leaves the namespace's segments as they were."""

import logging
import os
import pickle
import random
import threading
import time
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from shmq.engine.shm.segment import namespace_entries
from shmq.spark.options import Options, SpecError
from shmq.spark.reader import (
    BatchReader, DataLossError, OffsetRange, RangeGroup, StreamReader, duration, group, share, split,
)
from tests.conftest import ThreadedServer

QUERY_TIMEOUT = 120


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def rows_of(df):
    return sorted((r.partition, r.offset, r.key, r.value) for r in df.collect())


def run(spark, broker, checkpoint, stream="events", source="shmq", **options):
    """One availableNow query of ``source`` (the format name) to its end: [(batch id, its
    rows sorted by partition and offset)]. The namespace's segments must all be there
    afterwards."""
    before = namespace_entries(broker.namespace)
    batches = []
    reader = spark.readStream.format(source).option("stream", stream).option("namespace", broker.namespace)
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.foreachBatch(lambda df, bid: batches.append((bid, rows_of(df))))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "the availableNow query did not finish"
    finally:
        q.stop()
    assert namespace_entries(broker.namespace) == before
    return batches


def data(batches):
    """The rows of the batches that have any, in batch order."""
    return [rows for _, rows in sorted(batches) if rows]


def reader_of(broker, cls=StreamReader, stream="events", **options):
    return cls(Options({"stream": stream, "namespace": broker.namespace, **options}), None)


def fill(s, counts, headers=None):
    """Append counts[p] records to each partition p: key k{i % 3}, value "p:key:i"."""
    out = {}
    for p, n in enumerate(counts):
        keys = [f"k{i % 3}".encode() for i in range(n)]
        values = [f"{p}:k{i % 3}:{i}".encode() for i in range(n)]
        if n:
            out[p] = s.append_many(values, keys=keys, headers=headers and [headers] * n, partition=p)
    return out


def pad_fill(s, start, end):
    """Append records start..end-1 to partition 0, ten at a time, each ~150 bytes in the ring."""
    for a in range(start, end, 10):
        s.append_many([b"%d:" % i + b"." * 100 for i in range(a, min(a + 10, end))], partition=0)


def expected(s, ranges):
    """(partition, offset, key, value) of the records in {partition: (start, end)}."""
    return sorted((r.partition, r.offset, r.key, r.value) for p, (a, b) in ranges.items()
                  for r in s.read(p, a, max_records=max(b - a, 1)) if r.offset < b)


# ---------------------------------------------------------------- planning, in this process

def test_share_is_proportional_bounded_and_deterministic():
    assert share({0: 40, 1: 8, 2: 2}, 10) == {0: 7, 1: 2, 2: 1}
    assert share({0: 3, 1: 2}, 10) == {0: 3, 1: 2}  # it all fits
    assert share({0: 1, 1: 9, 2: 5, 3: 0}, 2) == {0: 0, 1: 1, 2: 1, 3: 0}  # fewer than the partitions: largest first
    rng = random.Random(7)
    for _ in range(2000):
        backlog = {p: rng.choice([0, 1, 2, rng.randrange(1000)]) for p in range(rng.randrange(1, 9))}
        budget = rng.randrange(1, 600)
        take = share(backlog, budget)
        assert take == share(dict(reversed(list(backlog.items()))), budget)
        assert all(0 <= take[p] <= backlog[p] for p in backlog)
        total = sum(backlog.values())
        assert sum(take.values()) == min(total, budget)
        waiting = [p for p in backlog if backlog[p]]
        if budget >= len(waiting):
            assert all(take[p] >= 1 for p in waiting)


def test_split_cuts_ranges_in_proportion_and_deterministically():
    ranges = [OffsetRange(0, 10, 40), OffsetRange(1, 0, 10)]
    assert split(ranges, None) == ranges
    assert split(ranges, 2) == ranges
    assert split(ranges, 6) == [OffsetRange(0, 10, 16), OffsetRange(0, 16, 22), OffsetRange(0, 22, 28),
                                OffsetRange(0, 28, 34), OffsetRange(0, 34, 40), OffsetRange(1, 0, 5),
                                OffsetRange(1, 5, 10)]
    assert split([OffsetRange(0, 0, 2)], 5) == [OffsetRange(0, 0, 1), OffsetRange(0, 1, 2)]


def test_group_makes_at_most_max_partitions_of_about_equal_size_and_reads_them_all(broker):
    ranges = [OffsetRange(0, 0, 40), OffsetRange(1, 5, 15), OffsetRange(2, 0, 30), OffsetRange(3, 0, 25)]
    assert group(ranges, None) == ranges and group(ranges, 4) == ranges
    assert group(ranges, 2) == [RangeGroup([OffsetRange(0, 0, 40), OffsetRange(1, 5, 15)]),
                                RangeGroup([OffsetRange(2, 0, 30), OffsetRange(3, 0, 25)])]
    assert group(ranges, 1) == [RangeGroup(sorted(ranges, key=lambda r: r.partition))]
    s = broker.create_stream("events", partitions=4, max_bytes=2**16)
    fill(s, [40, 15, 30, 25])
    plan = reader_of(broker, BatchReader, startingOffsets='{"1": 5}', maxPartitions=2)
    parts = plan.partitions()
    assert parts == group(ranges, 2)
    got = pa.Table.from_batches([b for part in parts for b in plan.read(part)])
    assert list(zip(got.column("partition").to_pylist(), got.column("offset").to_pylist())) == \
        [(r.partition, o) for g in parts for r in g.ranges for o in range(r.start, r.end)]
    default = reader_of(broker, BatchReader, startingOffsets='{"1": 5}')  # as many as this host has cores
    assert default.partitions() == group(ranges, os.cpu_count())
    assert len(reader_of(broker, BatchReader, minPartitions=3).partitions()) == 4  # none with minPartitions
    with pytest.raises(SpecError, match="maxPartitions must be >= 1"):
        reader_of(broker, BatchReader, maxPartitions=0)


def test_durations_read_like_kafkas():
    def of(raw):
        return duration(Options({"stream": "s", "maxTriggerDelay": raw}), "maxTriggerDelay", "15m")
    assert [of("15s"), of("500ms"), of("2m"), of("1 h"), of("100"), of("1.5s")] == [15, 0.5, 120, 3600, 0.1, 1.5]
    assert duration(Options({"stream": "s"}), "maxTriggerDelay", "15m") == 900
    for bad in ("soon", "5 parsecs", "-1s", ""):
        with pytest.raises(SpecError, match="maxTriggerDelay must be a duration"):
            of(bad)


def test_initial_offsets_from_starting_offsets(broker):
    s = broker.create_stream("events", partitions=4, max_bytes=2**16)
    fill(s, [5, 6, 7, 8])
    assert reader_of(broker, startingOffsets="earliest").initialOffset() == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert reader_of(broker).initialOffset() == {"0": 5, "1": 6, "2": 7, "3": 8}  # default: latest
    spec = '{"0": 2, "1": -1, "2": -2}'  # partition 3 left out: earliest
    assert reader_of(broker, startingOffsets=spec).initialOffset() == {"0": 2, "1": 6, "2": 0, "3": 0}
    with pytest.raises(SpecError, match="names partition 4, but stream 'events' has partitions 0..3"):
        reader_of(broker, startingOffsets='{"4": 0}').initialOffset()
    with pytest.raises(SpecError, match="offset 9 of partition 0 is past the end of stream 'events' \\(5\\)"):
        reader_of(broker, startingOffsets='{"0": 9}').initialOffset()


def test_latest_offset_under_each_read_limit(broker):
    s = broker.create_stream("events", partitions=3, max_bytes=2**16)
    fill(s, [40, 8, 2])
    start = {"0": 0, "1": 0, "2": 0}
    r = reader_of(broker, maxRecordsPerTrigger=10)
    assert r.getDefaultReadLimit() == ReadMaxRows(10)
    assert r.latestOffset(start, ReadMaxRows(10)) == {"0": 7, "1": 2, "2": 1}
    assert r.latestOffset({"0": 7, "1": 2, "2": 1}, ReadMaxRows(10)) == {"0": 14, "1": 4, "2": 2}
    assert r.latestOffset(start, ReadAllAvailable()) == {"0": 40, "1": 8, "2": 2}  # the trigger's limit rules
    assert r.latestOffset({"0": 40}, ReadAllAvailable()) == {"0": 40, "1": 8, "2": 2}  # new partitions from 0
    assert r.partitions({"0": 40}, {"0": 40, "1": 8, "2": 2}) in (
        [OffsetRange(1, 0, 8), OffsetRange(2, 0, 2)], [RangeGroup([OffsetRange(1, 0, 8), OffsetRange(2, 0, 2)])])
    assert reader_of(broker).getDefaultReadLimit() == ReadAllAvailable()
    with pytest.raises(SpecError, match="minRecordsPerTrigger \\(20\\) is more than maxRecordsPerTrigger \\(10\\)"):
        reader_of(broker, maxRecordsPerTrigger=10, minRecordsPerTrigger=20)


def test_min_records_wait_for_enough_rows_or_the_delay(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [4, 0])
    start = {"0": 0, "1": 0}
    r = reader_of(broker, minRecordsPerTrigger=10, maxTriggerDelay="1h", maxRecordsPerTrigger=12)
    assert r.getDefaultReadLimit() == ReadMinRows(10)
    assert r.latestOffset(start, ReadMinRows(10)) == start
    fill(s, [4, 6])
    assert r.latestOffset(start, ReadMinRows(10)) == {"0": 7, "1": 5}  # 14 waiting, maxRecordsPerTrigger 12
    fill(s, [3, 0])
    assert r.latestOffset({"0": 7, "1": 5}, ReadMinRows(10)) == {"0": 7, "1": 5}
    assert r.latestOffset({"0": 7, "1": 5}, ReadAllAvailable()) == {"0": 11, "1": 6}
    impatient = reader_of(broker, minRecordsPerTrigger=100, maxTriggerDelay="0s")
    assert impatient.latestOffset(start, ReadMinRows(100)) == {"0": 11, "1": 6}  # the delay has passed
    available_now = reader_of(broker, minRecordsPerTrigger=100, maxTriggerDelay="1h")
    available_now.prepareForTriggerAvailableNow()
    assert available_now.latestOffset(start, ReadMinRows(100)) == {"0": 11, "1": 6}  # it would never come


def test_available_now_stops_at_the_ends_it_found(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [5, 3])
    r = reader_of(broker, startingOffsets="earliest")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    fill(s, [7, 7])
    assert r.latestOffset(start, ReadMaxRows(6)) == {"0": 4, "1": 2}
    assert r.latestOffset({"0": 4, "1": 2}, ReadMaxRows(6)) == {"0": 5, "1": 3}
    assert r.latestOffset({"0": 5, "1": 3}, ReadMaxRows(6)) == {"0": 5, "1": 3}  # the target: no more batches
    assert r.reportLatestOffset() == {"0": 12, "1": 10}


def test_the_driver_keeps_one_connection_and_pickles_without_it(broker):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [3, 3])
    r = reader_of(broker, startingOffsets="earliest")
    start = r.initialOffset()
    kept = r._broker
    for _ in range(5):
        r.latestOffset(start, ReadAllAvailable())
    assert r._broker is kept
    copy = pickle.loads(pickle.dumps(r))
    assert copy._broker is None and copy._stream is None
    assert copy.latestOffset(start, ReadAllAvailable()) == {"0": 3, "1": 3}
    for reader in (r, copy):
        reader.commit({"0": 3, "1": 3})
        reader.stop()
        reader.stop()
    assert r.latestOffset(start, ReadAllAvailable()) == {"0": 3, "1": 3}  # opens another
    r.stop()


def test_read_yields_arrow_batches_of_the_range_only(broker):
    s = broker.create_stream("events", partitions=1, max_bytes=2**16)
    fill(s, [30])
    batches = list(reader_of(broker).read(OffsetRange(0, 4, 27)))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(4, 27))
    assert table.column("value").to_pylist()[0] == b"0:k1:4"
    assert list(reader_of(broker).read(OffsetRange(0, 5, 5))) == []


@pytest.mark.parametrize("where", ["local", "local-python-paths", "tcp"])
def test_a_range_with_transactions_gives_the_committed_records(broker, where):
    """A range over a transaction's marker, an aborted one's records and up to an open one's
    first offset (docs/STREAMS.md, Transactions): the committed records, on each read path
    (the C columns, the Python rows, READ over TCP); planning ends at the last stable offset."""
    from shmq.engine.shm import cpaths
    from shmq.engine.shm import layout as L

    s = broker.create_stream("events", partitions=1)
    s.append_many([b"a", b"x", b"y"], partition=0)  # 0, 1-2 aborted
    s.hide(0, [(1, 3)], L.FLAG_ABORTED)
    s.append_marker(0, b"\0\0\0\0", b"\0\0\0\0\0\0")  # 3
    s.append_many([b"b"], partition=0)  # 4
    s.append_marker(0, b"\0\0\0\1", b"\0\0\0\0\0\0")  # 5
    s.set_stable(0, 6)
    s.append_many([b"open"], partition=0)  # 6
    srv = ThreadedServer(broker.namespace) if where == "tcp" else None
    cpaths.set_enabled(where != "local-python-paths")
    try:
        opts = {"stream": "events", **({"url": srv.url} if srv else {"namespace": broker.namespace})}
        reader = BatchReader(Options(opts), None)
        assert reader._positions(s) == {0: (0, 6)}  # planned up to the last stable offset
        for r in (OffsetRange(0, 0, 6), OffsetRange(0, 1, 4), OffsetRange(0, 2, 6)):
            got = [(o, v) for b in reader.read(r) for o, v in zip(b.column("offset").to_pylist(),
                                                                   b.column("value").to_pylist())]
            assert got == [(o, v) for o, v in ((0, b"a"), (4, b"b")) if r.start <= o < r.end], r
    finally:
        cpaths.set_enabled(True)
        if srv is not None:
            srv.stop()
        s.close()


def test_lost_offsets_fail_the_plan_and_the_read_or_are_skipped_with_a_warning(broker, caplog):
    s = broker.create_stream("small", partitions=1, max_bytes=4096)
    pad_fill(s, 0, 60)
    earliest, end = s.offsets(0)
    assert 20 < earliest < 60
    strict = reader_of(broker, stream="small")
    lost = f"stream 'small' partition 0: offsets 20..{earliest - 1} were dropped by retention"
    with pytest.raises(DataLossError, match=lost):
        strict.partitions({"0": 20}, {"0": 60})
    with pytest.raises(DataLossError, match=lost):
        list(strict.read(OffsetRange(0, 20, 60)))
    strict.stop()
    lenient = reader_of(broker, stream="small", failOnDataLoss="false")
    assert lenient.partitions({"0": 20}, {"0": 60}) == [OffsetRange(0, 20, 60)]  # the plan stays the same
    with caplog.at_level(logging.WARNING, logger="shmq.spark"):
        table = pa.Table.from_batches(list(lenient.read(OffsetRange(0, 20, 60))))
    assert table.column("offset").to_pylist() == list(range(earliest, 60))
    assert lost in caplog.text and "skipped (failOnDataLoss=false)" in caplog.text
    lenient.stop()


def test_batch_plan_resolves_starting_and_ending_offsets(broker):
    s = broker.create_stream("events", partitions=3, max_bytes=2**16)
    fill(s, [10, 10, 10])
    plan = reader_of(broker, BatchReader, startingOffsets='{"0": 3, "1": -2}', endingOffsets='{"0": 7, "2": 4}',
                     maxPartitions=3)
    assert plan.partitions() == [OffsetRange(0, 3, 7), OffsetRange(1, 0, 10), OffsetRange(2, 0, 4)]
    assert reader_of(broker, BatchReader, minPartitions=4).partitions() == [
        OffsetRange(0, 0, 5), OffsetRange(0, 5, 10), OffsetRange(1, 0, 5), OffsetRange(1, 5, 10),
        OffsetRange(2, 0, 5), OffsetRange(2, 5, 10)]
    with pytest.raises(SpecError, match="partition 0: endingOffsets \\(2\\) is before startingOffsets \\(3\\)"):
        reader_of(broker, BatchReader, startingOffsets='{"0": 3}', endingOffsets='{"0": 2}').partitions()
    with pytest.raises(SpecError, match="startingOffsets cannot be latest"):
        reader_of(broker, BatchReader, startingOffsets="latest")
    with pytest.raises(SpecError, match="endingOffsets cannot be earliest"):
        reader_of(broker, BatchReader, endingOffsets='{"0": -2}')


def test_option_errors_are_one_clear_line(broker):
    with pytest.raises(SpecError, match="exactly one of .option\\('stream', NAME\\) or .option\\('queue', NAME\\)"):
        Options({"namespace": broker.namespace})
    with pytest.raises(SpecError, match="exactly one of"):
        Options({"stream": "a", "queue": "b"})
    with pytest.raises(SpecError, match="option maxRecordsPerTrigger must be >= 1, not 0"):
        reader_of(broker, maxRecordsPerTrigger=0)
    with pytest.raises(SpecError, match="option failOnDataLoss must be true or false"):
        reader_of(broker, failOnDataLoss="maybe")


def test_an_option_the_source_does_not_read_is_refused_naming_those_it_does(broker):
    """Kafka's maxOffsetsPerTrigger once looked taken and did nothing: a user believed they
    had a rate limit (it is honoured now, tests/spark/test_kafka_options.py). Every option
    a part does not read is refused, as Spark hands it (lower-cased), with the closest name
    it has and the list of them."""
    known = ("stream, queue, namespace, url, token, maxOutage, subscribe, subscribePattern, startingOffsets, "
             "failOnDataLoss, includeHeaders, minPartitions, maxPartitions, queueStageMaxBytes")
    with pytest.raises(SpecError) as e:
        reader_of(broker, maxoffsetspertriger="10")
    assert str(e.value) == ("the shmq streaming source has no option maxoffsetspertriger (did you mean "
                            f"maxOffsetsPerTrigger?); its options are {known}, maxRecordsPerTrigger, "
                            "maxOffsetsPerTrigger, minRecordsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay")
    with pytest.raises(SpecError) as e:
        reader_of(broker, BatchReader, maxOffsetsPerTrigger="10", assign='{"events": [0]}')
    assert str(e.value) == ("the shmq batch source has no options assign, maxoffsetspertrigger (an option of the "
                            f"shmq streaming source); its options are {known}, endingOffsets")
    with pytest.raises(SpecError, match="^the shmq streaming source has no option endingoffsets \\(an option of "
                                        "the shmq batch source\\); its options"):
        reader_of(broker, endingOffsets="latest")
    broker.create_stream("events", partitions=1).close()
    every = dict.fromkeys(["startingOffsets", "failOnDataLoss", "includeHeaders", "minPartitions", "maxPartitions",
                           "queueStageMaxBytes"], "true")
    every.update(startingOffsets="earliest", minPartitions="1", maxPartitions="2", queueStageMaxBytes="65536")
    reader_of(broker, **every, maxRecordsPerTrigger="10", minRecordsPerTrigger="5", maxTriggerDelay="1s")
    reader_of(broker, BatchReader, **every, endingOffsets="latest")


def test_every_option_the_code_reads_is_in_a_parts_list():
    """The lists the refusal checks against are the options the code reads: one read that
    is in no list would be refused as unknown, one listed and never read ignored."""
    import re
    from pathlib import Path

    from shmq.spark import options

    listed = {n.lower() for names in options.OPTIONS.values() for n in names}
    src = "".join((Path(options.__file__).parent / f).read_text() for f in ("reader.py", "writer.py", "options.py"))
    read = {n.lower() for n in re.findall(r'(?:(?:opts|self)\.(?:get|integer|number|flag|offsets|seconds)\(|duration\(opts, )'
                                          r'"(\w+)"', src)}
    kafkas = {n.lower() for n in options.KAFKA_NAMES.values()}  # read under our names (Options.get)
    assert read | kafkas == listed - {"checkpointlocation", "queryname"}  # (Spark's own, handed to a sink: not read)


# ---------------------------------------------------------------- Spark queries

def test_micro_batches_share_the_limit_over_skewed_partitions_with_exact_records(spark, broker, tmp_path, source):
    s = broker.create_stream("events", partitions=3, max_bytes=2**16)
    appended = fill(s, [40, 8, 2])
    batches = run(spark, broker, tmp_path / "ck", source=source, startingOffsets="earliest", maxRecordsPerTrigger=10)
    counts = [{p: sum(1 for r in rows if r[0] == p) for p in range(3) if any(r[0] == p for r in rows)}
              for rows in data(batches)]
    assert counts == [{0: 7, 1: 2, 2: 1}, {0: 7, 1: 2, 2: 1}, {0: 8, 1: 2}, {0: 9, 1: 1}, {0: 9, 1: 1}]
    rows = [r for b in data(batches) for r in b]
    assert sorted(rows) == expected(s, {0: (0, 40), 1: (0, 8), 2: (0, 2)})
    seen = {}
    for p, _offset, key, value in rows:  # batch by batch: every key's records in append order
        seq = int(value.split(b":")[2])
        assert seq > seen.get((p, key), -1)
        seen[p, key] = seq
    one = (spark.read.format(source).option("stream", "events").option("namespace", broker.namespace)
           .option("endingOffsets", '{"0": 1, "1": 0, "2": 0}').load())
    assert [f.simpleString() for f in one.schema.fields] == [
        "key:binary", "value:binary", "stream:string", "partition:int", "offset:bigint", "timestamp:timestamp"]
    row = one.collect()[0]
    assert (row.key, row.value, row.stream, row.partition, row.offset) == (b"k0", b"0:k0:0", "events", 0, 0)
    assert row.timestamp.timestamp() == pytest.approx(appended[0][0].timestamp, abs=1e-5)  # naive, local time


def test_latest_then_restarts_resume_from_the_checkpoint(spark, broker, tmp_path, source):
    s = broker.create_stream("events", partitions=3, max_bytes=2**16)
    fill(s, [10, 10, 10])
    ck = tmp_path / "ck"
    assert data(run(spark, broker, ck, source=source, startingOffsets="latest")) == []
    fill(s, [4, 0, 2])
    again = run(spark, broker, ck, source=source, startingOffsets="earliest")  # ignored: the checkpoint has offsets
    assert data(again) == [expected(s, {0: (10, 14), 2: (10, 12)})]
    assert run(spark, broker, ck, source=source, startingOffsets="earliest") == []  # nothing new: no batch at all


def test_starting_offsets_as_json(spark, broker, tmp_path, source):
    s = broker.create_stream("events", partitions=4, max_bytes=2**16)
    fill(s, [6, 6, 6, 6])
    batches = run(spark, broker, tmp_path / "ck", source=source, startingOffsets='{"0": 4, "1": -1, "2": -2}')
    assert data(batches) == [expected(s, {0: (4, 6), 2: (0, 6), 3: (0, 6)})]


def test_available_now_stops_at_its_target_while_a_producer_appends(spark, broker, tmp_path, source):
    s = broker.create_stream("events", partitions=3, max_bytes=2**22)
    fill(s, [400, 300, 300])
    stop = threading.Event()

    def produce():  # ~500 records a second, key-less: ten at a time to each partition in turn
        with broker.stream("events") as mine:
            n = 0
            while not stop.is_set():
                mine.append_many([f"live-{n + i}".encode() for i in range(10)])
                n += 10
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: sum(s.offsets(p)[1] for p in range(3)) > 1100, 30, "the producer")
        batches = run(spark, broker, tmp_path / "ck", source=source, startingOffsets="earliest",
                      maxRecordsPerTrigger=1000)
        ends = [s.offsets(p)[1] for p in range(3)]
        wait_for(lambda: [s.offsets(p)[1] for p in range(3)] != ends, 30, "appends after the query ended")
    finally:
        stop.set()
        producer.join(30)
    assert len(data(batches)) >= 2 and all(len(b) <= 1000 for b in data(batches))
    rows = [r for b in data(batches) for r in b]
    read = {p: sorted(r[1] for r in rows if r[0] == p) for p in range(3)}
    assert all(read[p] == list(range(len(read[p]))) for p in range(3))  # a prefix of each partition
    assert 1100 < len(rows) < sum(ends)  # more than before the start, less than the producer had at the end
    assert sorted(rows) == expected(s, {p: (0, len(read[p])) for p in range(3)})


def test_fail_on_data_loss_both_ways(spark, broker, tmp_path, source):
    s = broker.create_stream("small", partitions=1, max_bytes=4096)
    pad_fill(s, 0, 20)
    ck = tmp_path / "ck"
    first = run(spark, broker, ck, source=source, stream="small", startingOffsets="earliest")
    assert data(first) == [expected(s, {0: (0, 20)})]
    pad_fill(s, 20, 60)
    earliest, end = s.offsets(0)
    assert 20 < earliest and end == 60
    with pytest.raises(Exception, match=f"stream 'small' partition 0: offsets 20..{earliest - 1} were dropped"):
        run(spark, broker, ck, source=source, stream="small")
    batches = run(spark, broker, ck, source=source, stream="small", failOnDataLoss="false")
    assert data(batches) == [expected(s, {0: (earliest, 60)})]


def test_min_records_per_trigger_holds_the_batch_back(spark, broker, tmp_path, source):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [4, 0])
    batches = []
    q = (spark.readStream.format(source).option("stream", "events").option("namespace", broker.namespace)
         .option("startingOffsets", "earliest").option("minRecordsPerTrigger", 10).option("maxTriggerDelay", "1h")
         .load().writeStream.foreachBatch(lambda df, bid: batches.append((bid, rows_of(df))))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="100 milliseconds").start())
    try:
        # Spark runs an empty first batch; "waiting" then means a trigger found 4 rows too few
        wait_for(lambda: q.status["message"] == "Waiting for data to arrive", QUERY_TIMEOUT, "the first trigger")
        fill(s, [0, 6])
        wait_for(lambda: data(batches), QUERY_TIMEOUT, "a batch")
    finally:
        q.stop()
    assert data(batches) == [expected(s, {0: (0, 4), 1: (0, 6)})]


def test_batch_reads_exact_rows_with_offsets_headers_and_min_partitions(spark, broker, source):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [10, 10], headers={"s": "text", "b": b"\xff", "n": 3, "t": True})
    s.append(b"bare", partition=1)

    def load(**options):
        reader = spark.read.format(source).option("stream", "events").option("namespace", broker.namespace)
        for k, v in options.items():
            reader = reader.option(k, v)
        return reader.load()

    assert rows_of(load()) == expected(s, {0: (0, 10), 1: (0, 11)})
    df = load(startingOffsets='{"0": 3, "1": -2}', endingOffsets='{"0": 7, "1": -1}')
    assert rows_of(df) == expected(s, {0: (3, 7), 1: (0, 11)})
    df = load(startingOffsets='{"0": 8}', endingOffsets='{"1": 2}', minPartitions=3)
    assert df.rdd.getNumPartitions() == 4  # two ranges of 2 offsets, each cut in two
    assert rows_of(df) == expected(s, {0: (8, 10), 1: (0, 2)})
    assert rows_of(load(startingOffsets='{"0": 10, "1": 11}')) == []  # nothing to plan
    heads = {(r.partition, r.offset): r.headers for r in load(includeHeaders="true").collect()}
    assert heads[0, 0] == {"s": "text", "b": "\ufffd", "n": "3", "t": "true"}
    assert heads[1, 10] == {}
    s.append(None, key=b"k", headers=[("a", b"1"), ("z", None)], partition=1)  # a tombstone: null value, null header
    (row,) = load(includeHeaders="true", startingOffsets='{"0": 10, "1": 11}').collect()
    assert (row.offset, row.key, row.value, row.headers) == (11, b"k", None, {"a": "1", "z": None})


def test_the_source_over_tcp_with_a_token(spark, broker, tmp_path, source):
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [7, 5])
    srv = ThreadedServer(broker.namespace, token="s3cret")
    try:
        batches = []
        q = (spark.readStream.format(source).option("stream", "events").option("url", srv.url)
             .option("token", "s3cret").option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 8)
             .load().writeStream.foreachBatch(lambda df, bid: batches.append((bid, rows_of(df))))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        assert q.awaitTermination(QUERY_TIMEOUT)
        remote = (spark.read.format(source).option("stream", "events").option("url", srv.url)
                  .option("token", "s3cret").load())
        assert rows_of(remote) == expected(s, {0: (0, 7), 1: (0, 5)})
    finally:
        srv.stop()
    assert [len(b) for b in data(batches)] == [8, 4]
    assert sorted(r for b in data(batches) for r in b) == expected(s, {0: (0, 7), 1: (0, 5)})


def test_the_source_over_url_finds_the_token_of_this_users_server_by_itself(spark, broker, servers, source):
    """No token option and no $SHMQ_TOKEN: both sources (their driver and their tasks) show the
    server the token of this user's server that listens there (its runtime file, shmq.auth; the
    JVM source through io.shmq.spark.tcp.Auth), as the Python client does (issue 69, item 6)."""
    assert "SHMQ_TOKEN" not in os.environ
    s = broker.create_stream("events", partitions=2, max_bytes=2**16)
    fill(s, [7, 5])
    srv = servers(broker.namespace, "--no-persist")  # the token of the per-user token file, advertised
    try:
        assert "token required" in srv.log[-1]
        df = spark.read.format(source).option("stream", "events").option("url", srv.url).load()
        assert rows_of(df) == expected(s, {0: (0, 7), 1: (0, 5)})
    finally:
        assert srv.stop() == 0


def test_bad_options_fail_with_messages_naming_what(spark, broker, tmp_path, source):
    broker.create_stream("events", partitions=1, max_bytes=2**16)
    ns = broker.namespace
    with pytest.raises(Exception, match="needs exactly one of .option\\('stream', NAME\\)"):
        spark.read.format(source).option("namespace", ns).load()
    with pytest.raises(Exception, match="needs exactly one of"):
        spark.readStream.format(source).option("stream", "events").option("queue", "q").load()
    with pytest.raises(Exception, match="no stream 'nope' in namespace"):
        spark.read.format(source).option("stream", "nope").option("namespace", ns).load().collect()
    with pytest.raises(Exception, match="no queue 'orders'"):
        spark.read.format(source).option("queue", "orders").option("namespace", ns).load().collect()
    with pytest.raises(Exception, match="no stream 'nope' in namespace"):
        run(spark, broker, tmp_path / "ck1", source=source, stream="nope")
    with pytest.raises(Exception, match="startingOffsets must be earliest, latest or JSON"):
        run(spark, broker, tmp_path / "ck2", source=source, startingOffsets="yesterday")
    with pytest.raises(Exception, match="the shmq streaming source has no option maxrecordspertriger \\(did you "
                                        "mean maxRecordsPerTrigger\\?\\); its options are stream, queue"):
        run(spark, broker, tmp_path / "ck3", source=source, maxRecordsPerTriger=10)


def test_planning_a_query_imports_no_pyarrow(broker):
    """Spark starts a new Python process per query to plan it (the source's offsets and
    partitions) and runs the sink's commit in another: neither needs pyarrow, whose import
    would be part of every query's start."""
    import subprocess
    import sys

    broker.create_stream("events", partitions=2)
    code = (
        "import sys, pickle\n"
        "from shmq.spark.datasource import ShmqDataSource\n"
        f"ds = ShmqDataSource({{'stream': 'events', 'namespace': {broker.namespace!r}}})\n"
        "r = ds.streamReader(ds.schema())\n"
        "end = r.latestOffset(r.initialOffset(), r.getDefaultReadLimit())\n"
        "pickle.dumps(r.partitions({'0': 0, '1': 0}, end))\n"
        "import shmq.spark.writer\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
