"""The ``shmq`` command line (click). Errors print one line on stderr, never a traceback."""

import asyncio
import base64
import json
import logging
import os
import sys

import click

from . import __version__
from .auth import command_line_warning
from .engine.broker import Broker, default_namespace
from .errors import OffsetOutOfRange, QueueEmpty, ShmqError
from .spark.staging import staged_by_writer


class _Cli(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (ShmqError, ValueError, TypeError, OSError) as e:
            click.echo(f"shmq: error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Cli)
@click.version_option(__version__, prog_name="shmq")
def main():
    """shmq: a message broker for processes on one host."""


def _namespace_option(f):
    return click.option(
        "--namespace", default=default_namespace, show_default="$SHMQ_NAMESPACE or shmq",
        help="Registry of queues to use.",
    )(f)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=7878, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0: any free).")
@_namespace_option
@click.option("--token", envvar="SHMQ_TOKEN", default=None,
              help="Require this token in HELLO. Prefer $SHMQ_TOKEN or --token-file: a command line is readable "
                   "by every user.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="Require the token in this file (0600; created with a new token if missing). "
                   "Default: $SHMQ_HOME/token (~/.local/state/shmq/token).")
@click.option("--no-auth", is_flag=True, help="Require no token: every local user can use the queues over TCP.")
@click.option("--max-frame-bytes", default=16 * 2**20, show_default=True, type=click.IntRange(1024, 2**31),
              help="Largest frame accepted from a client.")
@click.option("--max-connections", type=click.IntRange(1), default=None,
              help="Open connections at most; more get LIMIT_EXCEEDED and are closed. [default: 1024]")
@click.option("--max-waiting-per-connection", type=click.IntRange(1), default=None,
              help="Waiting CONSUMEs per connection; more get LIMIT_EXCEEDED. [default: 256]")
@click.option("--max-subscriptions-per-connection", type=click.IntRange(1), default=None,
              help="SUBSCRIBEs (consume with prefetch) open at once per connection; more get LIMIT_EXCEEDED. "
                   "[default: 64]")
@click.option("--max-prefetch", type=click.IntRange(1), default=None,
              help="Largest prefetch a SUBSCRIBE may ask for; more gets BAD_REQUEST. [default: 10000]")
@click.option("--max-buffered-bytes", type=click.IntRange(1024), default=None,
              help="Bytes of unfinished big frames held across all connections; beyond, readers wait. "
                   "At least --max-frame-bytes + 16. [default: 64 MiB]")
@click.option("--frame-timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds a frame may take from its first byte to its last; then the connection closes. "
                   "[default: 30]")
@click.option("--idle-timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds a connection may stay without a request or a waiting CONSUME. [default: 300]")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Snapshot durable queues and streams here; rebuild lost ones from it on start. "
                   "[default: $SHMQ_HOME/data/NAMESPACE if $SHMQ_HOME is set, else $XDG_DATA_HOME/shmq/NAMESPACE, "
                   "else ~/.local/share/shmq/NAMESPACE]")
@click.option("--no-persist", is_flag=True,
              help="No data dir: queues and streams live in shared memory only (a reboot loses them).")
@click.option("--snapshot-interval", type=click.FloatRange(0.01), default=1.0, show_default=True,
              help="Seconds between snapshots.")
@click.option("--fsync", default="batch:2", show_default=True, metavar="always|batch:MS|never",
              help="When write-ahead logs of 'wal' queues are fsynced.")
@click.option("--metrics", "metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT binds 127.0.0.1; "
                   "docs/METRICS.md). [default: off]")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]),
              show_default=True)
@click.option("--log-format", default="text", type=click.Choice(["text", "json"]), show_default=True,
              help="One line per event, with its fields: TIME shmq LEVEL message k=v..., or a JSON object.")
