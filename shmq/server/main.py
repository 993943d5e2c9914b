"""``shmq server``: the TCP front, the housekeeper and the snapshots in one process,
until a signal.

Strategy: the event loop only serves clients (``tcp.TcpServer``); housekeeping,
snapshots and log fsyncs run in threads (``asyncio.to_thread``) on brokers of their
own, so the loop never waits on a disk or on a pass over every queue.
"""

import asyncio
import dataclasses
import logging
import os
import signal
import ssl
import time

from ..auth import advertise, default_data_dir, server_token, withdraw
from ..engine.broker import Broker
from ..engine.shm.logbell import Bell
from .shmwatch import ShmPressure
from ..engine.shm.names import queue_base, store_prefix, stream_base
from ..engine.shm.segment import SHM_DIR, destroy_namespace
from ..persistence import Snapshotter, recover
from ..persistence.files import owner_of
from ..persistence.upgrade import check_files, upgrade
from ..engine.shm.layout import WAL_ALWAYS, WAL_BATCH, WAL_NEVER
from ..errors import ShmqError
from ..sharing import resolve_group, share_dir
from .housekeeper import ROUND_S as HOUSEKEEPING_INTERVAL_S
from .housekeeper import TICK_S, Housekeeper
from .limits import BASE_FDS, Census, Descriptors, open_fds, raise_fd_limit
from .lock import BrokerLock
from .logsync import LogSyncer
from .loops import loop_name
from .metrics import NO_METRICS, Metrics
from .notify import notify
from .periodic import Periodic
from .tcp import TcpServer
from .transactions import Transactions

__all__ = ["serve", "parse_fsync", "HOUSEKEEPING_INTERVAL_S"]


log = logging.getLogger("shmq.server")


def parse_fsync(policy: str) -> tuple[int, int]:
    """``always`` | ``batch:MS`` | ``never`` -> (mode, batch ms) for the write-ahead logs."""
    if policy == "always":
        return WAL_ALWAYS, 0
    if policy == "never":
        return WAL_NEVER, 0
    if policy.startswith("batch:") and policy[6:].isdigit() and int(policy[6:]) > 0:
        return WAL_BATCH, int(policy[6:])
    raise ValueError(f"--fsync must be always, batch:MS or never, not {policy!r}")


class _FitDescriptors:
    """The server's connections kept within its file descriptors (``limits.Descriptors``):
    fitted at start and again whenever the housekeeper's census changes (queues, streams
    and stores made or deleted), on the loop; said in one line at start, and again when
    the fit changes (it stops or starts fitting, or the lowered limit falls by a tenth)."""

    def __init__(self, descriptors, server, kafka_listener, loop):
        self.descriptors = descriptors
        self.server = server
        self.kafka_listener = kafka_listener
        self.asked = server.limits
        self.loop = loop
        self.said = None  # the Fit last said

    def fit(self, census: Census) -> None:
        """(The housekeeper's thread, or the loop at start.) Fit to ``census``; say it when it matters."""
        fit = self.descriptors.fit(census)
        said = self.said
        if said is None or (fit.fits, fit.overfull) != (said.fits, said.overfull) \
                or fit.max_connections < said.max_connections * 0.9:
            level = logging.INFO if fit.fits else logging.ERROR if fit.overfull else logging.WARNING
            log.log(level, "%s", fit.line(), extra=fit.fields())
            self.said = fit
        if self.loop is None:
            self._apply(fit)
        else:
            self.loop.call_soon_threadsafe(self._apply, fit)

    def _apply(self, fit) -> None:
        self.server.fit_descriptors(fit)
        if self.kafka_listener is not None:  # (its own limits: the DEADBEEF front's, with the same connection limit)
            self.kafka_listener.limits = dataclasses.replace(self.asked, max_connections=self.server.max_connections)


