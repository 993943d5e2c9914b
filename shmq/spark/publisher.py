"""The JVM sink's publisher (issue 46): a process of the Spark driver's host that appends what the
JVM sink's tasks spooled into shared memory to the target stream or queue, in C, on the driver's
commit: ``python -m shmq.spark.publisher``, one per driver JVM, its requests and replies JSON
lines on its stdin and stdout (``io.shmq.spark.sink.Publisher`` starts it and talks to it).

Strategy: a partition's lock is a process-shared robust mutex that shmq's C code takes, and the
JVM does not; so the executors write each task's rows to a spool of their own in /dev/shm (an
Arrow IPC file, no lock), and the commit hands the spools to this process, which does what the
Python sink's driver does with staged rows: per partition of the target, every task's rows (in
task order) appended in one step noting (query, batch) in the partition's publishers' table
(``Stream.publish_columns``), so a batch replayed after a crash anywhere lands once. Over TCP
(``url``) the rows go as the Python sink's tasks send theirs, to a staging stream, published by
the server. A queue target gets its rows put (at least once). The spools are deleted once
published (or once the batch is found published already), and on an abort.

A local target's handle is kept from one request to the next (attached again if its stream was
deleted, and closed within IDLE_S of that while no request comes), and once a publish is
answered the publisher makes ready the room the next batch will take, as much as this one took
(``Stream.prepare``: allocated, and mapped into this process), while Spark runs that batch: the
commit then writes into mapped memory, not a page fault a page.

Requests (one JSON object a line; the reply echoes ``id``): ``check`` (the options and the
target: its partitions), ``publish`` / ``put`` (``options``, ``txn``, ``batch``, ``spools``:
[{"path", "task"}]), ``drop`` (``spools``). A reply is ``{"id", "ok": true, ...}`` or ``{"id",
"error": one line, "kind": "spec" | "shmq" | "internal"}``; the process lives on after an error.
It ends at EOF on its stdin (its driver gone).
"""

import json
import os
import select
import sys
import traceback
import uuid

from ..errors import ShmqError, StreamExists, StreamNotFound
from .options import SINK, OPTIONS, Options, SpecError
from .outage import ride_out
from .staging import staging_name

__all__ = ["handle", "main"]

REQUEST_BYTES = 8 * 2**20  # the most one APPEND_BATCH carries over TCP (as the Python sink's tasks send)
IDLE_S = 1.0  # how often, without a request, the kept handles of deleted streams are closed


def _spools(req) -> list:
    """(path, task) of the request's spools, in task order (the order their rows are published)."""
    return sorted(((s["path"], int(s["task"])) for s in req.get("spools", ())), key=lambda x: (x[1], x[0]))


def _batches(path):
    import pyarrow as pa

    with pa.memory_map(path) as source:  # the spool's pages, not a copy
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


def _drop(spools) -> None:
    for path, _task in spools:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _check(opts: Options) -> dict:
    opts.refuse_unknown(SINK, OPTIONS[SINK])
    return ride_out(opts, "sink (the publisher)", lambda: _check_once(opts))


def _check_once(opts: Options) -> dict:
    with opts.connect() as broker:
        if opts.stream is not None:
            try:
                return {"partitions": broker.stream(opts.stream).partitions}
            except StreamNotFound:
                raise SpecError(f"the shmq sink writes to an existing stream: create stream {opts.stream!r} first "
                                f"(shmq stream create {opts.stream})") from None
        broker.queue(opts.queue)
        return {"partitions": 1}


def _route(target, batch, task, paths):
    from . import arrow

    try:
        return arrow.route(batch, target.partitions, task % target.partitions, target.name, paths)
    except arrow.SinkError as e:
        raise SpecError(str(e)) from None


_local = {}  # (namespace, stream) -> its Stream handle, kept between requests (and its mappings with it)


def _local_stream(opts: Options):
    """The local target's handle, kept from the last request unless its stream was deleted since."""
    key = (opts.namespace, opts.stream)
    target = _local.get(key)
    if target is not None and not target.deleted:
        return target
    _local.pop(key, None)
    if target is not None:
        target.close()
    with opts.connect() as broker:  # (the namespace's check: SpecError where there is none)
        target = _local[key] = broker.stream(opts.stream)
    return target


def _publish(opts: Options, txn: str, batch: int, spools) -> dict:
    """The spools' rows into the target stream, exactly once per (``txn``, ``batch``); a local
    publish's reply carries what to do once it is sent (``"then"``: the next batch's room made ready)."""
    from . import arrow

    txn_id = uuid.UUID(txn).bytes
    rows = 0
    if opts.url is None:
        target = _local_stream(opts)
        chunks = {}
        for path, task in spools:
            for b in _batches(path):
                rows += b.num_rows
                for p, values, keys, headers in _route(target, b, task, target.paths):
                    chunks.setdefault(p, []).append(arrow.chunk(values, keys, headers))
        if chunks:
            target.publish_columns(chunks, txn_id, batch)
        return {"rows": rows, "then": lambda: target.prepare(chunks)}
    return ride_out(opts, f"sink (the publisher, batch {batch})",
                    lambda: _publish_over_tcp(opts, txn_id, batch, spools))


