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
is finished by the replay. After the publish the staging stream is trimmed to its end:
what failed task attempts and killed runs staged is reclaimed with it.
A queue sink (``option("queue")``) puts from the tasks: at least once.
"""

import logging
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from ..engine.stream import partition_of
from ..errors import StreamNotFound
from .options import SpecError
from .staging import reclaim, staging_name

__all__ = ["StreamWriter", "BatchWriter"]

log = logging.getLogger("shmq.spark")

CHUNK = 16_384  # rows staged per append
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


def _column(batch, name):
    """Column ``name`` as a list (value and key as bytes, cast in Arrow), or None."""
    i = batch.schema.get_field_index(name)
    if i < 0:
        return None
    column = batch.column(i)
    if name in ("value", "key") and column.type != pa.binary():
        column = column.cast(pa.binary())
    return column.to_pylist()


class _Writer:
    """What the stream and batch sinks share: the options, the checks made in the
    driver, and the task's staging of rows."""

    def __init__(self, opts, schema, overwrite):
        if overwrite:
            raise SpecError("the shmq sink appends: use mode('append')")
        self.opts = opts
        _check_columns(schema, opts.target)
        with opts.connect() as broker:  # in the driver, before a task runs: a clear error now
            if opts.stream is not None:
                try:
                    broker.stream(opts.stream)
                except StreamNotFound:
                    raise SpecError(f"the shmq sink writes to an existing stream: create stream {opts.stream!r} "
                                    f"first (shmq stream create {opts.stream})") from None
            else:
                broker.queue(opts.queue)

    def _stage(self, writer_id: str, batches, task: int) -> Staged:
        """Append the task's rows to the staging stream; the ranges they took."""
        staged = Staged(writer_id, task)
        with self.opts.connect() as broker:
            if self.opts.queue is not None:
                q = broker.queue(self.opts.queue)
                for b in batches:
                    self._put(q, b)
                return staged
            target = broker.stream(self.opts.stream)
            staging = broker.create_stream(staging_name(target.name, writer_id), partitions=target.partitions,
                                           max_bytes=self.opts.integer("stagingMaxBytes", target.max_bytes, 4096),
                                           max_message_bytes=target.max_message_bytes, durability="memory",
                                           exist_ok=True)
            n, own = target.partitions, task % target.partitions
            for b in batches:
                values = _column(b, "value")
                keys, hdrs, parts = _column(b, "key"), _column(b, "headers"), _column(b, "partition")
                if hdrs is not None:
                    hdrs = [dict(h) if h else None for h in hdrs]
                if keys is None and parts is None:  # every row to the task's own partition: no routing
                    route = {own: range(len(values))}
                else:
                    route = self._route(keys or [None] * len(values), parts or [None] * len(values), n, own,
                                        target.name)
                for p, idx in sorted(route.items()):
                    for at in range(0, len(idx), CHUNK):
                        chunk = idx[at:at + CHUNK]
                        metas = staging.append_many(
                            [values[i] for i in chunk], keys=None if keys is None else [keys[i] for i in chunk],
                            headers=None if hdrs is None else [hdrs[i] for i in chunk], partition=p)
                        staged.ranges.setdefault(p, []).append((metas[0].offset, metas[-1].offset + 1))
            return staged

    @staticmethod
    def _route(keys, parts, n: int, own: int, name: str) -> dict:
        """{partition: row indexes}: the ``partition`` column's, else the key's hash, else ``own``."""
        route = {}
        for i, (k, p) in enumerate(zip(keys, parts)):
            if p is not None and not 0 <= p < n:
                raise SpecError(f"partition column: stream {name!r} has partitions 0..{n - 1}, not {p}")
            route.setdefault(p if p is not None else own if k is None else partition_of(k, n), []).append(i)
        return route

    @staticmethod
    def _put(q, batch):
        values = _column(batch, "value")
        hdrs = _column(batch, "headers")
        if hdrs is None:
            q.put_many(values, timeout=None)
            return
        for v, h in zip(values, hdrs):
            q.put(v, headers=dict(h) if h else None, timeout=None)

    def _publish(self, messages, writer_id: str, txn_id: bytes, batch: int) -> None:
        """Publish what the tasks staged, exactly once per (``txn_id``, ``batch``), then
        trim the staging stream: nothing staged is left behind."""
        if self.opts.queue is not None:
            return
        staged = sorted((m for m in messages if isinstance(m, Staged)), key=lambda m: m.task)
        ranges = {}
        for m in staged:
            for p, spans in m.ranges.items():
                ranges.setdefault(p, []).extend((p, first, end) for first, end in spans)
        with self.opts.connect() as broker:
            target = broker.stream(self.opts.stream)
            try:
                staging = broker.stream(staging_name(target.name, writer_id))
            except StreamNotFound:
                return  # nothing was staged: an empty batch
            target.publish(staging, ranges, txn_id, batch)
            reclaim(staging)


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
        log.warning("shmq sink: batch %d of the query into %s aborted; its staged rows are reclaimed at the next "
                    "commit", batchId, self.opts.target)


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
        with self.opts.connect() as broker:
            try:
                broker.delete_stream(staging_name(self.opts.stream, self.job))
            except StreamNotFound:
                pass
