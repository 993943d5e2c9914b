"""The ``shmq`` command line (click). Errors print one line on stderr, never a traceback."""

import logging
import signal
import sys
import threading

import click

from . import __version__
from .broker import Broker, default_namespace
from .errors import ShmqError

HOUSEKEEPING_INTERVAL_S = 0.25


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


@main.command()
@_namespace_option
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]),
              show_default=True)
def server(namespace, log_level):
    """Run the broker: hold the namespace's registry and do housekeeping.

    Stops on SIGINT/SIGTERM and exits 0; queues stay in shared memory.
    """
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s shmq %(levelname)s %(message)s",
                        stream=sys.stderr)
    log = logging.getLogger("shmq.server")
    from .server import Housekeeper

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with Broker(namespace) as broker:
        keeper = Housekeeper(broker)
        log.info("serving namespace %s (%d queues); housekeeping every %.2fs",
                 namespace, len(broker.list_queues()), HOUSEKEEPING_INTERVAL_S)
        try:
            while not stop.is_set():
                keeper.run_once()
                stop.wait(HOUSEKEEPING_INTERVAL_S)
        finally:
            keeper.close()
    log.info("stopped")


@main.command("list")
@_namespace_option
def list_(namespace):
    """List the namespace's queues."""
    with Broker(namespace) as broker:
        for name in broker.list_queues():
            click.echo(name)


if __name__ == "__main__":
    main()
