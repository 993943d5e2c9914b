"""Exchanges: named routers of one namespace, bound to queues and streams.

Strategy: the exchanges of a namespace are one small table shared by every process, in
one segment beside the registry (``shmq.NS.exchanges``, 0600): a robust mutex and two
slots that hold the table as msgpack. A change (create, delete, bind, unbind) writes the
new table into the slot not in use, then stores one 8-byte word naming the slot, its
length and a generation: the commit. A process killed anywhere leaves the old table or
the new one whole, so a lock taken from a dead holder needs no repair. A publish reads
that word without the lock and copies the table again (under the lock) only when the
generation moved.

A publish then puts the message into each matching target in turn, each under that
target's own lock: never two locks at once. So a crash mid-publish leaves the message in
some targets only, and the publisher, whose call never returned, retries: with the same
``dedup_id`` the queues that have it drop the repeat (within their ``dedup_window``).
Streams have no dedup: a retry appends again, and the record carries the id in its
``x-dedup-id`` header so that readers can drop repeats. A target that no longer exists
is passed over and its bindings dropped.

The segment is made on the first create of an exchange, under the registry's lock
(which makes the namespace's registry if it has none: a create makes a namespace; a
delete, bind or unbind in a namespace with no table finds no exchange and makes
nothing). A creator killed half-way leaves it unpublished, and the next creator,
holding that lock too, makes it again; it goes with the namespace (``destroy_namespace``).
"""

import ctypes
import struct

import msgpack

from ...errors import ExchangeExists, ExchangeNotFound, LimitExceeded, QueueNotFound, StreamNotFound
from ...model.checks import MAX_KEY_CHARS, check_pattern, check_routing_key
from ..shm.mutex import RobustMutex, init_mutex
from ..shm.process import current_identity
from .lanes import attach
from ..shm.registry import Registry
from ..shm.names import exchanges_segment
from ..shm.segment import check_queue_name, create_segment, open_segment, unlink_segment
from ..streams.stream import Stream

__all__ = ["Exchanges", "TYPES", "topic_matches", "check_pattern", "check_routing_key", "MAX_KEY_CHARS"]

TYPES = ("fanout", "topic")
DEDUP_HEADER = "x-dedup-id"  # on a stream record published with a dedup id

_MAGIC = b"SHMX"
_VERSION = 1
_HEADER = struct.Struct("<4sHHQQ")  # magic, version, pad, creator pid, creator start_ms
_MUTEX_OFF = 64
_COMMIT_OFF = 128  # generation << 32 | slot << 24 | length
_WORD = struct.Struct("<Q")
_SLOT_OFF = 4096
_SLOT_BYTES = 256 * 1024  # the largest table, encoded
_SIZE = _SLOT_OFF + 2 * _SLOT_BYTES
_KINDS = {"q": "queue", "s": "stream"}


def _words(text: str) -> list[str]:
    return text.split(".") if text else []  # "" has no words; "a..b" has an empty one


def topic_matches(pattern: str, key: str) -> bool:
    """Whether ``key`` matches the topic ``pattern``, as AMQP's topic exchange: both are
    words split on "."; in the pattern ``*`` is exactly one word, ``#`` zero or more."""
    pw, kw = _words(pattern), _words(key)
    # can[j]: the pattern's words so far match the key's first j words
    can = [True] + [False] * len(kw)
    for p in pw:
        if p == "#":
            for j in range(1, len(kw) + 1):
                can[j] = can[j] or can[j - 1]
        else:
            for j in range(len(kw), 0, -1):
                can[j] = can[j - 1] and (p == "*" or p == kw[j - 1])
            can[0] = False
    return can[len(kw)]


