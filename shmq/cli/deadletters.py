"""``shmq dlq``: the dead letters of the queues, seen from the queue they died in."""

import base64

import click

from ..errors import ShmqError
from .app import _echo_json, _json_option, _jsonable, _print_table, _target_options, _connect, main

@main.command()
@click.argument("queue", required=False)
@_target_options
@click.option("-n", "count", type=click.IntRange(1), default=10, show_default=True,
              help="Show at most this many dead letters of QUEUE.")
@click.option("--redrive", is_flag=True, help="Move the dead letters of QUEUE's dead-letter queue back, each into "
                                               "the queue it died in, to be delivered again.")
@_json_option
def dlq(queue, namespace, url, token, count, redrive, as_json):
    """The dead-letter queues: every queue that has one, with its dead letters; with QUEUE,
    next letters of QUEUE's dead-letter queue (the queue each died in, why, after how
    many deliveries), or --redrive them back, as shmq redrive does."""
    with _connect(namespace, url, token) as broker:
        if queue is None:
            if redrive:
                raise click.UsageError("--redrive needs the QUEUE whose dead letters go back")
            rows, names = [], broker.list_queues()
            for name in names:
                target = broker.queue(name).settings().get("dead_letter_queue")
                if target:
                    rows.append((name, target, broker.queue(target).stats().ready if target in names else None))
            if as_json:
                _echo_json([{"queue": n, "dead_letter_queue": t, "dead_letters": d} for n, t, d in rows])
            elif rows:
                _print_table(("QUEUE", "DEAD-LETTER QUEUE", "DEAD LETTERS"),
                             [(n, t, "missing" if d is None else d) for n, t, d in rows], left=2)
            else:
                click.echo("no queue has a dead-letter queue")
            return
        if queue not in broker.list_queues():
            raise ShmqError(f"no queue {queue!r}")
        target = broker.queue(queue).settings().get("dead_letter_queue")
        if not target:
            raise ShmqError(f"queue {queue!r} has no dead-letter queue (create it with --dead-letter-queue, or "
                            f"set one: shmq queue set {queue} --dead-letter-queue NAME)")
        if redrive:
            n = broker.redrive(target)
            if as_json:
                _echo_json({"queue": queue, "dead_letter_queue": target, "redriven": n})
            else:
                click.echo(f"redrove {n} message(s) from {target}, each to the queue it died in")
            return
        letters = broker.queue(target).peek(count)
    if as_json:
        for m in letters:
            _echo_json({"queue": queue, "dead_letter_queue": target, "id": m.id, "headers": _jsonable(m.headers),
                        "body": m.body.decode("utf-8", "replace"), "body_base64": base64.b64encode(m.body).decode()})
        return
    if not letters:
        click.echo(f"{target}: no dead letters")
        return
    _print_table(("DIED IN", "REASON", "DELIVERIES", "ID", "BODY"),
                 [(m.headers.get("x-death-queue", "?"), m.headers.get("x-death-reason", "?"), m.headers.get("x-death-attempts", "?"),
                   m.headers.get("x-death-id", "?"), _preview(m.body)) for m in letters], right=(2, 3))


def _preview(body: bytes, width: int = 60) -> str:
    text = body.decode("utf-8", "replace").replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 3] + "..."
