"""``shmq server``, ``shmq doctor``, ``shmq bench``: running and looking after a broker."""

import logging
import os
import sys

import click

from ..auth import command_line_warning
from ..busypoll import MAX_BUSY_POLL_US
from ..errors import ShmqError
from .app import Size, _echo_json, _json_option, _namespace_option, _on_command_line, main
from .config import config_file_options, given, origin


@main.command()
@config_file_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=7878, show_default=True, type=click.IntRange(0, 65535), help="TCP port (0: any free).")
@_namespace_option
@click.option("--token", envvar="SHMQ_TOKEN", default=None,
              help="Require this token in HELLO. Prefer $SHMQ_TOKEN or --token-file: a command line is readable "
                   "by every user.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="Require the token in this file (0600; created with a new token if missing). "
                   "Default: $SHMQ_HOME/token (~/.local/state/shmq/token).")
@click.option("--no-auth", is_flag=True, help="Require no token: every local user can use the queues over TCP.")
@click.option("--max-frame-bytes", default="16MiB", show_default=True, type=Size(min=1024, max=2**31),
              help="Largest frame accepted from a client (a size: 1048576, 1MiB...; at most 2GiB).")
@click.option("--max-connections", type=click.IntRange(1), default=None,
              help="Open connections at most; more get LIMIT_EXCEEDED and are closed. [default: 1024]")
@click.option("--max-waiting-per-connection", type=click.IntRange(1), default=None,
              help="Waiting CONSUMEs per connection; more get LIMIT_EXCEEDED. [default: 256]")
@click.option("--max-subscriptions-per-connection", type=click.IntRange(1), default=None,
              help="SUBSCRIBEs (consume with prefetch) open at once per connection; more get LIMIT_EXCEEDED. "
                   "[default: 64]")
@click.option("--max-prefetch", type=click.IntRange(1), default=None,
              help="Largest prefetch a SUBSCRIBE may ask for; more gets BAD_REQUEST. [default: 10000]")
@click.option("--busy-poll-us", type=click.IntRange(0, MAX_BUSY_POLL_US), default=None,
              help="Microseconds the server looks for a client's next request without sleeping, after each read "
                   "(a sleeping CPU's wake-up costs tens of µs on a VM); the window adapts down when nothing comes "
                   "and ends when the CPU is wanted; 0: never. [default: 100]")
@click.option("--max-buffered-bytes", type=Size(min=1024), default=None,
              help="Bytes of unfinished big frames held across all connections; beyond, readers wait. "
                   "At least --max-frame-bytes + 16 (a size). [default: 64MiB]")
@click.option("--frame-timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds a frame may take from its first byte to its last; then the connection closes "
                   "(on the Kafka port too). [default: 30]")
@click.option("--idle-timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds a connection may stay without a request while it holds nothing (no waiting "
                   "request, subscription, unsettled delivery or group member; on the Kafka port, no request in "
                   "progress); then it closes. [default: 300]")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Snapshot durable queues and streams here; rebuild lost ones from it on start. "
                   "[default: $SHMQ_HOME/data/NAMESPACE if $SHMQ_HOME is set, else $XDG_DATA_HOME/shmq/NAMESPACE, "
                   "else ~/.local/share/shmq/NAMESPACE]")
@click.option("--no-persist", is_flag=True,
              help="No data dir: queues and streams live in shared memory only (a reboot loses them).")
@click.option("--snapshot-interval", type=click.FloatRange(0.01), default=1.0, show_default=True,
              help="Seconds between snapshots.")
@click.option("--fsync", default="batch:2", show_default=True, metavar="always|batch:MS|never",
              help="When write-ahead logs of 'wal' queues are fsynced.")
@click.option("--disk-free-limit", type=Size(), default=None,
              help="The disk alarm: below this much free space in the data dir's filesystem, puts and appends of "
                   "'wal' queues and streams are refused (acks and purges go on) until there is room again (0: never). "
                   "[default: 50MiB, or a twentieth of the filesystem if less]")
@click.option("--metrics", "metrics", default=None, metavar="HOST:PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (a bare PORT binds 127.0.0.1; "
                   "docs/METRICS.md). [default: off]")
@click.option("--kafka-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve Kafka clients on this port (0: any free; docs/KAFKA.md). [default: off]")
@click.option("--kafka-host", default=None, help="Address of the Kafka listener. [default: --host]")
@click.option("--kafka-advertised-host", default=None, metavar="HOST[:PORT]",
              help="The address Kafka's Metadata names to clients (a proxy's, a name). [default: the --kafka-host "
                   "(127.0.0.1 for a wildcard address) and the bound port]")
@click.option("--kafka-auto-create-partitions", type=click.IntRange(1), default=1, show_default=True,
              help="Partitions of a topic made because a Kafka client named it.")
