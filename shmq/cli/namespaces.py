"""``shmq namespace list|create|destroy``: the namespaces of this user on this host."""

import os

import click

from ..engine.shm.segment import check_namespace, destroy_namespace, namespace_entries
from ..errors import ShmqError
from ..server.lock import describe, holder
from .app import _echo_json, _json_option, _print_table, main


@main.group("namespace")
def namespace_group():
    """Namespaces: the independent registries of queues and streams on this host."""


@namespace_group.command("list")
@_json_option
def namespace_list(as_json):
    """List your namespaces in /dev/shm, with their queues, streams and broker."""
    from ..doctor import diagnose  # (here: every other command's start would import it)

    found = diagnose()["namespaces"]
    if as_json:
        _echo_json([{k: ns[k] for k in ("namespace", "queues", "streams", "broker", "entries", "bytes", "registry")}
                    for ns in found])
        return
    rows = []
    for ns in found:
        b = ns["broker"]
        broker = "-" if b is None else (describe(b) if b["alive"] else f"pid {b['pid']} (not running)")
        ok = ns["registry"] == "ok"
        rows.append((ns["namespace"], broker if ok else f"{broker}; no usable registry: see shmq doctor",
                     len(ns["queues"]) if ok else "-", len(ns["streams"]) if ok else "-"))
    if rows:
        _print_table(("namespace", "broker", "queues", "streams"), rows, left=2)


@namespace_group.command("create")
@click.argument("name")
@click.option("--group", default=None, metavar="GROUP",
              help="Share it with this Unix group (one of yours): everything made in it 0660 with that group.")
def namespace_create(name, group):
    """Make the namespace NAME (its registry) now, or with --group share it, an existing
    one included (its entries must be yours), with a Unix group: every queue, stream and
    semaphore made in it later is 0660 with that group, not 0600."""
    from ..engine.broker import Broker
    from ..sharing import group_name

    with Broker(check_namespace(name)) as broker:
        made = broker.create_namespace(group)
        shared = broker.shared_group
    how = "owner-only (0600)" if shared is None else f"shared with group {group_name(shared)} (0660)"
    click.echo(f"{'made' if made else 'kept'} namespace {name}, {how}")


@namespace_group.command("destroy")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def namespace_destroy(name, yes):
    """Delete the namespace NAME: every queue, stream and keyed store in it, with what they hold, its
    registry, and its default data dir (so no server brings it back). A data dir given
    to its server with --data-dir is not touched: remove it yourself. Refused while its
    broker runs (stop it first)."""
    from ..auth import default_data_dir
    from ..persistence import remove_data_dir

    entries = namespace_entries(check_namespace(name))
    data_dir = default_data_dir(name)
    if not entries and not os.path.isdir(data_dir):
        raise ShmqError(f"no namespace {name!r} on this host ('shmq namespace list' shows them)")
    broker = holder(name)
    if broker is not None and broker["alive"]:
        raise ShmqError(f"namespace {name!r} has a running broker, {describe(broker)}: stop it first")
    if not yes:
        click.confirm(f"Destroy namespace {name!r}: every queue, stream and store in it, what they hold, and its "
                      f"data dir {data_dir}?", abort=True)
    n = destroy_namespace(name)
    removed, kept = remove_data_dir(data_dir)
    said = [f"destroyed namespace {name} ({n} entries removed"]
    if removed or kept:
        said.append(f"; its data dir {data_dir}: {removed} file(s) removed"
                    + (f", {len(kept)} kept that are not shmq's ({', '.join(kept[:3])}"
                       f"{', ...' if len(kept) > 3 else ''})" if kept else ""))
    else:
        said.append(f"; no data dir at {data_dir}")
    elsewhere = broker.get("data_dir") if broker is not None else None
    if elsewhere and os.path.abspath(elsewhere) != os.path.abspath(data_dir):
        said.append(f"; its last broker's --data-dir {elsewhere} is not touched")
    else:
        said.append("; data dirs given with --data-dir are not touched")
    click.echo("".join(said) + ")")
