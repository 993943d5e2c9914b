"""What a reboot lost, rebuilt on start: queues, streams and the exchange table."""

import logging
import os

from .. import dmsq
from ..engine.broker import Broker
from ..errors import ShmqError
from .files import owner_of
from .queues import recover_queues
from .streams import rebuild_stream

log = logging.getLogger("shmq.persistence")

def recover(broker: Broker, data_dir: str) -> list[str]:
    """On start: rebuild every queue and stream whose segments are gone from its
    snapshots and its write-ahead logs; keep the ones still in shared memory. Damaged
    files are replayed up to the damage and moved aside (``.corrupt``). Returns the names
    rebuilt: queues by name, streams as ``@NAME``."""
    owners = {owner for owner in map(owner_of, os.listdir(data_dir)) if owner is not None}
    rebuilt = recover_queues(broker, data_dir, [o for o in owners if not o.startswith("@")])
    live = set(broker.list_streams())
    for name in sorted({o[1:] for o in owners if o.startswith("@")} - live):
        try:
            if rebuild_stream(broker, data_dir, name):
                rebuilt.append("@" + name)
        except (ValueError, TypeError, OSError, ShmqError) as e:
            log.error("%s: cannot rebuild stream %s: %s", data_dir, name, e)
    _recover_exchanges(broker, data_dir)
    return rebuilt


def _recover_exchanges(broker: Broker, data_dir: str) -> None:
    """Put back the exchanges and bindings saved in the data dir's exchange file, when
    the namespace has no exchange table in shared memory (memory is newer than the file).
    Bindings to a queue or stream that is not there (a "memory" one) are dropped. A
    damaged file is moved aside and said in one line; start-up goes on."""
    path = os.path.join(data_dir, dmsq.EXCHANGES_FILE)
    exchanges = broker.exchange_table()
    if not os.path.exists(path) or exchanges.exists():
        return
    try:
        table = dmsq.read_exchanges(path)
    except ValueError as e:
        aside = dmsq.quarantine(path)
        log.error("%s; no exchanges restored; file moved to %s", e, aside,
                  extra={"event": "file_quarantined", "file": path, "moved_to": aside, "error": str(e),
                         "replayed": 0})
        return
    except OSError as e:
        log.error("%s: cannot read the exchange table: %s", path, e)
        return
    there = {"q": set(broker.list_queues()), "s": set(broker.list_streams())}
    bindings = dropped = 0
    for x in table.values():
        kept = [b for b in x["bindings"] if b[1] in there[b[0]]]
        dropped += len(x["bindings"]) - len(kept)
        bindings += len(kept)
        x["bindings"] = kept
    try:
        exchanges.restore(table)
    except (ValueError, OSError, ShmqError) as e:
        log.error("%s: cannot restore the exchanges: %s", path, e)
        return
    log.info("exchanges restored from %s: %d exchange(s), %d binding(s)%s", path, len(table), bindings,
             f" ({dropped} to queues or streams not there dropped)" if dropped else "",
             extra={"event": "exchanges_restored", "data_dir": data_dir, "exchanges": len(table),
                    "bindings": bindings, "dropped": dropped})