def _start_persistence(broker, data_dir, mode, ms, interval, group=None, disk_free_limit=None):
    """Rebuild lost queues, open the logs, snapshot at once. What cannot be written (a
    full disk) is logged and retried by the snapshot loop: the server comes up anyway.
    ``group``: a gid the data dir is shared with (``sharing.share_dir``)."""
    try:
        if group is not None:
            share_dir(data_dir, group)
        snapshotter = Snapshotter(broker, data_dir, wal_mode=mode, wal_batch_ms=ms, disk_free_limit=disk_free_limit)
    except OSError as e:
        raise ShmqError(f"cannot use --data-dir {data_dir}: {e.strerror or e} (give another --data-dir, "
                        f"or --no-persist)") from None
    started = time.monotonic()
    check_files(data_dir)  # a newer shmq's files, or an older one's memory with none: one line, nothing changed
    rebuilt = recover(broker, data_dir, upgrade(broker, data_dir))
    log.info("data dir %s: %d queue(s) and stream(s) rebuilt from its files", data_dir, len(rebuilt),
             extra={"event": "recovery", "data_dir": data_dir,
                    "queues": [n for n in rebuilt if not n.startswith("@")],
                    "streams": [n[1:] for n in rebuilt if n.startswith("@")],
                    "duration_ms": round((time.monotonic() - started) * 1000, 1)})
    for step in (snapshotter.open_all_wals, lambda: _snapshot(snapshotter, interval, logging.INFO)):
        try:  # what was rebuilt is on disk again at once
            step()
        except OSError as e:
            log.error("data dir %s: %s; retrying every interval", data_dir, e)
    return snapshotter


def _snapshot(snapshotter, interval, level=logging.DEBUG):
    """One snapshot round, logged (the event ``snapshot``): at ``level`` (debug every
    interval; info at start and at the stop), at warning if it took longer than the
    interval; a round where a write failed is never said written: at error at start and
    at the stop, else at ``level`` (each failure itself is logged once as it starts)."""
    started = time.monotonic()
    snapshotter.run_once()
    took = time.monotonic() - started
    failed = snapshotter.last_round.get("failed", 0)
    if failed:
        level = logging.ERROR if level >= logging.INFO else level
        if log.isEnabledFor(level):
            failing = snapshotter.failing()
            first = next(iter(failing.items()), ("", ""))
            log.log(level, "snapshot of %s failed: %d write(s) failed (%s: %s)%s", snapshotter.data_dir, failed,
                    first[0], first[1], f" and {len(failing) - 1} more" if len(failing) > 1 else "",
                    extra={"event": "snapshot_failed", "data_dir": snapshotter.data_dir, **snapshotter.last_round,
                           "duration_ms": round(took * 1000, 1)})
        return
    if took > interval:
        level = logging.WARNING
    if log.isEnabledFor(level):
        log.log(level, "snapshot of %s written in %.1f ms%s", snapshotter.data_dir, took * 1000,
                " (longer than --snapshot-interval)" if level == logging.WARNING else "",
                extra={"event": "snapshot", "data_dir": snapshotter.data_dir, **snapshotter.last_round,
                       "duration_ms": round(took * 1000, 1)})


def kafka_listener_class():
    """The Kafka listener's class, imported only where asked for: its codec (kio) is the
    ``kafka`` extra's, not a core dependency."""
    try:
        from .kafka import KafkaListener
    except ImportError as e:
        raise ShmqError(f"--kafka-port needs the kafka extra ({e.name} is not installed): "
                        "pip install 'shmq[kafka]'") from None
    return KafkaListener


