"""The keyed-store commands (``shmq store ...``): list, keys, get, set, delete."""

import sys

import click

from ..errors import ShmqError
from .app import _connect, _echo_json, _echo_names, _json_option, _target_options, main


@main.group()
def store():
    """Keyed stores: values, counters and sets under keys, with expiry (docs/DESIGN.md, "Keyed stores")."""


def _existing(broker, name, namespace, url):
    """The handle on store ``name``, which must exist (a read never makes one)."""
    if name not in broker.list_stores():
        where = url or f"namespace {namespace!r}"
        raise ShmqError(f"no store {name!r} in {where} ('shmq store list' shows them)")
    return broker.store(name)


@store.command("list")
@_target_options
@_json_option
def store_list(namespace, url, token, as_json):
    """List the keyed stores."""
    with _connect(namespace, url, token) as broker:
        names = broker.list_stores()
    _echo_names(names, as_json, none="no stores")


@store.command("keys")
@click.argument("name")
@_target_options
@click.option("--prefix", default="", help="Only the keys that start with this.")
@_json_option
def store_keys(name, namespace, url, token, prefix, as_json):
    """List the keys of store NAME (not expired), sorted."""
    with _connect(namespace, url, token) as broker:
        keys = _existing(broker, name, namespace, url).keys(prefix)
    _echo_names(keys, as_json)


@store.command("get")
@click.argument("name")
@click.argument("key")
@_target_options
@click.option("--wait", type=click.FloatRange(min=0), default=0.0, show_default=True, metavar="SECONDS",
              help="Wait up to this long for the key to be there.")
def store_get(name, key, namespace, url, token, wait):
    """Print the value of KEY in store NAME (its bytes as they are, then a newline);
    an error if it has none. A set prints its members, one a line."""
    from ..errors import WrongType

    with _connect(namespace, url, token) as broker:
        kv = _existing(broker, name, namespace, url)
        try:
            value = kv.get(key, timeout=wait)
        except WrongType:
            for member in sorted(kv.members(key)):
                click.echo(member)
            return
    if value is None:
        raise ShmqError(f"store {name!r} has no key {key!r}")
    out = sys.stdout.buffer
    out.write(value + b"\n")
    out.flush()


@store.command("set")
@click.argument("name")
@click.argument("key")
@click.argument("value")
@_target_options
@click.option("--ttl", type=float, default=None, metavar="SECONDS", help="Expire the key after this long.")
@click.option("--only-new", is_flag=True, help="Only if the key is not there.")
@_json_option
def store_set(name, key, value, namespace, url, token, ttl, only_new, as_json):
    """Set KEY of store NAME to VALUE (UTF-8), the store made if need be."""
    with _connect(namespace, url, token, create=True) as broker:
        done = broker.store(name).set(key, value.encode(), ttl=ttl, only_new=only_new)
    if as_json:
        _echo_json({"store": name, "key": key, "set": done})
    elif done:
        click.echo(f"set {key} in store {name}" + (f", expiring in {ttl:g}s" if ttl is not None else ""))
    else:
        click.echo(f"kept {key} in store {name}: it is there already (--only-new)")


@store.command("delete")
@click.argument("name")
@click.argument("keys", nargs=-1, required=True)
@_target_options
@_json_option
def store_delete(name, keys, namespace, url, token, as_json):
    """Delete KEYS of store NAME."""
    with _connect(namespace, url, token) as broker:
        n = _existing(broker, name, namespace, url).delete(*keys)
    if as_json:
        _echo_json({"store": name, "deleted": n})
    else:
        click.echo(f"deleted {n} of {len(keys)} key(s) from store {name}")
