"""The queue commands: list, create, delete, purge, stats, top, produce, consume, peek, redrive; and
``queue set`` (a live queue's settings)."""

import base64
import json
import os
import sys
import time

import click

from ..errors import MessageTooLarge, QueueEmpty, QueueExists, QueueNotFound, SettingsMismatch, ShmqError
from .app import (
    EXIT_EMPTY, Size, shown, _connect, _created, _echo_json, _echo_names, _echo_set, _json_option, _jsonable,
    _on_command_line, _parse_headers, _stop_on_signals, _target_options, main,
)
from ..model.settings import QUEUE, QUEUE_TABLE
from .framing import TERMINATORS, Batches
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
@click.option("--max-bytes", type=Size(min=4096), default=shown(QUEUE.max_bytes), show_default=True,
              help="Ring size: bytes of records the queue holds (65536, 64KiB, 64MiB, 1GiB; KB, MB, GB: powers "
                   "of 1000).")
@click.option("--max-message-bytes", type=Size(min=1), default=None, help="Largest body (a size). [default: 1MiB]")
@click.option("--visibility-timeout", type=click.FloatRange(0, min_open=True), default=QUEUE.visibility_timeout,
              show_default=True, help="Seconds a delivery stays leased.")
@click.option("--max-deliveries", type=click.IntRange(1), default=None, help="Dead-letter after this many deliveries.")
@click.option("--dead-letter-queue", default=None, help="Queue that receives rejected messages.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the queue exists.")
@click.option("--durability", type=click.Choice(["memory", "snapshot", "wal"]), default=QUEUE.durability,
              show_default=True,
              help="memory: never on disk; snapshot: saved by a server with --data-dir; wal: also logged.")
@click.option("--priorities", type=int, default=None, help=f"Priority levels, 0 (lowest) .. N-1. [default: {shown(QUEUE.priorities)}]")
@click.option("--message-ttl", type=float, default=None,
              help="Seconds a message may wait to be delivered; then it is dropped (dead-lettered if the queue has "
                   f"a dead-letter queue). [default: {shown(QUEUE.message_ttl)}]")
@click.option("--dedup-window", type=float, default=None,
              help="Seconds a put's --dedup-id is remembered: a second put with it is dropped. "
                   f"[default: {shown(QUEUE.dedup_window)}]")
@click.option("--retry-delay", type=float, default=None,
              help=f"Seconds before a message nacked without a delay is ready again. [default: {shown(QUEUE.retry_delay)}]")
@click.option("--retry-backoff", type=float, default=None,
              help=f"Factor by which the retry delay grows with each attempt. [default: {shown(QUEUE.retry_backoff)}]")
@click.option("--retry-delay-max", type=float, default=None, help=f"Most seconds of a retry delay. [default: {shown(QUEUE.retry_delay_max)}]")
@click.option("--priority-aging", type=float, default=None,
              help="Seconds after which a waiting message is served as one level higher, so no level starves; "
                   f"0: strict priorities. [default: {shown(QUEUE.priority_aging)}]")
@click.option("--lanes", type=click.IntRange(1), default=None,
              help="Rings with a lock each, for many producers and consumers on many cores; FIFO per lane. "
                   f"[default: {shown(QUEUE.lanes)}]")
@click.option("--auto-delete", is_flag=True, default=None,
              help="Delete the queue when its last consumer goes (one that never had a consumer stays).")