def server(host, port, namespace, token, token_file, no_auth, max_frame_bytes, data_dir, no_persist,
           snapshot_interval, fsync, log_level, log_format, metrics, **limits):
    """Run the broker: serve TCP clients, hold the namespace's registry, do housekeeping.

    Clients must present a token, by default one generated at the first start into
    $SHMQ_HOME/token; your own clients on this host find it by themselves.
    Stops on SIGINT/SIGTERM (answering what is in flight) and exits 0; queues stay in
    shared memory for the next start. Durable queues and streams are snapshotted to the
    data dir (--data-dir, by default one per namespace in your data directory; none with
    --no-persist) and rebuilt from it after a reboot. One broker per namespace: a second
    one refuses to start.
    """
    from .auth import default_data_dir
    from .logs import configure as configure_logs

    configure_logs(log_level, log_format)
    if no_persist and data_dir is not None:
        raise click.UsageError("--data-dir and --no-persist exclude each other")
    if data_dir is None and not no_persist:
        data_dir = default_data_dir(namespace)
    from .server.main import parse_fsync, serve
    from .server.metrics import parse_address
    from .server.tcp import Limits

    parse_fsync(fsync)  # a bad policy is an error before anything starts
    metrics = parse_address(metrics) if metrics is not None else None  # so is a bad --metrics
    limits = Limits(**{k: v for k, v in limits.items() if v is not None})  # the options left out: defaults
    if token is not None and not _on_command_line("token") and (token_file or no_auth):
        token = None  # --token-file and --no-auth win over $SHMQ_TOKEN
    if token is not None and _on_command_line("token"):
        logging.getLogger("shmq.server").warning(command_line_warning(os.getpid()))
    asyncio.run(serve(namespace, host, port, token, max_frame_bytes, data_dir=data_dir,
                      snapshot_interval=snapshot_interval, fsync=fsync, token_file=token_file, no_auth=no_auth,
                      limits=limits, metrics=metrics))


def _on_command_line(param) -> bool:
    """Whether the current command got ``param`` on its command line (not from the environment)."""
    return click.get_current_context().get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE


def _target_options(f):
    """--namespace for local attach, --url/--token for a remote broker."""
    f = click.option("--token", envvar="SHMQ_TOKEN", default=None,
                     help="Token for a remote broker (prefer $SHMQ_TOKEN; default: your own server's on this host, "
                          "found in $SHMQ_HOME/run).")(f)
    f = click.option("--url", envvar="SHMQ_URL", default=None,
                     help="Remote broker tcp://host:port ($SHMQ_URL); local attach when absent.")(f)
    return _namespace_option(f)


def _connect(namespace, url, token):
    if token is not None and _on_command_line("token"):
        click.echo(f"shmq: warning: {command_line_warning(os.getpid(), '$SHMQ_TOKEN')}", err=True)
    elif token is not None:
        token = None  # from $SHMQ_TOKEN: the client reads it itself (and names it if refused)
    if url:
        from .client.remote import RemoteBroker

        return RemoteBroker(url, token=token)
    return Broker(namespace)


def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)


def _echo_json(value):
    click.echo(json.dumps(value, sort_keys=True))


def _echo_names(names, as_json):
    if as_json:
        _echo_json(names)
    else:
        for name in names:
            click.echo(name)


@main.command("list")
@_target_options
@_json_option
def list_(namespace, url, token, as_json):
    """List the queues."""
    with _connect(namespace, url, token) as broker:
        names = broker.list_queues()
    _echo_names(names, as_json)


@main.command()
@click.argument("name")
@_target_options
@click.option("--max-bytes", type=click.IntRange(4096), default=64 * 2**20, show_default=True,
              help="Ring size: bytes of records the queue holds.")
@click.option("--max-message-bytes", type=click.IntRange(1), default=None, help="Largest body (default 1 MiB).")
@click.option("--visibility-timeout", type=click.FloatRange(0, min_open=True), default=30.0, show_default=True,
              help="Seconds a delivery stays leased.")
@click.option("--max-deliveries", type=click.IntRange(1), default=None, help="Dead-letter after this many deliveries.")
@click.option("--dead-letter-queue", default=None, help="Queue that receives rejected messages.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the queue exists.")
@click.option("--durability", type=click.Choice(["memory", "snapshot", "wal"]), default="snapshot",
              show_default=True,
              help="memory: never on disk; snapshot: saved by a server with --data-dir; wal: also logged.")
@click.option("--priorities", type=int, default=None, help="Priority levels, 0 (lowest) .. N-1. [default: 1]")
@click.option("--message-ttl", type=float, default=None,
              help="Seconds a message may wait to be delivered; then it is dropped (dead-lettered if the queue has "
                   "a dead-letter queue). [default: none]")
@click.option("--dedup-window", type=float, default=None,
              help="Seconds a put's --dedup-id is remembered: a second put with it is dropped. [default: 300]")