@click.option("--kafka-topic-max-bytes", type=Size(min=4096), default="64MiB", show_default=True,
              help="The memory ring of each partition of a topic the Kafka listener makes (auto-created or by "
                   "CreateTopics): what it holds before retention drops the oldest; taken as written.")
@click.option("--kafka-initial-rebalance-delay-ms", type=click.IntRange(0), default=3000, show_default=True,
              help="How long a Kafka group with no members waits after its first JoinGroup before it assigns, "
                   "so that members starting together are assigned once (Kafka's "
                   "group.initial.rebalance.delay.ms; 0: at once).")
@click.option("--kafka-max-replication-factor", type=click.IntRange(1), default=1, show_default=True,
              help="CreateTopics takes a replication factor up to this, each topic still one copy on this node "
                   "(set-ups written for a cluster of that many brokers, such as librdkafka's test suite).")
@click.option("--no-kafka-auto-create", is_flag=True, help="Kafka clients name only topics that exist (or create "
              "them with CreateTopics).")
@click.option("--loop", "loop", envvar="SHMQ_LOOP", default="auto", show_default=True,
              type=click.Choice(["auto", "asyncio", "uvloop"]),
              help="The event loop: uvloop (faster TCP), asyncio's own, or auto: uvloop if installed. "
                   "Also $SHMQ_LOOP.")
@click.option("--group", "group", default=None, metavar="GROUP",
              help="Share the namespace with this Unix group (one of yours): its shared memory, semaphores, lock "
                   "file and data files 0660 with that group (data dir 2770), not 0600. Other users stay refused.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Speak TLS on every port with this certificate (PEM, with its chain); clients use tcps:// "
                   "(Kafka clients SSL or SASL_SSL). [default: plain TCP]")
