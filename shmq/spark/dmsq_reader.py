"""The "dmsq" data source: ``.dmsq`` snapshot files read as a batch DataFrame, one row
per message (docs/FORMAT.md is the file format).

    spark.read.format("dmsq").load("/var/lib/shmq/orders.dmsq")    # one file
    spark.read.format("dmsq").load("/var/lib/shmq")                # every *.dmsq in a directory
    spark.read.format("dmsq").load("/var/lib/shmq/orders-*.dmsq")  # a glob; or a list of these

A queue's snapshot gives ``id long, body binary, headers map<string,string>, attempt int,
enqueued_at timestamp`` (UTC). A stream partition's snapshot (``@STREAM#P.dmsq``) gives the
columns of the "shmq" source with headers: ``key binary, value binary, stream string,
partition int, offset long, timestamp timestamp, headers map<string,string>``. One read
takes one kind: a directory holding both (a broker's data directory) is refused; load
``DIR/[!@]*.dmsq`` for its queues, ``DIR/@NAME#*.dmsq`` for stream NAME. Header values
become strings (``arrow.header_map``). A damaged file fails the read with the reader's
one-line error (file and byte offset); with ``.option("ignoreCorruptFiles", "true")`` a
warning is logged and the records before the damage are kept, as Spark's own file
sources do. A file of a newer format version always fails the read: it is intact, and
skipping it would lose it silently. Paths are local (``file:`` URIs too); a relative one is
taken from the directory the Spark session started in, as Spark's own file sources do.

Strategy: files are the unit of work, one Spark partition per file, because a file cannot
be split: each record's CRC is chained from byte 0, so checking a record needs every byte
before it. The paths (file, directory, glob, or a list) are resolved in the driver when
the read is planned, so a path that matches nothing fails at ``load()`` naming it, and the
workers get absolute paths. Each task streams its file with ``shmq.formats.dmsq.SnapshotReader``,
the format's one codec and damage checker (it never raises on damage; it stops and says
where), and yields Arrow record batches of up to 8192 rows, about five times faster into
Spark than tuples; decoded headers are cached per batch, since many messages share theirs.
"""

import glob
import json
import logging
import os

import msgpack
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType,
                               TimestampType)

from ..formats.dmsq import SUFFIX, SnapshotReader, stream_row
from ..engine.queues import extension
from ..formats.logfiles import split_partition_name
from ..errors import ShmqError
from .arrow import header_map
from .options import SpecError, refuse_unknown

__all__ = ["DmsqDataSource", "DmsqReader", "DmsqFile", "DamagedSnapshot", "QUEUE_SCHEMA", "STREAM_SCHEMA",
           "resolve_paths"]

log = logging.getLogger("shmq.spark.dmsq")

BATCH_ROWS = 8192
_HEADERS = MapType(StringType(), StringType())
QUEUE_SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("body", BinaryType()),
    StructField("headers", _HEADERS),
    StructField("attempt", IntegerType()),
    StructField("enqueued_at", TimestampType()),
])
STREAM_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("stream", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("headers", _HEADERS),
])
_SCHEMAS = {"queue": QUEUE_SCHEMA, "stream": STREAM_SCHEMA}


class DamagedSnapshot(ShmqError):
    """A snapshot file failed a check; the message is the reader's line: file, what
    failed, byte offset."""


class DmsqFile(InputPartition):
    """One Spark partition: one snapshot file (an absolute path)."""

    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


_OPTIONS = ("path", "paths", "ignoreCorruptFiles")  # (path, paths: what load() is given)


def _options(raw) -> dict:
    """The options, by lower-cased name; SpecError for one the dmsq source does not read."""
    opts = {str(k).lower(): v for k, v in dict(raw or {}).items()}
    refuse_unknown(opts, "the dmsq data source", _OPTIONS)
    return opts