@click.option("--retry-delay", type=float, default=None,
              help="Seconds before a message nacked without a delay is ready again. [default: 0]")
@click.option("--retry-backoff", type=float, default=None,
              help="Factor by which the retry delay grows with each attempt. [default: 1]")
@click.option("--retry-delay-max", type=float, default=None, help="Most seconds of a retry delay. [default: none]")
@click.option("--priority-aging", type=float, default=None,
              help="Seconds after which a waiting message is served as one level higher, so no level starves; "
                   "0: strict priorities. [default: 60]")
def create(name, namespace, url, token, max_bytes, max_message_bytes, visibility_timeout, max_deliveries,
           dead_letter_queue, exist_ok, durability, **options):
    """Create a queue."""
    kwargs = {} if durability == "snapshot" else {"durability": durability}
    kwargs.update((k, v) for k, v in options.items() if v is not None)  # the others: the broker's defaults
    if kwargs.get("priority_aging") == 0:
        kwargs["priority_aging"] = None  # strict
    with _connect(namespace, url, token) as broker:
        broker.create_queue(name, max_bytes=max_bytes, max_message_bytes=max_message_bytes,
                            visibility_timeout=visibility_timeout, max_deliveries=max_deliveries,
                            dead_letter_queue=dead_letter_queue, exist_ok=exist_ok, **kwargs).close()
    click.echo(f"created {name}")


@main.command()
@click.argument("name")
@_target_options
def delete(name, namespace, url, token):
    """Delete a queue and every message in it."""
    with _connect(namespace, url, token) as broker:
        broker.delete_queue(name)
    click.echo(f"deleted {name}")


@main.command()
@click.argument("name")
@_target_options
def purge(name, namespace, url, token):
    """Drop every ready message of a queue."""
    with _connect(namespace, url, token) as broker:
        n = broker.queue(name).purge()
    click.echo(f"purged {n} message(s) from {name}")


@main.command()
@click.argument("name", required=False)
@_target_options
@_json_option
def stats(name, namespace, url, token, as_json):
    """Counters of the queues and streams, or of the queue and/or stream NAME."""
    from . import views  # rich: only for the commands that draw tables

    with _connect(namespace, url, token) as broker:
        queues, streams = broker.list_queues(), broker.list_streams()
        if name:
            queues, streams = [n for n in queues if n == name], [n for n in streams if n == name]
            if not queues and not streams:
                raise ShmqError(f"no queue or stream {name!r}")
        with views.Sampler(broker) as sampler:
            sample = sampler.sample(queues, streams=())  # and their dead-letter queues' depths
        stream_stats = _streams_stats(broker, streams, broker.list_streams())
    if as_json:
        _echo_json({"queues": {n: {f: getattr(s, f) for f in s.__dataclass_fields__}
                               for n, s in sample.queues.items()},
                    "streams": stream_stats})
        return
    views.console().print(views.stats_view(sample, stream_stats))


@main.command()
@_target_options
@click.option("--sort", type=click.Choice(["depth", "age", "dlq", "rate", "name"]), default="depth",
              show_default=True, help="Order of the queues: ready messages, oldest message's age, dead-letter "
                                      "queue's depth, puts + acks per second, or name.")
@click.option("--interval", type=click.FloatRange(0.05, 3600), default=1.0, show_default=True,
              help="Seconds between samples (the rates are over one interval).")
@click.option("--once", is_flag=True, help="Sample twice, --interval apart, print one frame and exit.")
def top(namespace, url, token, sort, interval, once):
    """A live view of every queue and stream: depth, in flight, oldest age, dead-letter depth,
    put/ack rates, each group's lag. q or Ctrl-C quits."""
    from . import views  # rich: only for the commands that draw tables

    with _connect(namespace, url, token) as broker:
        views.run_top(broker, url or f"namespace {namespace}", sort=sort, interval=interval, once=once)


def _print_table(header, rows, left=1):
    """Aligned columns: the first ``left`` ones to the left, the others (numbers) to the right."""
    table = [header] + [tuple(_cell(v) for v in row) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))))


def _cell(value):
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _parse_headers(pairs):
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--header")
        headers[key] = value
    return headers or None


