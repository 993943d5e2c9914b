"""The queue commands: list, create, delete, purge, stats, top, produce, consume, peek, redrive."""

import base64
import sys

import click

from ..errors import QueueEmpty, ShmqError
from .app import (
    _connect, _echo_json, _echo_names, _json_option, _jsonable, _parse_headers, _target_options, main,
)
from .streams import _streams_stats


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
    from .. import views  # rich: only for the commands that draw tables

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
    from .. import views  # rich: only for the commands that draw tables

    with _connect(namespace, url, token) as broker:
        views.run_top(broker, url or f"namespace {namespace}", sort=sort, interval=interval, once=once)


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
