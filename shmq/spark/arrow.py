"""Records as Arrow record batches, the form Spark takes from a Python data source about
five times faster than tuples: the conversion, written once for the stream source and
the queue source; and the sink's side, a batch Spark hands a task
cut by target partition into the buffers a stream appends as they are
(``Stream.append_columns``)."""

import pyarrow as pa
import pyarrow.compute as pc

from ..engine.streams import paths as stream_paths
from ..model.headers import decode_headers, encode_headers, header_pairs
from ..engine.streams.partitioner import partition_of

__all__ = ["records_to_batch", "rows_to_batch", "columns_to_batch", "header_map", "SinkError", "route", "chunk",
           "encoded_headers"]

_UTC_US = pa.timestamp("us", tz="UTC")
_HEADERS = pa.map_(pa.string(), pa.string())


def header_map(headers) -> list[tuple[str, str | None]]:
    """A record's headers (a dict, or a list of pairs) as map<string,string> entries, in
    order: str values as they are, bytes decoded as UTF-8 (invalid bytes replaced),
    numbers and booleans in their str form, None (a null value) as null."""
    out = []
    for k, v in header_pairs(headers):
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif v is not None and not isinstance(v, str):
            v = str(v).lower() if isinstance(v, bool) else str(v)
        out.append((k, v))
    return out