@main.command()
@click.argument("name")
@_target_options
@click.option("-m", "--message", "messages", multiple=True, help="A message body (repeatable).")
@click.option("--file", "file", type=click.File("rb"), default=None, help="One message: the whole file.")
@click.option("--header", "header_pairs", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option("--timeout", type=click.FloatRange(0), default=None, help="Seconds to wait while the queue is full.")
@click.option("--priority", type=int, default=0, show_default=True, help="Priority level (higher: delivered first).")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before they are ready.")
@click.option("--ttl", type=float, default=None, help="Seconds they may wait to be delivered; then dropped.")
@click.option("--group", default=None, help="Message group: one message of a group is in flight at a time.")
@click.option("--dedup-id", default=None,
              help="Deduplication id (one message): dropped if one with this id was put within the dedup window.")
@_json_option
def produce(name, namespace, url, token, messages, file, header_pairs, timeout, priority, delay, ttl, group, dedup_id,
            as_json):
    """Put messages: -m TEXT, --file F, or one per line of standard input."""
    headers = _parse_headers(header_pairs)
    if messages and file:
        raise click.UsageError("give -m or --file, not both")
    if messages:
        bodies = [m.encode() for m in messages]
    elif file is not None:
        bodies = [file.read()]
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    if dedup_id is not None and len(bodies) != 1:
        raise ShmqError(f"--dedup-id names one message, not {len(bodies)}")
    options = {"priority": priority, "delay": delay, "ttl": ttl}
    with _connect(namespace, url, token) as broker:
        q = broker.queue(name)
        if group is None and dedup_id is None:
            ids = q.put_many([(b, headers) for b in bodies], timeout=timeout, **options) if bodies else []
        else:  # put_many takes neither: one put each
            ids = [q.put(b, headers, timeout=timeout, group=group, dedup_id=dedup_id, **options) for b in bodies]
    if as_json:
        _echo_json({"queue": name, "ids": ids})
    else:
        click.echo(f"produced {len(ids)} message(s) to {name}" + (f": ids {ids[0]}..{ids[-1]}" if ids else ""))


@main.command()
@click.argument("name")
@_target_options
@click.option("-n", "count", type=click.IntRange(1), default=1, show_default=True, help="At most this many.")
@click.option("--wait", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds to wait for the first message.")
@click.option("--no-ack", "mode", flag_value="no-ack", help="Leave them leased (they come back when it lapses).")
@click.option("--requeue", "mode", flag_value="requeue", help="Put them back (nack) after printing.")
@_json_option
def consume(name, namespace, url, token, count, wait, mode, as_json):
    """Get messages, print them, and ack them (unless --no-ack or --requeue)."""
    got = []
    with _connect(namespace, url, token) as broker:
        q = broker.queue(name)
        while len(got) < count:
            try:
                got += q.get_many(count - len(got), timeout=wait if not got else 0)
            except QueueEmpty:
                break
        for d in got:
            if as_json:
                _echo_json({"queue": name, "id": d.id, "attempt": d.attempt, "headers": _jsonable(d.headers),
                            "body": d.body.decode("utf-8", "replace"),
                            "body_base64": base64.b64encode(d.body).decode()})
            else:
                click.echo(d.body.decode("utf-8", "replace"))
        if mode == "requeue":
            for d in got:
                d.nack()
        elif mode != "no-ack" and got:
            q.ack_many(got)


@main.command()
@click.argument("name")
@_target_options
@click.option("-n", "count", type=int, default=10, show_default=True, help="At most this many.")
@_json_option
def peek(name, namespace, url, token, count, as_json):
    """Print the next ready messages without taking them (no lease, no attempt counted)."""
    with _connect(namespace, url, token) as broker:
        messages = broker.queue(name).peek(count)
    for m in messages:
        if as_json:
            _echo_json({"queue": name, "id": m.id, "attempt": m.attempt, "priority": m.priority,
                        "enqueued_at": m.enqueued_at, "group": m.group, "headers": _jsonable(m.headers),
                        "body": m.body.decode("utf-8", "replace"), "body_base64": base64.b64encode(m.body).decode()})
        else:
            click.echo(m.body.decode("utf-8", "replace"))


@main.command()
@click.argument("dlq")
@_target_options
@click.option("--to", default=None, help="Queue to move them to (default: each to the queue it was dead-lettered "
                                         "from).")
@click.option("-n", "count", type=int, default=None, help="At most this many (default: all).")
@_json_option
def redrive(dlq, namespace, url, token, to, count, as_json):
    """Move the messages of dead-letter queue DLQ back to be delivered again."""
    with _connect(namespace, url, token) as broker:
        n = broker.redrive(dlq, to=to, max_messages=count)
    if as_json:
        _echo_json({"queue": dlq, "redriven": n})
    else:
        click.echo(f"redrove {n} message(s) from {dlq}" + (f" to {to}" if to else ""))


# ---------------------------------------------------------------- streams (docs/STREAMS.md)
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
@click.option("--partitions", type=int, default=4, show_default=True, help="Partitions (at most 256).")
@click.option("--max-bytes", type=int, default=64 * 2**20, show_default=True,
              help="Each partition's ring in shared memory: the newest records it keeps.")
@click.option("--max-message-bytes", type=int, default=2**20, show_default=True,
              help="Largest record: key, headers and value.")
@click.option("--retention", type=click.Choice(["drop", "block"]), default="drop", show_default=True,
              help="When a partition is full: drop its oldest records, or make appends wait for the slowest group.")
@click.option("--retention-bytes", type=int, default=None, help="Bound of a wal stream's logs on disk.")
@click.option("--retention-seconds", type=float, default=None, help="Age bound of a wal stream's logs on disk.")
@click.option("--group-idle-timeout", type=float, default=300.0, show_default=True,
              help="Seconds after which a group without live members stops holding back --retention block.")
@click.option("--durability", type=click.Choice(["memory", "snapshot", "wal"]), default="snapshot",
              show_default=True)
@click.option("--exist-ok", is_flag=True, help="Succeed if the stream exists.")
def stream_create(name, namespace, url, token, **options):
    """Create a stream."""
    with _connect(namespace, url, token) as broker, broker.create_stream(name, **options) as s:
        partitions = s.partitions
    click.echo(f"created stream {name} ({partitions} partitions)")


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
        from . import views

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
    from .producer import Producer

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


def _stop_on_signals():
    """Make SIGINT and SIGTERM end --follow cleanly (at its next slice); returns a check."""
    import signal

    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    return lambda: bool(stop)


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
    if not as_json:
        click.echo(r.value.decode("utf-8", "replace"))
        return
    _echo_json({"stream": r.stream, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
                "key": None if r.key is None else r.key.decode("utf-8", "replace"),
                "key_base64": None if r.key is None else base64.b64encode(r.key).decode(),
                "headers": _jsonable(r.headers), "value": r.value.decode("utf-8", "replace"),
                "value_base64": base64.b64encode(r.value).decode()})


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
    _echo_names(names, as_json)


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


@main.command()
@click.argument("name", required=False)
@_namespace_option
@click.option("--data-dir", type=click.Path(file_okay=False), required=True, envvar="SHMQ_DATA_DIR",
              help="Where the .dmsq files go ($SHMQ_DATA_DIR).")
def snapshot(name, namespace, data_dir):
    """Snapshot one queue (or every durable one) to .dmsq files now."""
    from .persistence import Snapshotter, snapshot_queue

    with Broker(namespace) as broker:
        if name:
            os.makedirs(data_dir, mode=0o700, exist_ok=True)
            q = broker.queue(name)
            try:
                path, n = snapshot_queue(q, data_dir)
            finally:
                q.close()
            click.echo(f"snapshot of {name}: {n} message(s) in {path}")
        else:
            n = Snapshotter(broker, data_dir).run_once()
            click.echo(f"{n} queue(s) snapshotted into {data_dir}")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_json_option
def inspect(file, as_json):
    """Show a .dmsq file's header and a summary of its records."""
    from .dmsq import summary

    info = summary(file)
    if as_json:
        _echo_json(info)
        return
    for key, value in info.items():
        click.echo(f"{key:18s} {value}")


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_namespace_option
@click.option("--into", default=None, help="Queue to load into (default: the one it was taken from).")
def restore(file, namespace, into):
    """Load a .dmsq file into a queue (created with the file's settings if needed)."""
    from .persistence import restore_file

    with Broker(namespace) as broker:
        name, n, error = restore_file(broker, file, into)
    if error and not name:
        raise ShmqError(error)
    click.echo(f"restored {n} message(s) into {name}")
    if error:
        click.echo(f"shmq: warning: {error}", err=True)


@main.command()
@click.option("--clean", is_flag=True, help="Remove what is provably orphaned (nothing else).")
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="Only this namespace (repeatable). Default: every namespace of yours.")
@_json_option
def doctor(clean, namespaces, as_json):
    """Check this host: /dev/shm's size and free space, your namespaces and their brokers,
    orphaned segments, data directories and their disk space."""
    from . import doctor as doc

    report = doc.diagnose(namespaces, remove=clean)
    if as_json:
        _echo_json(report)
    else:
        for line in doc.render(report):
            click.echo(line)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args):
    """Run the benchmark matrix (``python -m bench``; needs a shmq checkout). ARGS go
    to it, e.g. ``shmq bench --quick``."""
    import subprocess

    if not os.path.exists(os.path.join("bench", "__main__.py")):
        raise ShmqError("shmq bench runs the bench/ folder of a shmq checkout: cd into one first")
    sys.exit(subprocess.call([sys.executable, "-m", "bench", *args]))


