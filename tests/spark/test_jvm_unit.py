"""The JVM connector's shared-memory reader (shmq/spark/jvm: io.shmq.spark.source, io.shmq.spark.shm),
run with the JDK: its layout constants generated from the engine's, RecordBlock's growth, header decoding
against the Python engine's bytes and the Python source's rendering, and ShmStream reading a real
stream the Python engine wrote (keys and none, headers, values of many sizes, a ring wrapped by
retention) with exact contents and exact errors."""

import math
import random
import re
import struct

import msgpack

from shmq.engine.shm import layout as L
from shmq.model.headers import decode_headers, encode_record_headers
from shmq.spark.arrow import header_map
from tests.spark.jvm_harness import SRC, run_java

LAYOUT_JAVA = f"{SRC}/io/shmq/spark/shm/Layout.java"


def test_layout_java_is_generated_from_the_engines_layout():
    """Layout.java is layout.py's offsets for the JVM, generated (as _layout.h is for C; tests/test_mirrors.py
    holds it fresh): the offsets it names are where layout.py's structs put the fields."""
    text = L.java_layout()
    java = {m[1]: int(m[2], 0) for m in re.finditer(r"public static final int (\w+) = (0x[0-9a-f]+|\d+);", text)}
    assert len(java) == text.count("public static final int ")  # (every constant an int literal)
    # the static headers' fields it names, where layout.py's structs put them (a struct's bytes, read back)
    def u(buf, off, n):
        return int.from_bytes(buf[off:off + n], "little")

    part = L.PART_STATIC.pack(L.PART_MAGIC, L.STREAM_VERSION, 0, 0x1111, 0, 0x2222, 0x3333, 0)
    assert (u(part, 0, 4), u(part, java["PART_VERSION_OFF"], 2), u(part, java["PART_CAPACITY_OFF"], 8),
            u(part, java["PART_SLOTS_OFF"], 8), u(part, java["PART_DATA_OFF"], 8), len(part)) == (
        java["PART_MAGIC"], java["STREAM_VERSION"], 0x1111, 0x2222, 0x3333, java["PART_STATIC_SIZE"])
    meta = L.STREAM_STATIC.pack(L.STREAM_MAGIC, L.STREAM_VERSION, 0xABC, 0, 0x7E, 0, 0, 0, 0, 0, 0, 0, 0)
    assert (u(meta, 0, 4), u(meta, java["STREAM_PARTITIONS_OFF"], 2), u(meta, java["STREAM_DURABILITY_OFF"], 1),
            len(meta)) == (java["STREAM_MAGIC"], 0xABC, 0x7E, java["STREAM_STATIC_SIZE"])


def test_record_block_grows_and_never_shrinks(classes):
    assert run_java(classes, "io.shmq.spark.source.RecordBlockTest").stdout == "RecordBlockTest OK\n"


_RANDOM = random.Random(32)
HEADERS = [
    {"a": "b"},
    {"unicode ключ": "значение ✓", "": ""},
    {"bin": b"\x00\x01raw", "bad utf-8": b"\xff\xfeok\xe2\x82", "empty": b""},
    {"t": True, "f": False},
    {"ints": 0, "i1": 127, "i2": 128, "i3": 255, "i4": 256, "i5": 65535, "i6": 65536, "i7": 2**32, "i8": 2**63 - 1,
     "i9": 2**64 - 1, "n1": -1, "n2": -32, "n3": -33, "n4": -128, "n5": -129, "n6": -32768, "n7": -2**31,
     "n8": -2**63},
    {"f0": 0.0, "f1": -0.0, "f2": 0.1, "f3": 1.5, "f4": 2 / 3, "f5": 1e15, "f6": 1e16, "f7": 123456789.125,
     "f8": 1e-4, "f9": 1e-5, "fa": 1e23, "fb": 5e-324, "fc": 1.7976931348623157e308, "fd": math.inf,
     "fe": -math.inf, "ff": math.nan, "fg": 100.0, "fh": -2.5e-7, "fi": 9007199254740993.0, "fj": 0.3},
    {"long": "x" * 40, "longer": "y" * 300, "longest": "z" * 60000},
    {f"k{i}": str(i) for i in range(20)},  # a map16
    {f"r{i}": struct.unpack("<d", _RANDOM.randbytes(8))[0] for i in range(300)},  # Python's repr of any double
    {f"u{i}": _RANDOM.uniform(-1e6, 1e6) for i in range(300)},
    [("a", b"1"), ("a", "2"), ("n", None), ("i", 7)],  # a stream record's pairs: a key repeated, a null value
    [(f"r{i % 3}", i) for i in range(20)],  # an array16
]
# encodings the Python engine never makes but another msgpack writer may: a float32, a str32, a bin32, a map32,
# an array32 of pairs
OTHER_WRITERS = [b"\x81\xa1f" + msgpack.packb(0.1, use_single_float=True),
                 b"\x82\xa1s\xdb\x00\x00\x00\x03abc\xa1b\xc6\x00\x00\x00\x02hi",
                 b"\xdf\x00\x00\x00\x01\xa1k\xa1v",
                 b"\xdd\x00\x00\x00\x02\x92\xa1k\xa1v\x92\xa1k\xc0"]


