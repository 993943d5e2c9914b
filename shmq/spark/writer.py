"""The "shmq" sink: a stream, exactly once per micro-batch; or a work queue, at least once.

Strategy: a task cannot publish on its own (Spark may run it twice, or run the batch
again after a crash), so tasks stage: each appends its rows to a staging stream of the
query (``NAME:staging:QUERY-ID``, partitioned as the target, in shared memory), into the
partition its row goes to (the ``partition`` column, else the key's hash, else the
task's own partition), and returns the offset ranges it staged. The driver's
``commit(messages, batchId)`` then asks the broker to publish those ranges
(``Stream.publish``): per partition, all of them in one append that also notes
(query id, batch id) in the partition's publishers' table, in the same step; a
partition that has the batch already is skipped. So a batch replayed after a crash
anywhere — before, during or after the commit — lands once, and an interrupted publish
is finished by the replay. After the publish the staging stream is deleted (the next
batch's tasks make it again): what failed task attempts and killed runs staged goes with
it, and a stopped query leaves nothing behind.
A queue sink (``option("queue")``) puts from the tasks: at least once.
"""

import logging
import uuid
from dataclasses import dataclass, field

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..engine.broker import Broker
from ..errors import ShmqError, StreamExists, StreamNotFound
from .options import OPTIONS, SINK, SpecError
from .outage import ride_out
from .staging import staging_name

__all__ = ["StreamWriter", "BatchWriter", "put_rows"]

log = logging.getLogger("shmq.spark")

REQUEST_BYTES = 8 * 2**20  # the most a task sends in one APPEND_BATCH over TCP (the server takes 16 MiB frames)
_TYPES = {"value": ("binary", "string"), "key": ("binary", "string"), "partition": ("int", "bigint", "smallint"),
          "headers": ("map<string,string>",)}


@dataclass
class Staged(WriterCommitMessage):
    """What one task staged: {partition: [(first, end), ...]} of the staging stream."""

    writer: str
    task: int
    ranges: dict = field(default_factory=dict)


def _check_columns(schema, target: str) -> None:
    types = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
    if "value" not in types:
        raise SpecError(f"the shmq sink into {target} needs a 'value' column (binary or string); the columns are "
                        f"{', '.join(types) or 'none'}")
    for name, allowed in _TYPES.items():
        if name in types and types[name] not in allowed:
            raise SpecError(f"the shmq sink's {name!r} column must be {' or '.join(allowed)}, not {types[name]}")


