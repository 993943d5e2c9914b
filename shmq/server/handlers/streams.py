"""The streams' requests: STREAM_CREATE and the rest of a stream's life, APPEND and
APPEND_BATCH, READ, OFFSETS, a sink's PUBLISH and PUBLISHED, DELETE_RECORDS; and ``fill``,
which the reads and polls share."""

import msgpack

from ...engine.shm.waits import serving
from ...protocol.payloads import (
    batch_args,
    from_pairs,
    metadata_fields,
    pairs,
    record_reply,
    stream_create_args,
    stream_info_fields,
    stream_stats_fields,
)
from . import txns
from .answers import BlockingAppend, RECORD_OVERHEAD, reply_budget, wait_or_answer


def stream_create(conn, f):
    server = conn.server
    s = server.broker.create_stream(f["stream"], **stream_create_args(f))
    try:
        if server.on_create is not None:
            server.on_create(s)  # a wal stream's logs are open before the first append
        return stream_info_fields(s)
    finally:
        s.close()


def stream_delete(conn, f):
    conn.server.streams.forget(f["stream"])
    conn.server.broker.delete_stream(f["stream"])
    return {}


def stream_list(conn, f):
    return {"streams": conn.server.broker.list_streams()}


def stream_info(conn, f):
    return stream_info_fields(conn.server.stream(f["stream"]))


def stream_stats(conn, f):
    return stream_stats_fields(conn.server.stream(f["stream"]).stats())


def _appended(conn, s, run, reply):
    """``reply(run())`` of an append, made now, or a BlockingAppend where it may wait for room."""
    if s.retention == "block":
        return BlockingAppend(s, run, reply)
    with serving():
        result = reply(run())
    conn.server.streams.notify(s.name)
    return result


def append(conn, f):
    s = conn.server.stream(f["stream"])
    if "txn" in f:  # (handlers/txns.py)
        return txns.append_in(conn, s, f["txn"], [f["value"]], [f.get("key")], [f.get("headers")],
                              f.get("partition"), lambda ms: _one_appended(ms[0]))
    return _appended(conn, s, lambda: s.append(f["value"], key=f.get("key"), headers=f.get("headers"),
                                               partition=f.get("partition")), _one_appended)


def _one_appended(m):
    return {"partition": m.partition, "offset": m.offset, "timestamp": m.timestamp}


def append_batch(conn, f):
    s = conn.server.stream(f["stream"])
    values, keys, headers = batch_args(f, conn.server.max_frame_bytes)
    if "txn" in f:
        return txns.append_in(conn, s, f["txn"], values, keys or [None] * len(values), headers, f.get("partition"),
                              _batch_appended)
    return _appended(conn, s, lambda: s.append_many(values, keys=keys, headers=headers, partition=f.get("partition")),
                     _batch_appended)


def _batch_appended(metas):
    return {"records": [metadata_fields(m) for m in metas]}


def fill(take, most, budget, per_record) -> list:
    """Records from ``take(n, got)`` (a non-blocking read or poll of up to n records, after
    the records ``got`` so far) until ``most`` of them, or until the next could overrun
    ``budget`` bytes: each round asks only for as many as surely fit, every record being
    at most ``per_record`` bytes on the wire. The first record always comes, as a
    CONSUME's first message does."""
    out = []
    while len(out) < most:
        n = min(most - len(out), max(budget, 0) // per_record) or (0 if out else 1)
        if n == 0:
            break
        got = take(n, out)
        out += got
        if len(got) < n:
            break
        budget -= sum(map(record_bytes, got))
    return out


def record_bytes(r) -> int:
    """What a record read takes of a reply's budget."""
    n = len(r.value or b"") + len(r.key or b"") + RECORD_OVERHEAD
    return n + len(msgpack.packb(r.headers, use_bin_type=True)) if r.headers else n


def _records(conn, s, f, take, *what):
    """A READ's or POLL's reply: what ``take`` gives now, else a Wait on the stream's line.
    ``what``: the request's own args (a READ's stream, partition and offset, a POLL's
    member), then the most records, the reply's budget and the most a record may take."""
    args = (*what, f["max"], reply_budget(conn.server, 0), s.max_message_bytes + RECORD_OVERHEAD)
    return wait_or_answer(conn, f, conn.server.streams.line_of, s, take, _records_reply, args)


def _read(args):
    s, p, offset, *limits = args
    return fill(lambda n, got: s.read(p, got[-1].offset + 1 if got else offset, n), *limits) or None


def _records_reply(conn, args, rs):
    return {"records": [record_reply(r) for r in rs]}


def read(conn, f):
    s = conn.server.stream(f["stream"])
    return _records(conn, s, f, _read, s, f["partition"], f["offset"])


def offsets(conn, f):
    s = conn.server.stream(f["stream"])
    earliest, end = s.offsets(f["partition"])
    return {"earliest": earliest, "end": end, "stable": s.stable(f["partition"])}


def publish(conn, f):
    ranges = {}
    for p, sp, first, end in f["ranges"]:
        ranges.setdefault(p, []).append((sp, first, end))
    s, staging = conn.server.stream(f["stream"]), conn.server.stream(f["staging"])
    return _appended(conn, s, lambda: s.publish(staging, ranges, f["txn"], f["batch"]),
                     lambda first: {"first": pairs(first)})


def published(conn, f):
    return {"published": pairs(conn.server.stream(f["stream"]).published(f["txn"]))}


def delete_records(conn, f):
    return {"deleted": conn.server.stream(f["stream"]).delete_records(from_pairs(f["offsets"]))}
