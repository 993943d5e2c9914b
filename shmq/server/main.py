"""``shmq server``: the TCP front, the housekeeper and the snapshots in one process,
until a signal.

Strategy: the event loop only serves clients (``tcp.TcpServer``); housekeeping,
snapshots and log fsyncs run in threads (``asyncio.to_thread``) on brokers of their
own, so the loop never waits on a disk or on a pass over every queue.
"""

import asyncio
import logging
import resource
import signal

from ..auth import advertise, server_token, withdraw
from ..engine.broker import Broker
from ..persistence import Snapshotter, recover
from ..engine.layout import WAL_ALWAYS, WAL_BATCH, WAL_NEVER
from .housekeeper import Housekeeper
from .tcp import TcpServer

__all__ = ["serve", "parse_fsync", "HOUSEKEEPING_INTERVAL_S"]

HOUSEKEEPING_INTERVAL_S = 0.25

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


def _raise_fd_limit():
    """Thousands of connections need thousands of descriptors: use the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _start_persistence(broker, data_dir, mode, ms):
    """Rebuild lost queues, open the logs, snapshot at once. What cannot be written (a
    full disk) is logged and retried by the snapshot loop: the server comes up anyway."""
    try:
        snapshotter = Snapshotter(broker, data_dir, wal_mode=mode, wal_batch_ms=ms)
    except OSError as e:
        raise SystemExit(f"shmq server: cannot use --data-dir {data_dir}: {e}") from None
    rebuilt = recover(broker, data_dir)
    log.info("data dir %s: %d queue(s) rebuilt from snapshots", data_dir, len(rebuilt))
    for step in (snapshotter.open_all_wals, snapshotter.run_once):  # what was rebuilt is on disk again at once
        try:
            step()
        except OSError as e:
            log.error("data dir %s: %s; retrying every interval", data_dir, e)
    return snapshotter


async def serve(namespace, host="127.0.0.1", port=7878, token=None, max_frame_bytes=16 * 2**20, ready=None,
                data_dir=None, snapshot_interval=1.0, fsync="batch:2",
                token_file=None, no_auth=False, limits=None):
    """Serve until SIGINT/SIGTERM. ``ready`` (an optional callable) gets the bound port.

    With ``data_dir``: queues lost with shared memory (a reboot) are rebuilt from their
    snapshots first, then every durable queue is snapshotted every ``snapshot_interval``
    seconds and once more on a clean stop. ``limits`` (``shmq.server.limits.Limits``, default
    its defaults) caps what clients may cost: connections, waiting CONSUMEs, buffered
    bytes, frame and idle deadlines.

    Clients must say HELLO with a token: ``token``, or the one in ``token_file``, else
    the per-user default file (created at the first start; see shmq.auth); none with
    ``no_auth``. This user's clients on this host find it through a runtime file.
    """
    token, auth_note = server_token(token, token_file, no_auth)
    _raise_fd_limit()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with Broker(namespace) as broker, Broker(namespace) as keeper_broker, Broker(namespace) as snap_broker:
        snapshotter = None
        if data_dir is not None:
            mode, ms = parse_fsync(fsync)
            snapshotter = await asyncio.to_thread(_start_persistence, snap_broker, data_dir, mode, ms)
            log.info("data dir %s: snapshots every %.2fs", data_dir, snapshot_interval)
        on_create = snapshotter.open_wal if snapshotter is not None else None
        server = await TcpServer(broker, host, port, token, max_frame_bytes, on_create=on_create,
                                 limits=limits).start()
        keeper = Housekeeper(keeper_broker)
        runtime_file = await asyncio.to_thread(advertise, server.port, host, namespace, token)
        log.info("serving namespace %s on %s:%d (%d queues), %s; housekeeping every %.2fs", namespace, host,
                 server.port, len(broker.list_queues()), auth_note,
                 HOUSEKEEPING_INTERVAL_S)
        if ready is not None:
            ready(server.port)

        async def every(seconds, work, what, first=True):
            """Run ``work`` in a thread every ``seconds`` until stopped (and once more
            after, unless ``first``); a failure is logged and the loop goes on. The rate
            is fixed, start to start: a run begins ``seconds`` after the previous one
            began (at once if that one took longer), so a power loss costs at most one
            interval plus the duration of one run."""
            due = loop.time()
            while True:
                if first or stop.is_set():
                    try:
                        await asyncio.to_thread(work)
                    except Exception:
                        log.exception("%s failed; trying again in %.2fs", what, seconds)
                if stop.is_set():
                    return
                first = True
                due = max(due + seconds, loop.time())
                try:
                    await asyncio.wait_for(stop.wait(), due - loop.time())
                except asyncio.TimeoutError:
                    pass

        tasks = [asyncio.create_task(every(HOUSEKEEPING_INTERVAL_S, keeper.run_once, "housekeeping"))]
        if snapshotter is not None:
            # the snapshot loop ends with a last snapshot after the stop
            tasks.append(asyncio.create_task(every(snapshot_interval, snapshotter.run_once, "snapshot", first=False)))
            if mode == WAL_BATCH:
                tasks.append(asyncio.create_task(every(ms / 1000, snapshotter.sync_logs, "log fsync", first=False)))
        await stop.wait()
        log.info("stopping: answering what is in flight")
        withdraw(runtime_file)
        await server.stop()
        await asyncio.gather(*tasks)  # the snapshot task ends with a last snapshot
        keeper.close()
        if snapshotter is not None:
            snapshotter.close()
    log.info("stopped")
