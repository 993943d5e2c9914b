"""The "shmq" source: a stream's records by offset, for Structured Streaming
(``StreamReader``) and for batch queries (``BatchReader``).

Strategy: Kafka's source, on a stream. An offset is ``{"partition": next offset to
read}`` (string keys: it goes through JSON into Spark's checkpoint), and Spark owns it:
a restart resumes from the checkpoint and a replayed batch is replanned from the start
and end offsets written there, possibly in a new process. So planning
(``partitions``) is a pure function of those two offsets and the options (it looks at
the stream only to report data loss early), and ``read`` reads exactly ``[start, end)``
of one partition, which a retained stream returns the same every time. Nothing depends
on ``commit`` or ``stop`` being called (Spark skips both at times). The driver side
(``initialOffset``, ``latestOffset``, ``partitions``, all in one source-runner process)
keeps one connection, opened at first use: an idle query asks for the latest offsets
about 90 times a second. Tasks open their own, inside ``read``; the readers are pickled
to them, so they hold no open handle (``__getstate__``). Records leave as Arrow batches
(``arrow.records_to_batch``), about five times faster than tuples.
"""

import logging
import os
import re
import time
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from ..errors import OffsetOutOfRange, ShmqError
from .options import _UNIT_SECONDS, BATCH_SOURCE, OPTIONS, STREAM_SOURCE, SpecError
from .outage import ride_out
from .stager import MOVE_MAX, Stager, stage_name

__all__ = ["StreamReader", "BatchReader", "OffsetRange", "RangeGroup", "DataLossError"]

log = logging.getLogger("shmq.spark")

READ_CHUNK = 10_000  # records per read (and per Arrow batch) in a task
MOVES_PER_PLAN = 10  # the queue source: stager moves (of up to MOVE_MAX messages) before a batch is planned


class DataLossError(ShmqError):
    """Offsets a query planned to read were dropped by retention (or lost) before it read
    them, and ``failOnDataLoss`` is true."""


@dataclass
class OffsetRange(InputPartition):
    """One Spark partition: offsets ``[start, end)`` of one stream partition."""

    partition: int
    start: int
    end: int


def duration(opts, name: str, default: str) -> float:
    """Option ``name`` as seconds: a number and a unit (us, ms, s, m or min, h, d), a bare
    number being milliseconds, as Kafka's source reads ``maxTriggerDelay``."""
    raw = opts.get(name, default)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", raw.lower())
    if m is None or (m.group(2) or "ms") not in _UNIT_SECONDS:
        raise SpecError(f"option {name} must be a duration like 500ms, 15s or 15m, not {raw!r}")
    return float(m.group(1)) * _UNIT_SECONDS[m.group(2) or "ms"]


def share(backlog: dict, budget: int) -> dict:
    """How many of each partition's ``backlog`` records to take within ``budget``: all of
    them if they fit; else in proportion to the backlogs, every partition with a backlog
    getting at least one while the budget allows (the largest backlogs first when it does
    not), the rest by largest remainder, ties to the lower partition. Deterministic, and
    never more than ``budget`` in total or a backlog for any partition."""
    waiting = sorted((p for p, n in backlog.items() if n > 0), key=lambda p: (-backlog[p], p))
    if sum(backlog[p] for p in waiting) <= budget:
        return dict(backlog)
    take = {p: 0 for p in backlog}
    for p in waiting[:budget]:
        take[p] = 1
    rest, weights = budget - len(waiting), {p: backlog[p] - 1 for p in waiting}
    if rest > 0:
        total = sum(weights.values())
        remainders = {}
        for p in waiting:
            take[p] += rest * weights[p] // total
            remainders[p] = rest * weights[p] % total
        for p in sorted(waiting, key=lambda p: (-remainders[p], p))[:budget - sum(take.values())]:
            take[p] += 1
    return take


