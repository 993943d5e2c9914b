"""The .dmsq snapshot format and the log entry codec (shmq/formats/dmsq.py, docs/FORMAT.md).

Pure file I/O in a temporary directory: no shared memory, no processes, no sleeps. The
Hypothesis properties hold the readers to their promise: for any damage they return a
prefix of what was written, exactly the structures wholly before the first damaged
byte, and never raise.
"""

import dataclasses
import json
import os
import struct
import zlib

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq.formats import dmsq
from shmq.formats.dmsq import (ACK, FORMAT_VERSION, MAGIC, PUT, SUFFIX, LogEntry, ReadResult, SnapshotHeader,
                                   SnapshotRecord, SnapshotWriter, encode_log_entry, iter_records, quarantine,
                                   read_log, read_snapshot, summary, write_snapshot)
from shmq.errors import MessageTooLarge

ALL_BYTES = bytes(range(256))
SETTINGS = {
    "max_bytes": 64 * 2**20,
    "max_message_bytes": 2**20,
    "visibility_timeout": 30.0,
    "max_deliveries": 5,
    "dead_letter_queue": "orders.dlq",
    "durability": "snapshot",
}
HEADER = SnapshotHeader("orders", SETTINGS, 1_700_000_000_000_000_000, 1_700_000_060_000_000_000)
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00"


def make_records(n):
    out = []
    for i in range(n):
        headers = msgpack.packb({"trace": f"t-{i}", "n": i}, use_bin_type=True) if i % 3 == 0 else b""
        if i % 4 == 0:
            body = ALL_BYTES
        elif i % 4 == 1:
            body = b""
        else:
            body = bytes([i % 256]) * (i % 97)
        out.append(SnapshotRecord(msg_id=i + 1, attempt=i % 5, enqueued_ns=1_700_000_000_000_000_000 + i,
                                  headers=headers, body=body))
    return out


def record_size(r):
    return dmsq.RECORD_OVERHEAD + len(r.headers) + len(r.body)


def boundaries(data, records):
    """Offsets where each record starts, then where the trailer starts."""
    pos = struct.unpack_from("<I", data, 8)[0]  # header_len
    out = [pos]
    for r in records:
        pos += record_size(r)
        out.append(pos)
    return out


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture
def snap(tmp_path):
    return str(tmp_path / ("orders" + SUFFIX))


# ---------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_round_trip(snap, n):
    records = make_records(n)
    size = write_snapshot(snap, HEADER, records)
    assert size == os.path.getsize(snap)
    r = read_snapshot(snap)
    assert r == ReadResult(HEADER, records, complete=True, error=None, error_offset=None)
    assert r.header.version == FORMAT_VERSION
    assert r.records == records
    assert r.complete is True and r.error is None and r.error_offset is None


def test_file_layout_basics(snap):
    size = write_snapshot(snap, HEADER, make_records(2), fsync=False)
    data = open(snap, "rb").read()
    assert data[:4] == MAGIC == b"DMSQ"
    assert struct.unpack_from("<H", data, 4)[0] == FORMAT_VERSION
    header_len = struct.unpack_from("<I", data, 8)[0]
    assert struct.unpack_from("<I", data, header_len - 4)[0] == zlib.crc32(data[: header_len - 4])
    assert data[header_len : header_len + 4] == b"RECD"
    assert data[-32:-28] == b"TAIL"
    tag, _chain, count, file_bytes, _reserved, crc = struct.unpack("<4sIQQII", data[-32:])
    assert (count, file_bytes, crc) == (2, size, zlib.crc32(data[-32:-4]))


def test_settings_and_names_round_trip(snap):
    header = SnapshotHeader("q.é:ü-1", {"dead_letter_queue": None, "new_setting": [1, "x"], "f": 0.25}, 0, 2**64 - 1)
    rec = SnapshotRecord(2**64 - 1, 2**32 - 1, 2**64 - 1, b"\x80", ALL_BYTES * 40)
    write_snapshot(snap, header, [rec], fsync=False)
    r = read_snapshot(snap)
    assert r.header == header
    assert r.records == [rec]
    assert r.complete


