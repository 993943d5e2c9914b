"""shmq's on-disk formats (docs/FORMAT.md), one section each: the .dmsq snapshot file, the
write-ahead log entry codec, a stream's high-water mark file and the exchange table file.

Strategy: this module is sans-engine. It turns a queue's (or a stream partition's)
header and records into a file and back, and knows nothing of shared memory, locks or
the queue engine; the caller decides what to snapshot and what to do with what it reads
back. The byte layout is specified in docs/FORMAT.md; the structs below are its only
encoding.

Writing is crash-safe: a snapshot is written to ``<path>.tmp``, fsynced, renamed over
``<path>`` and the directory fsynced, so at every instant ``<path>`` is either the old
snapshot or the new one, whole. Reading is damage-tolerant: nothing read from disk is
trusted. Every length is checked against a fixed maximum and the bytes left in the file
before a byte is read, every structure carries a CRC-32, and the reader stops at the
first structure that fails a check, keeping everything before it. The readers' promise:
for any file content they return (a prefix of what was written, and an error naming the
file and byte offset of the first damage); an exception is only ever an OSError from
opening or reading the file.

The CRCs are chained: each stored CRC is the CRC-32 of every covered byte from the start
of the file up to it (a record's CRC is seeded with the previous one), so a record from
another snapshot, or a record moved within the file, fails its check even if it is
itself intact.
"""

from __future__ import annotations

import errno
import io
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import msgpack

from ..errors import MessageTooLarge
from ..sharing import file_mode

__all__ = [
    "fsync_dir",
    "MAGIC",
    "FORMAT_VERSION",
    "READ_VERSIONS",
    "SUFFIX",
    "MAX_NAME_BYTES",
    "MAX_SETTINGS_BYTES",
    "MAX_HEADERS_BYTES",
    "MAX_BODY_BYTES",
    "PUT",
    "ACK",
    "PUBLISH",
    "SnapshotHeader",
    "SnapshotRecord",
    "SnapshotWriter",
    "SnapshotReader",
    "ReadResult",
    "LogEntry",
    "write_snapshot",
    "read_snapshot",
    "iter_records",
    "quarantine",
    "summary",
    "encode_log_entry",
    "read_log",
    "scan_log",
    "salvage_log",
    "stream_entry",
    "NULL_VALUE",
    "stream_record",
    "stream_row",
    "publish_entry",
    "publish_note",
    "HWM_SLOT",
    "encode_hwm",
    "read_hwm",
    "EXCHANGES_FILE",
    "write_exchanges",
    "read_exchanges",
]

MAGIC = b"DMSQ"
# 2: a record's header bytes may start with the engine's extension block (0xC1, before the
# msgpack headers: a version-1 reader would take them for damaged headers), and the settings
# have the work-queue options; the layout is version 1's
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)  # what this code reads: every version since 1 has the same layout
SUFFIX = ".dmsq"
TMP_SUFFIX = ".tmp"
CORRUPT_SUFFIX = ".corrupt"

# Bounds on every length field: a damaged length is refused before anything is read.
MAX_NAME_BYTES = 1024
MAX_SETTINGS_BYTES = 64 * 1024
MAX_HEADERS_BYTES = 1 << 20
MAX_BODY_BYTES = 1 << 30
MAX_HEADER_BYTES = 1 << 20  # any version's file header, so a newer one can be checked

# ------------------------------------------------------------------------ byte layout
# All integers little-endian and unsigned. CRC = zlib.crc32 (CRC-32/ISO-HDLC).
#
# File header prefix, the same in every format version:
#   magic 4s, version u16, reserved u16 (0), header_len u32 (whole header, CRC included)
PREFIX = struct.Struct("<4sHHI")
# Version 1 header body, after the prefix:
#   created_ns u64, snapshot_ns u64, settings_len u32, name_len u16, reserved u16 (0)
#   then name (UTF-8), settings (msgpack map), then crc u32 over everything before it.
HEADER_V1 = struct.Struct("<QQIHH")
HEADER_V1_FIXED = PREFIX.size + HEADER_V1.size  # 36
# Record head: tag b"RECD", headers_len u32, body_len u32, attempt u32, msg_id u64,
# enqueued_ns u64; then headers, body, crc u32 (chained).
RECORD_TAG = b"RECD"
RECORD_HEAD = struct.Struct("<4sIIIQQ")
# Trailer: tag b"TAIL", records_crc u32 (the last chained CRC), record_count u64,
# file_bytes u64 (the whole file, trailer included), reserved u32 (0), crc u32 (over
# the 28 bytes before it, not chained).
TRAILER_TAG = b"TAIL"
TRAILER = struct.Struct("<4sIQQII")
# Log entry: tag b"WAL" + op byte, then the same fields as a record head; then headers,
# body, crc u32 over the entry before it (not chained: entries stand alone).
LOG_TAG = b"WAL"
LOG_HEAD = RECORD_HEAD
CRC = struct.Struct("<I")

