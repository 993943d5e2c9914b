"""The "dmsq" data source: snapshot files the broker wrote (``persistence.snapshot_queue``
/ ``snapshot_stream``), read back by Spark exactly, damaged files refused naming the file
and offset (or read up to the damage with ignoreCorruptFiles)."""

import datetime
import os
import re
import zlib

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from shmq.formats import dmsq
from shmq.model.headers import encode_headers
from shmq.persistence import snapshot_queue, snapshot_stream
from shmq.spark import dmsq_reader
from shmq.spark.dmsq_reader import QUEUE_SCHEMA, DmsqFile, DmsqReader
from shmq.spark.options import SpecError

T0 = 1_700_000_000_123_456_789  # ns: the microseconds are what Spark keeps


def _snapshot(broker, data_dir, name, messages=None, bodies=None, max_bytes=1 << 20):
    """``data_dir/name.dmsq`` as the broker writes it: a "snapshot" queue holding
    ``messages`` (id, attempt, enqueued_ns, headers dict, body), or ``bodies`` put."""
    os.makedirs(data_dir, exist_ok=True)
    q = broker.create_queue(name, durability="snapshot", max_bytes=max_bytes)
    try:
        if messages:
            q._import_messages((i, a, e, encode_headers(h), b) for i, a, e, h, b in messages)
        if bodies:
            q.put_many(bodies)
        path, _ = snapshot_queue(q, str(data_dir))
    finally:
        q.close()
    return path


def _messages(n, first_id=1):
    headers = [{}, {"s": "text", "b": b"\x00raw\xff", "n": 42, "neg": -7, "ok": True, "f": 1.5}, {"only": "one"}]
    return [(first_id + i, i % 4, T0 + i * 1_000_001_001, headers[i % 3], b"body-%d" % i * (i % 5)) for i in range(n)]