def _rendered(raw: bytes) -> str:
    pairs = header_map(decode_headers(raw))
    return ",".join(k.encode().hex() + "=" + ("-" if v is None else v.encode().hex()) for k, v in pairs)


def test_headers_decode_as_the_python_source_renders_them(classes, tmp_path):
    """Header bytes the Python engine encodes (and encodings other msgpack writers make) decode to the
    strings the Python source shows; malformed ones are refused (HeadersDump checks those)."""
    raws = [encode_record_headers(h) for h in HEADERS] + OTHER_WRITERS
    fixture = tmp_path / "headers.hex"
    fixture.write_text("".join(r.hex() + "\n" for r in raws))
    out = run_java(classes, "io.shmq.spark.source.HeadersDump", fixture).stdout.splitlines()
    assert out == [_rendered(r) for r in raws]


def _record_line(p, row) -> str:
    off, ts, key, hraw, value = row
    return (f"{p} {off} {ts} {'-' if key is None else bytes(key).hex()} {bytes(hraw).hex()} "
            f"{'-' if value is None else bytes(value).hex()}")


def _expected(stream, partitions) -> list[str]:
    lines = [f"partitions {partitions}"]
    for p in range(partitions):
        first, end = stream.offsets(p)
        lines.append(f"offsets {p} {first} {end}")
        rows = []
        while first + len(rows) < end:
            rows += stream.read_raw(p, first + len(rows), 1000)
        lines += [_record_line(p, r) for r in rows]
    return lines


def test_reads_a_stream_the_python_engine_wrote(classes, broker):
    """Partition 0 wraps its 8 KiB ring many times (retention drops, pads at lap ends): Java reads
    exactly the records Python reads, offset by offset; partition 1 holds a few; reads of 7 at a time
    cross the index's strides. ShmStreamTest checks the errors (missing stream, bad names, bad
    partition, offsets dropped, past the end) and the bounds (until, maxRecords)."""
    s = broker.create_stream("events", partitions=2, max_bytes=8192, durability="memory")
    try:
        sizes = [0, 1, 7, 8, 9, 100, 1000, 3000, 55, 4000]
        for i in range(60):
            n = sizes[i % len(sizes)]
            key = None if i % 3 == 0 else f"k{i}".encode() * (i % 5)
            headers = None if i % 4 == 0 else {"i": i, "s": f"v{i}", "b": bytes([i]), "f": i / 7}
            s.append_many([None if i % 20 == 10 else bytes([i % 256]) * n], keys=None if key is None else [key],
                          headers=None if headers is None else [headers], partition=0)
        s.append_many([b"one", None, b"three"], keys=[None, b"", b"k"], headers=[{}, {"h": "v"}, [("a", None)]],
                      partition=1)  # a tombstone: a null value, -1 long
        earliest, end = s.offsets(0)
        assert earliest > 0 and end == 60, "partition 0's ring wrapped and dropped its first records"
        columns = s.read_columns(0, earliest, 1000)  # partition 0's records again, written by the C path
        if columns is not None:
            assert s.append_columns(columns[:9], 1) == 3  # (with the values' validity: tombstones stay)
        copied = s.offsets(1)[1] - 3
        got = run_java(classes, "io.shmq.spark.source.ShmStreamTest", broker.namespace, "events", 7)
        assert got.stdout.splitlines() == _expected(s, 2)
        assert got.stdout.count("\n") == 1 + 2 + (end - earliest) + 3 + copied
    finally:
        s.close()


def test_offsets_only_on_disk_are_not_a_loss(classes, broker, tmp_path):
    """A "wal" stream's oldest offsets live only in its logs: ShmStream's earliest is the Python
    source's (the disk's), and reads below shared memory throw OnDiskException for the caller to
    read them another way."""
    from shmq.persistence import Snapshotter

    s = broker.create_stream("events", partitions=1, durability="wal", max_bytes=4096)
    snap = Snapshotter(broker, str(tmp_path), wal_mode=0)
    try:
        snap.open_stream(s)
        for i in range(100):
            s.append(b"r%d." % i + b"." * 100, partition=0)
        earliest, end = s.offsets(0)
        memory = s.stats()["partitions"][0]["memory_earliest"]
        got = run_java(classes, "io.shmq.spark.source.OnDiskTest", broker.namespace, "events")
        assert got.stdout == f"earliest {earliest} memory {memory} end {end}\n"
        assert (earliest, end) == (0, 100) and memory > 0
    finally:
        snap.close()
        s.close()