RECORD_HEAD_SIZE = RECORD_HEAD.size  # 32
TRAILER_SIZE = TRAILER.size  # 32
CRC_SIZE = CRC.size  # 4
RECORD_OVERHEAD = RECORD_HEAD_SIZE + CRC_SIZE  # 36 bytes besides headers and body
assert RECORD_HEAD_SIZE == TRAILER_SIZE == 32

PUT = 1
ACK = 2
PUBLISH = 3  # a stream partition's publish note (docs/FORMAT.md, "Streams"): after the PUTs it came with
_LOG_OPS = {PUT: "PUT", ACK: "ACK", PUBLISH: "PUBLISH"}
PUBLISH_BODY = struct.Struct("<16sQ")  # a publish note's body: publisher id, batch

_crc32 = zlib.crc32
_U64 = 2**64


# ------------------------------------------------------------------------------ types


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """What a snapshot says about its queue. ``settings`` is a map with str keys
    (max_bytes, max_message_bytes, visibility_timeout, max_deliveries,
    dead_letter_queue, durability; since version 2 priorities, message_ttl,
    dedup_window, retry_delay, retry_backoff, retry_delay_max; and whatever later
    versions add)."""

    queue: str
    settings: dict
    created_ns: int
    snapshot_ns: int
    version: int = FORMAT_VERSION


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """One message. ``headers`` is the record's header bytes as the engine keeps them:
    its extension block (version 2), then the msgpack-encoded headers map (b"" when none);
    ``attempt`` counts deliveries so far (an in-flight message is saved as ready)."""

    msg_id: int
    attempt: int
    enqueued_ns: int
    headers: bytes
    body: bytes


@dataclass
class ReadResult:
    """What ``read_snapshot`` found.

    ``records`` are the intact records before the first damage, in file order.
    ``complete`` is True only when the trailer is present and agrees with them.
    ``error`` is one line naming the file and the byte offset of the first damage, and
    ``error_offset`` that offset: the start of the first structure not accepted (every
    byte before it was checked and kept). ``unsupported`` is True when the file is an
    intact snapshot of a format version this code cannot read: leave such a file alone
    rather than quarantine it.
    """

    header: SnapshotHeader | None
    records: list[SnapshotRecord] = field(default_factory=list)
    complete: bool = False
    error: str | None = None
    error_offset: int | None = None
    unsupported: bool = False


class LogEntry(NamedTuple):
    """One write-ahead log entry; ACK entries have empty headers and body, PUBLISH entries
    empty headers and a 24-byte body (``publish_note``)."""

    op: int
    msg_id: int
    attempt: int
    enqueued_ns: int
    headers: bytes
    body: bytes


# ---------------------------------------------------------------------------- encoding


def _encode_header(header: SnapshotHeader) -> bytes:
    if not isinstance(header, SnapshotHeader):
        raise TypeError(f"header must be a SnapshotHeader, not {type(header).__name__}")
    if header.version != FORMAT_VERSION:
        raise ValueError(f"can only write format version {FORMAT_VERSION}, not {header.version!r}")
    if not isinstance(header.queue, str):
        raise TypeError(f"queue name must be a str, not {type(header.queue).__name__}")
    name = header.queue.encode("utf-8")
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"queue name is {len(name)} bytes in UTF-8; the limit is {MAX_NAME_BYTES}")
    settings = header.settings
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise TypeError("settings must be a dict with str keys")
    raw = msgpack.packb(settings, use_bin_type=True)
    if len(raw) > MAX_SETTINGS_BYTES:
        raise ValueError(f"settings encode to {len(raw)} bytes; the limit is {MAX_SETTINGS_BYTES}")
    for what, v in (("created_ns", header.created_ns), ("snapshot_ns", header.snapshot_ns)):
        if type(v) is not int or not 0 <= v < _U64:
            raise ValueError(f"{what} must be an int in [0, 2**64), not {v!r}")
    header_len = HEADER_V1_FIXED + len(name) + len(raw) + CRC_SIZE
    body = (
        PREFIX.pack(MAGIC, FORMAT_VERSION, 0, header_len)
        + HEADER_V1.pack(header.created_ns, header.snapshot_ns, len(raw), len(name), 0)
        + name
        + raw
    )
    return body + CRC.pack(_crc32(body))


def _record_head(tag: bytes, msg_id, attempt, enqueued_ns, headers, body) -> bytes:
    """The 32-byte head of a record or log entry, after checking every field."""
    hl = len(headers)
    bl = len(body)
    if hl > MAX_HEADERS_BYTES:
        raise MessageTooLarge(f"headers are {hl} bytes; a record takes at most {MAX_HEADERS_BYTES}")
    if bl > MAX_BODY_BYTES:
        raise MessageTooLarge(f"body is {bl} bytes; a record takes at most {MAX_BODY_BYTES}")
    try:
        return RECORD_HEAD.pack(tag, hl, bl, attempt, msg_id, enqueued_ns)
    except struct.error:
        raise ValueError(
            f"record field out of range: msg_id={msg_id!r} (u64) attempt={attempt!r} (u32) "
            f"enqueued_ns={enqueued_ns!r} (u64)"
        ) from None


