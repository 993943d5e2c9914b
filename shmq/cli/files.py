"""The snapshot file commands: snapshot, inspect, restore."""

import os

import click

from ..errors import ShmqError
from .app import _echo_json, _json_option, _local_broker, _namespace_option, main


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
    from ..dmsq import summary

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
    from ..persistence import restore_file

    with _local_broker(namespace, create=True) as broker:
        name, n, error = restore_file(broker, file, into)
    if error and not name:
        raise ShmqError(error)
    click.echo(f"restored {n} message(s) into {name}")
    if error:
        click.echo(f"shmq: warning: {error}", err=True)
