"""The exchange commands (``shmq exchange ...``): create, delete, bind, unbind, list, publish."""

import click

from ..errors import ShmqError
from .app import _connect, _echo_json, _json_option, _parse_headers, _target_options, main


@main.group()
def exchange():
    """Exchanges: route published messages to bound queues and streams."""


@exchange.command("create")
@click.argument("name")
@_target_options
@click.option("--type", "type_", type=click.Choice(["fanout", "topic"]), default="fanout", show_default=True,
              help="fanout: every bound target; topic: those whose pattern matches the routing key.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the exchange exists (of this type).")
@_json_option
def exchange_create(name, namespace, url, token, type_, exist_ok, as_json):
    """Create an exchange."""
    with _connect(namespace, url, token, create=True) as broker:
        broker.create_exchange(name, type=type_, exist_ok=exist_ok)
    if as_json:
        _echo_json({"exchange": name, "type": type_})
    else:
        click.echo(f"created {type_} exchange {name}")


@exchange.command("delete")
@click.argument("name")
@_target_options
def exchange_delete(name, namespace, url, token):
    """Delete an exchange and its bindings."""
    with _connect(namespace, url, token) as broker:
        broker.delete_exchange(name)
    click.echo(f"deleted exchange {name}")


@exchange.command("bind")
@click.argument("name")
@click.argument("target")
@_target_options
@click.option("--pattern", default="#", show_default=True,
              help='Topic pattern: words split on ".", * one word, # zero or more.')
@_json_option
def exchange_bind(name, target, namespace, url, token, pattern, as_json):
    """Bind the queue or stream TARGET to the exchange NAME."""
    with _connect(namespace, url, token) as broker:
        broker.bind(name, target, pattern=pattern)
        info = broker.exchange_info(name)
    kind = next(b["kind"] for b in info["bindings"] if b["target"] == target and b["pattern"] == pattern)
    if as_json:
        _echo_json({"exchange": name, "type": info["type"], "target": target, "kind": kind, "pattern": pattern})
    else:
        click.echo(f"bound {kind} {target} to {info['type']} exchange {name}"
                   + (f" with pattern {pattern}" if info["type"] == "topic" else ""))


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
@_json_option
def exchange_publish(name, namespace, url, token, messages, routing_key, header_pairs, dedup_id, as_json):
    """Publish messages to the exchange NAME; says how many targets (queues, streams) got each."""
    if not messages:
        raise click.UsageError("give at least one -m/--message")
    if dedup_id is not None and len(messages) > 1:
        raise click.UsageError("--dedup-id names one message: give one -m")
    headers = _parse_headers(header_pairs) or None
    got = []  # how many targets got each message published
    with _connect(namespace, url, token) as broker:
        for body in messages:
            try:
                got.append(broker.publish(name, body.encode(), routing_key=routing_key, headers=headers,
                                          dedup_id=dedup_id))
            except ShmqError as e:
                if not got:
                    raise
                raise ShmqError(f"message {len(got) + 1} of {len(messages)}: {e} (the {len(got)} before it were "
                                "published)") from e
    if as_json:
        _echo_json({"exchange": name, "targets": got})
    elif len(set(got)) == 1:
        click.echo(f"published {len(got)} message(s) to exchange {name}: "
                   f"{'each ' if len(got) > 1 else ''}to {got[0]} target(s)")
    else:
        click.echo(f"published {len(got)} message(s) to exchange {name}: to {', '.join(map(str, got))} target(s)")
