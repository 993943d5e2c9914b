"""What a reboot lost, rebuilt on start: queues, streams and the exchange table."""

import logging
import os

from . import dmsq
from ..engine.broker import Broker
from ..engine.queues.exchange import _KINDS  # a binding's kind ("q", "s") -> "queue", "stream"
from ..errors import ShmqError
from .files import owner_of
from .queues import recover_queues
from .streams import rebuild_stream

log = logging.getLogger("shmq.persistence")


def recover(broker: Broker, data_dir: str, upgraded: dict | None = None) -> list[str]:
    """On start: rebuild every queue and stream whose segments are gone from its
    snapshots and its write-ahead logs; keep the ones still in shared memory. The links
    between them are made once all are there: dead-letter queues (``create_queues``),
    then the exchanges' bindings; a link to something that is nowhere is a warning
    naming both. Damaged files are replayed up to the damage and moved aside
    (``.corrupt``). Returns the names rebuilt: queues by name, streams as ``@NAME``.
    ``upgraded``: ``upgrade``'s, the layout version an older shmq's memory held each in."""
    upgraded = upgraded or {}
    owners = {owner for owner in map(owner_of, os.listdir(data_dir)) if owner is not None}
    rebuilt = recover_queues(broker, data_dir, [o for o in owners if not o.startswith("@")], upgraded)
    live = set(broker.list_streams())
    for name in sorted({o[1:] for o in owners if o.startswith("@")} - live):
        try:
            if rebuild_stream(broker, data_dir, name, upgraded.get("@" + name)):
                rebuilt.append("@" + name)
        except (ValueError, TypeError, OSError, ShmqError) as e:
            log.error("%s: cannot rebuild stream %s: %s", data_dir, name, e)
    _recover_exchanges(broker, data_dir)
    return rebuilt


def _recover_exchanges(broker: Broker, data_dir: str) -> None:
    """Put back the exchanges and bindings saved in the data dir's exchange file, when
    the namespace has no exchange table in shared memory (memory is newer than the file).
    Bindings to a queue or stream that is not there once every one is rebuilt (a
    "memory" one) are dropped, each with a warning naming both. A damaged file is moved
    aside and said in one line; start-up goes on."""
    path = os.path.join(data_dir, dmsq.EXCHANGES_FILE)
    if not os.path.exists(path) or broker.exchange_table().exists():
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
    try:
        restored, bindings, dropped = restore_exchanges(broker, table)
    except (ValueError, OSError, ShmqError) as e:
        log.error("%s: cannot restore the exchanges: %s", path, e)
        return
    for exchange, kind, target, pattern in dropped:
        log.warning("%s", dropped_binding(exchange, kind, target, pattern,
                                          f"none in shared memory, none rebuilt from {data_dir}"),
                    extra={"event": "binding_dropped", "exchange": exchange, "kind": kind, "target": target,
                           "pattern": pattern, "data_dir": data_dir})
    log.info("exchanges restored from %s: %d exchange(s), %d binding(s)%s", path, len(restored), bindings,
             f" ({len(dropped)} to queues or streams not there dropped)" if dropped else "",
             extra={"event": "exchanges_restored", "data_dir": data_dir, "exchanges": len(restored),
                    "bindings": bindings, "dropped": len(dropped)})


def restore_exchanges(broker: Broker, table: dict) -> tuple[list[str], int, list[tuple[str, str, str, str]]]:
    """Put back the exchanges of ``table`` (``dmsq.read_exchanges``) that the namespace
    does not have (those it has stay as they are), with their bindings to the queues and
    streams there now: make those first. Returns (the exchanges put back, how many
    bindings they have, the bindings dropped: (exchange, "queue" or "stream", target,
    pattern)). Raises ValueError, OSError or ShmqError when the table cannot be written."""
    exchanges = broker.exchange_table()
    here = set(exchanges.table())
    there = {"q": set(broker.list_queues()), "s": set(broker.list_streams())}
    new, bindings, dropped = {}, 0, []
    for name, x in table.items():
        if name in here:
            continue
        kept = [b for b in x["bindings"] if b[1] in there[b[0]]]
        dropped += [(name, _KINDS[k], t, p) for k, t, p in x["bindings"] if t not in there[k]]
        bindings += len(kept)
        new[name] = {**x, "bindings": kept}
    if new:
        exchanges.restore(new)
    return sorted(new), bindings, dropped


def dropped_binding(exchange: str, kind: str, target: str, pattern: str, why: str) -> str:
    """The warning for a binding left out because its queue or stream is not there."""
    return (f"exchange {exchange!r} has lost its binding to {kind} {target!r} (pattern {pattern!r}): there is no "
            f"{kind} {target!r} ({why}); what it routes there is not delivered")
