"""BACKUP (``shmq backup``): the server copies every durable queue and stream, the
exchanges, its Kafka listener's commit metadata and its transactions into a new directory of its host
(``persistence.backup``, which says what the copy promises).

Strategy: what only the loop may read (the Kafka listener's state) is taken on the loop,
when the request comes; the copy itself runs in a thread of the loop's executor
(``handlers.OffLoop``), on a broker handle of its own, so the loop serves every client
meanwhile, the writers whose messages are being copied included. One backup at a time.
"""

import asyncio
import os
import threading

from ..engine.broker import Broker
from ..persistence.backup import backup

__all__ = ["start"]

TXNS_WAIT_S = 30.0  # the loop answers at once; a bound all the same
_ONE = threading.Lock()  # a second BACKUP waits for the first (two copies at once only halve the disk's speed)


def start(server, dest: str):
    """On the loop: check ``dest`` (absolute: a path on the server's host, which a client
    elsewhere cannot make absolute for it) and take the Kafka listener's state
    (``server.kafka_listener``, if it has one) and the transactions' (``server.txns``);
    returns the copy, to run in a thread, whose
    result is ``persistence.backup.backup``'s summary."""
    if not os.path.isabs(dest):
        raise ValueError(f"dest {dest!r} is not an absolute path: a backup goes into a directory of the server's "
                         "host, named from its root")
    listener = getattr(server, "kafka_listener", None)
    kafka = txns = None
    if listener is not None:
        from .kafka.state import for_backup

        kafka = for_backup(listener)
    coordinator = getattr(server, "txns", None)
    if coordinator is not None:
        loop = asyncio.get_running_loop()

        async def rows():
            return coordinator.rows()

        def txns():  # the transactions, taken on the loop once the streams are copied (persistence.backup)
            return asyncio.run_coroutine_threadsafe(rows(), loop).result(TXNS_WAIT_S)
    namespace = server.broker.namespace

    def run():
        with _ONE, Broker(namespace) as broker:
            return backup(broker, dest, kafka, txns)

    return run