def _pieces(values, keys, headers) -> list:
    """(first row, rows) of the requests that send these rows over TCP: one, unless its
    bytes would pass REQUEST_BYTES (a frame holds at most 16 MiB)."""
    n = len(values)
    size = values.nbytes + (keys.nbytes if keys is not None else 0) + (headers.nbytes if headers is not None else 0)
    pieces = max(1, -(-size // REQUEST_BYTES))
    step = max(1, -(-n // pieces))
    return [(at, min(step, n - at)) for at in range(0, n, step)]


class _Writer:
    """What the stream and batch sinks share: the options, the checks made in the
    driver, and the task's staging of rows."""

    PART, KNOWN = SINK, OPTIONS[SINK]  # its name in errors, and the options it reads (any other is refused)

    def __init__(self, opts, schema, overwrite):
        opts.refuse_unknown(self.PART, self.KNOWN)
        if overwrite:
            raise SpecError("the shmq sink appends: use mode('append')")
        self.opts = opts
        _check_columns(schema, opts.target)
        ride_out(opts, "sink (the driver)", self._check)  # in the driver, before a task runs: a clear error now

    def _check(self) -> None:
        opts = self.opts
        with opts.connect() as broker:
            if opts.stream is not None:
                try:
                    broker.stream(opts.stream)
                except StreamNotFound:
                    raise SpecError(f"the shmq sink writes to an existing stream: create stream {opts.stream!r} "
                                    f"first (shmq stream create {opts.stream})") from None
            else:
                broker.queue(opts.queue)

    def _staging(self, broker, target, writer_id: str):
        """The staging stream of ``writer_id`` for ``target``: made by the first task of a
        batch, its memory taken as rows are staged (it is made and deleted each batch); one
        left by a run killed before its commit, made with other settings, as it is."""
        name = staging_name(target.name, writer_id)
        try:
            return broker.create_stream(
                name, partitions=target.partitions,
                max_bytes=self.opts.integer("sinkStagingMaxBytes", target.max_bytes, 4096),
                max_message_bytes=target.max_message_bytes, durability="memory", exist_ok=True)
        except StreamExists:
            staging = broker.stream(name)
            short = target.partitions - staging.partitions
            if short > 0 and hasattr(staging, "add_partitions"):  # the target grew since another task made it
                staging.add_partitions(short)
            return staging

    def _stage(self, writer_id: str, batches, task: int) -> Staged:
        """Append the task's rows to the staging stream, each Arrow batch in one append per
        target partition (locally, its buffers as they are: ``Stream.append_columns``;
        over TCP, one APPEND_BATCH, each request riding out an outage: ``outage``); the
        ranges they took."""
        from . import arrow  # here, not at the top: the driver's commit never needs pyarrow

        staged = Staged(writer_id, task)
        who = f"sink (task {task})"
        opts = self.opts
        with ride_out(opts, who, opts.connect) as broker:
            if self.opts.queue is not None:
                q = ride_out(opts, who, lambda: broker.queue(opts.queue))
                for b in batches:
                    ride_out(opts, who, lambda: put_rows(q, b))  # (at least once: a put again puts again)
                return staged
            target = ride_out(opts, who, lambda: broker.stream(opts.stream))
            staging = None
            n, own = target.partitions, task % target.partitions
            for b in batches:
                try:
                    parts = arrow.route(b, n, own, target.name, getattr(target, "paths", None))  # (a local one's)
                except arrow.SinkError as e:
                    raise SpecError(str(e)) from None
                if parts and staging is None:  # made by the batch's first task with rows; the commit deletes it
                    local = isinstance(broker, Broker)
                    staging = ride_out(opts, who, lambda: self._staging(broker, target, writer_id))
                for p, values, keys, headers in parts:
                    if local:
                        chunk = arrow.chunk(values, keys, headers)
                        first = staging.append_columns(chunk, p)
                        staged.ranges.setdefault(p, []).append((first, first + len(values)))
                        continue
                    for at, size in _pieces(values, keys, headers):  # one request, unless too big for a frame
                        v = values.slice(at, size)
                        k = None if keys is None else keys.slice(at, size).to_pylist()
                        h = None if headers is None else [dict(x) if x else None for x in headers.slice(at, size).to_pylist()]
                        # (an append made twice, its reply lost, leaves records no range names: never published)
                        first = ride_out(opts, who, lambda: staging.append_many(
                            v.to_pylist(), keys=k, headers=h, partition=p))[0].offset
                        staged.ranges.setdefault(p, []).append((first, first + size))
            return staged

    def _publish(self, messages, writer_id: str, txn_id: bytes, batch: int) -> None:
        """Publish what the tasks staged, exactly once per (``txn_id``, ``batch``), then
        delete the staging stream: nothing staged is left behind (the next batch's tasks
        make it again), rows of failed task attempts and killed runs included. Over TCP the
        whole of it is made again while the server cannot be reached (``outage``)."""
        if self.opts.queue is not None:
            return
        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.task)
        ranges = {}
        for m in staged:
            for p, spans in m.ranges.items():
                ranges.setdefault(p, []).extend((p, first, end) for first, end in spans)
        ride_out(self.opts, f"sink (the commit of batch {batch})",
                 lambda: self._publish_once(ranges, writer_id, txn_id, batch))

    def _drop_one(self, name: str) -> None:
        with self.opts.connect() as broker:
            _drop(broker, name)

    def _publish_once(self, ranges: dict, writer_id: str, txn_id: bytes, batch: int) -> None:
        with self.opts.connect() as broker:
            target = broker.stream(self.opts.stream)
            name = staging_name(target.name, writer_id)
            try:
                staging = broker.stream(name)
            except StreamNotFound:
                published = target.published(txn_id) if any(ranges.values()) else {}
                if any(ranges.values()) and any(published.get(p, -1) < batch for p, spans in ranges.items() if spans):
                    # staged, then deleted before this commit: the batch must run again
                    raise ShmqError(f"the shmq sink cannot commit batch {batch} into {self.opts.target}: its staging "
                                    f"stream {name!r} was deleted; restart the query, which runs the batch again"
                                    ) from None
                return  # nothing was staged (an empty batch), or published and deleted (a try whose reply was lost)
            try:
                target.publish(staging, ranges, txn_id, batch)
            finally:
                staging.close()
            _drop(broker, name)


def put_rows(q, batch) -> int:
    """Put an Arrow batch's rows into queue ``q`` (its value column the bodies, its headers
    column their headers): the queue sink's, Python's tasks and the JVM sink's publisher
    alike. Returns how many."""
    import pyarrow as pa

    values = batch.column(batch.schema.get_field_index("value"))
    if values.null_count:
        raise SpecError(f"the shmq sink's value column is null in {values.null_count} row(s): a message needs a body")
    values = (values if values.type == pa.binary() else values.cast(pa.binary())).to_pylist()
    i = batch.schema.get_field_index("headers")
    if i < 0:
        q.put_many(values, timeout=None)
        return len(values)
    for v, h in zip(values, batch.column(i).to_pylist()):
        q.put(v, headers=dict(h) if h else None, timeout=None)
    return len(values)


def _drop(broker, name: str) -> None:
    try:
        broker.delete_stream(name)
    except StreamNotFound:
        pass


def _task_context():
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx, ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId")


class StreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``writeStream.format("shmq")``: exactly once into a stream, keyed by the batch id."""

    def write(self, iterator):
        ctx, query, _batch = _task_context()
        return self._stage(query, iterator, ctx.partitionId())

    def commit(self, messages, batchId):
        writer = next((m.writer for m in messages if isinstance(m, Staged)), None)
        if writer is not None:
            self._publish(messages, writer, uuid.UUID(writer).bytes, batchId)

    def abort(self, messages, batchId):
        writer = next((m.writer for m in messages if isinstance(m, Staged)), None)
        log.warning("shmq sink: batch %d of the query into %s aborted; nothing of it was published", batchId,
                    self.opts.target)
        if writer is not None and self.opts.stream is not None:  # what it staged: the batch stages again when rerun
            ride_out(self.opts, "sink (the driver)", lambda: self._drop_one(staging_name(self.opts.stream, writer)))


class BatchWriter(_Writer, DataSourceArrowWriter):
    """``write.format("shmq").mode("append")``: the job's rows land all at once per
    partition (staged, then published), or not at all."""

    def __init__(self, opts, schema, overwrite):
        super().__init__(opts, schema, overwrite)
        self.job = str(uuid.uuid4())  # the same in every task: the writer is pickled to them

    def write(self, iterator):
        ctx, _query, _batch = _task_context()
        return self._stage(self.job, iterator, ctx.partitionId())

    def commit(self, messages):
        try:
            self._publish(messages, self.job, uuid.UUID(self.job).bytes, 0)
        finally:
            self._drop_staging()

    def abort(self, messages):
        self._drop_staging()

    def _drop_staging(self):
        if self.opts.stream is None:
            return
        ride_out(self.opts, "sink (the driver)", lambda: self._drop_one(staging_name(self.opts.stream, self.job)))