def _jsonable(headers):
    return {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in headers.items()}


# ---------------------------------------------------------------- exchanges
@main.group()
def exchange():
    """Exchanges: route published messages to bound queues and streams."""


@exchange.command("create")
@click.argument("name")
@_target_options
@click.option("--type", "type_", type=click.Choice(["fanout", "topic"]), default="fanout", show_default=True,
              help="fanout: every bound target; topic: those whose pattern matches the routing key.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the exchange exists (of this type).")
def exchange_create(name, namespace, url, token, type_, exist_ok):
    """Create an exchange."""
    with _connect(namespace, url, token) as broker:
        broker.create_exchange(name, type=type_, exist_ok=exist_ok)


@exchange.command("delete")
@click.argument("name")
@_target_options
def exchange_delete(name, namespace, url, token):
    """Delete an exchange and its bindings."""
    with _connect(namespace, url, token) as broker:
        broker.delete_exchange(name)


@exchange.command("bind")
@click.argument("name")
@click.argument("target")
@_target_options
@click.option("--pattern", default="#", show_default=True,
              help='Topic pattern: words split on ".", * one word, # zero or more.')
def exchange_bind(name, target, namespace, url, token, pattern):
    """Bind the queue or stream TARGET to the exchange NAME."""
    with _connect(namespace, url, token) as broker:
        broker.bind(name, target, pattern=pattern)