def _byte_view(value, what: str):
    """bytes or bytearray as they are; a memoryview as bytes (len = bytes); else TypeError."""
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, memoryview):
        return value.cast("B") if value.c_contiguous else value.tobytes()
    raise TypeError(f"{what} must be bytes, not {type(value).__name__}")


def encode_log_entry(op: int, msg_id: int, attempt: int, enqueued_ns: int, headers: bytes, body: bytes) -> bytes:
    """One write-ahead log entry, ready to append; ACK entries take empty headers/body."""
    if op not in _LOG_OPS:
        raise ValueError(f"log op must be PUT ({PUT}), ACK ({ACK}) or PUBLISH ({PUBLISH}), not {op!r}")
    headers = _byte_view(headers, "headers (msgpack-encoded)")
    body = _byte_view(body, "body")
    if op == ACK and (len(headers) or len(body)):
        raise ValueError("an ACK log entry has no headers and no body")
    if op == PUBLISH and (len(headers) or len(body) != PUBLISH_BODY.size):
        raise ValueError(f"a PUBLISH log entry has no headers and a body of {PUBLISH_BODY.size} bytes")
    return _log_entry(_record_head(LOG_TAG + bytes((op,)), msg_id, attempt, enqueued_ns, headers, body), headers, body)


def _log_entry(head: bytes, headers, body) -> bytes:
    """An entry from its packed head: the one place its bytes are put together."""
    crc = _crc32(body, _crc32(headers, _crc32(head))) if headers else _crc32(body, _crc32(head))
    return b"".join((head, headers, body, CRC.pack(crc)))


_PUT_TAG = LOG_TAG + bytes((PUT,))
_ACK_TAG = LOG_TAG + bytes((ACK,))


def encode_put_entry(msg_id: int, enqueued_ns: int, headers: bytes, body: bytes) -> bytes:
    """``encode_log_entry(PUT, msg_id, 0, ...)`` for the engine's hot path: the caller has
    already checked the sizes and types (a queue's own limits are far below the format's)."""
    return _log_entry(RECORD_HEAD.pack(_PUT_TAG, len(headers), len(body), 0, msg_id, enqueued_ns), headers, body)


def encode_ack_entry(msg_id: int, attempt: int) -> bytes:
    """``encode_log_entry(ACK, msg_id, attempt, 0, b"", b"")`` for the engine's hot path."""
    return _log_entry(RECORD_HEAD.pack(_ACK_TAG, 0, 0, attempt, msg_id, 0), b"", b"")


# A stream record in a snapshot or a log entry: msg_id = its offset, enqueued_ns = its
# timestamp, attempt = the key's length + 1 (0: no key), with NULL_VALUE set when the value
# is null (a tombstone), headers as given, body = the key's bytes followed by the value's
# (docs/FORMAT.md, "Streams").
NULL_VALUE = 1 << 31  # in a stream record's attempt: its value is null (the body is the key alone)


def _stream_attempt(key, value) -> int:
    return (0 if key is None else len(key) + 1) | (NULL_VALUE if value is None else 0)


def stream_entry(offset: int, timestamp_ns: int, key, headers, value) -> bytes:
    """The PUT log entry of one stream record (the caller has checked the sizes; value
    None: a tombstone)."""
    body = (value or b"") if key is None else key + (value or b"")
    return _log_entry(RECORD_HEAD.pack(_PUT_TAG, len(headers), len(body), _stream_attempt(key, value), offset,
                                       timestamp_ns), headers, body)


def stream_record(offset: int, timestamp_ns: int, key, headers, value) -> SnapshotRecord:
    """The snapshot record of one stream record."""
    body = (value or b"") if key is None else key + (value or b"")
    return SnapshotRecord(offset, _stream_attempt(key, value), timestamp_ns, headers, body)


_PUBLISH_TAG = LOG_TAG + bytes((PUBLISH,))


def publish_entry(offset: int, timestamp_ns: int, txn_id: bytes, batch: int) -> bytes:
    """The PUBLISH log entry of a stream partition's publish (``Stream.publish``): publisher
    ``txn_id`` (16 bytes) published ``batch`` with the append whose last record is at
    ``offset``; it follows that append's PUT entries, in the same write."""
    body = PUBLISH_BODY.pack(txn_id, batch)
    return _log_entry(RECORD_HEAD.pack(_PUBLISH_TAG, 0, len(body), 0, offset, timestamp_ns), b"", body)


def publish_note(entry) -> tuple[bytes, int, int]:
    """(publisher id, batch, end offset) of a PUBLISH entry: the publishers' table's entry
    (``Partition.published``) that it logged."""
    txn_id, batch = PUBLISH_BODY.unpack(entry.body)
    return txn_id, batch, entry.msg_id + 1