def _flag(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if str(raw).lower() in ("true", "1", "yes"):
        return True
    if str(raw).lower() in ("false", "0", "no"):
        return False
    raise SpecError(f"option {name} must be true or false, not {raw!r}")


def _given_paths(opts: dict) -> list[str]:
    """The paths of ``load()``: Spark passes one as option "path" and a list of several as
    option "paths" (a JSON array); ``option("paths", "a,b")`` is split on commas."""
    out = []
    if opts.get("path"):
        out.append(str(opts["path"]))
    raw = opts.get("paths")
    if raw:
        try:
            listed = json.loads(raw)
        except ValueError:
            listed = str(raw).split(",")
        if isinstance(listed, str):
            listed = [listed]
        if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
            raise SpecError(f"option paths must be a JSON list of paths or a comma-separated list, not {raw!r}")
        out.extend(p.strip() for p in listed if p.strip())
    if not out:
        raise SpecError('the dmsq data source needs a path: spark.read.format("dmsq").load("/data/orders.dmsq") '
                        "(a file, a directory of .dmsq files, a glob, or a list of these)")
    return out


def _local(path: str) -> str:
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith("file:"):
        path = path[len("file:"):]
    elif "://" in path:
        raise SpecError(f"the dmsq data source reads local files only, not {path!r}")
    return os.path.abspath(os.path.expanduser(path))


def _directory(path: str) -> list[str]:
    return sorted(e.path for e in os.scandir(path) if e.name.endswith(SUFFIX) and e.is_file())


def resolve_paths(options) -> list[str]:
    """The files a read covers, absolute and without repeats, in the order given: a file
    as it is, a directory's ``*.dmsq`` files (sorted), a glob's matches (sorted; a
    matched directory is expanded). A relative path is taken from the working directory
    of Spark's planner, which is where the session started, as for Spark's own file
    sources. Raises SpecError naming a path that matches nothing."""
    files = []
    for given in _given_paths(_options(options)):
        path = _local(given)
        shown = given if given == path else f"{given} ({path})"
        if os.path.isdir(path):
            found = _directory(path)
            if not found:
                raise SpecError(f"dmsq: no *{SUFFIX} files in directory: {shown}")
        elif os.path.exists(path):
            found = [path]
        elif glob.has_magic(path):
            found = []
            for match in sorted(glob.glob(path)):
                found.extend(_directory(match) if os.path.isdir(match) else [match])
            if not found:
                raise SpecError(f"dmsq: no file matches: {shown}")
        else:
            raise SpecError(f"dmsq: path does not exist: {shown}")
        files.extend(found)
    return list(dict.fromkeys(files))


def _kind(header) -> str:
    return "stream" if split_partition_name(header.queue) is not None else "queue"


def _what(header) -> str:
    part = split_partition_name(header.queue)
    return f"queue {header.queue!r}" if part is None else f"partition {part[1]} of stream {part[0]!r}"


def _kind_of(files: list[str]) -> str:
    """"queue" or "stream": what the readable headers of ``files`` say (a file whose header
    cannot be read is left to ``read()``; none readable: "queue"). SpecError if mixed."""
    seen = {}
    for path in files:
        try:
            with SnapshotReader(path) as r:
                header = r.header
        except OSError:
            continue
        if header is not None:
            seen.setdefault(_kind(header), (path, header))
        if len(seen) > 1:
            (qp, qh), (sp, sh) = seen["queue"], seen["stream"]
            raise SpecError(f"dmsq: one read takes queue snapshots or stream snapshots, not both: {qp} is "
                            f"{_what(qh)}, {sp} is {_what(sh)}; load them separately (a glob such as "
                            f"DIR/[!@]*.dmsq for the queues, DIR/@NAME#*.dmsq for stream NAME)")
    return next(iter(seen), "queue")


class DmsqDataSource(DataSource):
    """``format("dmsq")``: a batch reader of ``.dmsq`` snapshot files."""

    @classmethod
    def name(cls):
        return "dmsq"

    def schema(self):
        """The columns of the kind of snapshot the paths hold (queue or stream)."""
        return _SCHEMAS[_kind_of(resolve_paths(self.options))]

    def reader(self, schema):
        return DmsqReader(self.options, schema)


class DmsqReader(DataSourceReader):
    """Plans one partition per file; reads a file into Arrow batches."""

    def __init__(self, options, schema: StructType):
        opts = _options(options)
        self.options = opts
        self.ignore_corrupt = _flag(opts, "ignoreCorruptFiles", False)
        given = [(f.name, f.dataType) for f in schema.fields]
        kinds = [k for k, s in _SCHEMAS.items() if given == [(f.name, f.dataType) for f in s.fields]]
        if not kinds:
            raise SpecError(f"the dmsq data source has the columns {QUEUE_SCHEMA.simpleString()} (queue snapshots) "
                            f"or {STREAM_SCHEMA.simpleString()} (stream snapshots), not {schema.simpleString()}")
        self.kind = kinds[0]
        self.schema = schema

    def partitions(self):
        return [DmsqFile(path) for path in resolve_paths(self.options)]

    def read(self, partition: DmsqFile):
        path = partition.path
        with SnapshotReader(path) as r:
            if r.header is not None:
                if _kind(r.header) != self.kind:
                    raise SpecError(f"dmsq: {path} is {_what(r.header)}, and this read has the columns of "
                                    f"{self.kind} snapshots: load queue and stream snapshots separately")
                arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
                rows = _queue_rows if self.kind == "queue" else _stream_rows
                try:
                    yield from _batches(rows(r), arrow_schema)
                except _BadHeaders as e:
                    self._damaged(f"{path}: {e}", r.count - 1)
                    return
            if r.unsupported:
                raise DamagedSnapshot(f"{r.error}; the file is intact, written by a newer shmq: read it with that")
            if r.error is not None:
                self._damaged(r.error, r.count)

    def _damaged(self, error: str, kept: int) -> None:
        if not self.ignore_corrupt:
            raise DamagedSnapshot(f"{error} (option ignoreCorruptFiles=true reads the records before the damage)")
        log.warning("%s; ignoreCorruptFiles is set: kept the %d records before it", error, kept)


class _BadHeaders(Exception):
    """A record's headers are not a msgpack map (the batch before it was yielded)."""


def _headers(raw: bytes, cache: dict, msg_id: int) -> list:
    entries = cache.get(raw)
    if entries is None:
        try:
            headers = extension.split(raw)[1] if raw else raw  # the extension block (priority, ...): not headers
            decoded = msgpack.unpackb(headers, raw=False) if headers else {}
            if isinstance(decoded, list):  # a stream record's (key, value) pairs (model/headers.py)
                decoded = [(k, v) for k, v in decoded]
            elif not isinstance(decoded, dict):
                raise TypeError(f"a {type(decoded).__name__}")
        except Exception as e:  # msgpack raises several kinds; all mean the same here
            raise _BadHeaders(f"message {msg_id}: headers are not a msgpack map or array of pairs "
                              f"({type(e).__name__}: {e})") from None
        entries = [(k if isinstance(k, str) else str(k), v) for k, v in header_map(decoded)]
        if len(cache) >= BATCH_ROWS:  # many distinct headers: keep the cache small
            cache.clear()
        cache[raw] = entries
    return entries


def _queue_rows(reader):
    """A queue snapshot's records as rows of QUEUE_SCHEMA."""
    cache = {}
    for rec in reader:
        yield rec.msg_id, rec.body, _headers(rec.headers, cache, rec.msg_id), rec.attempt, rec.enqueued_ns // 1000


def _stream_rows(reader):
    """A stream partition's snapshot records as rows of STREAM_SCHEMA."""
    stream, partition = split_partition_name(reader.header.queue)
    cache = {}
    for rec in reader:
        offset, ts_ns, key, _, value = stream_row(rec.msg_id, rec.attempt, rec.enqueued_ns, rec.headers, rec.body)
        yield key, value, stream, partition, offset, ts_ns // 1000, _headers(rec.headers, cache, rec.msg_id)


def _batches(rows, schema: pa.Schema):
    """Arrow batches of BATCH_ROWS ``rows``. On bad headers, yields the rows before them,
    then raises _BadHeaders."""
    buf, error = [], None
    try:
        for row in rows:
            buf.append(row)
            if len(buf) == BATCH_ROWS:
                yield _batch(schema, list(zip(*buf)))
                buf = []
    except _BadHeaders as e:
        error = e
    if buf:
        yield _batch(schema, list(zip(*buf)))
    if error is not None:
        raise error


def _batch(schema: pa.Schema, columns: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, schema)], schema=schema)
