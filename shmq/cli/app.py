"""The ``shmq`` command group and what its commands share: the exit codes, options, the
connection they name, output helpers. Errors print one line on stderr, never a traceback."""

import base64
import fractions
import importlib
import json
import os
import re
import sys

import click

from .. import __version__
from ..auth import command_line_warning
from ..engine.shm.names import default_namespace
from ..errors import ShmqError

# The exit codes, the one table of them (docs/OPERATIONS.md, "Exit codes", says the same).
EXIT_OK = 0     # done
EXIT_ERROR = 1  # an error (shmq's, a bad value, I/O, a refused confirmation): one line on stderr
EXIT_USAGE = 2  # the command line is wrong (unknown option, missing argument, malformed value): one line
EXIT_EMPTY = 3  # consume: no message came before the wait ended

_NoArgsIsHelp = getattr(click.exceptions, "NoArgsIsHelpError", ())  # click >= 8.2: a group run bare shows help


def _usage_error(e: click.UsageError):
    """A usage error in one line, with where to find help; exit 2."""
    where = f"; try '{e.ctx.command_path} --help'" if e.ctx is not None else ""
    click.echo(f"shmq: error: {e.format_message().rstrip('.')}{where}", err=True)
    sys.exit(EXIT_USAGE)


# command -> the module of this package that holds it: a command's module (and what it imports:
# the engine, the clients, Spark's staging names...) is imported only when it runs; a test holds
# this table to what the modules register
COMMANDS = {
    "backup": "files", "inspect": "files", "restore": "files", "snapshot": "files",
    "bench": "ops", "doctor": "ops", "server": "ops",
    "consume": "queues", "create": "queues", "delete": "queues", "list": "queues", "peek": "queues",
    "produce": "queues", "purge": "queues", "queue": "queues", "redrive": "queues", "stats": "queues",
    "top": "queues",
    "dlq": "deadletters", "exchange": "exchanges", "group": "streams", "stream": "streams",
    "namespace": "namespaces", "status": "status", "store": "stores",
}


class _Cli(click.Group):
    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            importlib.import_module(f"{__package__}.{COMMANDS[name]}")  # (it registers its commands on main)
        return super().get_command(ctx, name)

    def list_commands(self, ctx):
        for module in sorted(set(COMMANDS.values())):
            importlib.import_module(f"{__package__}.{module}")
        return super().list_commands(ctx)

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:  # the group's own options
            if isinstance(e, _NoArgsIsHelp):
                raise
            _usage_error(e)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:  # a command's options and arguments, an unknown command
            if isinstance(e, _NoArgsIsHelp):
                raise
            _usage_error(e)
        except (ShmqError, ValueError, TypeError, OSError) as e:
            click.echo(f"shmq: error: {e}", err=True)
            sys.exit(EXIT_ERROR)


@click.group(cls=_Cli)
@click.version_option(__version__, prog_name="shmq")
def main():
    """shmq: a message broker for processes on one host.

    Exit codes: 0 done, 1 an error, 2 a usage error, 3 consume got no message before
    its wait ended."""


def shown(value) -> str:
    """A setting's default as a command's help shows it (model/settings.py's table holds it):
    64MiB, 300, none."""
    if value is None:
        return "none"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2**20 and value % 2**20 == 0:
        return f"{value >> 20}MiB"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class Size(click.ParamType):
    """A number of bytes: 65536, or with a unit: KiB, MiB, GiB, TiB (powers of 1024) or
    KB, MB, GB, TB (powers of 1000); B is bytes. Units are case-insensitive; a fraction
    (1.5MiB) must come to whole bytes."""

    name = "size"
    UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    _FORM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")

    def __init__(self, min: int = 0, max: int | None = None):
        self.min, self.max = min, max

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            m = self._FORM.fullmatch(str(value))
            unit = m and m.group(2).lower()
            if not m or unit not in self.UNITS:
                self.fail(f"{value!r} is not a size: give bytes (65536) or a number with KiB, MiB, GiB "
                          "(powers of 1024) or KB, MB, GB (powers of 1000)", param, ctx)
            exact = fractions.Fraction(m.group(1)) * self.UNITS[unit]
            if exact.denominator != 1:
                self.fail(f"{value!r} is not a whole number of bytes", param, ctx)
            n = int(exact)
        if n < self.min:
            self.fail(f"{value!r} is less than the least allowed, {self.min} bytes", param, ctx)
        if self.max is not None and n > self.max:
            self.fail(f"{value!r} is more than the most allowed, {self.max} bytes", param, ctx)
        return n


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
                     help="Remote broker tcp://host:port, or tcps://host:port for TLS ($SHMQ_URL); local attach when "
                          "absent.")(f)
    return _namespace_option(f)