def test_streaming_reader(snap):
    records = make_records(10)
    write_snapshot(snap, HEADER, records, fsync=False)
    reader = iter_records(snap)
    assert reader.header == HEADER
    assert reader.complete is False  # not until the trailer has been read
    assert list(reader) == records
    assert reader.complete is True and reader.error is None
    assert list(reader) == []


def test_writer_accepts_bytes_like(snap):
    with SnapshotWriter(snap, HEADER, fsync=False) as w:
        w.append(SnapshotRecord(1, 0, 0, bytearray(b"\x80"), memoryview(b"abc")))
        w.append(SnapshotRecord(2, 0, 0, b"", memoryview(struct.pack("<QQ", 1, 2)).cast("Q")))
        w.append(SnapshotRecord(3, 0, 0, b"", memoryview(b"0123456789")[::2]))
        assert w.records == 3
    assert read_snapshot(snap).records == [
        SnapshotRecord(1, 0, 0, b"\x80", b"abc"),
        SnapshotRecord(2, 0, 0, b"", struct.pack("<QQ", 1, 2)),
        SnapshotRecord(3, 0, 0, b"", b"02468"),
    ]


# ----------------------------------------------------------------- temp file and rename


def test_commit_replaces_previous_and_is_owner_only(snap):
    write_snapshot(snap, HEADER, make_records(3))
    old_umask = os.umask(0)
    try:
        with SnapshotWriter(snap, HEADER) as w:
            for rec in make_records(5):
                w.append(rec)
            size = w.commit()
    finally:
        os.umask(old_umask)
    assert size == os.path.getsize(snap)
    assert read_snapshot(snap).records == make_records(5)
    assert os.stat(snap).st_mode & 0o777 == 0o600
    assert not os.path.exists(snap + ".tmp")


def test_clean_exit_commits(snap):
    with SnapshotWriter(snap, HEADER, fsync=False) as w:
        w.append(make_records(1)[0])
    assert read_snapshot(snap).complete
    assert not os.path.exists(snap + ".tmp")


def test_abort_leaves_previous_snapshot_byte_identical(snap):
    write_snapshot(snap, HEADER, make_records(3))
    before = open(snap, "rb").read()
    w = SnapshotWriter(snap, HEADER)
    for rec in make_records(50):
        w.append(rec)
    # A crash here (before commit) leaves the old snapshot at path, whole.
    assert os.path.exists(snap + ".tmp")
    assert open(snap, "rb").read() == before
    w.abort()
    w.abort()  # idempotent
    assert open(snap, "rb").read() == before
    assert not os.path.exists(snap + ".tmp")
    with pytest.raises(ValueError, match="closed"):
        w.append(make_records(1)[0])


def test_exception_in_with_block_aborts(snap):
    write_snapshot(snap, HEADER, make_records(3))
    before = open(snap, "rb").read()
    with pytest.raises(RuntimeError, match="boom"):
        with SnapshotWriter(snap, HEADER) as w:
            w.append(make_records(1)[0])
            raise RuntimeError("boom")
    assert open(snap, "rb").read() == before
    assert sorted(os.listdir(os.path.dirname(snap))) == [os.path.basename(snap)]


def test_failed_rename_leaves_previous_snapshot(snap, monkeypatch):
    write_snapshot(snap, HEADER, make_records(3))
    before = open(snap, "rb").read()

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dmsq.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        write_snapshot(snap, HEADER, make_records(7))
    monkeypatch.undo()
    assert open(snap, "rb").read() == before
    assert not os.path.exists(snap + ".tmp")


def test_stale_tmp_from_a_crash_is_replaced(snap):
    write_bytes(snap + ".tmp", b"half a snapshot")
    os.chmod(snap + ".tmp", 0o644)
    write_snapshot(snap, HEADER, make_records(2))
    assert read_snapshot(snap).records == make_records(2)
    assert os.stat(snap).st_mode & 0o777 == 0o600
    assert not os.path.exists(snap + ".tmp")


