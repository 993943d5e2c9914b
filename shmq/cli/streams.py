"""The stream commands (``shmq stream ...``) and consumer groups (``shmq group ...``)."""

import base64
import json
import sys

import click

from ..engine.shm.layout import MAX_PARTITIONS
from ..model.settings import STREAM
from ..errors import OffsetOutOfRange, SettingsMismatch, ShmqError, StreamExists, StreamNotFound
from .app import (
    Size, shown, _connect, _created, _echo_json, _echo_names, _echo_set, _json_option, _jsonable, _parse_headers, _print_table,
    _stop_on_signals, _target_options, main,
)


READ_BATCH = 1000  # records per read call


# --follow waits on one partition at a time, this long: a stop signal, or a record in another partition, is
# seen within one slice
FOLLOW_SLICE_S = 0.25


def _streams_stats(broker, names, every=()) -> dict:
    """``Stream.stats()`` by name; a stream a Spark sink writes into (shmq.spark) also
    says what is staged for it, by writer: {"staged": {writer id: records}}."""
    out = {}
    for name in names:
        with broker.stream(name) as s:
            out[name] = s.stats()
        from ..spark.staging import staged_by_writer  # (Spark's package: imported only where a stream is shown)

        staged = staged_by_writer(broker, name, every)
        if staged:
            out[name]["staged"] = staged
    return out


@main.group("stream")
def stream_group():
    """Streams: partitioned append-only logs read by offset, with consumer groups (docs/STREAMS.md)."""


@stream_group.command("create")
@click.argument("name")
@_target_options
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), default=STREAM.partitions, show_default=True,
              help=f"Partitions (at most {MAX_PARTITIONS}).")
@click.option("--max-bytes", type=Size(min=4096), default=shown(STREAM.max_bytes), show_default=True,
              help="Each partition's ring in shared memory: the newest records it keeps (a size: 65536, 64KiB, "
                   "64MiB...).")
@click.option("--max-message-bytes", type=Size(min=1), default=shown(STREAM.max_message_bytes),
              show_default=True, help="Largest record: key, headers and value (a size).")
@click.option("--retention", type=click.Choice(["drop", "block"]), default=STREAM.retention, show_default=True,
              help="When a partition is full: drop its oldest records, or make appends wait for the slowest group.")
@click.option("--retention-bytes", type=Size(min=1), default=None,
              help="Bound of a wal stream's logs on disk (a size).")
@click.option("--retention-seconds", type=click.FloatRange(0, min_open=True), default=None,
              help="Age bound of a wal stream's logs on disk.")
@click.option("--group-idle-timeout", type=click.FloatRange(0, min_open=True), default=STREAM.group_idle_timeout,
              show_default=True,
              help="Seconds after which a group without live members stops holding back --retention block.")
@click.option("--durability", type=click.Choice(["memory", "snapshot", "wal"]), default=STREAM.durability,
              show_default=True)
@click.option("--compact", is_flag=True, help="Keep the latest record of each key (Kafka's cleanup.policy=compact; "
                                               "docs/STREAMS.md, Compacted streams).")
@click.option("--delete-retention-seconds", type=click.FloatRange(0), default=STREAM.delete_retention_seconds,
              show_default=True, help="How long a compacted stream keeps a tombstone (a record with a null value).")
@click.option("--exist-ok", is_flag=True, help="Succeed if the stream exists.")
@_json_option
def stream_create(name, namespace, url, token, exist_ok, as_json, **options):
    """Create a stream. With --exist-ok a stream of that name is taken as it is if it has
    the settings given (it says "exists", not "created"), else refused naming each that differs."""
    partitions = []

    def create(ok):
        with broker.create_stream(name, exist_ok=ok, **options) as s:
            partitions.append(s.partitions)

    with _connect(namespace, url, token, create=True) as broker:
        created = _created(create, exist_ok, StreamExists)
    if as_json:
        _echo_json({"stream": name, "created": created, "partitions": partitions[-1]})
    else:
        click.echo(f"{'created stream' if created else 'stream'} {name} ({partitions[-1]} partitions)"
                   + ("" if created else " exists (settings match)"))