async def serve(namespace, host="127.0.0.1", port=7878, token=None, max_frame_bytes=16 * 2**20, ready=None,
                data_dir=None, snapshot_interval=1.0, fsync="batch:2",
                token_file=None, no_auth=False, limits=None, metrics=None, kafka=None, group=None, tls=None,
                port_settings=None, disk_free_limit=None):
    """Serve until SIGINT/SIGTERM. ``ready`` (an optional callable) gets the bound port.
    ``disk_free_limit``: the data dir's free bytes below which the disk alarm refuses
    puts and appends of "wal" queues and streams (0: never; None: the default, 50 MiB or
    a twentieth of the filesystem if less).

    With ``data_dir``: queues lost with shared memory (a reboot) are rebuilt from their
    snapshots first, then every durable queue is snapshotted every ``snapshot_interval``
    seconds and once more on a clean stop. ``limits`` (``shmq.server.limits.Limits``, default
    its defaults) caps what clients may cost: connections, waiting CONSUMEs, buffered
    bytes, frame and idle deadlines. ``metrics``: (host, port) to serve Prometheus'
    /metrics on (``shmq.server.metrics``; port 0: any free), or None.

    Clients must say HELLO with a token: ``token``, or the one in ``token_file``, else
    the per-user default file (created at the first start; see shmq.auth); none with
    ``no_auth``. This user's clients on this host find it through a runtime file.

    ``kafka``: a dict of ``kafka.KafkaListener``'s arguments (host, port, advertised_host,
    auto_create, auto_create_partitions) to serve Kafka clients too (docs/KAFKA.md), or None.

    ``tls``: an ``ssl.SSLContext`` (``shmq.tls.server_context``): both ports speak only TLS
    (clients: ``tcps://``; Kafka's SSL / SASL_SSL), or None: plain TCP.

    One broker per namespace: if another holds it (``lock.BrokerLock``), BrokerRunning
    (naming its pid) before anything starts.

    ``group`` (a group name or gid, one of this user's): the namespace, its lock file and
    the data dir are shared with that group, 0660 / 2770 (shmq/sharing.py).

    ``port_settings``: what chose each address, by ``port``, ``kafka_port``, ``metrics``
    (a config file's key, say), for the one line a port in use is; default the options.
    """
    gid = None if group is None else resolve_group(group)
    token, auth_note = server_token(token, token_file, no_auth)
    fd_limit = raise_fd_limit()  # thousands of connections need thousands of descriptors: the hard limit
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with BrokerLock(namespace, gid) as lock, Broker(namespace) as broker, Broker(namespace) as keeper_broker, \
            Broker(namespace) as snap_broker:  # the lock first: one broker per namespace, else a one-line refusal
        # the addresses next: a port in use is one line before anything is made (no data dir, no namespace)
        named = port_settings or {}
        server = TcpServer(broker, host, port, token, max_frame_bytes, limits=limits, tls=tls)
        server.port_setting = named.get("port", server.port_setting)
        await server.bind()
        txns = server.txns = Transactions(broker, server.streams)  # the transaction coordinator: every port's
        kafka_listener = None
        if kafka is not None:
            try:
                kafka_listener = kafka_listener_class()(broker, token=token, max_frame_bytes=max_frame_bytes,
                                                   limits=server.limits, tls=tls, transactions=txns,
                                                   **{"host": host, **kafka})
                txns.kafka = kafka_listener
                kafka_listener.port_setting = named.get("kafka_port", kafka_listener.port_setting)
                await kafka_listener.bind()
            except BaseException:
                server.unbind()
                raise
        exporter, snapshotter, syncer, made_ns, made_dir = NO_METRICS, None, None, False, None
        bell = keeper = None
        runtime_file = None
        try:
            if metrics is not None:
                exporter = Metrics(namespace)
                mhost, mport = metrics[0], exporter.start(*metrics, named.get("metrics", "--metrics"))
                log.info("metrics on http://%s:%d/metrics", f"[{mhost}]" if ":" in mhost else mhost, mport,
                         extra={"event": "metrics_started", "host": mhost, "port": mport})
            server.metrics = exporter
            made_ns = broker.create_namespace(gid)  # a server makes its namespace (only it, of the commands that run)
            if data_dir is None:
                upgrade(broker, None)  # an older shmq's memory, and no files to rebuild it from: one line
            if data_dir is not None:
                mode, ms = parse_fsync(fsync)
                made_dir = None if os.path.exists(data_dir) else data_dir
                snapshotter = await asyncio.to_thread(_start_persistence, snap_broker, data_dir, mode, ms,
                                                      snapshot_interval, gid, disk_free_limit)
                if mode == WAL_BATCH:  # rounds only while logs are written (logsync.py)
                    syncer = LogSyncer(snapshotter, ms).start()
                # a local create of a "wal" queue or stream rings it, and waits for its log to be opened
                bell = Bell(namespace, snapshotter.open_all_wals, gid)
                server.on_create = snapshotter.open_wal
                txns.fsync = (mode, ms)  # the transaction journal: synced as the logs are
                if kafka_listener is not None:
                    kafka_listener.on_create = snapshotter.open_wal
                    kafka_listener.state_dir = data_dir  # its producers' sequences, commit metadata: kept there
            _log_persistence(namespace, data_dir, snapshot_interval, fsync)
            # the token told before the port listens: a client that reaches it (one coming
            # back after a restart, at once) finds the runtime file there
            runtime_file = await asyncio.to_thread(advertise, server.port, host, namespace, token)
            await txns.start(data_dir)  # what its journal left completed or aborted, before any request
            # its descriptors: its own now, then what the housekeeper attaches (its survey); the connections
            # that fit beside them and the reserve (said in one line), before the first is accepted
            holders = 2 + (syncer is not None) + (metrics is not None)  # the front's, the housekeeper's, ...
            fitter = _FitDescriptors(
                Descriptors(fd_limit, _own_fds(namespace, data_dir), server.limits.max_connections,
                            ports=1 + (kafka_listener is not None), queue_holders=holders,
                            stream_holders=holders + 2 * (kafka_listener is not None)),
                server, kafka_listener, None)
            keeper = Housekeeper(keeper_broker)
            try:
                await asyncio.to_thread(keeper.survey)
            except Exception as e:  # (said again by the rounds, once, if it goes on)
                log.error("cannot count the namespace's queues and streams: %s", e)
            fitter.fit(keeper.census or Census())
            fitter.loop, keeper.on_census = loop, fitter.fit  # from now on, its rounds' census changes
            await server.start()
            if kafka_listener is not None:
                await kafka_listener.start()
                server.streams.join(kafka_listener.streams)  # one loop serves both ports' waiting reads
                server.kafka_listener = kafka_listener  # a BACKUP keeps its commit metadata (server/backup.py)
        except BaseException:
            if keeper is not None:
                keeper.close()
            withdraw(runtime_file)
            server.unbind()
            if kafka_listener is not None:
                kafka_listener.unbind()
            for step in (exporter.close, syncer.stop if syncer else None, bell.close if bell else None,
                         snapshotter.close if snapshotter else None):
                if step is not None:
                    step()
            _unmake(broker, made_ns, made_dir)
            raise
        exporter.watch(server, snapshotter)  # its open connections, and its snapshots (None: no data dir)
        lock.update(host=host, port=server.port, data_dir=os.path.abspath(data_dir) if data_dir else None,
                    tls=tls is not None, token=token is not None)  # for shmq status
        if kafka_listener is not None:
            lock.update(kafka_host=kafka_listener.host, kafka_port=kafka_listener.port)
            log.info("kafka listener on %s:%d (advertised as %s:%d), %s", kafka_listener.host, kafka_listener.port,
                     kafka_listener.advertised_host, kafka_listener.port,
                     "SASL/PLAIN with the token as the password" if token else "no authentication",
                     extra={"event": "kafka_started", "host": kafka_listener.host, "port": kafka_listener.port,
                            "advertised_host": kafka_listener.advertised_host})
        if tls is not None:
            _log_tls(tls)
        log.info("serving namespace %s on %s:%d (%d queues), %s; housekeeping every %.2fs; %s event loop",
                 namespace, host, server.port, len(broker.list_queues()), auth_note, HOUSEKEEPING_INTERVAL_S,
                 loop_name(loop), extra={"event": "server_started", "namespace": namespace, "host": host,
                                         "port": server.port, "pid": os.getpid(), "data_dir": data_dir,
                                         "loop": loop_name(loop)})
        if ready is not None:
            ready(server.port)
        notify(READY="1", STATUS=f"serving namespace {namespace} on {host}:{server.port}")  # Type=notify

        shm_watch = ShmPressure()  # /dev/shm running short: said once per episode

        def housekeeping():
            shm_watch.check()
            return keeper.tick()

        periodic = [Periodic(TICK_S, housekeeping, "housekeeping").start()]
        if snapshotter is not None:
            # the snapshot runs end with a last snapshot after the stop
            said = {}

            def snapshot_round():  # at info the last one, after the stop
                _snapshot(snapshotter, snapshot_interval, logging.INFO if stop.is_set() else logging.DEBUG)
                failing = snapshotter.failing()
                if failing != said:  # what `shmq doctor` shows of a running broker
                    said.clear()
                    said.update(failing)
                    lock.update(snapshot_failing={"since": time.time(), "what": failing} if failing else None)

            periodic.append(Periodic(snapshot_interval, snapshot_round, "snapshot", first=False).start())
        await stop.wait()
        notify(STOPPING="1", STATUS="stopping: answering what is in flight")
        for p in periodic:
            p.stop()
        log.info("stopping: answering what is in flight", extra={"event": "server_stopping"})
        withdraw(runtime_file)
        if kafka_listener is not None:
            await kafka_listener.stop()
        await server.stop()
        txns.stop()
        await asyncio.to_thread(exporter.close)
        if syncer is not None:
            await asyncio.to_thread(syncer.stop)  # with a last round
        for p in periodic:  # the snapshot thread ends with a last snapshot
            await asyncio.to_thread(p.join)
        keeper.close()
        if bell is not None:
            bell.close()
        unsaved = snapshotter is not None and snapshotter.last_round.get("failed", 0)
        if snapshotter is not None:
            snapshotter.close()
    if unsaved:
        log.error("stopped without a complete last snapshot in %s: what it could not write is lost at a reboot "
                  "(the queues stay in shared memory until then; free space there and start the server again)",
                  data_dir, extra={"event": "server_stopped", "namespace": namespace, "snapshot_failed": unsaved})
        return 1
    log.info("stopped", extra={"event": "server_stopped", "namespace": namespace})
    return 0