@click.option("--expires", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds without a consumer, a declare or a get after which the queue is deleted. [default: never]")
@_json_option
def create(name, namespace, url, token, max_bytes, max_message_bytes, visibility_timeout, max_deliveries,
           dead_letter_queue, exist_ok, durability, as_json, **options):
    """Create a queue. With --exist-ok a queue of that name is taken as it is if it has the
    settings given (it says "exists", not "created"), else refused naming each that differs."""
    kwargs = {} if durability == "snapshot" else {"durability": durability}
    kwargs.update((k, v) for k, v in options.items() if v is not None)  # the others: the broker's defaults
    if kwargs.get("priority_aging") == 0:
        kwargs["priority_aging"] = None  # strict
    kwargs.update(max_bytes=max_bytes, max_message_bytes=max_message_bytes, visibility_timeout=visibility_timeout,
                  max_deliveries=max_deliveries, dead_letter_queue=dead_letter_queue)
    with _connect(namespace, url, token, create=True) as broker:
        created = _created(lambda ok: broker.create_queue(name, exist_ok=ok, **kwargs).close(), exist_ok, QueueExists)
    if as_json:
        _echo_json({"queue": name, "created": created})
    else:
        click.echo(f"created {name}" if created else f"queue {name} exists (settings match)")



@main.group("queue")
def queue_group():
    """A queue's settings."""


_NONE_IF_ZERO = tuple(s.name for s in QUEUE_TABLE if s.clearable and s.wire != "str")  # 0 here: none ("": a name's)


@queue_group.command("set")
@click.argument("name")
@_target_options
@click.option("--visibility-timeout", type=float, default=None, help="Seconds a delivery stays leased.")
@click.option("--max-deliveries", type=int, default=None, help="Dead-letter after this many deliveries; 0: never.")
@click.option("--dead-letter-queue", default=None, help="Queue that receives rejected messages; \"\": none.")
@click.option("--message-ttl", type=float, default=None, help="Seconds a message may wait to be delivered; 0: for ever.")
@click.option("--dedup-window", type=float, default=None, help="Seconds a put's --dedup-id is remembered.")
@click.option("--retry-delay", type=float, default=None, help="Seconds before a nacked message is ready again.")
@click.option("--retry-backoff", type=float, default=None, help="Factor by which the retry delay grows per attempt.")
@click.option("--retry-delay-max", type=float, default=None, help="Most seconds of a retry delay; 0: no bound.")
@click.option("--priority-aging", type=float, default=None,
              help="Seconds after which a waiting message is served as one level higher; 0: strict priorities.")
@click.option("--expires", type=float, default=None,
              help="Seconds without a consumer, a declare or a get after which the queue is deleted; 0: never.")
@click.option("--max-bytes", type=Size(min=4096), default=None, help="Cannot change: accepted when it is the queue's.")
@click.option("--max-message-bytes", type=Size(min=1), default=None,
              help="Cannot change: accepted when it is the queue's.")
@click.option("--priorities", type=int, default=None, help="Cannot change: accepted when it is the queue's.")
@click.option("--lanes", type=int, default=None, help="Cannot change: accepted when it is the queue's.")
@click.option("--durability", type=click.Choice(["memory", "snapshot", "wal"]), default=None,
              help="Cannot change: accepted when it is the queue's.")
@_json_option
def queue_set(name, namespace, url, token, as_json, **options):
    """Change settings of a live queue (docs/QUEUES.md, "Changing a live queue"); the others
    stay as they are. An unknown queue, a setting that cannot change, a bad value: one line,
    exit 2."""
    settings = {k: v for k, v in options.items() if v is not None}
    if not settings:
        raise click.UsageError("nothing to set: give at least one setting (--visibility-timeout, ...)")
    for k in _NONE_IF_ZERO:
        if settings.get(k) == 0:
            settings[k] = None
    if settings.get("dead_letter_queue") == "":
        settings["dead_letter_queue"] = None
    try:
        with _connect(namespace, url, token) as broker:
            after = broker.update_queue(name, **settings)
    except (QueueNotFound, SettingsMismatch, ValueError, TypeError) as e:
        raise click.UsageError(str(e).splitlines()[0]) from None
    _echo_set(name, settings, after, as_json)


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
@click.option("--delayed", is_flag=True, help="Drop the delayed messages (not due yet) too.")
def purge(name, namespace, url, token, delayed):
    """Drop every ready message of a queue (with --delayed, the delayed ones too); the
    messages in flight stay with their consumers."""
    with _connect(namespace, url, token) as broker:
        n = broker.queue(name).purge(delayed=delayed)
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
    unreadable = [n for n in queues if n not in sample.queues]  # listed, but its memory is gone (or going)
    if as_json:
        _echo_json({"queues": {n: {f: getattr(s, f) for f in s.__dataclass_fields__}
                               for n, s in sample.queues.items()},
                    "streams": stream_stats})
    elif sample.queues or stream_stats or not unreadable:
        views.console().print(views.stats_view(sample, stream_stats))
    if unreadable:
        raise ShmqError(f"queue {unreadable[0]!r} is listed but cannot be read: its shared memory is gone (half "
                        f"removed{f'; and {len(unreadable) - 1} more' if len(unreadable) > 1 else ''}): "
                        "`shmq doctor` says what is left of it")


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
@click.option("-0", "--null", "framing", flag_value="nul",
              help="Standard input holds NUL-terminated bodies (as find -print0 writes), not lines.")
@click.option("--raw", "framing", flag_value="raw", help="Standard input is one body, read to its end as it is.")
@click.option("--header", "header_pairs", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option("--timeout", type=click.FloatRange(0), default=None,
              help="Seconds a put may wait while the queue is full. [default: as long as it takes]")
@click.option("--priority", type=int, default=0, show_default=True, help="Priority level (higher: delivered first).")
@click.option("--delay", type=float, default=0.0, show_default=True, help="Seconds before they are ready.")
@click.option("--ttl", type=float, default=None, help="Seconds they may wait to be delivered; then dropped.")
@click.option("--group", default=None, help="Message group: one message of a group is in flight at a time.")
@click.option("--dedup-id", default=None,
              help="Deduplication id (one message): dropped if one with this id was put within the dedup window.")
@_json_option
def produce(name, namespace, url, token, messages, file, framing, header_pairs, timeout, priority, delay, ttl, group,
            dedup_id, as_json):
    """Put messages: -m TEXT, --file F, or standard input, one message per line (-0:
    NUL-terminated; --raw: all of it, one message).

    Standard input is put as it is read, in batches of up to 64 KiB or 1024 messages or
    what came within 50 ms; a full queue makes it wait for room. SIGINT or SIGTERM stops
    the reading: what was read is still put (an unterminated last line is not; a
    warning says so), then it exits 0."""
    headers = _parse_headers(header_pairs)
    if messages and file:
        raise click.UsageError("give -m or --file, not both")
    if framing and (messages or file):
        raise click.UsageError(f"--{'raw' if framing == 'raw' else 'null'} reads standard input: "
                               "not with -m or --file")
    reader = None
    with _connect(namespace, url, token) as broker:
        q = broker.queue(name)  # a typo fails before anything is read
        if messages:
            batches = [[m.encode() for m in messages]]
        elif file is not None:
            batches = [[file.read()]]
        elif framing == "raw":
            batches = [[sys.stdin.buffer.read()]]
        else:
            reader = batches = Batches(sys.stdin.fileno(), b"\0" if framing == "nul" else b"\n", _stop_on_signals())
        if dedup_id is not None:  # one message: read it all before putting anything
            batches = [[body for batch in batches for body in batch]]
            if len(batches[0]) != 1:
                raise ShmqError(f"--dedup-id names one message, not {len(batches[0])}")
        ids = []
        put = _Putter(q, ids, headers, timeout, group, dedup_id, priority=priority, delay=delay, ttl=ttl)
        for batch in batches:
            put(batch)
    if reader is not None and reader.unterminated:
        click.echo(f"shmq: warning: stopped: the last {reader.unterminated} byte(s) read had no terminator yet and "
                   "were not put", err=True)
    if as_json:
        _echo_json({"queue": name, "ids": ids})
    else:
        click.echo(f"produced {len(ids)} message(s) to {name}" + (f": ids {ids[0]}..{ids[-1]}" if ids else ""))


class _Putter:
    """Puts batches of bodies in order, appending their ids to ``ids``: one put_many each
    (all or nothing), or one put each with a group or a dedup id (put_many takes
    neither). A batch too large for the queue's ring is put in halves. An error names
    the first message not put and how many were put before it."""

    def __init__(self, q, ids, headers, timeout, group, dedup_id, **options):
        self.q, self.ids, self.headers, self.timeout = q, ids, headers, timeout
        self.group, self.dedup_id, self.options = group, dedup_id, options

    def __call__(self, batch):
        if self.group is not None or self.dedup_id is not None:
            for body in batch:
                self._put([body], lambda: [self.q.put(body, self.headers, timeout=self.timeout, group=self.group,
                                                      dedup_id=self.dedup_id, **self.options)])
            return
        try:
            self._put(batch, lambda: self.q.put_many(batch, timeout=self.timeout, headers=self.headers,
                                                     **self.options))
        except MessageTooLarge:  # a batch of several: all or nothing, so neither half is in the queue yet
            half = len(batch) // 2
            self(batch[:half])
            self(batch[half:])

    def _put(self, batch, put):
        try:
            self.ids += put()
        except ShmqError as e:
            if isinstance(e, MessageTooLarge) and len(batch) > 1:
                raise  # the caller halves the batch
            done = len(self.ids)
            if len(batch) == 1:
                raise ShmqError(f"message {done + 1} not put: {e} ({done} message(s) before it were put)") from None
            raise ShmqError(f"messages {done + 1}..{done + len(batch)} not put: {e} ({done} message(s) before "
                            "them were put)") from None


CONSUME_BATCH = 256  # the most messages one get takes (and holds leased until they are written)
CONSUME_SLICE_S = 0.25  # a wait is cut in slices this long: a stop signal is seen within one


@main.command()
@click.argument("name")
@_target_options
@click.option("-n", "count", type=click.IntRange(1), default=1, show_default=True, help="Take up to this many.")
@click.option("--wait", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds to wait, in all, for the -n messages; then it returns what it got (0: what is ready "
                   "now).")
@click.option("--follow", is_flag=True, help="Keep consuming until SIGINT or SIGTERM (then it exits 0).")
@click.option("-0", "--null", "framing", flag_value="nul", help="End each body with a NUL byte, not a newline.")
@click.option("--raw", "framing", flag_value="raw", help="Write one body as it is, nothing after it (only with -n 1).")
@click.option("--no-ack", "mode", flag_value="no-ack", help="Leave them leased (they come back when it lapses).")
@click.option("--requeue", "mode", flag_value="requeue", help="Put them back (nack) after printing.")
@_json_option
def consume(name, namespace, url, token, count, wait, follow, framing, mode, as_json):
    """Take messages, print them, and ack them (unless --no-ack or --requeue).

    Each body is written as it is, then a newline (a body holding a newline reads as two
    lines: use -0 or --json for such bodies). A message is acked only after its output
    was written and flushed: at least once, never lost. Exits 3 when no message came
    before the wait ended."""
    if follow and (_on_command_line("count") or _on_command_line("wait")):
        raise click.UsageError("--follow takes neither -n nor --wait: it consumes until it is stopped")
    if follow and mode == "requeue":
        raise click.UsageError("--requeue with --follow would take the same messages again and again")
    if framing == "raw" and (count > 1 or follow):
        raise click.UsageError("--raw writes one body as it is: use -0 to take more than one")
    if as_json and framing:
        raise click.UsageError("--json is a format of its own: not with -0 or --raw")
    stopped = _stop_on_signals()
    deadline = time.monotonic() + wait
    taken, requeue = 0, []
    with _connect(namespace, url, token) as broker:
        q = broker.queue(name)
        while follow or taken < count:
            left = CONSUME_SLICE_S if follow else min(CONSUME_SLICE_S, max(0.0, deadline - time.monotonic()))
            try:
                got = q.get_many(CONSUME_BATCH if follow else min(CONSUME_BATCH, count - taken), timeout=left)
            except QueueEmpty:
                got = []
            if got:
                _write_deliveries(name, got, TERMINATORS[framing or "lines"], as_json)
                taken += len(got)
                if mode == "requeue":
                    requeue += got  # at the end: put back now, they would be taken again
                elif mode != "no-ack":
                    q.ack_many(got)
            if stopped() or (not follow and not got and time.monotonic() >= deadline):
                break
        for d in requeue:
            d.nack()
    if not taken and not follow:
        sys.exit(EXIT_EMPTY)


def _write_deliveries(name, deliveries, end, as_json):
    """Write ``deliveries`` to stdout and flush. If stdout is gone (a closed pipe), they
    are put back (nacked) and it is an error."""
    if as_json:
        data = b"".join(json.dumps({"queue": name, "id": d.id, "attempt": d.attempt, "headers": _jsonable(d.headers),
                                    "body": d.body.decode("utf-8", "replace"),
                                    "body_base64": base64.b64encode(d.body).decode()}, sort_keys=True).encode() + b"\n"
                        for d in deliveries)
    else:
        data = b"".join(bytes(d.body) + end for d in deliveries)
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        for d in deliveries:
            d.nack()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
        os.close(devnull)
        raise ShmqError(f"standard output was closed: the last {len(deliveries)} message(s) taken were put "
                        "back") from None


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