@stream_group.command("set")
@click.argument("name")
@_target_options
@click.option("--partitions", type=click.IntRange(1, MAX_PARTITIONS), default=None,
              help="The new partition count, more than the stream has (records stay where they are; keys hash "
                   "over the new count from now on).")
@click.option("--max-message-bytes", type=Size(min=1), default=None, help="Largest record (a size).")
@click.option("--retention-bytes", type=Size(min=0), default=None, help="Bound of what a partition keeps; 0: none.")
@click.option("--retention-seconds", type=click.FloatRange(0), default=None,
              help="Age bound of what a partition keeps; 0: none.")
@click.option("--timestamp-type", type=click.Choice(["create_time", "log_append_time"]), default=None,
              help="Kafka producers' timestamps kept, or the time of the append.")
@click.option("--compression", type=click.Choice(["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]),
              default=None, help="The codec of the batches the Kafka listener serves (producer: as they came).")
@click.option("--compact/--no-compact", default=None, help="Keep the latest record of each key, or stop compacting.")
@click.option("--delete-retention-seconds", type=click.FloatRange(0), default=None,
              help="How long a compacted stream keeps a tombstone.")
@click.option("--min-cleanable-dirty-ratio", type=click.FloatRange(0, 1), default=None,
              help="Compact a partition once this share of what it holds was appended since its last compaction.")
@_json_option
def stream_set(name, namespace, url, token, as_json, **options):
    """Change settings of a live stream, or add partitions (docs/STREAMS.md, "Changing a live
    stream"); the others stay as they are. An unknown stream, fewer or as many partitions, a
    bad value: one line, exit 2."""
    settings = {k: v for k, v in options.items() if v is not None}
    if not settings:
        raise click.UsageError("nothing to set: give at least one setting (--partitions, --retention-seconds, ...)")
    for k in ("retention_bytes", "retention_seconds"):
        if settings.get(k) == 0:
            settings[k] = None
    try:
        with _connect(namespace, url, token) as broker:
            if not hasattr(broker, "update_stream"):
                raise ValueError("shmq stream set works on this host's namespace, not over tcp:// (yet)")
            if "partitions" in settings:
                with broker.stream(name) as s:
                    have = s.partitions
                if settings["partitions"] <= have:
                    raise ValueError(f"stream {name!r} has {have} partitions: --partitions must be more "
                                     f"(a stream never shrinks), not {settings['partitions']}")
            after = broker.update_stream(name, **settings)
    except (StreamNotFound, SettingsMismatch, ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0]) from None
    _echo_set(name, settings, after, as_json)


@stream_group.command("list")
@_target_options
@_json_option
def stream_list(namespace, url, token, as_json):
    """List the streams."""
    with _connect(namespace, url, token) as broker:
        names = broker.list_streams()
    _echo_names(names, as_json)


@stream_group.command("delete")
@click.argument("name")
@_target_options
def stream_delete(name, namespace, url, token):
    """Delete a stream, its records and its groups."""
    with _connect(namespace, url, token) as broker:
        broker.delete_stream(name)
    click.echo(f"deleted stream {name}")


@stream_group.command("trim")
@click.argument("name")
@click.option("--partition", "-p", "partitions", type=click.IntRange(0), multiple=True,
              help="The partition to trim (repeat for several). [default: every one]")
@click.option("--before", type=click.IntRange(0), required=True, metavar="OFFSET",
              help="Drop the records below this offset (past the end: every record).")
@_target_options
def stream_trim(name, partitions, before, namespace, url, token):
    """Drop a stream's records below an offset now, as retention would (Kafka's
    DeleteRecords): readers below it get OffsetOutOfRange and start at the new earliest.
    A "wal" stream's logs on disk stay for retention to delete."""
    try:
        with _connect(namespace, url, token) as broker:
            with broker.stream(name) as s:
                ps = partitions or range(s.partitions)
                offsets = {p: min(before, s.offsets(p)[1]) for p in ps}
                dropped = s.delete_records(offsets)
                starts = {p: s.offsets(p)[0] for p in ps}
    except (StreamNotFound, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"trimmed stream {name}: {dropped} record(s) dropped; earliest offsets "
               + ", ".join(f"{p}: {o}" for p, o in starts.items()))


@stream_group.command("stats")
@click.argument("name", required=False)
@_target_options
@_json_option
def stream_stats(name, namespace, url, token, as_json):
    """Offsets and bytes of each partition, and each group's lag, of one stream or of all."""
    with _connect(namespace, url, token) as broker:
        every = broker.list_streams()
        by_name = _streams_stats(broker, [name] if name else every, every)
    if as_json:
        _echo_json(by_name)
    else:
        from .. import views

        views.console().print(views.stream_stats_view(by_name))


@stream_group.command("append")
@click.argument("name")
@_target_options
@click.option("-k", "--key", default=None,
              help="Key of every record: one key stays in one partition, in order (default: none).")
@click.option("-m", "--message", "messages", multiple=True,
              help="A record's value (repeatable); without it, one record per line of standard input.")
@click.option("--header", "header_pairs", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option("-p", "--partition", type=int, default=None,
              help="Append to this partition (default: by key; without a key, one partition per batch).")
@_json_option
def stream_append(name, namespace, url, token, key, messages, header_pairs, partition, as_json):
    """Append records: -m TEXT, or one per line of standard input (sent as they are read, in batches)."""
    from ..producer import Producer

    headers = _parse_headers(header_pairs)
    key = None if key is None else key.encode()
    values = [m.encode() for m in messages] if messages else (line.rstrip(b"\n") for line in sys.stdin.buffer)
    with _connect(namespace, url, token) as broker, broker.stream(name) as s:
        with Producer(s) as producer:
            futures = [producer.send(v, key=key, headers=headers, partition=partition) for v in values]
        metas = [f.result() for f in futures]
    if as_json:
        _echo_json({"stream": name, "records": [{"partition": m.partition, "offset": m.offset,
                                                  "timestamp": m.timestamp} for m in metas]})
        return
    spans = {}
    for m in metas:
        first, last = spans.get(m.partition, (m.offset, m.offset))
        spans[m.partition] = (min(first, m.offset), max(last, m.offset))
    where = ", ".join(f"partition {p} offsets {a}..{b}" for p, (a, b) in sorted(spans.items()))
    click.echo(f"appended {len(metas)} record(s) to {name}" + (f": {where}" if where else ""))


@stream_group.command("read")
@click.argument("name")
@_target_options
@click.option("-p", "--partition", type=int, default=None, help="Read this partition (default: every one).")
@click.option("--from", "start", default="earliest", show_default=True, metavar="earliest|latest|OFFSET",
              help="Where to start: the earliest retained record, the end, or an offset (with -p).")
@click.option("-n", "count", type=click.IntRange(1), default=None, help="At most this many records.")
@click.option("--follow", is_flag=True, help="Then wait for new records until SIGINT or SIGTERM (exit 0).")
@_json_option
def stream_read(name, namespace, url, token, partition, start, count, follow, as_json):
    """Print records by offset, without a group: every partition to its current end, one after the other
    (with --follow, then the new records as they come)."""
    if start not in ("earliest", "latest"):
        if not start.isdigit():
            raise click.BadParameter(f"{start!r} is not earliest, latest or an offset", param_hint="--from")
        if partition is None:
            raise click.UsageError("--from OFFSET needs -p: offsets are per partition")
    stopped = _stop_on_signals() if follow else (lambda: False)
    with _connect(namespace, url, token) as broker, broker.stream(name) as s:
        parts = range(s.partitions) if partition is None else [partition]
        offsets = {p: s.offsets(p) for p in parts}  # also checks -p
        if start.isdigit():
            positions = {partition: int(start)}  # a read outside what is retained is an error
        else:
            positions = {p: earliest if start == "earliest" else end for p, (earliest, end) in offsets.items()}
        ends = None if follow else {p: end for p, (_earliest, end) in offsets.items()}
        printed = 0
        for record in _tail(s, positions, ends, stopped, strict=start.isdigit()):
            _print_record(record, as_json)
            printed += 1
            if printed == count:
                break


def _tail(s, positions, ends, stopped, strict):
    """Records from ``positions`` on: each partition up to ``ends`` (its end when the read
    began), one after the other; with ``ends`` None, then new records of any partition
    until ``stopped()``. A position retention has dropped since is skipped with a warning
    (unless ``strict``: the first read of a position the user gave)."""
    fresh = set(positions) if strict else set()

    def read(p, timeout=0.0):
        try:
            records = s.read(p, positions[p], max_records=READ_BATCH, timeout=timeout)
        except OffsetOutOfRange as e:
            if p in fresh or positions[p] > e.end:
                raise
            click.echo(f"shmq: warning: partition {p}: offsets {positions[p]}..{e.earliest - 1} were dropped by "
                       "retention before they were read", err=True)
            positions[p] = e.earliest
            records = s.read(p, positions[p], max_records=READ_BATCH)
        fresh.discard(p)
        if records:
            positions[p] = records[-1].offset + 1
        return records

    if ends is not None:
        for p in positions:
            while records := [r for r in read(p) if r.offset < ends[p]]:
                yield from records
        return
    parts, turn = list(positions), 0
    while not stopped():
        idle = True
        for p in parts:
            records = read(p)
            idle = idle and not records
            yield from records
        if idle and not stopped():  # every partition at its end: wait on one, in turn
            yield from read(parts[turn % len(parts)], timeout=FOLLOW_SLICE_S)
            turn += 1


def _print_record(r, as_json):
    """One record: its value as text (a tombstone's, None, as an empty line), or with
    ``as_json`` one JSON object (a tombstone's value null)."""
    if not as_json:
        click.echo("" if r.value is None else r.value.decode("utf-8", "replace"))
        return
    _echo_json({"stream": r.stream, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
                "key": None if r.key is None else r.key.decode("utf-8", "replace"),
                "key_base64": None if r.key is None else base64.b64encode(r.key).decode(),
                "headers": _jsonable(r.headers),
                "value": None if r.value is None else r.value.decode("utf-8", "replace"),
                "value_base64": None if r.value is None else base64.b64encode(r.value).decode()})


@main.group("group")
def group_group():
    """Consumer groups of a stream: list them, show their lag, move their committed offsets."""


@group_group.command("list")
@click.argument("stream")
@_target_options
@_json_option
def group_list(stream, namespace, url, token, as_json):
    """List the groups of STREAM."""
    with _connect(namespace, url, token) as broker, broker.stream(stream) as s:
        names = s.groups()
    _echo_names(names, as_json, none=f"stream {stream} has no consumer groups")


@group_group.command("lag")
@click.argument("stream")
@click.argument("group", required=False)
@_target_options
@_json_option
def group_lag(stream, group, namespace, url, token, as_json):
    """Committed offset and lag of each partition, for GROUP or every group of STREAM."""
    with _connect(namespace, url, token) as broker, broker.stream(stream) as s:
        names = s.groups()
        if group is not None:
            if group not in names:
                raise ShmqError(f"stream {stream!r} has no group {group!r}")
            names = [group]
        lags = {g: {"committed": s.committed(g), "lag": s.lag(g)} for g in names}
    if as_json:
        _echo_json(lags)
        return
    _print_table(("group", "partition", "committed", "lag"),
                 [(g, p, info["committed"].get(p, "-"), n) for g, info in lags.items() for p, n in info["lag"].items()])


@group_group.command("reset")
@click.argument("stream")
@click.argument("group")
@_target_options
@click.option("--to", "to", required=True, metavar="earliest|latest|JSON",
              help='The earliest retained offsets, the ends, or {"PARTITION": OFFSET, ...}.')
def group_reset(stream, group, namespace, url, token, to):
    """Move GROUP's committed offsets (it must have no live member; a new group is made)."""
    if to not in ("earliest", "latest"):
        try:
            to = {int(p): offset for p, offset in json.loads(to).items()}
        except (ValueError, AttributeError):
            raise click.BadParameter(f"{to!r} is not earliest, latest or a JSON object "
                                     '{"PARTITION": OFFSET, ...}', param_hint="--to") from None
    with _connect(namespace, url, token) as broker, broker.stream(stream) as s:
        s.reset(group, to=to)
        committed = s.committed(group)
    click.echo(f"group {group} of {stream} committed: " + " ".join(f"{p}:{o}" for p, o in sorted(committed.items())))
