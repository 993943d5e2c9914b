"""``shmq server``: the TCP front and the housekeeper in one process, until a signal."""

import asyncio
import logging
import resource
import signal

from ..broker import Broker
from .housekeeper import Housekeeper
from .tcp import TcpServer

__all__ = ["serve", "HOUSEKEEPING_INTERVAL_S"]

HOUSEKEEPING_INTERVAL_S = 0.25

log = logging.getLogger("shmq.server")


def _raise_fd_limit():
    """Thousands of connections need thousands of descriptors: use the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(namespace, host="127.0.0.1", port=7878, token=None, max_frame_bytes=16 * 2**20, ready=None):
    """Serve until SIGINT/SIGTERM. ``ready`` (an optional callable) gets the bound port."""
    _raise_fd_limit()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with Broker(namespace) as broker, Broker(namespace) as keeper_broker:
        server = await TcpServer(broker, host, port, token, max_frame_bytes).start()
        keeper = Housekeeper(keeper_broker)
        log.info("serving namespace %s on %s:%d (%d queues)%s; housekeeping every %.2fs", namespace, host,
                 server.port, len(broker.list_queues()), ", token required" if token else "",
                 HOUSEKEEPING_INTERVAL_S)
        if ready is not None:
            ready(server.port)

        async def housekeeping():
            while not stop.is_set():
                await asyncio.to_thread(keeper.run_once)
                try:
                    await asyncio.wait_for(stop.wait(), HOUSEKEEPING_INTERVAL_S)
                except asyncio.TimeoutError:
                    pass

        task = asyncio.create_task(housekeeping())
        await stop.wait()
        log.info("stopping: answering what is in flight")
        await server.stop()
        await task
        keeper.close()
    log.info("stopped")