def test_commit_twice_is_refused(snap):
    w = SnapshotWriter(snap, HEADER, fsync=False)
    w.commit()
    with pytest.raises(ValueError, match="closed"):
        w.commit()
    w.abort()  # no-op after commit: the file stays
    assert read_snapshot(snap).complete


def test_writer_rejects_bad_input(snap, monkeypatch):
    with pytest.raises(TypeError):
        SnapshotWriter(snap, SnapshotHeader(b"orders", {}, 0, 0))
    with pytest.raises(TypeError):
        SnapshotWriter(snap, SnapshotHeader("orders", {1: 2}, 0, 0))
    with pytest.raises(ValueError, match="version"):
        SnapshotWriter(snap, SnapshotHeader("orders", {}, 0, 0, version=FORMAT_VERSION + 1))
    with pytest.raises(ValueError, match="version"):  # older versions are read, never written
        SnapshotWriter(snap, SnapshotHeader("orders", {}, 0, 0, version=1))
    with pytest.raises(ValueError, match="created_ns"):
        SnapshotWriter(snap, SnapshotHeader("orders", {}, -1, 0))
    with pytest.raises(ValueError, match="name"):
        SnapshotWriter(snap, SnapshotHeader("q" * (dmsq.MAX_NAME_BYTES + 1), {}, 0, 0))
    assert os.listdir(os.path.dirname(snap)) == []

    monkeypatch.setattr(dmsq, "MAX_BODY_BYTES", 10)
    with SnapshotWriter(snap, HEADER, fsync=False) as w:
        with pytest.raises(ValueError, match="out of range"):
            w.append(SnapshotRecord(-1, 0, 0, b"", b""))
        with pytest.raises(ValueError, match="out of range"):
            w.append(SnapshotRecord(1, 2**32, 0, b"", b""))
        with pytest.raises(TypeError):
            w.append(SnapshotRecord(1, 0, 0, {"a": 1}, b""))
        with pytest.raises(TypeError):
            w.append(SnapshotRecord(1, 0, 0, b"", "text"))
        with pytest.raises(MessageTooLarge):
            w.append(SnapshotRecord(1, 0, 0, b"", b"x" * 11))
        w.append(SnapshotRecord(1, 0, 0, b"", b"x" * 10))  # still usable
    assert read_snapshot(snap).records == [SnapshotRecord(1, 0, 0, b"", b"x" * 10)]


# ------------------------------------------------------------------------------ damage