def _expected(messages):
    str_value = {bytes: lambda v: v.decode("utf-8", "replace"), bool: lambda v: str(v).lower()}
    return [(i, b, {k: str_value.get(type(v), str)(v) for k, v in h.items()}, a, e // 1000)
            for i, a, e, h, b in messages]


def _rows(df):
    rows = df.select("id", "body", "headers", "attempt", F.unix_micros("enqueued_at")).collect()
    return sorted((r[0], bytes(r[1]), r[2], r[3], r[4]) for r in rows)


def _read(spark, path, **options):
    reader = spark.read.format("dmsq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(path)


def _damage_offset(path, record):
    """Where record ``record`` of the file starts."""
    with dmsq.SnapshotReader(path) as r:
        for _ in range(record):
            next(r)
        return r.offset


def test_a_snapshot_reads_back_exactly(spark, broker, tmp_path):
    messages = _messages(30)
    path = _snapshot(broker, tmp_path, "orders", messages)
    df = _read(spark, path)
    assert df.schema.simpleString() == ("struct<id:bigint,body:binary,headers:map<string,string>,attempt:int,"
                                        "enqueued_at:timestamp>")
    assert df.rdd.getNumPartitions() == 1
    assert _rows(df) == _expected(messages)
    assert messages[1][3]["b"] == b"\x00raw\xff" and _rows(df)[1][2]["b"] == "\x00raw\ufffd"
    table = df.orderBy("id").toArrow()  # UTC, microseconds, tz-aware
    assert str(table.schema.field("enqueued_at").type) == "timestamp[us, tz=UTC]"
    assert table.column("enqueued_at")[0].as_py() == datetime.datetime(2023, 11, 14, 22, 13, 20, 123456,
                                                                        tzinfo=datetime.timezone.utc)


def test_what_the_broker_snapshots_in_flight_messages_included(spark, broker, tmp_path):
    q = broker.create_queue("jobs", durability="snapshot")
    try:
        q.put(b"first", headers={"k": "v", "n": 7})
        q.put(b"second")
        q.get_nowait()  # leased: saved with attempt 1, delivered again after a restore
        path, n = snapshot_queue(q, str(tmp_path))
    finally:
        q.close()
    rows = _read(spark, path).orderBy("id").collect()
    assert [(r.id, bytes(r.body), r.headers, r.attempt) for r in rows] == [
        (1, b"first", {"k": "v", "n": "7"}, 1), (2, b"second", {}, 0)]


def test_several_files_one_partition_each_by_list_directory_and_glob(spark, broker, tmp_path):
    data = tmp_path / "data"
    chunks = [_messages(5, 1), _messages(7, 100), _messages(3, 200)]
    paths = [_snapshot(broker, data, name, m) for name, m in zip(["a", "b", "c"], chunks)]
    (data / "a.wal.00000001").write_bytes(b"not a snapshot")  # a directory read takes only *.dmsq
    (data / "b.dmsq.tmp").write_bytes(b"an unfinished snapshot")
    expected = sorted(_expected(chunks[0] + chunks[1] + chunks[2]))
    loads = [(str(data), 3), (paths, 3), (str(data / "[ab].dmsq"), 2), ([str(data / "*.dmsq"), paths[0]], 3)]
    for load, parts in loads:
        df = _read(spark, load)  # a list arrives as option "paths", a JSON array
        assert df.rdd.getNumPartitions() == parts, load
        assert _rows(df) == (expected if parts == 3 else sorted(_expected(chunks[0] + chunks[1]))), load


def test_an_empty_snapshot_has_no_rows(spark, broker, tmp_path):
    path = _snapshot(broker, tmp_path, "empty")
    assert dmsq.read_snapshot(path).complete
    df = _read(spark, path)
    assert df.count() == 0 and df.columns == ["id", "body", "headers", "attempt", "enqueued_at"]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_file_fails_naming_it_unless_ignore_corrupt_files(spark, broker, tmp_path, damage):
    messages = _messages(20)
    _snapshot(broker, tmp_path, "good", _messages(4, 1000))
    path = _snapshot(broker, tmp_path, "bad", messages)
    at = _damage_offset(path, 12)
    with open(path, "r+b") as f:
        if damage == "truncate":
            f.truncate(at + 10)
        else:
            f.seek(at + 40)  # a body byte of record 12
            byte = f.read(1)
            f.seek(at + 40)
            f.write(bytes([byte[0] ^ 0x01]))
    error = dmsq.read_snapshot(path).error
    assert error.startswith(path) and error.endswith(f"(at byte {at})")
    with pytest.raises(PySparkException) as e:
        _read(spark, str(tmp_path)).collect()
    assert error in str(e.value) and "ignoreCorruptFiles" in str(e.value)
    df = _read(spark, str(tmp_path), ignoreCorruptFiles="true")
    assert _rows(df) == sorted(_expected(_messages(4, 1000) + messages[:12]))


def test_ignore_corrupt_files_skips_a_file_that_is_no_snapshot(spark, broker, tmp_path):
    messages = _messages(3)
    _snapshot(broker, tmp_path, "good", messages)
    (tmp_path / "junk.dmsq").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(PySparkException) as e:
        _read(spark, str(tmp_path)).collect()
    assert f"{tmp_path / 'junk.dmsq'}: bad magic" in str(e.value)
    assert _rows(_read(spark, str(tmp_path), ignoreCorruptFiles="true")) == _expected(messages)


def test_a_path_that_matches_nothing_fails_naming_it(spark, tmp_path):
    (tmp_path / "empty").mkdir()
    for load, says in [(str(tmp_path / "nope.dmsq"), "path does not exist"),
                       (str(tmp_path / "nope-*.dmsq"), "no file matches"),
                       (str(tmp_path / "empty"), "no *.dmsq files in directory")]:
        with pytest.raises(PySparkException) as e:
            _read(spark, load)
        assert f"{says}: {load}" in str(e.value)
    with pytest.raises(PySparkException, match="needs a path"):
        spark.read.format("dmsq").load()


def test_stream_partition_snapshots_have_the_stream_columns(spark, broker, tmp_path):
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    try:
        s.append(b"v0", key=b"user-7", headers={"h": "1"}, partition=0)
        s.append(b"v1", key=b"", partition=0)
        s.append(b"v2", partition=1)
        snapshot_stream(s, str(tmp_path))
    finally:
        s.close()
    df = _read(spark, str(tmp_path))
    assert df.columns == ["key", "value", "stream", "partition", "offset", "timestamp", "headers"]
    assert df.rdd.getNumPartitions() == 2
    rows = sorted((r.partition, r.offset, r.key, bytes(r.value), r.stream, r.headers) for r in df.collect())
    assert rows == [(0, 0, b"user-7", b"v0", "events", {"h": "1"}), (0, 1, b"", b"v1", "events", {}),
                    (1, 0, None, b"v2", "events", {})]
    _snapshot(broker, tmp_path, "orders", _messages(2))  # a data dir holding both kinds: one at a time
    with pytest.raises(PySparkException, match="queue snapshots or stream snapshots, not both"):
        _read(spark, str(tmp_path))
    assert _read(spark, str(tmp_path / "[!@]*.dmsq")).count() == 2
    assert _read(spark, str(tmp_path / "@events#*.dmsq")).count() == 3


def test_fifty_thousand_messages_read_exactly(spark, broker, tmp_path):
    bodies = [b"%08d:" % i + b"x" * (i % 97) for i in range(50_000)]
    path = _snapshot(broker, tmp_path, "big", bodies=bodies, max_bytes=16 << 20)
    got = _read(spark, path).agg(F.count("*"), F.sum("id"), F.sum(F.crc32("body")), F.sum(F.length("body")),
                                 F.min("id"), F.max("id")).first()
    assert tuple(got) == (50_000, 50_000 * 50_001 // 2, sum(zlib.crc32(b) for b in bodies),
                          sum(map(len, bodies)), 1, 50_000)


def test_headers_that_are_not_a_map_are_damage(tmp_path, caplog):
    """A foreign writer's record (the broker never writes one), read in this process."""
    path = str(tmp_path / "odd.dmsq")
    records = [dmsq.SnapshotRecord(1, 0, T0, b"", b"a"), dmsq.SnapshotRecord(2, 0, T0, b"\x93\x01\x02\x03", b"b"),
               dmsq.SnapshotRecord(3, 0, T0, b"", b"c")]
    dmsq.write_snapshot(path, dmsq.SnapshotHeader("odd", {}, T0, T0), records, fsync=False)
    says = "^" + re.escape(path) + ": message 2: headers are not a msgpack map"
    with pytest.raises(dmsq_reader.DamagedSnapshot, match=says):
        list(DmsqReader({"path": path}, QUEUE_SCHEMA).read(DmsqFile(path)))
    batches = list(DmsqReader({"path": path, "ignoreCorruptFiles": "true"}, QUEUE_SCHEMA).read(DmsqFile(path)))
    assert [b.column("body").to_pylist() for b in batches] == [[b"a"]]
    assert "kept the 1 records before it" in caplog.text
    with pytest.raises(SpecError, match="the dmsq data source has the columns"):
        DmsqReader({"path": path}, QUEUE_SCHEMA[:2])
    with pytest.raises(SpecError, match=r"^the dmsq data source has no option recursivefilelookup; its options "
                                        r"are path, paths, ignoreCorruptFiles$"):
        DmsqReader({"path": path, "recursiveFileLookup": "true"}, QUEUE_SCHEMA)