class Exchanges:
    """The exchange table of one namespace (attached on first use)."""

    lock_timeout = None  # as Queue.lock_timeout, for the lock and the targets' handles

    def __init__(self, namespace: str):
        self.namespace = namespace
        self._name = exchanges_segment(namespace)
        self._seg = None
        self._mutex = None
        self._gen = None
        self._table = {}
        self._handles = {}  # (kind, name) -> an attached Queue or Stream, for publish

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles.clear()
        if self._seg is not None:
            self._mutex = None
            self._seg.close()
            self._seg = None

    # ---------------------------------------------------------------- the segment
    def _open(self):
        try:
            seg = open_segment(self._name)
        except (FileNotFoundError, ValueError):
            return None
        if seg.size < _SIZE or _HEADER.unpack_from(seg._mmap, 0)[0] != _MAGIC:
            seg.close()
            return None
        return seg

    def _attach(self, create: bool) -> bool:
        """Attach to the segment (making it, with ``create``); False if there is none."""
        if self._seg is not None:
            return True
        seg = self._open()
        if seg is None:
            if not create:
                return False
            registry = Registry(self.namespace)  # (made if the namespace has none: a create makes it)
            try:
                with registry:
                    seg = self._open()
                    if seg is None:  # none, or one its creator died making: (re)make it
                        unlink_segment(self._name)
                        seg = create_segment(self._name, _SIZE, group=registry.group)
                        pid, start = current_identity()
                        _HEADER.pack_into(seg._mmap, 0, b"\0\0\0\0", _VERSION, 0, pid, start)
                        init_mutex(ctypes.addressof(ctypes.c_char.from_buffer(seg._mmap, _MUTEX_OFF)))
                        self._write(seg._mmap, {}, 1)
                        seg._mmap[0:4] = _MAGIC  # published
            finally:
                registry.close()
        self._seg = seg
        self._mutex = RobustMutex(ctypes.addressof(ctypes.c_char.from_buffer(seg._mmap, _MUTEX_OFF)))
        return True

    def _lock(self):
        wait = self.lock_timeout
        if self._mutex.acquire(wait_s=wait):
            self._mutex.mark_consistent()  # the commit word is whole: nothing to repair

    @staticmethod
    def _word(mm):
        word = _WORD.unpack_from(mm, _COMMIT_OFF)[0]
        return word >> 32, (word >> 24) & 1, word & 0xFFFFFF

    @staticmethod
    def _write(mm, table, gen, slot=0):
        data = msgpack.packb(table, use_bin_type=True)
        if len(data) > _SLOT_BYTES:
            raise LimitExceeded(f"the exchanges of a namespace take {_SLOT_BYTES} bytes at most "
                                f"(this change needs {len(data)}): delete exchanges or bindings first")
        off = _SLOT_OFF + slot * _SLOT_BYTES
        mm[off:off + len(data)] = data
        _WORD.pack_into(mm, _COMMIT_OFF, gen << 32 | slot << 24 | len(data))  # the commit

    def _load(self, locked=False) -> dict:
        """The table (cached while its generation stays)."""
        mm = self._seg._mmap
        gen, slot, n = self._word(mm)
        if gen == self._gen and not locked:
            return self._table
        if not locked:
            self._lock()
        try:
            gen, slot, n = self._word(mm)
            off = _SLOT_OFF + slot * _SLOT_BYTES
            self._table = msgpack.unpackb(bytes(mm[off:off + n]), raw=False)
            self._gen = gen
        finally:
            if not locked:
                self._mutex.release()
        return self._table

    def _change(self, change, make=False):
        """``change(table)`` (a copy it may edit) under the lock; the edited table is
        committed unless it returns ``(result, False)``. Returns its result. With no
        table, only ``make`` (a create) makes one; else the change sees an empty table."""
        if not self._attach(create=make):
            return change({})[0]
        self._lock()
        try:
            table = self._load(locked=True)
            table = {k: {"type": v["type"], "bindings": [list(b) for b in v["bindings"]]} for k, v in table.items()}
            result, changed = change(table)
            if changed:
                gen, slot, _n = self._word(self._seg._mmap)
                self._write(self._seg._mmap, table, gen + 1, 1 - slot)
            return result
        finally:
            self._mutex.release()

    def _missing(self, name):
        return ExchangeNotFound(f"no exchange {name!r} in namespace {self.namespace!r}")

    # ---------------------------------------------------------------- admin
    def create(self, name: str, type: str = "fanout", exist_ok: bool = False) -> None:
        check_queue_name(name)
        if type not in TYPES:
            raise ValueError(f"exchange type must be one of {', '.join(TYPES)}, not {type!r}")

        def change(table):
            old = table.get(name)
            if old is not None:
                if old["type"] != type:
                    raise ExchangeExists(f"exchange {name!r} exists as a {old['type']} exchange, not {type}")
                if not exist_ok:
                    raise ExchangeExists(f"exchange {name!r} already exists in namespace {self.namespace!r}")
                return None, False
            table[name] = {"type": type, "bindings": []}
            return None, True

        self._change(change, make=True)

    def delete(self, name: str) -> None:
        def change(table):
            if table.pop(name, None) is None:
                raise self._missing(name)
            return None, True

        self._change(change)

    def exists(self) -> bool:
        """Whether the namespace has an exchange table (made by the first create)."""
        return self._attach(create=False)

    def table(self) -> dict:
        """{name: {"type": ..., "bindings": [[kind, target, pattern], ...]}} (kind "q" or "s")."""
        return self._load() if self._attach(create=False) else {}

    def names(self) -> list[str]:
        return sorted(self.table())

    def info(self, name: str) -> dict:
        """An exchange's type and bindings: {"name", "type", "bindings": [{"target",
        "kind" ("queue" or "stream"), "pattern"}]}."""
        x = self.table().get(name)
        if x is None:
            raise self._missing(name)
        return {"name": name, "type": x["type"],
                "bindings": [{"target": t, "kind": _KINDS[k], "pattern": p} for k, t, p in x["bindings"]]}

    def bind(self, name: str, kind: str, target: str, pattern: str = "#") -> None:
        """Bind ``target`` (kind "q" or "s", known to exist) with ``pattern``; binding
        again with the same pattern changes nothing."""
        check_pattern(pattern)

        def change(table):
            x = table.get(name)
            if x is None:
                raise self._missing(name)
            if [kind, target, pattern] in x["bindings"]:
                return None, False
            x["bindings"].append([kind, target, pattern])
            return None, True

        self._change(change)

    def unbind(self, name: str, target: str, pattern: str | None = None, kind: str | None = None) -> int:
        """Drop the bindings of ``target`` (only the one of ``pattern``, if given);
        returns how many went."""
        def change(table):
            x = table.get(name)
            if x is None:
                raise self._missing(name)
            keep = [b for b in x["bindings"] if not (b[1] == target and (pattern is None or b[2] == pattern)
                                                    and (kind is None or b[0] == kind))]
            dropped = len(x["bindings"]) - len(keep)
            x["bindings"] = keep
            return dropped, bool(dropped)

        return self._change(change)

    def drop_target(self, kind: str, target: str) -> int:
        """Drop every binding of ``target`` (kind "q" or "s"), in every exchange: it was
        deleted. Returns how many went; the table is locked only when it has some."""
        if not any(b[0] == kind and b[1] == target for x in self.table().values() for b in x["bindings"]):
            return 0

        def change(table):
            dropped = 0
            for x in table.values():
                keep = [b for b in x["bindings"] if not (b[0] == kind and b[1] == target)]
                dropped += len(x["bindings"]) - len(keep)
                x["bindings"] = keep
            return dropped, bool(dropped)

        return self._change(change)

    def restore(self, table: dict) -> None:
        """Put back exchanges a snapshot saved (``table()``'s form); those here stay."""
        def change(current):
            for name, x in table.items():
                if name not in current and x.get("type") in TYPES:
                    current[name] = {"type": x["type"], "bindings": [list(b)[:3] for b in x.get("bindings", ())]}
            return None, True

        self._change(change, make=bool(table))  # (a restore is a create)

    # ---------------------------------------------------------------- publish
    def routes(self, name: str, routing_key: str) -> list[tuple[str, str]]:
        """The targets (kind, name) a message with ``routing_key`` goes to, each once, in
        binding order."""
        x = self.table().get(name)
        if x is None:
            raise self._missing(name)
        out = []
        for kind, target, pattern in x["bindings"]:
            if (kind, target) not in out and (x["type"] == "fanout" or topic_matches(pattern, routing_key)):
                out.append((kind, target))
        return out

    def _handle(self, kind, target, fresh=False):
        key = (kind, target)
        h = self._handles.get(key)
        if h is not None and (fresh or (kind == "q" and h.deleted)):
            self._handles.pop(key).close()
            h = None
        if h is None:
            h = attach(self.namespace, target) if kind == "q" else Stream(self.namespace, target)
            if kind == "q" and self.lock_timeout is not None:
                h.lock_timeout = self.lock_timeout
            self._handles[key] = h
        return h

    def publish(self, name: str, body, routing_key: str = "", headers=None, dedup_id=None,
                timeout=None) -> list[tuple[str, str]]:
        """Put ``body`` into every queue and append it to every stream that ``name`` routes
        ``routing_key`` to; returns the targets (kind, name) that got it. A full queue waits
        up to ``timeout`` seconds, then QueueFull (the targets before it have the message:
        retry with a ``dedup_id``). Targets deleted since they were bound are passed over,
        and their bindings dropped."""
        check_routing_key(routing_key)
        if dedup_id is not None and not isinstance(dedup_id, str):
            raise TypeError(f"dedup_id must be a str, not {type(dedup_id).__name__}")
        done, gone = [], []
        for kind, target in self.routes(name, routing_key):
            for attempt in (0, 1):  # a cached handle of a deleted target: attach once more
                try:
                    h = self._handle(kind, target, fresh=attempt == 1)
                    if kind == "q":
                        if dedup_id is None:
                            h.put(body, headers, timeout)
                        else:
                            h.put(body, headers, timeout, dedup_id=dedup_id)
                    else:
                        hdrs = headers if dedup_id is None else {**(headers or {}), DEDUP_HEADER: dedup_id}
                        h.append(body, key=routing_key.encode() if routing_key else None, headers=hdrs)
                    done.append((kind, target))
                    break
                except (QueueNotFound, StreamNotFound):
                    if attempt == 1:
                        self._handles.pop((kind, target), None)
                        gone.append((kind, target))
        for kind, target in gone:
            try:
                self.unbind(name, target, kind=kind)
            except ExchangeNotFound:
                break
        return done