def _own_fds(namespace, data_dir) -> int:
    """The descriptors the server holds now, less those on its namespace's queues,
    streams and keyed stores and their files in the data dir (``limits.Descriptors``
    counts those per object, for every handle the server keeps)."""
    objects = tuple(os.path.join(SHM_DIR, prefix.lstrip("/"))
                    for prefix in (queue_base(namespace), stream_base(namespace, ""), store_prefix(namespace)))
    here = os.path.abspath(data_dir) + os.sep if data_dir is not None else None

    def skip(target):
        if target.startswith(objects):
            return True
        return here is not None and target.startswith(here) and owner_of(target[len(here):]) is not None

    held = open_fds(skip)
    return BASE_FDS if held is None else held


def _unmake(broker, made_ns, made_dir):
    """A start that failed takes back what it made: its namespace, if nothing was put in
    it meanwhile, and its data dir, if left empty."""
    if made_ns and not (broker.list_queues() or broker.list_streams() or broker.list_exchanges()):
        destroy_namespace(broker.namespace)
    if made_dir is not None:
        try:
            os.rmdir(made_dir)  # only if empty
        except OSError:
            pass


def _log_tls(tls):
    """Say at start that clients must speak TLS, and whether they must show a certificate (event ``tls``)."""
    mutual = tls.verify_mode == ssl.CERT_REQUIRED
    log.info("TLS on every port: clients use tcps:// (Kafka clients SSL or SASL_SSL)%s",
             "; they must show a certificate the --tls-client-ca signed" if mutual else "",
             extra={"event": "tls", "client_certificates": mutual})


def _log_persistence(namespace, data_dir, interval, fsync):
    """Say at start where the files go (event ``persistence``)."""
    if data_dir is None:
        log.info("no data dir (--no-persist): queues and streams live in shared memory only, a reboot loses "
                 "them; 'wal' ones refuse writes", extra={"event": "persistence", "data_dir": None})
        return
    default = os.path.abspath(data_dir) == os.path.abspath(default_data_dir(namespace))
    log.info("data dir %s%s: snapshots every %.2fs, write-ahead logs fsynced %s", data_dir,
             " (the default for this namespace; --data-dir DIR to choose, --no-persist for none)" if default else "",
             interval, fsync, extra={"event": "persistence", "data_dir": data_dir, "default": default,
                                     "snapshot_interval": interval, "fsync": fsync})
