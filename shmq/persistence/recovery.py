"""What a reboot lost, rebuilt on start: queues, streams and the exchange table; and what
was deleted while the server was stopped, left deleted.

Strategy: the data dir keeps which registry of the namespace the server last ran on
(``REGISTRY_FILE``: ``registry.identity``). At start, the same registry in /dev/shm means
the memory outlived the stop: a queue or stream it no longer lists was deleted meanwhile
(``shmq delete`` needs no server), and its files go as a running server's would. Another
registry (a reboot, a namespace destroyed and made again) means nothing tells a deleted
object from a lost one: every file is rebuilt. A queue or stream the registry lists whose
memory is gone (half removed) is rebuilt from its files either way.
"""

import logging
import os

from ..formats import dmsq
from ..engine.broker import Broker
from ..engine.queues.exchange import _KINDS  # a binding's kind ("q", "s") -> "queue", "stream"
from ..engine.shm.names import queue_segment, stream_base
from ..engine.shm.registry import identity
from ..engine.shm.segment import SHM_DIR
from ..errors import QueueNotFound, ShmqError, StreamNotFound
from .files import REGISTRY_FILE, owner_of, write_atomically
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
    if _same_registry(broker.namespace, data_dir):  # (what an upgrade just took out of memory is not deleted)
        owners = _forget_deleted(broker, data_dir, owners, set(upgraded))
    _free_half_removed(broker, owners)
    rebuilt = recover_queues(broker, data_dir, [o for o in owners if not o.startswith("@")], upgraded)
    live = set(broker.list_streams())
    for name in sorted({o[1:] for o in owners if o.startswith("@")} - live):
        try:
            if rebuild_stream(broker, data_dir, name, upgraded.get("@" + name)):
                rebuilt.append("@" + name)
        except (ValueError, TypeError, OSError, ShmqError) as e:
            log.error("%s: cannot rebuild stream %s: %s", data_dir, name, e)
    _recover_exchanges(broker, data_dir)
    remember_registry(broker.namespace, data_dir)
    return rebuilt


def _registry_file(data_dir: str) -> str:
    return os.path.join(data_dir, REGISTRY_FILE)


def _same_registry(namespace: str, data_dir: str) -> bool:
    """Whether the namespace's registry now is the one the server last ran on here."""
    try:
        with open(_registry_file(data_dir)) as f:
            recorded = f.read().strip()
    except OSError:
        return False
    return bool(recorded) and recorded == identity(namespace)


def remember_registry(namespace: str, data_dir: str) -> None:
    """Note in the data dir which registry the server runs on (once recovered from it)."""
    now = identity(namespace)
    if now is None:
        return
    try:
        write_atomically(_registry_file(data_dir), (now + "\n").encode())
    except OSError as e:  # (a full disk: the next start rebuilds what it finds, as before this file)
        log.error("%s: cannot note the namespace's registry: %s", data_dir, e)


def _forget_deleted(broker: Broker, data_dir: str, owners: set, upgraded: set) -> set:
    """The owners the registry still lists (or ``upgraded`` took out of it to be rebuilt);
    the files of the others (deleted while the server was stopped) removed, one line each."""
    live = set(broker.list_queues()) | {"@" + s for s in broker.list_streams()} | upgraded
    gone = owners - live
    for entry in sorted(os.listdir(data_dir)):
        if owner_of(entry) in gone:
            os.unlink(os.path.join(data_dir, entry))
    for owner in sorted(gone):
        kind, name = ("stream", owner[1:]) if owner.startswith("@") else ("queue", owner)
        log.info("%s %s was deleted while the server was stopped: its files in %s removed", kind, name, data_dir,
                 extra={"event": "deleted_while_stopped", "kind": kind, kind: name, "data_dir": data_dir})
    return owners - gone


def _gone(path: str) -> bool:
    """Whether ``path`` is provably not there: a look that fails otherwise proves nothing."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _free_half_removed(broker: Broker, owners: set) -> None:
    """Free the registry entries of the queues and streams among ``owners`` (which the data
    dir holds) whose memory is gone: then they are rebuilt from their files as lost ones."""
    ns = broker.namespace
    for name in broker.list_queues():
        if name in owners and _gone(os.path.join(SHM_DIR, queue_segment(ns, name).lstrip("/"))):
            try:
                broker.delete_queue(name)
            except QueueNotFound:
                pass
            log.warning("queue %s was half removed (its memory gone, its registry entry left): rebuilt from its "
                        "files", name, extra={"event": "half_removed", "kind": "queue", "queue": name})
    for name in broker.list_streams():
        if "@" + name in owners and _gone(os.path.join(SHM_DIR, stream_base(ns, name).lstrip("/"))):
            try:
                broker.delete_stream(name)
            except StreamNotFound:
                pass
            log.warning("stream %s was half removed (its memory gone, its registry entry left): rebuilt from its "
                        "files", name, extra={"event": "half_removed", "kind": "stream", "stream": name})


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