@click.option("--tls-key", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The private key of --tls-cert (PEM). [default: in the --tls-cert file]")
@click.option("--tls-client-ca", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Mutual TLS: clients must show a certificate this CA (PEM) signed. [default: none asked]")
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"]),
              show_default=True)
@click.option("--log-format", default="text", type=click.Choice(["text", "json"]), show_default=True,
              help="One line per event, with its fields: TIME shmq LEVEL message k=v..., or a JSON object.")
def server(host, port, namespace, token, token_file, no_auth, max_frame_bytes, data_dir, no_persist,
           snapshot_interval, fsync, disk_free_limit, log_level, log_format, metrics, loop, kafka_port, kafka_host,
           kafka_advertised_host, kafka_auto_create_partitions, kafka_topic_max_bytes, kafka_initial_rebalance_delay_ms,
           kafka_max_replication_factor, no_kafka_auto_create,
           **limits):
    """Run the broker: serve TCP clients, hold the namespace's registry, do housekeeping.

    Clients must present a token, by default one generated at the first start into
    $SHMQ_HOME/token; your own clients on this host find it by themselves.
    Stops on SIGINT/SIGTERM (answering what is in flight) and exits 0; queues stay in
    shared memory for the next start. Durable queues and streams are snapshotted to the
    data dir (--data-dir, by default one per namespace in your data directory; none with
    --no-persist) and rebuilt from it after a reboot. One broker per namespace: a second
    one refuses to start.
    """
    from ..auth import default_data_dir
    from ..logs import configure as configure_logs

    configure_logs(log_level, log_format)
    if no_persist and data_dir is not None:
        raise click.UsageError("--data-dir and --no-persist exclude each other")
    if data_dir is None and not no_persist:
        data_dir = default_data_dir(namespace)
    from ..server import loops
    from ..server.main import parse_fsync, serve
    from ..server.metrics import parse_address
    from ..server.tcp import Limits

    try:  # a malformed value is a usage error (exit 2) before anything starts
        parse_fsync(fsync)
        loops.resolve(loop)  # so is --loop uvloop without uvloop
        metrics = parse_address(metrics) if metrics is not None else None
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    group = limits.pop("group")  # --group: the namespace shared with a Unix group (shmq/sharing.py)
    tls_files = limits.pop("tls_cert"), limits.pop("tls_key")
    tls = _tls_context(*tls_files, limits.pop("tls_client_ca"))
    limits = Limits(**{k: v for k, v in limits.items() if v is not None})  # the options left out: defaults
    kafka = None
    if kafka_port is not None:
        from ..server.main import kafka_listener_class
        from ..errors import ShmqError

        try:  # the kafka extra missing is a usage error too, before anything starts
            kafka_listener_class()
        except ShmqError as e:
            raise click.UsageError(str(e)) from None
        adv_host, adv_port = kafka_advertised_host, None
        if adv_host and (adv_host.count(":") == 1 or adv_host.startswith("[")) and ":" in adv_host \
                and adv_host.rsplit(":", 1)[1].isdigit():  # HOST:PORT or [V6]:PORT
            adv_host, adv_port = adv_host.rsplit(":", 1)[0].strip("[]"), int(adv_host.rsplit(":", 1)[1])
        kafka = {"host": kafka_host or host, "port": kafka_port, "advertised_host": adv_host,
                 "advertised_port": adv_port,
                 "auto_create": not no_kafka_auto_create, "auto_create_partitions": kafka_auto_create_partitions,
                 "initial_rebalance_delay_ms": kafka_initial_rebalance_delay_ms,
                 "topic_max_bytes": kafka_topic_max_bytes, "max_replication_factor": kafka_max_replication_factor}
    elif kafka_host or kafka_advertised_host or no_kafka_auto_create or given("kafka_auto_create_partitions") \
            or given("kafka_initial_rebalance_delay_ms") or given("kafka_topic_max_bytes") \
            or given("kafka_max_replication_factor"):
        raise click.UsageError("the --kafka-* options need --kafka-port")
    if token is not None and not _on_command_line("token") and (token_file or no_auth):
        token = None  # --token-file and --no-auth win over $SHMQ_TOKEN
    if token is not None and _on_command_line("token"):
        logging.getLogger("shmq.server").warning(command_line_warning(os.getpid()),
                                                 extra={"event": "token_on_command_line"})
    if tls is not None:
        _warn_readable_key(tls_files)
    port_settings = {name: origin(name) for name in ("port", "kafka_port", "metrics")}  # for a port in use
    rc = loops.run(serve(namespace, host, port, token, max_frame_bytes, data_dir=data_dir,
                         snapshot_interval=snapshot_interval, fsync=fsync, token_file=token_file, no_auth=no_auth,
                         limits=limits, metrics=metrics, kafka=kafka, group=group, tls=tls,
                         port_settings=port_settings, disk_free_limit=disk_free_limit), loop)
    if rc:  # the stop could not save what it holds: said at ERROR by the server
        sys.exit(rc)


def _warn_readable_key(tls_files):
    """A private key other users can read is accepted, with a warning that says how to
    close it (event ``tls_key_readable``)."""
    from ..tls import readable_key_warning

    line = readable_key_warning(*tls_files)
    if line is not None:
        logging.getLogger("shmq.server").warning(line, extra={"event": "tls_key_readable"})


def _tls_context(cert, key, client_ca):
    """The server's TLS context from --tls-cert, --tls-key, --tls-client-ca (None: plain
    TCP); a file that cannot be used is a usage error (exit 2), before anything starts."""
    if cert is None:
        if key is not None or client_ca is not None:
            raise click.UsageError("--tls-key and --tls-client-ca need --tls-cert")
        return None
    from ..tls import server_context

    try:
        return server_context(cert, key, client_ca)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


@main.command()
@click.option("--clean", is_flag=True, help="Remove what is provably orphaned (nothing else): segments no registry "
              "owns, lock files and runtime files of brokers that are gone.")
@click.option("--data-dirs", "data_dirs", is_flag=True,
              help="With --clean: also remove the data dirs of namespaces not in /dev/shm (shmq's files only). After a "
                   "reboot they hold the only copy: a server rebuilds its namespace from them.")
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="Only this namespace (repeatable). Default: every namespace of yours.")
@_json_option
def doctor(clean, data_dirs, namespaces, as_json):
    """Check this host: /dev/shm's size and free space, your namespaces and their brokers,
    orphaned segments and files, half-removed queues and streams, data directories (and
    whether their namespace is still there, whether they can be written) and their disk
    space. Exits 1 when it found something that needs a hand (what --clean leaves)."""
    from .. import doctor as doc

    if data_dirs and not clean:
        raise click.UsageError("--data-dirs goes with --clean")
    report = doc.diagnose(namespaces, remove=clean, remove_data_dirs=data_dirs)
    report["problems"] = doc.problems(report)
    if as_json:
        _echo_json(report)
    else:
        for line in doc.render(report):
            click.echo(line)
    if report["problems"]:
        if not as_json:
            click.echo(f"shmq: error: {report['problems'][0]}"
                       + (f" (and {len(report['problems']) - 1} more above)" if len(report["problems"]) > 1 else ""),
                       err=True)
        sys.exit(1)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args):
    """Run the benchmark matrix (python -m bench; needs a shmq checkout). ARGS go to
    it, e.g. shmq bench --quick."""
    import subprocess

    if not os.path.exists(os.path.join("bench", "__main__.py")):
        raise ShmqError("shmq bench runs the bench/ folder of a shmq checkout: cd into one first")
    sys.exit(subprocess.call([sys.executable, "-m", "bench", *args]))
