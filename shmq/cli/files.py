"""The snapshot file commands: snapshot, inspect, restore; backup (a namespace's durable
state copied into a new directory, by its server or from shared memory)."""

import os
import sys

import click

from ..errors import ShmqError
from .app import EXIT_ERROR, _connect, _echo_json, _json_option, _local_broker, _namespace_option, _target_options, main


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
    from ..formats.dmsq import summary

    info = summary(file)
    if as_json:
        _echo_json(info)
    elif info["format_version"] is not None:  # a snapshot, whole or not: what could be read of it
        for key, value in info.items():
            click.echo(f"{key:18s} {value}")
    if info["error"] or info["unsupported"] or not info["complete"]:  # what a script checking it must not take for good
        raise ShmqError(info["error"] or f"{file}: not a complete .dmsq snapshot")


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_namespace_option
@click.option("--into", default=None, help="Queue to load into (default: the one it was taken from; one FILE only).")
@click.option("--replace", is_flag=True,
              help="Into a queue that holds messages: drop its ready and delayed ones first (those in flight stay).")
@click.option("--append", is_flag=True,
              help="Into a queue that holds messages: restore only the messages whose ids it does not hold.")
def restore(files, namespace, into, replace, append):
    """Load .dmsq files into queues (created with the files' settings if needed), and a
    data dir's exchanges.dmsx (the exchanges the namespace does not have).

    A restore adds the file's messages to what the queue holds: into one that holds messages
    (ready, in flight or delayed) it is refused, and nothing changes, unless --replace
    (empty the queue of its ready and delayed messages, then restore; a message in
    flight stays with its consumer and is not restored again) or --append (restore only
    the messages whose ids the queue does not hold).

    Give a queue's file and its dead-letter queue's, and the exchange file, in one
    command: every queue is made first, then linked and filled, then the exchanges are
    bound. A dead-letter queue or bound queue that is nowhere is left out, with a
    warning; a file that cannot be restored is an error (the others are restored)."""
    from ..formats.dmsq import EXCHANGES_FILE, read_exchanges
    from ..persistence import restore_exchanges, restore_files
    from ..persistence.queues import QueuesNotEmpty, dropped_link
    from ..persistence.recovery import dropped_binding

    if replace and append:
        raise click.UsageError("--replace and --append exclude each other: give one")
    mode = "replace" if replace else "append" if append else None
    tables = [f for f in files if os.path.splitext(f)[1] == os.path.splitext(EXCHANGES_FILE)[1]]
    if into is not None and (len(files) > 1 or tables):
        raise click.UsageError(f"--into names one queue: give it one .dmsq FILE, not {' '.join(files)}")
    why = "restore its file in the same command, or create it first"
    failed = False
    with _local_broker(namespace, create=True) as broker:
        try:
            results, unlinked = restore_files(broker, [f for f in files if f not in tables], into, mode)
        except QueuesNotEmpty as e:
            for name, n in sorted(e.held.items()):
                click.echo(f"shmq: error: queue {name!r} holds {n} message(s): restoring would add the file's "
                           "messages to them (delivered twice where they are the same); give --replace (empty it "
                           "first, then restore) or --append (restore only the ids it does not hold)", err=True)
            sys.exit(EXIT_ERROR)
        for name, n, error, replaced, skipped in results:
            if name:
                click.echo(f"restored {n} message(s) into {name}" + _restored_how(mode, replaced, skipped))
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


def _restored_how(mode, replaced, skipped) -> str:
    """What a restore into a queue that held messages did, after its count."""
    if mode == "replace" and (replaced or skipped):
        return f" (replaced {replaced} it held" + (f"; skipped {skipped} in flight there)" if skipped else ")")
    if mode == "append" and skipped:
        return f" (appended: skipped {skipped} already in it)"
    return ""


@main.command()
@click.argument("dest", type=click.Path())
@_target_options
@_json_option
def backup(dest, namespace, url, token, as_json):
    """Copy every durable queue and stream (records, groups' committed offsets, a wal
    stream's logs), the exchanges and the Kafka listener's commit metadata into DEST, a
    new directory, while writes go on. `shmq server --data-dir DEST` starts from it, here
    or on another host (docs/OPERATIONS.md, "Backup and restore").

    The namespace's running server takes it (with --url, that server: DEST is then a path
    on its host, absolute); with no server running, this command takes it from shared
    memory itself. Each queue and stream partition is copied whole at one instant, as a
    snapshot is; the copy is written in DEST.partial and renamed to DEST once complete."""
    from ..persistence.backup import backup as take_backup
    from ..server.lock import holder

    by = "server"
    if url:
        if not os.path.isabs(dest):
            raise click.BadParameter(f"{dest!r}: with --url, DEST is a directory of the server's host: give its "
                                     "absolute path", param_hint="'DEST'")
    else:
        dest = os.path.abspath(dest)
        info = holder(namespace)
        if info is not None and info.get("alive") and info.get("role", "broker") == "broker" and info.get("port"):
            host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(info.get("host") or "", info.get("host"))
            url = f"{'tcps' if info.get('tls') else 'tcp'}://{f'[{host}]' if ':' in host else host}:{info['port']}"
        else:
            by = "local"
    if by == "server":
        with _connect(namespace, url, token) as broker:
            done = broker._backup(dest)
    else:
        with _local_broker(namespace) as broker:
            done = take_backup(broker, dest)
    done = {**done, "by": by, **({"url": url} if url else {})}
    if as_json:
        _echo_json(done)
        return
    from ..views import human_bytes

    for name in done["skipped"]:
        click.echo(f"shmq: warning: {'stream ' + name[1:] if name.startswith('@') else 'queue ' + name} left out: "
                   "an older shmq's layout holds it (docs/OPERATIONS.md, Upgrading)", err=True)
    click.echo(f"backup in {done['dest']} ({human_bytes(done['bytes'])}, "
               f"{'by the server at ' + url if by == 'server' else 'from shared memory: no server runs'}): "
               f"{done['queues']} queue(s) with {done['messages']} message(s), {done['streams']} stream(s) with "
               f"{done['partitions']} partition(s), {done['records']} record(s) and {done['log_files']} log file(s), "
               f"{done['exchanges']} exchange(s)" + (", the Kafka listener's commit metadata" if done["kafka_state"]
                                                      else "")
               + (f" and its transactions ({done['kafka_txns']} journal event(s))" if done.get("kafka_txns") else ""))