@exchange.command("unbind")
@click.argument("name")
@click.argument("target")
@_target_options
@click.option("--pattern", default=None, help="Only the binding of this pattern (default: all of TARGET's).")
def exchange_unbind(name, target, namespace, url, token, pattern):
    """Drop the bindings of TARGET to the exchange NAME."""
    with _connect(namespace, url, token) as broker:
        n = broker.unbind(name, target, pattern=pattern)
    click.echo(f"{n} binding(s) removed")


@exchange.command("list")
@_target_options
@_json_option
def exchange_list(namespace, url, token, as_json):
    """List the exchanges, their types and bindings."""
    with _connect(namespace, url, token) as broker:
        infos = [broker.exchange_info(name) for name in broker.list_exchanges()]
    if as_json:
        _echo_json(infos)
        return
    for x in infos:
        binds = ", ".join(f"{b['kind']} {b['target']}" + (f" ({b['pattern']})" if x["type"] == "topic" else "")
                          for b in x["bindings"])
        click.echo(f"{x['name']}\t{x['type']}\t{binds or '-'}")


@exchange.command("publish")
@click.argument("name")
@_target_options
@click.option("-m", "--message", "messages", multiple=True, help="A message body (repeatable).")
@click.option("--routing-key", "-k", default="", help="The routing key (topic exchanges).")
@click.option("--header", "header_pairs", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option("--dedup-id", default=None, help="Make a retry safe: queues that have this id drop the repeat.")
def exchange_publish(name, namespace, url, token, messages, routing_key, header_pairs, dedup_id):
    """Publish messages to the exchange NAME; prints how many targets got each."""
    if not messages:
        raise click.UsageError("give at least one -m/--message")
    if dedup_id is not None and len(messages) > 1:
        raise click.UsageError("--dedup-id names one message: give one -m")
    headers = _parse_headers(header_pairs) or None
    with _connect(namespace, url, token) as broker:
        for body in messages:
            click.echo(broker.publish(name, body.encode(), routing_key=routing_key, headers=headers,
                                      dedup_id=dedup_id))


if __name__ == "__main__":
    main()
