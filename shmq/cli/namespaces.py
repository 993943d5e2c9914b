"""``shmq namespace list|destroy``: the namespaces of this user on this host."""

import click

from ..doctor import diagnose
from ..engine.segment import check_namespace, destroy_namespace, namespace_entries
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


@namespace_group.command("destroy")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def namespace_destroy(name, yes):
    """Delete the namespace NAME: every queue and stream in it, with their messages, and
    its registry. Refused while its broker runs (stop it first)."""
    entries = namespace_entries(check_namespace(name))
    if not entries:
        raise ShmqError(f"no namespace {name!r} on this host ('shmq namespace list' shows them)")
    broker = holder(name)
    if broker is not None and broker["alive"]:
        raise ShmqError(f"namespace {name!r} has a running broker, {describe(broker)}: stop it first")
    if not yes:
        click.confirm(f"Destroy namespace {name!r}: every queue and stream in it, and their messages?", abort=True)
    n = destroy_namespace(name)
    click.echo(f"destroyed namespace {name} ({n} entries removed)")
