"""The snapshot file commands: snapshot, inspect, restore."""

import os
import sys

import click

from .app import EXIT_ERROR, _echo_json, _json_option, _local_broker, _namespace_option, main


@main.command()
@click.argument("name", required=False)
@_namespace_option
@click.option("--data-dir", type=click.Path(file_okay=False), required=True, envvar="SHMQ_DATA_DIR",
              help="Where the .dmsq files go ($SHMQ_DATA_DIR).")
def snapshot(name, namespace, data_dir):
    """Snapshot one queue (or every durable one) to .dmsq files now."""
    from ..persistence import Snapshotter, snapshot_queue

    with _local_broker(namespace) as broker:
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
    from ..persistence.dmsq import summary

    info = summary(file)
    if as_json:
        _echo_json(info)
        return
    for key, value in info.items():
        click.echo(f"{key:18s} {value}")


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_namespace_option
@click.option("--into", default=None, help="Queue to load into (default: the one it was taken from; one FILE only).")
def restore(files, namespace, into):
    """Load .dmsq files into queues (created with the files' settings if needed), and a
    data dir's exchanges.dmsx (the exchanges the namespace does not have).

    Give a queue's file and its dead-letter queue's, and the exchange file, in one
    command: every queue is made first, then linked and filled, then the exchanges are
    bound. A dead-letter queue or bound queue that is nowhere is left out, with a
    warning; a file that cannot be restored is an error (the others are restored)."""
    from ..persistence.dmsq import EXCHANGES_FILE, read_exchanges
    from ..persistence import restore_exchanges, restore_files
    from ..persistence.queues import dropped_link
    from ..persistence.recovery import dropped_binding

    tables = [f for f in files if os.path.splitext(f)[1] == os.path.splitext(EXCHANGES_FILE)[1]]
    if into is not None and (len(files) > 1 or tables):
        raise click.UsageError(f"--into names one queue: give it one .dmsq FILE, not {' '.join(files)}")
    why = "restore its file in the same command, or create it first"
    failed = False
    with _local_broker(namespace, create=True) as broker:
        results, unlinked = restore_files(broker, [f for f in files if f not in tables], into)
        for name, n, error in results:
            if name:
                click.echo(f"restored {n} message(s) into {name}")
            if error:
                click.echo(f"shmq: {'warning' if name else 'error'}: {error}", err=True)
                failed |= not name
        for name, dlq in unlinked:
            click.echo(f"shmq: warning: {dropped_link(name, dlq, why)}", err=True)
        for path in tables:
            try:
                table = read_exchanges(path)
            except ValueError as e:
                click.echo(f"shmq: error: {e}", err=True)
                failed = True
                continue
            restored, bindings, dropped = restore_exchanges(broker, table)
            kept = len(table) - len(restored)
            click.echo(f"restored {len(restored)} exchange(s) with {bindings} binding(s) from {path}"
                       + (f" ({kept} already in the namespace kept as they are)" if kept else ""))
            for exchange, kind, target, pattern in dropped:
                click.echo(f"shmq: warning: {dropped_binding(exchange, kind, target, pattern, why)}", err=True)
    if failed:
        sys.exit(EXIT_ERROR)