def _connect(namespace, url, token, create=False):
    """The broker the options name: remote with ``url``, else the local ``namespace``
    (which must exist unless ``create``: see ``_local_broker``)."""
    if token is not None and _on_command_line("token"):
        click.echo(f"shmq: warning: {command_line_warning(os.getpid(), '$SHMQ_TOKEN')}", err=True)
    elif token is not None:
        token = None  # from $SHMQ_TOKEN: the client reads it itself (and names it if refused)
    if url:
        from ..client.options import split_url
        from ..client.remote import RemoteBroker

        try:
            split_url(url)  # a malformed url is a usage error (exit 2), an unreachable broker an error (1)
        except ValueError as e:
            raise click.BadParameter(str(e), ctx=click.get_current_context(), param_hint="'--url'") from None
        return RemoteBroker(url, token=token)
    return _local_broker(namespace, create)


def _local_broker(namespace, create=False):
    """The local broker of ``namespace``. Only the commands that make things pass
    ``create``: for the others a namespace that does not exist (a typo) is an error,
    never a new empty namespace."""
    try:
        from ..engine.broker import Broker

        return Broker(namespace, create=create)
    except FileNotFoundError:
        raise ShmqError(f"no namespace {namespace!r} on this host (check --namespace / $SHMQ_NAMESPACE; "
                        "'shmq namespace list' shows them)") from None


def _json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(f)


def _echo_json(value):
    click.echo(json.dumps(value, sort_keys=True))


def _echo_set(name, settings, after, as_json):
    """What ``queue set`` / ``stream set`` set: the settings given, as they are now
    (``--json``: every setting)."""
    if as_json:
        _echo_json(after)
    else:
        click.echo(f"set {name}: " + ", ".join(f"{k} {after[k]!r}" for k in settings))


def _echo_names(names, as_json, none=None):
    """One name a line (``--json``: a list). With none to list, ``none`` (if given) says
    so on stderr, as a note: standard output stays a list of names."""
    if as_json:
        _echo_json(names)
    else:
        for name in names:
            click.echo(name)
        if not names and none:
            click.echo(f"shmq: {none}", err=True)


def _print_table(header, rows, left=1, right=None):
    """Aligned columns: the first ``left`` ones to the left, the others (numbers) to the right;
    or the columns numbered in ``right`` to the right, the others to the left."""
    table = [header] + [tuple(_cell(v) for v in row) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = set(range(left, len(header))) if right is None else set(right)
    for row in table:
        click.echo("  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip())


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
    """Make SIGINT and SIGTERM set a flag instead of ending the process; returns the
    check. The commands that run long (a --follow, consume's wait, produce's reading of
    stdin) look at it at least every slice and stop cleanly, nothing lost."""
    import signal

    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(True))
    return lambda: bool(stop)


def _jsonable(headers):
    """Headers for JSON (bytes in base64): a dict as an object, a stream record's list of
    pairs as a list of [key, value]."""
    if isinstance(headers, dict):
        return {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in headers.items()}
    return [[k, base64.b64encode(v).decode() if isinstance(v, bytes) else v] for k, v in headers]


def _created(create, exist_ok, exists) -> bool:
    """Whether ``create(exist_ok)`` made the queue or stream: it is tried without exist_ok
    first, so that one found there (``exists``) is told apart; then, with --exist-ok, taken
    if its settings are those asked (``exists`` naming each that differs, if not)."""
    try:
        create(False)
    except exists:
        if not exist_ok:
            raise
        create(True)
        return False
    return True