def _publish_over_tcp(opts, txn_id: bytes, batch: int, spools) -> dict:
    """Over TCP: staged in a staging stream of the server, then published by it (as the Python sink does);
    made again whole while the server cannot be reached (``outage``): a publish lands once per batch, and
    records staged by a try that failed are in no range it publishes."""
    with opts.connect() as broker:
        return _publish_to(opts, broker, broker.stream(opts.stream), txn_id, batch, spools)


def _publish_to(opts, broker, target, txn_id: bytes, batch: int, spools) -> dict:
    from .writer import _pieces

    name = staging_name(target.name, str(uuid.UUID(bytes=txn_id)))
    if all(target.published(txn_id).get(p, -1) >= batch for p in range(target.partitions)):
        try:  # (a try before this one published, and its reply was lost before it deleted the staging stream)
            broker.delete_stream(name)
        except StreamNotFound:
            pass
        return {"rows": 0}  # (in already: a replayed commit)
    try:
        staging = broker.create_stream(name, partitions=target.partitions, max_bytes=opts.integer(
            "sinkStagingMaxBytes", target.max_bytes, 4096), max_message_bytes=target.max_message_bytes,
            durability="memory", exist_ok=True)
    except StreamExists:
        staging = broker.stream(name)
    ranges, rows = {}, 0
    try:
        for path, task in spools:
            for b in _batches(path):
                rows += b.num_rows
                for p, values, keys, headers in _route(target, b, task, None):
                    for at, size in _pieces(values, keys, headers):
                        v = values.slice(at, size).to_pylist()
                        k = None if keys is None else keys.slice(at, size).to_pylist()
                        h = None if headers is None else [dict(x) if x else None
                                                          for x in headers.slice(at, size).to_pylist()]
                        first = staging.append_many(v, keys=k, headers=h, partition=p)[0].offset
                        ranges.setdefault(p, []).append((p, first, first + size))
        if ranges:
            target.publish(staging, ranges, txn_id, batch)
    finally:
        staging.close()
        try:
            broker.delete_stream(name)
        except StreamNotFound:
            pass
    return {"rows": rows}


def _put(opts: Options, spools) -> dict:
    """The spools' rows put into the target queue (at least once: a put again after a crash puts again)."""
    from .writer import put_rows

    rows = 0
    who = "sink (the publisher)"
    with ride_out(opts, who, opts.connect) as broker:
        q = ride_out(opts, who, lambda: broker.queue(opts.queue))
        for path, _task in spools:
            for b in _batches(path):
                rows += ride_out(opts, who, lambda: put_rows(q, b))  # (at least once: a put again puts again)
    return {"rows": rows}


def handle(req: dict) -> dict:
    """The reply to one request (see the module's docstring); a callable under ``"then"``
    is not part of it: it is called once the reply is sent."""
    op = req.get("op")
    spools = _spools(req)
    if op == "drop":
        _drop(spools)
        return {"ok": True}
    opts = Options(req.get("options") or {})
    if op == "check":
        return {"ok": True, **_check(opts)}
    if op == "publish":
        out = _publish(opts, req["txn"], int(req["batch"]), spools)
    elif op == "put":
        out = _put(opts, spools)
    else:
        raise SpecError(f"the publisher has no request {op!r}")
    _drop(spools)
    return {"ok": True, **out}


def _forget() -> None:
    """Close the kept handles of streams deleted since (each IDLE_S without a request): a deleted
    stream's memory is not held by its mapping here while the driver idles."""
    for key, target in list(_local.items()):
        if target.deleted:
            del _local[key]
            target.close()


def _lines(fd: int):
    """The lines read from ``fd`` (bytes, without their newline); None after each IDLE_S without one."""
    buf = b""
    while True:
        while b"\n" not in buf:
            if not select.select([fd], [], [], IDLE_S)[0]:
                yield None
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                return
            buf += data
        line, buf = buf.split(b"\n", 1)
        yield line


def main() -> int:
    out = sys.stdout
    for line in _lines(sys.stdin.fileno()):
        if line is None:
            _forget()
            continue
        if not line.strip():
            continue
        req = {}
        try:
            req = json.loads(line)
            reply = handle(req)
        except SpecError as e:
            reply = {"error": str(e), "kind": "spec"}
        except ShmqError as e:
            reply = {"error": str(e), "kind": "shmq"}
        except Exception as e:  # a bug: said in one line to the driver, the traceback on stderr
            traceback.print_exc(file=sys.stderr)
            reply = {"error": f"{type(e).__name__}: {e}", "kind": "internal"}
        reply["id"] = req.get("id") if isinstance(req, dict) else None
        then = reply.pop("then", None)
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if then is not None:  # while the driver goes on
            try:
                then()
            except ShmqError:  # (the stream deleted meanwhile, say: the next publish finds out)
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