def test_truncation_at_every_record_boundary_and_inside_records(snap, tmp_path):
    records = make_records(20)
    write_snapshot(snap, HEADER, records, fsync=False)
    data = open(snap, "rb").read()
    starts = boundaries(data, records)
    cut_path = str(tmp_path / "cut.dmsq")
    cuts = [(s, k) for k, s in enumerate(starts)]  # at each boundary: k whole records before
    for k in range(len(records)):  # inside each record: head, headers/body, crc
        s, e = starts[k], starts[k + 1]
        cuts += [(c, k) for c in {s + 1, s + 3, s + 4, s + 31, s + 32, (s + e) // 2, e - 4, e - 1} if s < c < e]
    cuts += [(starts[-1] + c, len(records)) for c in (1, 4, 16, 31)]  # inside the trailer
    for cut, k in cuts:
        write_bytes(cut_path, data[:cut])
        r = read_snapshot(cut_path)
        assert r.header == HEADER
        assert r.records == records[:k], cut
        assert r.complete is False
        assert r.error_offset == starts[k]
        assert cut_path in r.error and f"byte {starts[k]}" in r.error and "truncated" in r.error
        assert "\n" not in r.error


def test_truncation_inside_the_header(snap, tmp_path):
    write_snapshot(snap, HEADER, make_records(3), fsync=False)
    data = open(snap, "rb").read()
    header_len = boundaries(data, [])[0]
    cut_path = str(tmp_path / "cut.dmsq")
    for cut in (0, 1, 4, 11, 12, 20, header_len - 1):
        write_bytes(cut_path, data[:cut])
        r = read_snapshot(cut_path)
        assert (r.header, r.records, r.complete, r.error_offset) == (None, [], False, 0)
        assert cut_path in r.error and "truncated" in r.error and "byte 0" in r.error


@pytest.mark.parametrize(
    "content", [PNG, b"hello, this is just some text\n" * 5, b"\x00" * 64, b"X"], ids=["png", "text", "zeros", "1byte"]
)
def test_foreign_file(tmp_path, content):
    path = str(tmp_path / "foreign.dmsq")
    write_bytes(path, content)
    r = read_snapshot(path)
    assert r.header is None and r.records == [] and r.complete is False
    assert "magic" in r.error and path in r.error and r.error_offset == 0
    assert r.unsupported is False


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_snapshot(str(tmp_path / "nope.dmsq"))
    with pytest.raises(FileNotFoundError):
        read_log(str(tmp_path / "nope.log"))


def _with_version(data, version):
    header_len = struct.unpack_from("<I", data, 8)[0]
    raw = bytearray(data[:header_len])
    struct.pack_into("<H", raw, 4, version)
    struct.pack_into("<I", raw, header_len - 4, zlib.crc32(raw[:-4]))
    return bytes(raw) + data[header_len:]


def test_newer_format_version_is_unsupported_not_damaged(snap):
    write_snapshot(snap, HEADER, make_records(2), fsync=False)
    data = open(snap, "rb").read()
    write_bytes(snap, _with_version(data, FORMAT_VERSION + 1))
    r = read_snapshot(snap)
    assert (r.header, r.records, r.complete, r.unsupported) == (None, [], False, True)
    assert f"version {FORMAT_VERSION + 1}" in r.error and r.error_offset == 0
    assert "reads versions 1, 2" in r.error
    # The same version field changed by damage (checksum not fixed) is damage.
    damaged = bytearray(data)
    damaged[4] = FORMAT_VERSION + 1
    write_bytes(snap, bytes(damaged))
    r = read_snapshot(snap)
    assert r.unsupported is False and "checksum" in r.error and r.header is None


def test_version_1_files_are_still_read(snap, monkeypatch):
    """Version 2 has version 1's layout: a file of the shmq before it reads the same, records and all."""
    records = make_records(3)
    with monkeypatch.context() as m:  # the writer as it was: version 1
        m.setattr(dmsq, "FORMAT_VERSION", 1)
        write_snapshot(snap, dataclasses.replace(HEADER, version=1), records, fsync=False)
    assert struct.unpack_from("<H", open(snap, "rb").read(), 4)[0] == 1
    r = read_snapshot(snap)
    assert (r.header.version, r.header.queue, r.header.settings) == (1, HEADER.queue, HEADER.settings)
    assert (r.records, r.complete, r.error) == (records, True, None)
    assert dmsq.summary(snap)["format_version"] == 1


def test_header_bytes_with_an_extension_block_are_kept_as_they_are(snap):
    """The engine's record extension (0xC1 ..., then the msgpack headers) is stored as given."""
    from shmq.engine.queues import extension

    hraw = extension.encode(priority=2, expires_ns=1_700_000_100 * 10**9, group="g") + msgpack.packb({"k": "v"})
    write_snapshot(snap, HEADER, [SnapshotRecord(1, 0, 1, hraw, b"body")], fsync=False)
    (rec,) = read_snapshot(snap).records
    assert rec.headers == hraw and rec.headers[0] == 0xC1
    ext, headers = extension.split(rec.headers)
    assert (ext.priority, ext.group, msgpack.unpackb(headers)) == (2, "g", {"k": "v"})


@pytest.mark.parametrize("settings_raw", [b"\xc1", b"\x81\x91\x01\x02", b"\x91\x01", b"\x81\x01\x02", b"\x80\x80"])
def test_header_with_valid_checksum_but_bad_settings(snap, settings_raw):
    """Crafted, not damaged: the checksum passes, the settings are not a str-keyed map."""
    body = dmsq.HEADER_V1.pack(0, 0, len(settings_raw), 1, 0) + b"q" + settings_raw
    pre = dmsq.PREFIX.pack(MAGIC, FORMAT_VERSION, 0, dmsq.PREFIX.size + len(body) + 4)
    head = pre + body
    write_bytes(snap, head + struct.pack("<I", zlib.crc32(head)))
    r = read_snapshot(snap)
    assert (r.header, r.records, r.complete, r.error_offset) == (None, [], False, 0)
    assert "damaged header" in r.error


def test_damaged_length_is_refused_before_reading(snap):
    records = make_records(4)
    write_snapshot(snap, HEADER, records, fsync=False)
    data = open(snap, "rb").read()
    starts = boundaries(data, records)
    for body_len, words in ((0xFFFFFFFF, "implausible"), (dmsq.MAX_BODY_BYTES, "remain")):
        bad = bytearray(data)
        struct.pack_into("<I", bad, starts[2] + 8, body_len)
        write_bytes(snap, bytes(bad))
        r = read_snapshot(snap)
        assert r.records == records[:2] and r.error_offset == starts[2] and words in r.error


def test_bad_record_checksum_and_bad_tag(snap):
    records = make_records(6)
    write_snapshot(snap, HEADER, records, fsync=False)
    data = open(snap, "rb").read()
    starts = boundaries(data, records)
    bad = bytearray(data)
    bad[starts[4] + 40] ^= 0x01  # inside record 4
    write_bytes(snap, bytes(bad))
    r = read_snapshot(snap)
    assert r.records == records[:4] and not r.complete and "checksum" in r.error and f"byte {starts[4]}" in r.error
    bad = bytearray(data)
    bad[starts[1]] = ord("X")
    write_bytes(snap, bytes(bad))
    r = read_snapshot(snap)
    assert r.records == records[:1] and "bad tag" in r.error and r.error_offset == starts[1]


def test_moved_record_fails_the_chained_checksum(snap):
    records = [SnapshotRecord(i, 0, 0, b"", bytes([i]) * 8) for i in range(4)]
    write_snapshot(snap, HEADER, records, fsync=False)
    data = open(snap, "rb").read()
    s = boundaries(data, records)
    swapped = data[: s[1]] + data[s[2] : s[3]] + data[s[1] : s[2]] + data[s[3] :]
    write_bytes(snap, swapped)
    r = read_snapshot(snap)  # each record is intact, but in the wrong place
    assert r.records == records[:1] and r.error_offset == s[1] and "checksum" in r.error


def test_bad_trailer_keeps_every_record(snap):
    records = make_records(5)
    size = write_snapshot(snap, HEADER, records, fsync=False)
    data = open(snap, "rb").read()
    bad = bytearray(data)
    bad[-10] ^= 0xFF  # the trailer's file_bytes
    write_bytes(snap, bytes(bad))
    r = read_snapshot(snap)
    assert r.records == records and r.complete is False
    assert r.error_offset == size - 32 and "trailer" in r.error
    write_bytes(snap, data + b"junk")
    r = read_snapshot(snap)
    assert r.records == records and r.complete is False
    assert r.error_offset == size and "after the trailer" in r.error


def draw_damage(data, n):
    """(cut, flip_at, mask): truncate at cut, or flip a byte before it, or both, or neither."""
    cut = data.draw(st.none() | st.integers(0, n - 1), label="cut") if n else None
    limit = n if cut is None else cut
    flip_at = data.draw(st.none() | st.integers(0, limit - 1), label="flip_at") if limit else None
    return cut, flip_at, data.draw(st.integers(1, 255), label="mask")


def _damage(data, cut, flip_at, mask):
    if cut is not None:
        data = data[:cut]
    if flip_at is not None:
        data = bytearray(data)
        data[flip_at] ^= mask
        data = bytes(data)
    return data


record_st = st.builds(
    SnapshotRecord,
    msg_id=st.integers(0, 2**64 - 1),
    attempt=st.integers(0, 2**32 - 1),
    enqueued_ns=st.integers(0, 2**64 - 1),
    headers=st.binary(max_size=24),
    body=st.binary(max_size=80),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(record_st, max_size=8), data=st.data())
def test_any_damage_returns_exactly_the_records_before_it(tmp_path, records, data):
    path = str(tmp_path / "p.dmsq")
    write_snapshot(path, HEADER, records, fsync=False)
    good = open(path, "rb").read()
    n = len(good)
    cut, flip_at, mask = draw_damage(data, n)
    write_bytes(path, _damage(good, cut, flip_at, mask))
    r = read_snapshot(path)  # never raises
    damage = min(x for x in (cut, flip_at, n) if x is not None)
    ends = boundaries(good, records)[1:]
    expected = sum(1 for e in ends if e <= damage)
    if damage == n:
        assert r.complete and r.error is None and r.records == records
        return
    assert r.complete is False and path in r.error
    assert r.records == records[: len(r.records)]  # a prefix: never a changed record
    header_len = boundaries(good, [])[0]
    if damage < header_len:
        assert r.header is None and r.records == [] and r.error_offset == 0
    else:
        assert r.header == HEADER
        assert len(r.records) == expected  # every record wholly before the damage
        assert r.error_offset == boundaries(good, records)[expected] <= damage


# ------------------------------------------------------------------------------- the log


def make_entries(n):
    out = []
    for i, rec in enumerate(make_records(n)):
        if i % 3 == 2:
            out.append(LogEntry(ACK, rec.msg_id - 1, 0, 0, b"", b""))
        else:
            out.append(LogEntry(PUT, *(rec.msg_id, rec.attempt, rec.enqueued_ns, rec.headers, rec.body)))
    return out


def entry_size(e):
    return dmsq.RECORD_OVERHEAD + len(e.headers) + len(e.body)


def test_log_round_trip_and_torn_tail(tmp_path):
    path = str(tmp_path / "orders.log")
    write_bytes(path, b"")
    assert read_log(path) == ([], None, None)
    entries = make_entries(30)
    blob = b"".join(encode_log_entry(*e) for e in entries)
    assert len(blob) == sum(entry_size(e) for e in entries)
    write_bytes(path, blob)
    got, error, offset = read_log(path)
    assert got == entries and error is None and offset is None
    assert all(isinstance(e, tuple) for e in got)
    last = len(blob) - entry_size(entries[-1])
    for cut in (len(blob) - 1, last + 5, last + 33):
        write_bytes(path, blob[:cut])
        got, error, offset = read_log(path)
        assert got == entries[:-1] and offset == last
        assert path in error and f"byte {last}" in error


def test_log_entry_layout_and_validation():
    raw = encode_log_entry(PUT, 7, 1, 99, b"\x80", b"hi")
    assert raw[:4] == b"WAL\x01" and len(raw) == 32 + 1 + 2 + 4
    assert struct.unpack("<I", raw[-4:])[0] == zlib.crc32(raw[:-4])
    assert encode_log_entry(ACK, 7, 1, 99, b"", b"")[:4] == b"WAL\x02"
    with pytest.raises(ValueError, match="ACK"):
        encode_log_entry(ACK, 7, 1, 99, b"", b"body")
    with pytest.raises(ValueError, match="op"):
        encode_log_entry(9, 7, 1, 99, b"", b"")
    note = dmsq.publish_entry(41, 99, b"\x07" * 16, 5)  # a stream publish's note: after its PUTs
    assert note[:4] == b"WAL\x03" and note == encode_log_entry(dmsq.PUBLISH, 41, 0, 99, b"", b"\x07" * 16 + b"\x05" +
                                                                bytes(7))
    with pytest.raises(ValueError, match="PUBLISH"):
        encode_log_entry(dmsq.PUBLISH, 7, 0, 99, b"h", b"\x07" * 24)
    with pytest.raises(ValueError, match="PUBLISH"):
        encode_log_entry(dmsq.PUBLISH, 7, 0, 99, b"", b"short")


def test_a_publish_note_reads_back_and_a_malformed_one_is_damage(tmp_path):
    path = str(tmp_path / "p.log")
    put = dmsq.stream_entry(41, 99, None, b"", b"v")
    note = dmsq.publish_entry(41, 99, b"\x07" * 16, 5)
    write_bytes(path, put + note)
    got, error, offset = read_log(path)
    assert [e.op for e in got] == [PUT, dmsq.PUBLISH] and error is None
    assert dmsq.publish_note(got[1]) == (b"\x07" * 16, 5, 42)  # (publisher, batch, end offset)
    short = bytearray(note)
    struct.pack_into("<I", short, 8, 16)  # a body of 16 bytes, CRC made right: still refused
    body = bytes(short[:32]) + b"\x07" * 16
    write_bytes(path, put + body + struct.pack("<I", zlib.crc32(body)))
    got, error, offset = read_log(path)
    assert [e.op for e in got] == [PUT] and offset == len(put) and "PUBLISH" in error
    with pytest.raises(ValueError, match="out of range"):
        encode_log_entry(PUT, -7, 1, 99, b"", b"")


def test_a_stream_tombstone_is_bit_31_of_attempt_and_old_records_read_as_before(tmp_path):
    """A null value (a tombstone) sets bit 31 of a stream record's attempt, the body being
    the key alone; without it (every record written before tombstones) the value is the
    rest of the body, b"" when empty."""
    rows = [(1, 7, b"key", b"", None), (2, 7, None, b"", None), (3, 7, b"key", b"", b""), (4, 7, None, b"h", b"v")]
    path = str(tmp_path / "s.log")
    write_bytes(path, b"".join(dmsq.stream_entry(*r) for r in rows))
    got, error, _offset = read_log(path)
    assert error is None and [e.attempt for e in got] == [dmsq.NULL_VALUE | 4, dmsq.NULL_VALUE, 4, 0]
    assert [e.body for e in got] == [b"key", b"", b"key", b"v"]
    assert [dmsq.stream_row(e.msg_id, e.attempt, e.enqueued_ns, e.headers, e.body) for e in got] == rows
    records = [dmsq.stream_record(*r) for r in rows]
    assert [dmsq.stream_row(r.msg_id, r.attempt, r.enqueued_ns, r.headers, r.body) for r in records] == rows
    assert dmsq.stream_row(5, 4, 7, b"", b"keyvalue") == (5, 7, b"key", b"", b"value")  # as before tombstones


def test_log_unknown_op_and_foreign_content(tmp_path):
    path = str(tmp_path / "x.log")
    good = encode_log_entry(PUT, 1, 0, 0, b"", b"a")
    bad = bytearray(encode_log_entry(PUT, 2, 0, 0, b"", b"b"))
    bad[3] = 9
    struct.pack_into("<I", bad, len(bad) - 4, zlib.crc32(bad[:-4]))
    write_bytes(path, good + bytes(bad))
    got, error, offset = read_log(path)
    assert got == [LogEntry(PUT, 1, 0, 0, b"", b"a")] and offset == len(good) and "unknown op 9" in error
    write_bytes(path, PNG)
    assert read_log(path)[0] == [] and read_log(path)[2] == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(
        st.one_of(
            st.builds(LogEntry, st.just(PUT), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
                      st.integers(0, 2**64 - 1), st.binary(max_size=24), st.binary(max_size=80)),
            st.builds(LogEntry, st.just(ACK), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
                      st.integers(0, 2**64 - 1), st.just(b""), st.just(b"")),
            st.builds(LogEntry, st.just(dmsq.PUBLISH), st.integers(0, 2**64 - 1), st.just(0),
                      st.integers(0, 2**64 - 1), st.just(b""), st.binary(min_size=24, max_size=24)),
        ),
        max_size=8,
    ),
    data=st.data(),
)
def test_log_damage_returns_exactly_the_entries_before_it(tmp_path, entries, data):
    path = str(tmp_path / "p.log")
    good = b"".join(encode_log_entry(*e) for e in entries)
    n = len(good)
    cut, flip_at, mask = draw_damage(data, n)
    bad = _damage(good, cut, flip_at, mask)
    write_bytes(path, bad)
    got, error, offset = read_log(path)  # never raises
    ends, pos = [], 0
    for e in entries:
        pos += entry_size(e)
        ends.append(pos)
    damage = min(x for x in (cut, flip_at, n) if x is not None)
    k = sum(1 for e in ends if e <= damage)
    assert got == entries[:k]  # a prefix, exactly the entries wholly before the damage
    if damage == len(bad) and damage in [0, *ends]:
        assert error is None and offset is None  # cut at an entry boundary: a shorter log
    else:
        assert path in error and offset == (ends[k - 1] if k else 0)


# --------------------------------------------------------------- quarantine and summary


def test_quarantine_never_overwrites(tmp_path):
    path = str(tmp_path / "orders.dmsq")
    moved = []
    for i in range(3):
        write_bytes(path, b"damaged %d" % i)
        moved.append(quarantine(path))
        assert not os.path.exists(path)
    assert moved == [path + ".corrupt", path + ".corrupt.1", path + ".corrupt.2"]
    assert [open(p, "rb").read() for p in moved] == [b"damaged 0", b"damaged 1", b"damaged 2"]


def test_summary_of_a_good_file(snap):
    records = make_records(10)
    size = write_snapshot(snap, HEADER, records, fsync=False)
    s = summary(snap)
    assert json.loads(json.dumps(s)) == s
    assert s == {
        "path": snap,
        "format_version": FORMAT_VERSION,
        "queue": "orders",
        "settings": SETTINGS,
        "created_ns": HEADER.created_ns,
        "snapshot_ns": HEADER.snapshot_ns,
        "records": 10,
        "bytes": size,
        "body_bytes": sum(len(r.body) for r in records),
        "first_id": 1,
        "last_id": 10,
        "oldest_enqueued_ns": records[0].enqueued_ns,
        "max_attempt": 4,
        "complete": True,
        "error": None,
        "error_offset": None,
        "unsupported": False,
    }


def test_summary_of_a_damaged_file(snap, tmp_path):
    records = make_records(10)
    write_snapshot(snap, HEADER, records, fsync=False)
    data = open(snap, "rb").read()
    starts = boundaries(data, records)
    write_bytes(snap, data[: starts[6] + 10])
    s = summary(snap)
    assert json.loads(json.dumps(s)) == s
    assert (s["records"], s["first_id"], s["last_id"], s["complete"]) == (6, 1, 6, False)
    assert s["error_offset"] == starts[6] and snap in s["error"] and s["queue"] == "orders"
    foreign = str(tmp_path / "x.dmsq")
    write_bytes(foreign, PNG)
    s = summary(foreign)
    assert json.loads(json.dumps(s)) == s
    assert (s["queue"], s["records"], s["first_id"], s["complete"], s["bytes"]) == (None, 0, None, False, len(PNG))
    assert "magic" in s["error"]


@settings(max_examples=200, deadline=None)
@given(
    msg_id=st.integers(0, 2**64 - 1), attempt=st.integers(0, 2**32 - 1), enqueued_ns=st.integers(0, 2**64 - 1),
    headers=st.binary(max_size=64), body=st.binary(max_size=512),
)
def test_the_engines_fast_log_encoders_write_the_same_bytes(msg_id, attempt, enqueued_ns, headers, body):
    assert dmsq.encode_put_entry(msg_id, enqueued_ns, headers, body) == dmsq.encode_log_entry(
        dmsq.PUT, msg_id, 0, enqueued_ns, headers, body)
    assert dmsq.encode_ack_entry(msg_id, attempt) == dmsq.encode_log_entry(dmsq.ACK, msg_id, attempt, 0, b"", b"")