def stream_row(msg_id: int, attempt: int, enqueued_ns: int, headers, body) -> tuple:
    """A stream record's (offset, timestamp_ns, key or None, headers, value or None) from
    the fields of a snapshot record or a log entry. A key length past the body yields no
    key."""
    null = attempt & NULL_VALUE
    attempt &= ~NULL_VALUE
    if attempt and attempt - 1 <= len(body):
        k = attempt - 1
        return msg_id, enqueued_ns, bytes(body[:k]), headers, None if null else body[k:]
    return msg_id, enqueued_ns, None, headers, None if null else body


# ----------------------------------------------------------------------------- writing


def fsync_dir(path: str) -> None:
    """fsync the directory holding ``path``: a new name is durable only once its directory is."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems cannot fsync a directory
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


class SnapshotWriter:
    """Writes one snapshot to ``<path>.tmp``; ``commit`` puts it in place atomically.

    Until ``commit`` returns, ``path`` still holds the previous snapshot (if any),
    byte for byte. Used as a context manager, a clean exit commits (if ``commit`` was
    not called) and an exception aborts. Files are created owner-only (0o600; 0o660 in a data
    dir shared with a group, shmq/sharing.py). One
    writer per path at a time: that is the caller's business.
    """

    def __init__(self, path, header: SnapshotHeader, fsync: bool = True):
        self.path = os.fsdecode(path)
        self.tmp_path = self.path + TMP_SUFFIX
        self.fsync = fsync
        head = _encode_header(header)
        self._chain = _crc32(head[:-CRC_SIZE])
        self._count = 0
        self._bytes = len(head)
        self._done = False
        # A .tmp left by a crash is removed, not reused: its mode or owner may be wrong.
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass
        fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.fchmod(fd, file_mode(self.path))  # whatever the umask; 0660 in a dir shared with a group
            self._f = os.fdopen(fd, "wb", buffering=1 << 20)
        except BaseException:
            os.close(fd)
            self._remove_tmp()
            raise
        try:
            self._f.write(head)
        except BaseException:
            self.abort()
            raise

    @property
    def records(self) -> int:
        """Records appended so far."""
        return self._count

    def append(self, record: SnapshotRecord) -> None:
        """Add one record; ValueError/TypeError/MessageTooLarge leave the writer usable."""
        if self._done:
            raise ValueError(f"snapshot writer for {self.path} is closed")
        headers = _byte_view(record.headers, "headers (msgpack-encoded)")
        body = _byte_view(record.body, "body")
        head = _record_head(RECORD_TAG, record.msg_id, record.attempt, record.enqueued_ns, headers, body)
        crc = _crc32(body, _crc32(headers, _crc32(head, self._chain)))
        w = self._f.write
        try:
            w(head)
            if headers:
                w(headers)
            if body:
                w(body)
            w(CRC.pack(crc))
        except BaseException:
            self.abort()
            raise
        self._chain = crc
        self._count += 1
        self._bytes += RECORD_OVERHEAD + len(headers) + len(body)

    def commit(self) -> int:
        """Write the trailer, flush, fsync, rename over ``path``, fsync the directory.

        Returns the file's size in bytes. On any error before the rename the temporary
        file is removed and ``path`` is untouched.
        """
        if self._done:
            raise ValueError(f"snapshot writer for {self.path} is closed")
        total = self._bytes + TRAILER_SIZE
        body = TRAILER.pack(TRAILER_TAG, self._chain, self._count, total, 0, 0)[:-CRC_SIZE]
        try:
            self._f.write(body + CRC.pack(_crc32(body)))
            self._f.flush()
            if self.fsync:
                os.fsync(self._f.fileno())
            self._f.close()
            os.replace(self.tmp_path, self.path)
        except BaseException:
            self.abort()
            raise
        self._done = True
        if self.fsync:
            fsync_dir(self.path)
        return total

    def abort(self) -> None:
        """Drop the snapshot being written: close and remove the temporary file."""
        if self._done:
            return
        self._done = True
        try:
            self._f.close()
        except (OSError, AttributeError):
            pass
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.commit()


def write_snapshot(path, header: SnapshotHeader, records: Iterable[SnapshotRecord], fsync: bool = True) -> int:
    """Write a whole snapshot crash-safely; returns the file's size in bytes."""
    with SnapshotWriter(path, header, fsync=fsync) as w:
        for r in records:
            w.append(r)
        return w.commit()


# ----------------------------------------------------------------------------- reading


class _Damage(Exception):
    """Internal: the structure at ``offset`` failed a check."""

    def __init__(self, offset: int, what: str):
        super().__init__(what)
        self.offset = offset
        self.what = what


class _Unsupported(_Damage):
    pass


