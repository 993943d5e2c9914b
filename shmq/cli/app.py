"""The ``shmq`` command group and what its commands share: options, the connection they
name, output helpers. Errors print one line on stderr, never a traceback."""

import base64
import json
import os
import sys

import click

from .. import __version__
from ..auth import command_line_warning
from ..engine.broker import Broker, default_namespace
from ..errors import ShmqError


class _Cli(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (ShmqError, ValueError, TypeError, OSError) as e:
            click.echo(f"shmq: error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Cli)
@click.version_option(__version__, prog_name="shmq")
def main():
    """shmq: a message broker for processes on one host."""


def _namespace_option(f):
    return click.option(
        "--namespace", default=default_namespace, show_default="$SHMQ_NAMESPACE or shmq",
        help="Registry of queues to use.",
    )(f)


def _on_command_line(param) -> bool:
    """Whether the current command got ``param`` on its command line (not from the environment)."""
    return click.get_current_context().get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE


def _target_options(f):
    """--namespace for local attach, --url/--token for a remote broker."""
    f = click.option("--token", envvar="SHMQ_TOKEN", default=None,
                     help="Token for a remote broker (prefer $SHMQ_TOKEN; default: your own server's on this host, "
                          "found in $SHMQ_HOME/run).")(f)
    f = click.option("--url", envvar="SHMQ_URL", default=None,
                     help="Remote broker tcp://host:port ($SHMQ_URL); local attach when absent.")(f)
    return _namespace_option(f)


def _connect(namespace, url, token):
    if token is not None and _on_command_line("token"):
        click.echo(f"shmq: warning: {command_line_warning(os.getpid(), '$SHMQ_TOKEN')}", err=True)
    elif token is not None:
        token = None  # from $SHMQ_TOKEN: the client reads it itself (and names it if refused)
    if url:
        from ..client.remote import RemoteBroker

        return RemoteBroker(url, token=token)
    return Broker(namespace)


def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)


def _echo_json(value):
    click.echo(json.dumps(value, sort_keys=True))


def _echo_names(names, as_json):
    if as_json:
        _echo_json(names)
    else:
        for name in names:
            click.echo(name)


def _print_table(header, rows, left=1):
    """Aligned columns: the first ``left`` ones to the left, the others (numbers) to the right."""
    table = [header] + [tuple(_cell(v) for v in row) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))))


def _cell(value):
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _parse_headers(pairs):
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--header")
        headers[key] = value
    return headers or None


def _stop_on_signals():
    """Make SIGINT and SIGTERM end --follow cleanly (at its next slice); returns a check."""
    import signal

    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    return lambda: bool(stop)


def _jsonable(headers):
    return {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in headers.items()}