def records_to_batch(records, include_headers: bool) -> pa.RecordBatch:
    """One Arrow batch of ``Record``s, in the source schema's column order."""
    arrays = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([r.stream for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([int(r.timestamp * 1_000_000) for r in records], _UTC_US),
    ]
    names = ["key", "value", "stream", "partition", "offset", "timestamp"]
    if include_headers:
        arrays.append(pa.array([header_map(r.headers) for r in records], _HEADERS))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def rows_to_batch(stream: str, partition: int, rows, include_headers: bool) -> pa.RecordBatch:
    """One Arrow batch of a partition's stored rows (``Stream.read_raw``: offset,
    timestamp ns, key, encoded headers, value), without a ``Record`` per row: the local
    source's path, about twice as fast as ``records_to_batch``."""
    n = len(rows)
    offsets, stamps, keys, hraws, values = zip(*rows) if rows else ((),) * 5
    arrays = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(stream, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array([t // 1000 for t in stamps], _UTC_US),
    ]
    names = ["key", "value", "stream", "partition", "offset", "timestamp"]
    if include_headers:
        arrays.append(pa.array([header_map(decode_headers(h)) if h else [] for h in hraws], _HEADERS))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def columns_to_batch(stream: str, partition: int, columns, include_headers: bool) -> pa.RecordBatch:
    """One Arrow batch from ``Stream.read_columns``'s buffers, wrapped, not copied: the
    local source's path when the C build is there."""
    n, voffs, vals, koffs, keys, kvalid, hoffs, hdrs, vvalid, offsets, stamps = columns[:11]  # (then where to read on)
    buf = pa.py_buffer
    arrays = [
        pa.Array.from_buffers(pa.binary(), n, [buf(kvalid), buf(koffs), buf(keys)]),
        pa.Array.from_buffers(pa.binary(), n, [None if vvalid is None else buf(vvalid), buf(voffs), buf(vals)]),
        pa.repeat(pa.scalar(stream, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(offsets)]),
        pa.Array.from_buffers(_UTC_US, n, [None, buf(stamps)]),
    ]
    names = ["key", "value", "stream", "partition", "offset", "timestamp"]
    if include_headers:
        raw = pa.Array.from_buffers(pa.binary(), n, [None, buf(hoffs), buf(hdrs)]).to_pylist()
        arrays.append(pa.array([header_map(decode_headers(h)) if h else [] for h in raw], _HEADERS))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


# ---------------------------------------------------------------- the sink's side


class SinkError(ValueError):
    """A row the sink cannot place or store (shmq.spark.options.SpecError wraps it)."""


def _binary(batch, name):
    """Column ``name`` of ``batch`` as a binary array (string cast without a copy), or None."""
    i = batch.schema.get_field_index(name)
    if i < 0:
        return None
    column = batch.column(i)
    return column if column.type == pa.binary() else column.cast(pa.binary())


def _column(batch, name):
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def route(batch, partitions: int, own: int, target: str, paths=None) -> list:
    """The rows of ``batch`` by the partition they go to, as Kafka's sink places them: the
    ``partition`` column's, else the key's hash (CRC-32, as ``append``), else ``own``:
    [(partition, values, keys or None, headers or None)], the arrays cut from the batch's
    columns (the whole columns, uncopied, when every row goes to one partition).
    SinkError for a null value or a partition outside the stream's. ``paths``: the
    target's (a local stream's ``paths``; None: those a handle attached now runs)."""
    values = _binary(batch, "value")
    if values.null_count:
        raise SinkError(f"the shmq sink's value column is null in {values.null_count} row(s): a record needs a value")
    keys, headers, parts = _binary(batch, "key"), _column(batch, "headers"), _column(batch, "partition")
    n = len(values)
    if parts is not None and parts.null_count == n:
        parts = None
    if parts is None and (keys is None or keys.null_count == n):
        return [(own, values, keys, headers)] if n else []
    routes = None
    if keys is not None and keys.null_count < n:
        routes = _key_routes(keys, partitions, own, paths or stream_paths.chosen())
    if parts is not None:
        try:
            parts = parts.cast(pa.int32())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SinkError(f"partition column: stream {target!r} has partitions 0..{partitions - 1}") from None
        bounds = pc.min_max(parts)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low < 0 or high >= partitions:
            raise SinkError(f"partition column: stream {target!r} has partitions 0..{partitions - 1}, not "
                            f"{low if low < 0 else high}")
        fallback = routes if routes is not None else pa.array([own] * n, pa.int32())
        routes = pc.if_else(pc.is_valid(parts), parts, fallback) if parts.null_count else parts
    counts = pc.value_counts(routes)
    out = []
    for p in sorted(c["values"].as_py() for c in counts):
        if len(counts) == 1:
            out.append((p, values, keys, headers))
            break
        idx = pc.indices_nonzero(pc.equal(routes, p))
        out.append((p, values.take(idx), None if keys is None else keys.take(idx),
                    None if headers is None else headers.take(idx)))
    return out


def _key_routes(keys, partitions: int, own: int, paths):
    """Each row's partition by its key (``own`` without one), in C on the C ``paths``."""
    n = len(keys)
    if paths.key_partitions is not None:
        koffs, kdata, kvalid = _buffers(keys)
        raw = paths.key_partitions(koffs, kdata, kvalid, n, partitions, own)
        return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(raw)])
    return pa.array([own if k is None else partition_of(k, partitions, paths.murmur2) for k in keys.to_pylist()],
                    pa.int32())


def _buffers(array):
    """(int32 offsets, data, validity bitmap or None) of a binary array, as the C appends
    read them: offsets index the data buffer (a slice's from where it starts), the bitmap
    from the array's first row."""
    _valid, offsets, data = array.buffers()
    n = len(array)
    offsets = offsets.slice(array.offset * 4, (n + 1) * 4)
    valid = None
    if array.null_count:
        valid = pc.is_valid(array).buffers()[1]  # a new array: its bitmap starts at row 0
    return offsets, data if data is not None else b"", valid


def encoded_headers(headers):
    """A map<string,string> column as the stored header bytes of each row (b"": none)."""
    return pa.array([encode_headers(dict(h)) if h else b"" for h in headers.to_pylist()], pa.binary())


def chunk(values, keys, headers) -> tuple:
    """One chunk for ``Stream.append_columns``: (n, value offsets, values, key offsets,
    keys, key validity, header offsets, headers), the arrays' own buffers."""
    voffs, vdata, _ = _buffers(values)
    koffs = kdata = kvalid = hoffs = hdata = None
    if keys is not None:
        koffs, kdata, kvalid = _buffers(keys)
    if headers is not None:
        hoffs, hdata, _ = _buffers(encoded_headers(headers))
    return (len(values), voffs, vdata, koffs, kdata, kvalid, hoffs, hdata)