def _read_exact(f, n: int, offset: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:  # the file shrank while we read it
        raise _Damage(offset, f"truncated: {what} needs {n} bytes, the file ends after {len(data)}")
    return data


def _parse_header(f, size: int) -> tuple[SnapshotHeader, int, int]:
    """(header, its length, the CRC that seeds the record chain) or _Damage at 0."""
    if size == 0:
        raise _Damage(0, "empty file (no header): truncated")
    pre = f.read(min(PREFIX.size, size))
    if pre[:4] != MAGIC[: len(pre[:4])]:
        raise _Damage(0, f"bad magic {pre[:4]!r} (expected {MAGIC!r}): not a {SUFFIX} snapshot")
    if len(pre) < PREFIX.size:
        raise _Damage(0, f"truncated: the file is {size} bytes, too short for the {PREFIX.size}-byte header prefix")
    _magic, version, _reserved, header_len = PREFIX.unpack(pre)
    if not PREFIX.size + CRC_SIZE <= header_len <= MAX_HEADER_BYTES:
        raise _Damage(0, f"damaged header: implausible header length {header_len}")
    if header_len > size:
        raise _Damage(0, f"truncated: the header declares {header_len} bytes, the file has {size}")
    rest = _read_exact(f, header_len - PREFIX.size, 0, "the header")
    raw = pre + rest
    chain = _crc32(raw[:-CRC_SIZE])
    if CRC.unpack_from(raw, header_len - CRC_SIZE)[0] != chain:
        raise _Damage(0, "damaged header: checksum mismatch")
    if version not in READ_VERSIONS:
        raise _Unsupported(0, f"unsupported format version {version} (this shmq reads versions "
                              f"{', '.join(map(str, READ_VERSIONS))})")
    if header_len < HEADER_V1_FIXED + CRC_SIZE:
        raise _Damage(0, f"damaged header: {header_len} bytes is too short for version {version}")
    created_ns, snapshot_ns, settings_len, name_len, _ = HEADER_V1.unpack_from(raw, PREFIX.size)
    if HEADER_V1_FIXED + name_len + settings_len + CRC_SIZE != header_len:
        raise _Damage(0, "damaged header: name and settings lengths disagree with the header length")
    if name_len > MAX_NAME_BYTES or settings_len > MAX_SETTINGS_BYTES:
        raise _Damage(0, "damaged header: implausible name or settings length")
    pos = HEADER_V1_FIXED
    try:
        name = raw[pos : pos + name_len].decode("utf-8")
        settings = msgpack.unpackb(raw[pos + name_len : pos + name_len + settings_len], raw=False)
    except Exception as e:  # msgpack raises several kinds; all mean the same here
        raise _Damage(0, f"damaged header: undecodable name or settings ({type(e).__name__}: {e})") from None
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise _Damage(0, "damaged header: settings are not a map with str keys")
    return SnapshotHeader(name, settings, created_ns, snapshot_ns, version), header_len, chain


class SnapshotReader:
    """Streams one snapshot: ``header`` on open, records by iterating, and after the
    iteration ends ``complete``, ``error`` and ``error_offset`` as in ReadResult.

    Opening raises OSError only (missing or unreadable file); damage never raises: a
    damaged header leaves ``header`` None and the iteration empty.
    """

    def __init__(self, path):
        self.path = os.fsdecode(path)
        self.header: SnapshotHeader | None = None
        self.complete = False
        self.error: str | None = None
        self.error_offset: int | None = None
        self.unsupported = False
        self.count = 0
        self.offset = 0  # end of the last structure accepted
        self._f = open(self.path, "rb")
        try:
            self.size = os.fstat(self._f.fileno()).st_size
            try:
                self.header, self.offset, self._chain = _parse_header(self._f, self.size)
            except _Damage as d:
                self.unsupported = isinstance(d, _Unsupported)
                self._fail(d)
        except BaseException:
            self._f.close()
            raise

    def _fail(self, d: _Damage) -> None:
        self.error = _error_line(self.path, d)
        self.error_offset = d.offset
        self.close()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[SnapshotRecord]:
        return self

    def __next__(self) -> SnapshotRecord:
        if self._f.closed:
            raise StopIteration
        try:
            rec = self._next()
        except _Damage as d:
            self._fail(d)
            raise StopIteration from None
        if rec is None:
            self.complete = self.error is None
            self.close()
            raise StopIteration
        return rec

    def _next(self) -> SnapshotRecord | None:
        pos, f = self.offset, self._f
        left = self.size - pos
        n = self.count
        if left == 0:
            raise _Damage(pos, f"truncated: the file ends after {n} records with no trailer")
        head = f.read(min(RECORD_HEAD_SIZE, left))
        tag = head[:4]
        if tag == TRAILER_TAG:
            self._trailer(head, pos, left)
            return None
        if tag != RECORD_TAG:
            if len(head) < 4 and (RECORD_TAG.startswith(tag) or TRAILER_TAG.startswith(tag)):
                raise _Damage(pos, f"truncated: the file ends {len(head)} bytes into record {n}")
            raise _Damage(pos, f"record {n}: bad tag {tag!r} (expected {RECORD_TAG!r} or {TRAILER_TAG!r})")
        if len(head) < RECORD_HEAD_SIZE:
            raise _Damage(pos, f"truncated: the file ends {len(head)} bytes into record {n}")
        _, hl, bl, attempt, msg_id, enqueued_ns = RECORD_HEAD.unpack(head)
        if hl > MAX_HEADERS_BYTES or bl > MAX_BODY_BYTES:
            raise _Damage(pos, f"record {n}: implausible lengths (headers {hl}, body {bl})")
        need = hl + bl + CRC_SIZE
        if need > left - RECORD_HEAD_SIZE:
            raise _Damage(
                pos,
                f"record {n} declares {RECORD_HEAD_SIZE + need} bytes, only {left} remain "
                "(truncated, or a damaged length)",
            )
        headers = _read_exact(f, hl, pos, f"record {n}") if hl else b""
        body = _read_exact(f, bl, pos, f"record {n}") if bl else b""
        (stored,) = CRC.unpack(_read_exact(f, CRC_SIZE, pos, f"record {n}"))
        crc = _crc32(body, _crc32(headers, _crc32(head, self._chain)))
        if crc != stored:
            raise _Damage(pos, f"record {n}: checksum mismatch")
        self._chain = crc
        self.count = n + 1
        self.offset = pos + RECORD_HEAD_SIZE + need
        return SnapshotRecord(msg_id, attempt, enqueued_ns, headers, body)

    def _trailer(self, raw: bytes, pos: int, left: int) -> None:
        if len(raw) < TRAILER_SIZE:
            raise _Damage(pos, f"truncated: the file ends {len(raw)} bytes into the trailer")
        _, records_crc, count, file_bytes, _, stored = TRAILER.unpack(raw)
        if _crc32(raw[:-CRC_SIZE]) != stored:
            raise _Damage(pos, "trailer: checksum mismatch")
        if count != self.count or records_crc != self._chain:
            raise _Damage(
                pos, f"trailer: says {count} records, {self.count} were read, or their checksums disagree"
            )
        end = pos + TRAILER_SIZE
        if file_bytes != end:
            raise _Damage(pos, f"trailer: says the file is {file_bytes} bytes, the trailer ends at {end}")
        self.offset = end
        if left > TRAILER_SIZE:
            raise _Damage(end, f"{left - TRAILER_SIZE} unexpected bytes after the trailer")


def _error_line(path: str, d: _Damage) -> str:
    what = " ".join(d.what.split())  # one line, whatever an exception message held
    return f"{path}: {what} (at byte {d.offset})"


def iter_records(path) -> SnapshotReader:
    """A streaming reader of ``path``: iterate it for the records; see SnapshotReader."""
    return SnapshotReader(path)


def read_snapshot(path) -> ReadResult:
    """Every intact record before the first damage, and what stopped the reading.

    Never raises for damaged or foreign content; only OSError when the file cannot be
    opened or read.
    """
    with SnapshotReader(path) as r:
        records = list(r)
    return ReadResult(r.header, records, r.complete, r.error, r.error_offset, r.unsupported)


def read_log(path) -> tuple[list[LogEntry], str | None, int | None]:
    """(entries, error, error_offset): every intact log entry before the first damage.

    A torn last entry (a crash mid-append) is reported like any damage; the entries
    before it are all returned. Before appending to such a log, truncate it to
    ``error_offset``. An empty log is valid. Raises only OSError.
    """
    path = os.fsdecode(path)
    entries: list[LogEntry] = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        try:
            while pos < size:
                entries.append(_read_log_entry(f, pos, size - pos, len(entries)))
                pos += RECORD_OVERHEAD + len(entries[-1].headers) + len(entries[-1].body)
        except _Damage as d:
            return entries, _error_line(path, d), d.offset
    return entries, None, None


def scan_log(path, start: int = 0) -> Iterator[tuple[int, LogEntry]]:
    """(position, entry) of each intact entry from byte ``start`` (an entry boundary) on,
    stopping silently at the first damage or at the end: for readers that only want
    what is intact now (a log another process is appending to ends in a torn entry
    while it writes). Raises only OSError."""
    with open(os.fsdecode(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos, n = start, 0
        f.seek(start)
        while pos < size:
            try:
                entry = _read_log_entry(f, pos, size - pos, n)
            except _Damage:
                return
            yield pos, entry
            pos += RECORD_OVERHEAD + len(entry.headers) + len(entry.body)
            n += 1


def salvage_log(path, start: int) -> list[LogEntry]:
    """Intact entries found after damage at byte ``start``, by trying each place the tag
    occurs for an entry whose lengths and CRC check. For recovery to learn what the
    damage hid (which offsets a stream had handed out), never to replay: bytes after
    damage are not trusted to be in order. Raises only OSError."""
    with open(os.fsdecode(path), "rb") as f:
        data = f.read()
    out, pos = [], data.find(LOG_TAG, start + 1)
    while pos >= 0:
        try:
            entry = _read_log_entry(io.BytesIO(data[pos:]), pos, len(data) - pos, 0)
        except _Damage:
            pos = data.find(LOG_TAG, pos + 1)
            continue
        out.append(entry)
        pos = data.find(LOG_TAG, pos + RECORD_OVERHEAD + len(entry.headers) + len(entry.body))
    return out


def _read_log_entry(f, pos: int, left: int, n: int) -> LogEntry:
    head = f.read(min(RECORD_HEAD_SIZE, left))
    tag = head[:3]
    if tag != LOG_TAG:
        if len(head) < 3 and LOG_TAG.startswith(tag):
            raise _Damage(pos, f"truncated: the file ends {len(head)} bytes into log entry {n}")
        raise _Damage(pos, f"log entry {n}: bad tag {head[:4]!r} (expected {LOG_TAG!r} + op)")
    if len(head) < RECORD_HEAD_SIZE:
        raise _Damage(pos, f"truncated: the file ends {len(head)} bytes into log entry {n}")
    _, hl, bl, attempt, msg_id, enqueued_ns = LOG_HEAD.unpack(head)
    op = head[3]
    if op not in _LOG_OPS:
        raise _Damage(pos, f"log entry {n}: unknown op {op}")
    if hl > MAX_HEADERS_BYTES or bl > MAX_BODY_BYTES:
        raise _Damage(pos, f"log entry {n}: implausible lengths (headers {hl}, body {bl})")
    need = hl + bl + CRC_SIZE
    if need > left - RECORD_HEAD_SIZE:
        raise _Damage(
            pos,
            f"log entry {n} declares {RECORD_HEAD_SIZE + need} bytes, only {left} remain "
            "(torn write, or a damaged length)",
        )
    headers = _read_exact(f, hl, pos, f"log entry {n}") if hl else b""
    body = _read_exact(f, bl, pos, f"log entry {n}") if bl else b""
    (stored,) = CRC.unpack(_read_exact(f, CRC_SIZE, pos, f"log entry {n}"))
    if _crc32(body, _crc32(headers, _crc32(head))) != stored:
        raise _Damage(pos, f"log entry {n}: checksum mismatch")
    if op == ACK and (hl or bl):
        raise _Damage(pos, f"log entry {n}: an ACK with headers or a body")
    if op == PUBLISH and (hl or bl != PUBLISH_BODY.size):
        raise _Damage(pos, f"log entry {n}: a PUBLISH with headers, or a body of {bl} bytes (not {PUBLISH_BODY.size})")
    return LogEntry(op, msg_id, attempt, enqueued_ns, headers, body)


# ---------------------------------------------------------------- high-water marks
# A stream partition's high-water file: two 32-byte slots, written in turn in place, so a
# torn write spoils at most the slot being written. A slot: tag b"HWM1", crc u32 (of the
# slot's other 28 bytes), writes u64 (which write this is: slot = writes % 2), epoch u64,
# offset u64 (no offset at or above it had been handed out, as of that epoch).
HWM_TAG = b"HWM1"
HWM_SLOT = struct.Struct("<4sIQQQ")


def encode_hwm(writes: int, epoch: int, offset: int) -> bytes:
    """One slot of a high-water file: write it at ``(writes % 2) * HWM_SLOT.size``."""
    rest = struct.pack("<QQQ", writes, epoch, offset)
    return HWM_TAG + CRC.pack(_crc32(rest, _crc32(HWM_TAG))) + rest


def read_hwm(path) -> tuple[int, int] | None:
    """(epoch, offset) of the newest intact slot of a high-water file, None if it has
    none. Raises only OSError."""
    with open(os.fsdecode(path), "rb") as f:
        raw = f.read(2 * HWM_SLOT.size)
    best = None
    n = HWM_SLOT.size
    for at in range(0, len(raw) - n + 1, n):
        tag, crc, writes, epoch, offset = HWM_SLOT.unpack_from(raw, at)
        if tag == HWM_TAG and crc == _crc32(raw[at + 8:at + n], _crc32(HWM_TAG)):
            if best is None or writes > best[0]:
                best = (writes, epoch, offset)
    return None if best is None else best[1:]


# ---------------------------------------------------------------- the exchange table
# A namespace's exchanges and bindings, in one file of a data dir (EXCHANGES_FILE): the
# prefix of a snapshot (magic b"DMSX", version u16, reserved u16 (0), table_len u32), the
# table (msgpack: {name: {"type": str, "bindings": [[kind "q" | "s", target, pattern]]}}),
# then crc u32 of every byte before it. Written whole to a .tmp and renamed into place.
EXCHANGES_MAGIC = b"DMSX"
EXCHANGES_VERSION = 1
EXCHANGES_FILE = "exchanges.dmsx"
MAX_EXCHANGES_BYTES = 1 << 20


def write_exchanges(path, table: dict, fsync: bool = True) -> None:
    """Write an exchange table crash-safely (0600, temp file, fsync, rename, directory fsync)."""
    data = msgpack.packb(table, use_bin_type=True)
    if len(data) > MAX_EXCHANGES_BYTES:
        raise MessageTooLarge(f"an exchange table of {len(data)} bytes (at most {MAX_EXCHANGES_BYTES})")
    raw = PREFIX.pack(EXCHANGES_MAGIC, EXCHANGES_VERSION, 0, len(data)) + data
    raw += CRC.pack(_crc32(raw))
    path = os.fsdecode(path)
    tmp = path + TMP_SUFFIX
    try:
        os.unlink(tmp)  # one left by a crash: its mode or owner may be wrong
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, file_mode(path))  # whatever the umask; 0660 in a dir shared with a group
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
        os.close(fd)
        fd = None
        os.replace(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if fsync:
        fsync_dir(path)


def _check_exchanges(table) -> dict:
    if not isinstance(table, dict):
        raise ValueError("the table is not a map")
    for name, x in table.items():
        if not isinstance(name, str) or not isinstance(x, dict) or not isinstance(x.get("type"), str):
            raise ValueError(f"exchange {name!r}: not a name with a type")
        bindings = x.get("bindings")
        if not isinstance(bindings, list) or not all(
                isinstance(b, list) and len(b) == 3 and b[0] in ("q", "s") and all(isinstance(v, str) for v in b)
                for b in bindings):
            raise ValueError(f"exchange {name!r}: damaged bindings")
    return table


def read_exchanges(path) -> dict:
    """The exchange table of a file ``write_exchanges`` wrote. ValueError (naming the file
    and what is wrong) if it is damaged or of another version; OSError if unreadable."""
    path = os.fsdecode(path)
    with open(path, "rb") as f:
        raw = f.read(PREFIX.size + MAX_EXCHANGES_BYTES + CRC_SIZE + 1)
    try:
        if len(raw) < PREFIX.size + CRC_SIZE:
            raise ValueError(f"{len(raw)} bytes is too short")
        magic, version, _reserved, n = PREFIX.unpack_from(raw, 0)
        if magic != EXCHANGES_MAGIC:
            raise ValueError(f"bad magic {magic!r} (not an exchange table)")
        if version != EXCHANGES_VERSION:
            raise ValueError(f"unsupported version {version} (this shmq reads version {EXCHANGES_VERSION})")
        if n > MAX_EXCHANGES_BYTES or len(raw) != PREFIX.size + n + CRC_SIZE:
            raise ValueError(f"the table's length {n} does not fit the file's {len(raw)} bytes")
        if CRC.unpack_from(raw, PREFIX.size + n)[0] != _crc32(raw[:PREFIX.size + n]):
            raise ValueError("checksum mismatch")
        try:
            table = msgpack.unpackb(raw[PREFIX.size:PREFIX.size + n], raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise ValueError(f"the table does not decode: {e}") from None
        return _check_exchanges(table)
    except ValueError as e:
        raise ValueError(f"{path}: damaged exchange table: {e}") from None


# ------------------------------------------------------------------------ maintenance


def quarantine(path) -> str:
    """Move a damaged file aside to ``<path>.corrupt`` (or ``.corrupt.1``, ``.2``, ...,
    never overwriting one); returns the new path. Nothing is deleted."""
    path = os.fsdecode(path)
    n = 0
    while True:
        dest = path + CORRUPT_SUFFIX + (f".{n}" if n else "")
        try:
            os.link(path, dest)  # fails if dest exists: no overwrite, no race
        except FileExistsError:
            n += 1
            continue
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            # no hard links on this filesystem: check, then rename (racy, but rare)
            if os.path.lexists(dest):
                n += 1
                continue
            os.rename(path, dest)
        else:
            os.unlink(path)
        try:
            fsync_dir(path)
        except OSError:
            pass
        return dest


def _jsonable(v):
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and v != v:
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)  # e.g. a msgpack ExtType: shown, not lost


def summary(path) -> dict:
    """What ``shmq inspect`` shows of a snapshot: JSON-serialisable, never raises for
    damaged content (OSError for an unreadable file). Counts only the intact records."""
    with SnapshotReader(path) as r:
        h = r.header
        first_id = last_id = oldest = None
        body_bytes = max_attempt = 0
        for rec in r:
            if first_id is None:
                first_id = rec.msg_id
            last_id = rec.msg_id
            if oldest is None or rec.enqueued_ns < oldest:
                oldest = rec.enqueued_ns
            body_bytes += len(rec.body)
            max_attempt = max(max_attempt, rec.attempt)
        size = r.size
    return {
        "path": r.path,
        "format_version": h.version if h else None,
        "queue": h.queue if h else None,
        "settings": _jsonable(h.settings) if h else None,
        "created_ns": h.created_ns if h else None,
        "snapshot_ns": h.snapshot_ns if h else None,
        "records": r.count,
        "bytes": size,
        "body_bytes": body_bytes,
        "first_id": first_id,
        "last_id": last_id,
        "oldest_enqueued_ns": oldest,
        "max_attempt": max_attempt,
        "complete": r.complete,
        "error": r.error,
        "error_offset": r.error_offset,
        "unsupported": r.unsupported,
    }