def split(ranges: list, min_partitions: int | None) -> list:
    """``ranges`` cut into at least ``min_partitions`` Spark partitions (when they are
    fewer): each range in about equal pieces, as many as its share of all the offsets."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out = []
    for r in ranges:
        size = r.end - r.start
        pieces = min(size, -(-size * min_partitions // total))
        out += [OffsetRange(r.partition, r.start + size * i // pieces, r.start + size * (i + 1) // pieces)
                for i in range(pieces)]
    return out


@dataclass
class RangeGroup(InputPartition):
    """One Spark partition reading several ``OffsetRange``s, one after the other."""

    ranges: list


def group(ranges: list, max_partitions: int | None) -> list:
    """``ranges`` as at most ``max_partitions`` Spark partitions (when they are more):
    about equal offsets in each (the largest range first into the lightest), each
    ``RangeGroup`` reading its ranges in partition order. Deterministic."""
    if not max_partitions or len(ranges) <= max_partitions:
        return ranges
    bins = [[0, i, []] for i in range(max_partitions)]
    for r in sorted(ranges, key=lambda r: (-(r.end - r.start), r.partition, r.start)):
        lightest = min(bins)
        lightest[0] += r.end - r.start
        lightest[2].append(r)
    return [RangeGroup(sorted(b[2], key=lambda r: (r.partition, r.start))) for b in sorted(bins, key=lambda b: b[1])
            if b[2]]


class _Source:
    """What the stream reader and the batch reader share: the options, the stream they
    name, the check for lost offsets and the read of one range."""

    PART, KNOWN = "", ()  # its name in errors, and the options it reads (any other is refused)

    def __init__(self, opts, schema):
        opts.refuse_unknown(self.PART, self.KNOWN)
        self.opts = opts
        self._headers = opts.flag("includeHeaders", False)
        self._fail_on_loss = opts.flag("failOnDataLoss", True)
        self._min_partitions = opts.integer("minPartitions", None, minimum=1)
        # one wave of tasks: each task costs a round with a Python worker, so by default no more
        # tasks than this host's cores (local attach: the executors run here); none with minPartitions
        default_max = None if opts.url or self._min_partitions else os.cpu_count()
        self._max_partitions = opts.integer("maxPartitions", default_max, minimum=1)
        if self._min_partitions and self._max_partitions:
            self._max_partitions = max(self._max_partitions, self._min_partitions)
        self._stage_bytes = opts.integer("queueStageMaxBytes", None, minimum=4096)
        self._stager = None  # the queue source's, on the driver's connection
        self._matched = None  # subscribePattern: the stream it matches, looked up once, when the query starts
        if opts.pattern is not None:
            self._matched = ride_out(opts, "source (the driver)", self._match)

    def _match(self) -> str:
        with self.opts.connect() as broker:
            return self.opts.resolve(broker.list_streams())

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_stager"] = None
        return state

    def _stream_name(self) -> str:
        """The stream read: the one named (or matched), or the one that stages the queue named."""
        if self._matched is not None:
            return self._matched
        return self.opts.stream if self.opts.queue is None else stage_name(self.opts.queue)

    def _before_plan(self, broker) -> None:
        """A queue source moves what its queue has ready into the stage stream, each
        message once (``stager``), before offsets are looked up: up to MOVES_PER_PLAN
        moves, so a queue filled faster than it drains still lets batches through."""
        if self.opts.queue is None:
            return
        if self._stager is None or self._stager.broker is not broker:
            self._stager = Stager(broker, self.opts.queue, max_bytes=self._stage_bytes)
        for _ in range(MOVES_PER_PLAN):
            if self._stager.move() < MOVE_MAX:
                break

    @staticmethod
    def _positions(stream) -> dict:
        """{partition: (earliest retained offset, end)} now; the end a reader's: the last
        stable offset (below an open transaction's records)."""
        return {p: (stream.offsets(p)[0], stream.stable(p)) for p in range(stream.partitions)}

    def _resolve(self, spec, positions: dict, name: str, missing: int) -> dict:
        """``startingOffsets`` / ``endingOffsets`` as {partition: offset}: earliest,
        latest, or per partition (-2 earliest, -1 latest; ``missing`` for partitions the
        JSON leaves out), the JSON keyed by the stream read or not (``Options.offsets``)."""
        if spec in ("earliest", "latest"):
            return {p: ends[spec == "latest"] for p, ends in positions.items()}
        if spec and isinstance(next(iter(spec.values())), dict):
            mine = {self._stream_name(), self.opts.queue} - {None}
            other = sorted(set(spec) - mine)
            if other or not set(spec) & mine:
                raise SpecError(f"option {name} names stream {(other or sorted(spec))[0]!r}, but this query reads "
                                f"stream {self._stream_name()!r} (one stream: its offsets are all it takes)")
            spec = next(iter(spec.values()))
        unknown = sorted(set(spec) - set(positions))
        if unknown:
            raise SpecError(f"option {name} names partition {unknown[0]}, but stream {self._stream_name()!r} has "
                            f"partitions 0..{len(positions) - 1}")
        out = {}
        for p, (earliest, end) in positions.items():
            o = spec.get(p, missing)
            out[p] = earliest if o == -2 else end if o == -1 else o
            if out[p] > end:
                raise SpecError(f"option {name}: offset {o} of partition {p} is past the end of stream "
                                f"{self._stream_name()!r} ({end})")
        return out

    def _loss(self, p: int, lost_from: int, lost_to: int) -> str:
        return (f"stream {self._stream_name()!r} partition {p}: offsets {lost_from}..{lost_to - 1} were dropped "
                f"by retention (or lost) before the query read them")

    def _check_loss(self, ranges: list, positions: dict) -> None:
        """DataLossError for the first range that starts below what its partition retains
        (with ``failOnDataLoss``; else ``read`` skips them, warning)."""
        if not self._fail_on_loss:
            return
        for r in ranges:
            earliest = positions[r.partition][0] if r.partition in positions else r.start
            if r.start < earliest:
                raise DataLossError(self._loss(r.partition, r.start, min(earliest, r.end))
                                    + "; set failOnDataLoss=false to skip them")

    def read(self, partition):
        """Arrow batches of the records ``[start, end)`` of one partition, read over a
        connection of this task's own. A batch plan with nothing to read has one
        partition that is not an ``OffsetRange``: nothing."""
        ranges = partition.ranges if isinstance(partition, RangeGroup) else [partition]
        if not all(isinstance(r, OffsetRange) for r in ranges):
            return
        who = f"source (a task reading partition {ranges[0].partition})"
        broker = ride_out(self.opts, who, self.opts.connect)
        try:  # (over TCP the handles connect again by themselves at their next call: each call rides out)
            stream = ride_out(self.opts, who, lambda: broker.stream(self._stream_name()))
            try:
                for r in ranges:
                    yield from self._read_range(stream, r, who)
            finally:
                stream.close()
        finally:
            broker.close()

    def _read_range(self, stream, r: OffsetRange, who: str):
        """Arrow batches of ``[start, end)``: locally as Arrow buffers made in C
        (``read_columns``) or else from the stored rows (``read_raw``), over TCP from the
        records."""
        from . import arrow  # here, not at the top: the process that plans never needs pyarrow

        columns, raw = getattr(stream, "read_columns", None), getattr(stream, "read_raw", None)
        offset = r.start
        while offset < r.end:  # (a range ends at most at the last stable offset: docs/STREAMS.md, Transactions)
            n = min(READ_CHUNK, r.end - offset)
            try:
                built = columns(r.partition, offset, n) if columns else None
                if built is not None and (built[0] or built[11] > offset):
                    if built[0]:
                        yield arrow.columns_to_batch(stream.name, r.partition, built, self._headers)
                    offset = built[11]  # (past markers and aborted records too)
                    continue
                if raw:
                    rows = raw(r.partition, offset, n, visible=True)
                    after = rows.next
                else:  # remote: a READ passes over what a reader does not see
                    rows = ride_out(self.opts, who, lambda: stream.read(r.partition, offset, max_records=n))
                    after = rows[-1].offset + 1 if rows else offset
            except OffsetOutOfRange as e:
                offset = self._skip(r, offset, e)
                continue
            if raw:
                rows = [x for x in rows if x[0] < r.end]
            else:
                rows = [x for x in rows if x.offset < r.end]
                if not rows and ride_out(self.opts, who, lambda: stream.offsets(r.partition))[1] >= r.end:
                    after = r.end  # nothing a reader sees is left in the range
            if not rows and after <= offset:
                raise ShmqError(f"stream {self._stream_name()!r} partition {r.partition} ends before offset "
                                f"{offset}: was it deleted and created again?")
            if rows:
                if raw:
                    yield arrow.rows_to_batch(stream.name, r.partition, rows, self._headers)
                else:
                    yield arrow.records_to_batch(rows, self._headers)
            offset = after

    def _skip(self, r: OffsetRange, offset: int, e: OffsetOutOfRange) -> int:
        """Where to read on after OffsetOutOfRange at ``offset``: DataLossError with
        ``failOnDataLoss``, else a warning and the next retained offset."""
        if e.earliest <= offset:  # past the end, not below the start
            raise ShmqError(f"stream {self._stream_name()!r} partition {r.partition} ends at {e.end}, before offset "
                            f"{offset}: was it deleted and created again?") from e
        resume = min(e.earliest, r.end)
        message = self._loss(r.partition, offset, resume)
        if self._fail_on_loss:
            raise DataLossError(message + "; set failOnDataLoss=false to skip them") from e
        log.warning("%s: skipped (failOnDataLoss=false)", message)
        return resume


class StreamReader(_Source, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("shmq")``: micro-batches of a stream's new records,
    within the read limit of the options (``maxRecordsPerTrigger``,
    ``minRecordsPerTrigger`` with ``maxTriggerDelay``; or Kafka's names for them,
    ``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger``) or of the trigger."""

    PART, KNOWN = STREAM_SOURCE, OPTIONS[STREAM_SOURCE]

    def __init__(self, opts, schema):
        super().__init__(opts, schema)
        # a queue's stage holds what was taken from the queue to be read: a new query reads it all
        self._starting = opts.offsets("startingOffsets", "latest" if opts.queue is None else "earliest")
        self._max_rows = opts.integer("maxRecordsPerTrigger", None, minimum=1)
        self._min_rows = opts.integer("minRecordsPerTrigger", None, minimum=1)
        if self._min_rows and self._max_rows and self._min_rows > self._max_rows:
            raise SpecError(f"option {opts.given_as('minRecordsPerTrigger')} ({self._min_rows}) is more than "
                            f"{opts.given_as('maxRecordsPerTrigger')} ({self._max_rows})")
        self._max_delay = duration(opts, "maxTriggerDelay", "15m")
        self._broker = self._stream = None  # the driver side's, opened at first use
        self._target = None  # availableNow: {partition: end} when the run began
        self._last_batch = None  # monotonic time of the last new offset (minRecordsPerTrigger)

    def __getstate__(self):
        state = super().__getstate__()
        state["_broker"] = state["_stream"] = None
        return state

    def _now(self, plan: bool = True) -> dict:
        """{partition: (earliest, end)} over the kept connection (after ``_before_plan``
        when planning); over ``url``, one that failed is opened again (at once: the server
        closed it while idle; then for as long as ``ride_out`` tries)."""

        def now():
            if self._broker is None:
                self._broker = self.opts.connect()
            if plan:
                self._before_plan(self._broker)
            if self._stream is None:
                self._stream = self._broker.stream(self._stream_name())
            return self._positions(self._stream)

        return ride_out(self.opts, "source (the driver)", now, reset=self.stop)

    def initialOffset(self) -> dict:
        """``startingOffsets`` (default latest) resolved now; partitions the JSON leaves
        out start at the earliest."""
        return {str(p): o for p, o in self._resolve(self._starting, self._now(), "startingOffsets", -2).items()}

    def getDefaultReadLimit(self):
        if self._min_rows is not None:
            return ReadMinRows(self._min_rows)
        if self._max_rows is not None:
            return ReadMaxRows(self._max_rows)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the ends now as the run's target: later appends wait for the next run."""
        self._target = {p: end for p, (_, end) in self._now().items()}

    def latestOffset(self, start: dict, limit) -> dict:
        """The ends now (capped at availableNow's target), within ``limit``: ReadMaxRows
        (and maxRecordsPerTrigger with ReadMinRows) shared over the partitions by
        ``share``; with ReadMinRows, ``start`` itself (no batch) while fewer rows wait
        and ``maxTriggerDelay`` has not passed since the last batch (or this source's
        first call). A partition ``start`` lacks starts at offset 0."""
        begin, backlog = {}, {}
        for p, (earliest, end) in self._now().items():
            s = start.get(str(p), 0)
            if end < s:
                raise ShmqError(f"stream {self._stream_name()!r} partition {p} ends at {end}, before the query's "
                                f"offset {s}: was it deleted and created again? Start the query with a new checkpoint")
            if self._target is not None:
                end = max(s, min(end, self._target.get(p, s)))
            begin[p] = max(s, min(earliest, end))  # lost offsets count for nothing
            backlog[p] = end - begin[p]
        now = time.monotonic()
        if self._last_batch is None:
            self._last_batch = now
        budget = None
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
        elif isinstance(limit, ReadMinRows):
            if (self._target is None and sum(backlog.values()) < limit.min_rows
                    and now - self._last_batch < self._max_delay):
                return start
            budget = self._max_rows
        take = backlog if budget is None else share(backlog, budget)
        end = {str(p): begin[p] + take[p] for p in begin}
        if end != start:
            self._last_batch = now
        return end

    def reportLatestOffset(self) -> dict:
        return {str(p): end for p, (_, end) in self._now(plan=False).items()}

    def partitions(self, start: dict, end: dict) -> list:
        """One ``OffsetRange`` per partition with offsets in ``[start, end)`` (split by
        ``minPartitions``): from the two offsets alone, so a replayed batch reads the
        same. DataLossError now if retention already dropped planned offsets."""
        ranges = [OffsetRange(int(p), start.get(p, 0), e) for p, e in sorted(end.items(), key=lambda i: int(i[0]))
                  if e > start.get(p, 0)]
        if ranges and self._fail_on_loss:
            self._check_loss(ranges, self._now(plan=False))
        return group(split(ranges, self._min_partitions), self._max_partitions)

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpoint is the only record of progress."""

    def stop(self) -> None:
        """Close the driver side's connection (a later call opens another)."""
        broker, stream, self._broker, self._stream, self._stager = self._broker, self._stream, None, None, None
        if stream is not None:
            stream.close()
        if broker is not None:
            broker.close()


class BatchReader(_Source, DataSourceReader):
    """``spark.read.format("shmq")``: the records between ``startingOffsets`` (default
    earliest) and ``endingOffsets`` (default latest), resolved when the query is
    planned."""

    PART, KNOWN = BATCH_SOURCE, OPTIONS[BATCH_SOURCE]

    def __init__(self, opts, schema):
        super().__init__(opts, schema)
        self._starting = opts.offsets("startingOffsets", "earliest")
        self._ending = opts.offsets("endingOffsets", "latest")
        if self._starting == "latest" or isinstance(self._starting, dict) and -1 in self._starting.values():
            raise SpecError("option startingOffsets cannot be latest (-1) in a batch query: it would read nothing")
        if self._ending == "earliest" or isinstance(self._ending, dict) and -2 in self._ending.values():
            raise SpecError("option endingOffsets cannot be earliest (-2) in a batch query: it would read nothing")

    def partitions(self) -> list:
        positions = ride_out(self.opts, "source (the driver)", self._positions_now)
        start = self._resolve(self._starting, positions, "startingOffsets", -2)
        end = self._resolve(self._ending, positions, "endingOffsets", -1)
        for p in positions:
            if end[p] < start[p]:
                raise SpecError(f"partition {p}: endingOffsets ({end[p]}) is before startingOffsets ({start[p]})")
        ranges = [OffsetRange(p, start[p], end[p]) for p in positions if end[p] > start[p]]
        self._check_loss(ranges, positions)
        return group(split(ranges, self._min_partitions), self._max_partitions)

    def _positions_now(self) -> dict:
        with self.opts.connect() as broker:
            self._before_plan(broker)
            with broker.stream(self._stream_name()) as stream:
                return self._positions(stream)