def test_read_bench_runs(classes, broker):
    """ReadBench (how fast ShmStream copies; docs/SPARK.md quotes it) still runs."""
    s = broker.create_stream("bench", partitions=1, max_bytes=2**20, durability="memory")
    try:
        s.append_many([b"v" * 100] * 1000, partition=0)
        out = run_java(classes, "io.shmq.spark.source.ReadBench", broker.namespace, "bench", 64, 2).stdout
        assert re.fullmatch(r"records/s \d+ values MB/s \d+ retries 0\n", out), out
    finally:
        s.close()


def test_a_reader_passes_over_markers_and_aborted_records_and_stops_at_the_stable_offset(classes, broker):
    """The JVM source reads what the Python readers read of a partition with transactions in it
    (their markers, an aborted one's records, an open one's: docs/STREAMS.md, Transactions)."""
    s = broker.create_stream("txns", partitions=1, durability="memory")
    try:
        s.append_many([b"a", b"b"], partition=0)  # 0, 1
        s.append_many([b"x", b"y"], partition=0)  # 2, 3: aborted
        s.append_marker(0, b"\0\0\0\0", b"\0\0\0\0\0\0")  # 4
        s.append_many([b"c"], partition=0)  # 5
        s.append_marker(0, b"\0\0\0\1", b"\0\0\0\0\0\0")  # 6
        assert s.hide(0, [(2, 4)], L.FLAG_ABORTED) == 2
        s.set_stable(0, 7)
        s.append_many([b"open"], partition=0)  # 7: a transaction still open
        want = [(r.offset, r.value.hex()) for r in s.read(0, 0, 100)]
        assert want == [(0, b"a".hex()), (1, b"b".hex()), (5, b"c".hex())] and s.stable(0) == 7
        for batch in (1, 2, 100):
            for until in ((), (0, "unbounded")):  # (a read asked past the stable offset stops there too)
                out = run_java(classes, "io.shmq.spark.source.VisibleDump", broker.namespace, "txns", 0, batch, *until)
                assert out.stdout.splitlines() == ["latest 7", *(f"{o} {v}" for o, v in want), "next 7"]
    finally:
        s.close()


def test_a_read_stops_at_the_next_offset_it_loaded(classes, broker):
    """An appender stores tail, then next_offset (docs/FORMAT.md, the reader's steps): between
    the two, records at or past next_offset already lie below tail. A read asked for everything
    (until Long.MAX_VALUE) stops at the next_offset it loaded, so its next read never starts
    past the end (it did: "offset N is past the end", under TornReader)."""
    s = broker.create_stream("between", partitions=1, durability="memory")
    try:
        s.append_many([b"r%d" % i for i in range(5)], partition=0)
        mq = s._part(0)._mq
        mq[L.PI_NEXT] = 3  # the appender of offsets 3 and 4 stored tail, not yet next_offset
        try:
            for batch in (1, 2, 100):
                out = run_java(classes, "io.shmq.spark.source.VisibleDump", broker.namespace, "between", 0, batch,
                               0, "unbounded")
                assert out.stdout.splitlines() == ["latest 3", *(f"{o} {(b'r%d' % o).hex()}" for o in range(3)),
                                                   "next 3"], batch
        finally:
            mq[L.PI_NEXT] = 5
    finally:
        s.close()


def test_a_reader_of_a_compacted_partition_reads_on_across_its_gaps(classes, broker):
    """The JVM source reads a compacted partition as the Python readers do: offsets compaction
    took are passed over, from below earliest too (docs/STREAMS.md, Compacted streams)."""
    s = broker.create_stream("c", partitions=1, durability="memory", compact=True)
    try:
        for i in range(40):
            s.append(b"%d" % i, key=b"a%d" % (i % 3) if i < 30 else b"b%d" % (i % 5), partition=0)
        s.compact_now()
        want = [(r.offset, r.value.hex()) for r in s.read(0, 0, 100)]
        assert [o for o, _v in want] == [27, 28, 29, 35, 36, 37, 38, 39]
        for batch in (1, 2, 100):
            for start in (0, 27, 30):
                out = run_java(classes, "io.shmq.spark.source.VisibleDump", broker.namespace, "c", 0, batch, start)
                assert out.stdout.splitlines() == ["latest 40", *(f"{o} {v}" for o, v in want if o >= start),
                                                   "next 40"], (batch, start)
    finally:
        s.close()
