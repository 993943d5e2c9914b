"""The local broker: create, attach, list and delete the queues and streams of one
namespace.

Strategy: a Broker is a thin handle on the namespace registry. It never sits on the
message path: a Queue handle it returns talks to shared memory directly. Attaching
makes nothing: a namespace's registry is made by the first create of a queue, a stream
or an exchange in it (or by ``shmq server``), so a mistyped namespace is never made by
looking at it; until then the namespace reads as empty.
"""

import os
import time
import weakref

from .shm import header
from .shm import layout as L
from .shm.memory import Memory, pinned_bytes
from .shm.process import monotonic_offset
from .shm.registry import CREATING, DELETING, LIVE, Registry
from .shm.logbell import await_log
from .shm.names import default_namespace  # noqa: F401  (re-exported: Broker's callers import it here)
from .shm.names import NOT_EMPTY, NOT_FULL, partition_segment, queue_segment, stream_base
from .shm.segment import (SHM_DIR, check_namespace, check_queue_name, create_segment, create_semaphore, lane_entries,
                          share_namespace, unlink_segment, unlink_semaphore)
from ..model import faces
from ..model.settings import FIXED_QUEUE_SETTINGS, FIXED_STREAM_SETTINGS, MUTABLE_QUEUE_SETTINGS
from ..model.settings import MUTABLE_STREAM_SETTINGS, QUEUE, QUEUE_SECONDS, STREAM, STREAM_SECONDS
from ..errors import (
    NamespaceNotFound, QueueExists, QueueNotFound, SettingsMismatch, ShmqError, StreamExists, StreamNotFound,
)
from ..serializers import SerializerSpec
from ..serializers import resolve as resolve_serializer
from ..sharing import check_deletable, resolve_group
from .streams.partition import create_partition
from .queues import deadletter, lifetime
from .queues.lanes import MAX_LANES, LanedQueue, attach
from .queues.queue import Queue
from .queues.serialized import SerializedQueue
from .streams.stream import Stream
from .streams.multiconsumer import MultiConsumer

__all__ = ["Broker", "DEFAULT_PROCESS_SLOTS", "MUTABLE_QUEUE_SETTINGS", "FIXED_QUEUE_SETTINGS",
           "MUTABLE_STREAM_SETTINGS", "FIXED_STREAM_SETTINGS", "STREAM_SETTINGS", "stream_settings",
           "check_stream_settings"]

# what ``update_queue`` can change on a live queue (model/settings.py's table says): each is a
# word of its header that the operations read as they go; and what it cannot: the ring's size
# and record bound, the priority levels and the lanes are the layout of its memory, the
# durability whether a log exists (docs/QUEUES.md, "Changing a live queue"). What
# ``update_stream`` can change on a live stream: the words of its header that every handle
# reads as it goes (``layout.STREAM_LIVE``), and the partition count, which only grows; and what
# it cannot: a partition's ring, what a full one does, and whether logs exist (docs/STREAMS.md)
STREAM_SETTINGS = MUTABLE_STREAM_SETTINGS + FIXED_STREAM_SETTINGS  # what a snapshot keeps, a rebuild creates with

DEFAULT_PROCESS_SLOTS = 256
LIFETIME_SWEEP_NS = 1_000_000_000  # a local create or declare sweeps unused queues (``lifetime``) at most this often
DEFAULT_MAX_MESSAGE_BYTES = 2**20
_MIN_BYTES = 4096
_DURABILITY_MODES = ("memory", "snapshot", "wal")
_COMPACTION_WORDS = ("compact", "delete_retention_ns", "dirty_ratio_ppm", "max_compaction_lag_ns")
_STREAM = "@"  # a stream's registry entry is "@NAME": no queue name starts with "@"


class Broker:
    """Local access to a namespace's queues (``shmq.connect()``)."""

    def __init__(self, namespace: str = "shmq", create: bool = True):
        """Attach to ``namespace``; nothing is made by attaching. ``create=True``: a
        namespace that does not exist yet is made by this handle's first create_queue,
        create_stream or create_exchange (until then it lists nothing); ``create=False``:
        NamespaceNotFound (a FileNotFoundError) if it does not exist now."""
        self.namespace = check_namespace(namespace)
        self._closed = False
        self._queues = weakref.WeakSet()
        try:
            self._registry = Registry(namespace, create=False)
        except FileNotFoundError:
            if not create:
                raise NamespaceNotFound(f"no namespace {namespace!r} on this host (nothing made a queue, stream or "
                                        "exchange in it): check the name") from None
            self._registry = None  # made by the first create (``_reg``)

    def _reg(self, make: bool = False, group: int | None = None) -> Registry | None:
        """The namespace's registry, attached when it appears; made only with ``make``
        (a create; shared with ``group``, a gid). None while the namespace has none."""
        reg = self._registry
        if reg is None:
            if self._closed:
                raise ShmqError(f"broker of namespace {self.namespace!r} is closed")
            try:
                reg = Registry(self.namespace, create=make, group=group)
            except FileNotFoundError:
                return None
            self._registry = reg
        return reg

    def create_namespace(self, group: str | int | None = None) -> bool:
        """Make the namespace's registry now if it has none (``shmq server`` does at start);
        True if this call made it. ``group`` (a name or gid, one of yours): the namespace
        is shared with it -- everything made in it is 0660 with that group, not 0600
        (docs/OPERATIONS.md, "Sharing with a group"); a namespace there already is
        converted (its entries must be yours). Without it an existing namespace keeps its
        setting."""
        gid = None if group is None else resolve_group(group)
        had = self._reg() is not None
        reg = self._reg(make=True, group=gid)
        if gid is not None and reg.group != gid:
            with reg:
                share_namespace(self.namespace, gid)
        return not had and reg.created

    @property
    def shared_group(self) -> int | None:
        """The gid the namespace is shared with (``create_namespace(group=)``), else None:
        owner-only, or not made yet."""
        reg = self._reg()
        return None if reg is None else reg.group

    def __repr__(self):
        return f"<shmq.Broker namespace={self.namespace!r}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        return (Broker, (self.namespace,))

    def __del__(self):
        # Only our own mapping: queue handles we returned live on without the broker
        # (``shmq.connect().queue("q")`` must work as a one-liner).
        if getattr(self, "_registry", None) is not None:
            self._registry.close()
            self._registry = None

    def ping(self) -> None:
        """Check the broker is open (the TCP client's is a round trip to the server)."""
        if self._closed:
            raise ShmqError(f"broker of namespace {self.namespace!r} is closed")

    def close(self) -> None:
        """Close this broker and every queue handle it returned. Queues stay."""
        for q in list(self._queues):
            q.close()
        for kv in list(self.__dict__.get("_stores", ())):
            kv.close()
        self._closed = True
        x = self.__dict__.pop("_exchanges", None)
        if x is not None:
            x.close()
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    # ---------------------------------------------------------------- queues
    def queue(self, name: str, prefetch: int | None = None, serializer: SerializerSpec = None) -> Queue:
        """Attach to an existing queue; raises QueueNotFound. ``prefetch``: at most this
        many un-settled deliveries on this handle (RabbitMQ's basic.qos): a get beyond it
        waits, as on an empty queue, until one is settled or its lease lapses.
        ``serializer``: "pickle", "json", "msgpack" or ``(dumps, loads)``: puts take
        objects and deliveries carry them in ``body`` (``shmq.serializers``)."""
        ser = resolve_serializer(serializer)
        check_queue_name(name)
        if ser is None:
            q = attach(self.namespace, name)
        else:
            q = attach(self.namespace, name, SerializedQueue, serializer=ser)
        if prefetch is not None:
            q._set_prefetch(_positive_int(prefetch, "prefetch"))
        self._queues.add(q)
        return q

    def create_queue(
        self,
        name: str,
        max_bytes: int = QUEUE.max_bytes,
        max_message_bytes: int | None = QUEUE.max_message_bytes,
        visibility_timeout: float = QUEUE.visibility_timeout,
        max_deliveries: int | None = QUEUE.max_deliveries,
        dead_letter_queue: str | None = QUEUE.dead_letter_queue,
        exist_ok: bool = False,
        durability: str = QUEUE.durability,
        priorities: int = QUEUE.priorities,
        message_ttl: float | None = QUEUE.message_ttl,
        dedup_window: float = QUEUE.dedup_window,
        retry_delay: float = QUEUE.retry_delay,
        retry_backoff: float = QUEUE.retry_backoff,
        retry_delay_max: float | None = QUEUE.retry_delay_max,
        priority_aging: float | None = QUEUE.priority_aging,
        serializer: SerializerSpec = None,
        lanes: int = QUEUE.lanes,
        auto_delete: bool = QUEUE.auto_delete,
        expires: float | None = QUEUE.expires,
    ) -> Queue:
        """Create a queue and attach to it. Raises QueueExists unless ``exist_ok``:
        then the existing queue is returned as it is, if it has the settings this call
        asks for (those given other than their defaults); QueueExists naming each that
        differs, with both values, if not (as RabbitMQ refuses a queue_declare).

        ``max_message_bytes`` defaults to 1 MiB (less if ``max_bytes`` is smaller).
        ``durability``: "memory" (never written to disk), "snapshot" (saved by a
        ``shmq server`` that has a ``--data-dir``, every ``--snapshot-interval``) or
        "wal" (also every put and ack appended to a write-ahead log before it returns;
        the log is opened by that server).

        Work-queue options (docs/DESIGN.md, "Work-queue options"): ``priorities`` levels
        0..N-1, higher first (a message waiting ``priority_aging`` seconds is served as one
        level higher, so no level starves; None: strict); ``message_ttl`` seconds a message
        may wait before it expires; ``dedup_window`` seconds a put's ``dedup_id`` is
        remembered; ``retry_delay``, ``retry_backoff``, ``retry_delay_max``: a nack
        without a delay, or a lapsed lease, makes the message ready again after
        ``retry_delay * retry_backoff ** (attempt - 1)`` seconds, at most ``retry_delay_max``.
        ``serializer``: the handle's, as ``queue()`` takes it (the queue stores bytes).

        ``lanes``: K rings with a lock each (``shmq.engine.queues.lanes``), for many producers and
        consumers on many cores: a producer appends to its own lane, a consumer takes from
        its home lane first, then from the others; order is FIFO per lane (best-effort
        ordering, as SQS standard queues), and ``max_bytes`` is shared out among the lanes.
        1 (the default): one ring, strict FIFO.

        Lifetime (RabbitMQ's, ``shmq.engine.queues.lifetime``): ``auto_delete`` -- the queue
        is deleted, with its exchange bindings, when its last consumer (``add_consumer``)
        goes: unregistered, or its process dead, or its TCP connection closed; one that never
        had a consumer stays. ``expires`` seconds: deleted when it has had no consumer and no
        declare or take for that long (x-expires; whole ms), by ``shmq server``'s
        housekeeping or, without one, by a create or declare of a queue in the namespace.
        """
        asked = _asked(_QUEUE_DEFAULTS, locals())  # before the checks below normalize them
        check_queue_name(name)
        resolve_serializer(serializer)
        lanes = _positive_int(lanes, "lanes")
        if lanes > MAX_LANES:
            raise ValueError(f"lanes must be at most {MAX_LANES}, not {lanes}")
        max_bytes = _positive_int(max_bytes, "max_bytes")
        if max_bytes < _MIN_BYTES * lanes:
            raise ValueError(f"max_bytes must be at least {_MIN_BYTES} per lane ({_MIN_BYTES * lanes}), "
                             f"not {max_bytes}")
        max_bytes = L.align(max_bytes // lanes)  # each lane's ring
        _check_ring(max_bytes, " per lane" if lanes > 1 else "")
        if max_message_bytes is None:  # 1 MiB, or as much as one record can hold
            max_message_bytes = min(DEFAULT_MAX_MESSAGE_BYTES, max_bytes - L.REC_SIZE)
        max_message_bytes = _positive_int(max_message_bytes, "max_message_bytes")
        if L.record_size(0, max_message_bytes) > max_bytes:
            raise ValueError(
                f"max_message_bytes={max_message_bytes} can never fit in max_bytes={max_bytes}"
                f"{f' of each of {lanes} lanes' if lanes > 1 else ''} "
                f"(each record also takes a {L.REC_SIZE}-byte header)"
            )
        _check_visibility(visibility_timeout)
        if max_deliveries is not None:
            max_deliveries = _positive_int(max_deliveries, "max_deliveries")
        if durability not in _DURABILITY_MODES:
            raise ValueError(f"durability must be one of {', '.join(_DURABILITY_MODES)}, not {durability!r}")
        opts = _options(priorities, message_ttl, dedup_window, retry_delay, retry_backoff, retry_delay_max,
                        priority_aging)
        _check_dead_letter_name(name, dead_letter_queue)
        life = _lifetime(auto_delete, expires)
        self._sweep_unused()
        if dead_letter_queue is not None and self._reg() is None:  # (a create that fails makes no namespace)
            raise QueueNotFound(f"dead-letter queue {dead_letter_queue!r} does not exist: create it first")
        reg = self._reg(make=True)
        with reg:
            self._clean_stale(reg)
            index, state = reg.find(name)
            if state == LIVE:
                if not exist_ok:
                    raise QueueExists(f"queue {name!r} already exists in namespace {self.namespace!r}")
                q = self.queue(name, serializer=serializer)
                have = q.settings()
                lanes_held = asked.get("lanes", have["lanes"])
                q = self._as_asked(q, "queue", asked, have, lambda k, v: _queue_as_held(k, v, lanes_held),
                                   QueueExists)
                lifetime.renew(q)  # a declare: its expiry counts from now
                return q
            if dead_letter_queue is not None and reg.find(dead_letter_queue)[1] != LIVE:
                raise QueueNotFound(f"dead-letter queue {dead_letter_queue!r} does not exist: create it first")
            index = reg.claim(name, CREATING)
            self._unlink_queue_files(name)  # leftovers of a crash, if any
            try:
                for lane in range(lanes):
                    self._build(name, max_bytes, max_message_bytes, visibility_timeout, max_deliveries,
                                dead_letter_queue, durability, opts, lanes, lane, life if lane == 0 else 0)
            except BaseException:
                self._unlink_queue_files(name)
                reg.free(index)
                raise
            reg.set_state(index, LIVE, name)
        q = self.queue(name, serializer=serializer)
        if durability == "wal":  # the server opens its log before the create returns (as over TCP)
            await_log(self.namespace, lambda: all(lane.wal.config()[0] for lane in getattr(q, "_lanes", None) or [q]))
        return q

    def update_queue(self, name: str, **settings) -> dict:
        """Change settings of the live queue ``name`` (``create_queue``'s keywords): those of
        MUTABLE_QUEUE_SETTINGS (``dead_letter_queue=None`` takes the queue's away). Every
        process attached to it sees them: the takes, nacks, rejects and housekeeping that
        follow use them (another process's handle looks again at most 0.2 s after its
        last look whenever it sleeps, nacks, rejects or does housekeeping). A setting of
        FIXED_QUEUE_SETTINGS given with another value than the queue's raises
        SettingsMismatch naming each, and nothing changes. Returns the queue's settings.
        QueueNotFound if there is no such queue (or no such dead-letter queue)."""
        check_queue_name(name)
        unknown = sorted(set(settings) - set(_QUEUE_DEFAULTS))
        if unknown:
            raise TypeError(f"update_queue() got unexpected keyword arguments: {', '.join(unknown)}")
        q = self.queue(name)
        try:
            have = q.settings()
            fixed = {k: v for k, v in settings.items() if k in FIXED_QUEUE_SETTINGS}
            differ = _differences(fixed, have, lambda k, v: _queue_as_held(k, v, have["lanes"]))
            if differ:
                raise SettingsMismatch(f"queue {name!r} in namespace {self.namespace!r} cannot change {differ}: "
                                       "not on a live queue (delete it and create it again)")
            new = {**have, **{k: v for k, v in settings.items() if k in MUTABLE_QUEUE_SETTINGS}}
            _check_visibility(new["visibility_timeout"])
            expires_ms = _lifetime(have["auto_delete"], new["expires"]) >> L.LIFE_EXPIRES_SHIFT
            maxdel = None if new["max_deliveries"] is None else _positive_int(new["max_deliveries"], "max_deliveries")
            dlq = new["dead_letter_queue"]
            _check_dead_letter_name(name, dlq)
            _levels, aging_ms, ttl, window, retry, backoff, retry_max = _options(
                have["priorities"], new["message_ttl"], new["dedup_window"], new["retry_delay"], new["retry_backoff"],
                new["retry_delay_max"], new["priority_aging"])
            reg = self._reg()
            with reg:
                if dlq is not None and reg.find(dlq)[1] != LIVE:
                    raise QueueNotFound(f"dead-letter queue {dlq!r} does not exist: create it first")
                for lane in getattr(q, "_lanes", (q,)):
                    lane._write_settings(int(new["visibility_timeout"] * 1e9), maxdel, dlq, aging_ms, ttl, window,
                                         retry, backoff, retry_max, expires_ms if lane._lane == 0 else None)
            return q.settings()
        finally:
            q.close()

    def declare_queue(self, name: str, serializer: SerializerSpec = None, **settings) -> Queue:
        """Make the queue ``name`` as ``settings`` say (``create_queue``'s keywords), whether
        it exists or not: created if it does not; if it does, the settings a live queue can
        change are changed (``update_queue``), and one that cannot raises SettingsMismatch.
        What an application runs on every start, so its queues' settings live in its code.
        Returns a handle (with ``serializer``)."""
        if "exist_ok" in settings:
            raise TypeError("declare_queue() takes no exist_ok: it always accepts an existing queue")
        try:
            return self.create_queue(name, serializer=serializer, **settings)
        except SettingsMismatch:
            raise
        except QueueExists:
            pass
        self.update_queue(name, **settings)
        return self.queue(name, serializer=serializer)

    def _build(self, name, capacity, max_message_bytes, visibility_timeout, max_deliveries, dlq, durability, opts,
               lanes=1, lane=0, life=0):
        slots = DEFAULT_PROCESS_SLOTS
        base = queue_segment(self.namespace, name, lane)
        group = self._registry.group
        size = L.segment_size(capacity, slots)
        pinned = pinned_bytes(L.data_offset(slots), size)  # the header: the ring is taken as it is written
        seg = create_segment(base, size, reserve=pinned, group=group)
        try:
            Memory.mark_pinned(seg._mmap, L.MEM_OFF, pinned)
            create_semaphore(base + NOT_EMPTY, group).close()
            create_semaphore(base + NOT_FULL, group).close()
            raw_name, raw_dlq = name.encode(), (dlq or "").encode()
            header.init_queue(seg._mmap, (L.LAYOUT_VERSION, L.DURABILITY[durability], capacity, max_message_bytes,
                                          int(visibility_timeout * 1e9), max_deliveries or 0, slots, time.time_ns(),
                                          L.data_offset(slots), len(raw_name), raw_name, len(raw_dlq), raw_dlq),
                              (*opts, lanes if lanes > 1 else 0, lane), life, lane, monotonic_offset(),
                              time.monotonic_ns())
        finally:
            seg.close()

    def _unlink_queue_files(self, name):
        base = queue_segment(self.namespace, name)
        unlink_segment(base)
        unlink_semaphore(base + NOT_EMPTY)
        unlink_semaphore(base + NOT_FULL)
        for entry in lane_entries(self.namespace, name):  # a laned queue's other lanes
            if entry.endswith((NOT_EMPTY, NOT_FULL)):
                unlink_semaphore(entry)
            else:
                unlink_segment(entry)

    def _clean_stale(self, reg):
        """Finish off creates and deletes whose process died holding the registry lock."""
        for index, state, name in reg.entries():
            if state in (CREATING, DELETING):
                if name.startswith(_STREAM):
                    self._unlink_stream_files(name[1:])
                else:
                    self._unlink_queue_files(name)
                reg.free(index)

    def delete_queue(self, name: str) -> None:
        """Delete a queue and every message in it, and its exchange bindings. Handles
        elsewhere get QueueNotFound."""
        check_queue_name(name)
        if not self._delete(name):
            raise QueueNotFound(f"no queue {name!r} in namespace {self.namespace!r}")

    def _delete(self, name: str, unused: bool = False):
        """Delete queue ``name`` and drop its bindings; True if it was there. ``unused``: only
        if it is to go now (``lifetime.condemn``: its last consumer went, or it expired), and
        then why it went, or None."""
        reg = self._reg()
        if reg is None:
            return None
        why = True
        with reg:
            self._clean_stale(reg)
            index, state = reg.find(name)
            if state != LIVE:
                return None
            if reg.group is not None:
                check_deletable(f"queue {name!r}", _shm_path(queue_segment(self.namespace, name)))
            try:
                q = attach(self.namespace, name)
            except QueueNotFound:
                q = None
            try:
                if unused:  # checked and marked under the queue's lock: a consumer that comes first keeps it
                    why = None if q is None else lifetime.condemn(q, lambda: reg.set_state(index, DELETING, name))
                    if why is None:
                        return None
                else:
                    reg.set_state(index, DELETING, name)
                if q is not None:
                    q._mark_deleted()
            finally:
                if q is not None:
                    q.close()
            self._unlink_queue_files(name)
            reg.free(index)
        try:
            self.exchange_table().drop_target("q", name)
        except ShmqError:  # (the table's lock held past its timeout: a publish drops them as it finds them)
            pass
        return why

    def _sweep_unused(self) -> None:
        """Delete the namespace's unused queues (``lifetime.sweep``), at most once every
        LIFETIME_SWEEP_NS by this broker: the local housekeeping of queue lifetimes, run by
        creates and declares (``shmq server`` sweeps every housekeeping round)."""
        now = time.monotonic_ns()
        if now < self.__dict__.get("_swept", 0) or self._reg() is None:
            return
        self._swept = now + LIFETIME_SWEEP_NS
        handles = []
        try:
            for name in self.list_queues():
                if lifetime.has_lifetime(self.namespace, name):  # (read from its file: most queues have none)
                    try:
                        handles.append(attach(self.namespace, name))
                    except ShmqError:
                        continue
            lifetime.sweep(handles, lambda n: self._delete(n, unused=True))
        finally:
            for h in handles:
                h.close()

    def list_queues(self) -> list[str]:
        """Names of the namespace's queues, sorted."""
        reg = self._reg()
        if reg is None:
            return []
        with reg:
            self._clean_stale(reg)
            return sorted(name for _i, state, name in reg.entries() if state == LIVE and name[0] != _STREAM)

    def redrive(self, dead_letter_queue: str, to: str | None = None, max_messages: int | None = None) -> int:
        """Move dead letters back to the queue each came from (or to ``to``), keeping
        ids and headers, with attempts reset (SQS's StartMessageMoveTask). Returns how
        many moved; QueueFull (after moving what fit) when a target is full."""
        if max_messages is not None:
            max_messages = _positive_int(max_messages, "max_messages")
        attached = {}

        def target(name):
            if name not in attached:
                attached[name] = self.queue(name)
            return attached[name]

        dlq = self.queue(dead_letter_queue)
        if to is not None:
            target(to)  # QueueNotFound before anything moves
        try:
            return deadletter.redrive(dlq, target, to, max_messages)
        finally:
            dlq.close()
            for q in attached.values():
                q.close()

    # ---------------------------------------------------------------- streams
    def _as_asked(self, h, kind, asked, have, as_held, error):
        """``h``, the existing queue or stream, if it has the settings ``asked`` (``have``
        are its own); else it is closed and ``error`` names each that differs."""
        differ = _differences(asked, have, as_held)
        if differ:
            h.close()
            raise error(f"{kind} {h.name!r} exists in namespace {self.namespace!r} with other settings: {differ}")
        return h

    def transactional(self, transactional_id: str, timeout: float = 60.0):
        """A transactional producer of ``transactional_id``: a transaction over appends to
        several streams and groups' offsets, seen by every reader only once committed
        (docs/STREAMS.md, Transactions). The coordinator is the namespace's server: the
        producer talks to it over a connection of its own (``shmq.transactional``); a
        namespace with no server running gets ShmqError."""
        return faces.transactional(self, transactional_id, timeout)

    def stream(self, name: str) -> Stream:
        """Attach to an existing stream; raises StreamNotFound."""
        return Stream(self.namespace, check_queue_name(name))

    def create_stream(self, name: str, partitions: int = STREAM.partitions, max_bytes: int = STREAM.max_bytes,
                      max_message_bytes: int = STREAM.max_message_bytes, retention: str = STREAM.retention,
                      retention_bytes: int | None = STREAM.retention_bytes,
                      retention_seconds: float | None = STREAM.retention_seconds,
                      group_idle_timeout: float = STREAM.group_idle_timeout, durability: str = STREAM.durability,
                      exist_ok: bool = False, *, timestamp_type: str = STREAM.timestamp_type,
                      compression: str = STREAM.compression, segment_bytes: int | None = STREAM.segment_bytes,
                      compact: bool = STREAM.compact, delete_retention_seconds: float = STREAM.delete_retention_seconds,
                      min_cleanable_dirty_ratio: float = STREAM.min_cleanable_dirty_ratio,
                      max_compaction_lag_seconds: float | None = STREAM.max_compaction_lag_seconds) -> Stream:
        """Create a stream of ``partitions`` append-only logs and attach to it. Raises
        StreamExists unless ``exist_ok``: then the existing stream is returned as it is,
        if it has the settings this call asks for (those given other than their
        defaults); StreamExists naming each that differs, if not.

        ``max_bytes``: each partition's ring in shared memory (the hot tail); when it is
        full the oldest records are dropped (``retention="drop"``, Kafka's) or appends
        wait for the slowest group's committed offset (``"block"``; a group with no live
        member for ``group_idle_timeout`` seconds stops holding them back).
        ``retention_bytes`` / ``retention_seconds`` bound what a partition keeps: its
        records in memory (housekeeping drops older or more, and gives their memory back)
        and a "wal" stream's logs on disk. A partition's memory is taken as its records
        are written and given back as retention drops them (``shm/memory.py``).

        For Kafka clients (docs/KAFKA.md, Topic configs): ``timestamp_type``
        "create_time" (a record keeps its Kafka producer's timestamp) or "log_append_time"
        (the listener stamps the time of the append); ``compression``: the codec of the
        batches the listener serves, "producer" (as their producer sent them),
        "uncompressed", "gzip", "snappy", "lz4" or "zstd"; ``segment_bytes``: Kafka's
        segment.bytes, kept and shown, no effect. ``update_stream`` changes these, the
        retention bounds, ``max_message_bytes`` and the partition count on a live stream.

        ``compact`` (Kafka's cleanup.policy=compact; with a retention bound, compact,delete):
        the server's housekeeping keeps the latest record of each key and takes back the
        older ones (docs/STREAMS.md, Compacted streams); a tombstone (a None value) stays
        ``delete_retention_seconds``, then its key is gone; a partition is compacted once
        the bytes appended since its last compaction are ``min_cleanable_dirty_ratio`` of
        what it holds, or a record has waited ``max_compaction_lag_seconds``. Offsets never
        change: a read of an offset compaction took goes on at the next record.
        """
        asked = _asked(_STREAM_DEFAULTS, locals())  # before the checks below normalize them
        check_queue_name(name)
        partitions = _positive_int(partitions, "partitions")
        if partitions > L.MAX_PARTITIONS:
            raise ValueError(f"partitions must be at most {L.MAX_PARTITIONS}, not {partitions}")
        max_bytes = _positive_int(max_bytes, "max_bytes")
        if max_bytes < _MIN_BYTES:
            raise ValueError(f"max_bytes must be at least {_MIN_BYTES}, not {max_bytes}")
        max_bytes = L.align(max_bytes)
        _check_ring(max_bytes, " per partition")
        live = _live_settings(max_bytes, max_message_bytes, retention_bytes, retention_seconds, timestamp_type,
                              compression, segment_bytes, compact, delete_retention_seconds, min_cleanable_dirty_ratio,
                              max_compaction_lag_seconds)
        if retention not in L.RETENTION:
            raise ValueError(f"retention must be 'drop' or 'block', not {retention!r}")
        _seconds(group_idle_timeout, "group_idle_timeout", allow_zero=False)
        if durability not in _DURABILITY_MODES:
            raise ValueError(f"durability must be one of {', '.join(_DURABILITY_MODES)}, not {durability!r}")
        reg = self._reg(make=True)
        entry = _STREAM + name
        with reg:
            self._clean_stale(reg)
            index, state = reg.find(entry)
            if state == LIVE:
                if not exist_ok:
                    raise StreamExists(f"stream {name!r} already exists in namespace {self.namespace!r}")
                s = self.stream(name)
                have = stream_settings(s)
                bytes_held = L.align(asked["max_bytes"]) if "max_bytes" in asked else have["max_bytes"]
                return self._as_asked(s, "stream", asked, have, lambda k, v: _stream_as_held(k, v, bytes_held),
                                      StreamExists)
            index = reg.claim(entry, CREATING)
            self._unlink_stream_files(name)
            try:
                self._build_stream(name, partitions, max_bytes, retention, group_idle_timeout, durability, live)
            except BaseException:
                self._unlink_stream_files(name)
                reg.free(index)
                raise
            reg.set_state(index, LIVE, entry)
        s = self.stream(name)
        if durability == "wal":  # the server opens its logs before the create returns (as over TCP)
            await_log(self.namespace, lambda: all(s._part(p).log.config()[0] for p in range(s.partitions)))
        return s

    def update_stream(self, name: str, **settings) -> dict:
        """Change settings of the live stream ``name`` (``create_stream``'s keywords): those
        of MUTABLE_STREAM_SETTINGS, None taking a bound or ``segment_bytes`` away;
        ``partitions``, the new total, adds partitions (``Stream.add_partitions``; the
        count it has is no change, fewer is ValueError: a stream never shrinks). Every
        handle in every process reads them at its next call (the server's housekeeping
        round applies new retention bounds). A setting of FIXED_STREAM_SETTINGS given with
        another value than the stream's raises SettingsMismatch naming each, and nothing
        changes. Returns the stream's settings. StreamNotFound if there is none."""
        unknown = sorted(set(settings) - set(_STREAM_DEFAULTS))
        if unknown:
            raise TypeError(f"update_stream() got unexpected keyword arguments: {', '.join(unknown)}")
        s = self.stream(name)
        try:
            have = stream_settings(s)
            fixed = {k: v for k, v in settings.items() if k in FIXED_STREAM_SETTINGS}
            differ = _differences(fixed, have, lambda k, v: _stream_as_held(k, v, have["max_bytes"]))
            if differ:
                raise SettingsMismatch(f"stream {name!r} in namespace {self.namespace!r} cannot change {differ}: "
                                       "not on a live stream (delete it and create it again)")
            new = {**have, **{k: v for k, v in settings.items() if k in MUTABLE_STREAM_SETTINGS}}
            total = _positive_int(new["partitions"], "partitions")
            if total < have["partitions"]:
                raise ValueError(f"stream {name!r} has {have['partitions']} partitions: a stream never shrinks "
                                 f"(asked {total})")
            if total > L.MAX_PARTITIONS:
                raise ValueError(f"partitions must be at most {L.MAX_PARTITIONS}, not {total}")
            s._write_settings(check_stream_settings(new))
            if total > have["partitions"]:
                s.add_partitions(total - have["partitions"])
            return stream_settings(s)
        finally:
            s.close()

    def _build_stream(self, name, partitions, max_bytes, retention, idle_s, durability, live):
        base = stream_base(self.namespace, name)
        now = time.time_ns()
        group = self._registry.group
        for p in range(partitions):
            create_partition(base, p, max_bytes, live["max_message_bytes"], now, group)
        create_semaphore(base + NOT_EMPTY, group).close()
        seg = create_segment(base, L.STREAM_SIZE, group=group)
        try:
            header.init_stream(seg._mmap, (L.STREAM_VERSION, partitions, L.RETENTION[retention],
                                           L.DURABILITY[durability], live["timestamp_type"], live["compression"],
                                           max_bytes, live["max_message_bytes"], live["retention_bytes"],
                                           live["retention_ns"], int(idle_s * 1e9), now),
                               {f: live[f] for f in _COMPACTION_WORDS + ("segment_bytes",)})
        finally:
            seg.close()

    def _unlink_stream_files(self, name):
        base = stream_base(self.namespace, name)
        unlink_segment(base)
        unlink_semaphore(base + NOT_EMPTY)
        for p in range(L.MAX_PARTITIONS):
            if not unlink_segment(partition_segment(base, p)) and p > 0:
                break

    def delete_stream(self, name: str) -> None:
        """Delete a stream, its records and its groups. Handles elsewhere get StreamNotFound."""
        check_queue_name(name)
        reg = self._reg()
        if reg is None:
            raise StreamNotFound(f"no stream {name!r} in namespace {self.namespace!r}")
        entry = _STREAM + name
        with reg:
            self._clean_stale(reg)
            index, state = reg.find(entry)
            if state != LIVE:
                raise StreamNotFound(f"no stream {name!r} in namespace {self.namespace!r}")
            if reg.group is not None:
                check_deletable(f"stream {name!r}", _shm_path(stream_base(self.namespace, name)))
            try:  # attached before the entry is marked: an attach that fails otherwise (EMFILE) changes nothing
                s = Stream(self.namespace, name)
            except StreamNotFound:
                s = None
            parts = []
            try:
                for p in range(s.partitions if s is not None else 0):
                    try:
                        parts.append(s._part(p))
                    except StreamNotFound:  # (that one's memory is gone already)
                        pass
            except BaseException:
                s.close()
                raise
            reg.set_state(index, DELETING, entry)
            if s is not None:
                header.set_deleted(s._mq, L.SI_DELETED)
                for part in parts:
                    header.set_deleted(part._mq, L.PI_DELETED)
                for _ in range(s._mq[L.SI_CWAIT] + 1):
                    s._ne.release()
                s.close()
            self._unlink_stream_files(name)
            reg.free(index)

    def consumer(self, group: str, streams=None, pattern=None, auto_offset_reset: str = "earliest",
                 **options) -> MultiConsumer:
        """Join ``group`` on several ``streams`` (names), or on every stream whose whole name
        matches ``pattern`` (a regular expression; streams made later are joined at a
        refresh, deleted ones let go), as Kafka's ``subscribe``. Partitions are then
        ``TopicPartition(stream, partition)`` pairs. ``options``: ``Stream.consumer``'s,
        and refresh_interval (seconds between looks at the namespace's streams; 5)."""
        return MultiConsumer(self, group, streams, pattern, auto_offset_reset, **options)

    def list_streams(self) -> list[str]:
        """Names of the namespace's streams, sorted."""
        reg = self._reg()
        if reg is None:
            return []
        with reg:
            self._clean_stale(reg)
            return sorted(name[1:] for _i, state, name in reg.entries() if state == LIVE and name[0] == _STREAM)

    # ---------------------------------------------------------------- exchanges (engine/queues/exchange.py)
    def exchange_table(self) -> "Exchanges":
        """The namespace's exchange table (``engine.queues.exchange.Exchanges``), attached on first use."""
        x = self.__dict__.get("_exchanges")
        if x is None:
            from .queues.exchange import Exchanges

            x = self._exchanges = Exchanges(self.namespace)
        return x

    def create_exchange(self, name: str, type: str = "fanout", exist_ok: bool = False) -> None:
        """Create an exchange: "fanout" copies each message to every target bound to it,
        "topic" to those whose pattern matches the routing key. ExchangeExists unless
        ``exist_ok`` (and then only if the type differs)."""
        self.exchange_table().create(name, type, exist_ok)

    def delete_exchange(self, name: str) -> None:
        """Delete an exchange and its bindings (the targets stay); ExchangeNotFound."""
        self.exchange_table().delete(name)

    def list_exchanges(self) -> list[str]:
        """Names of the namespace's exchanges, sorted."""
        return self.exchange_table().names()

    def exchange_info(self, name: str) -> dict:
        """{"name", "type", "bindings": [{"target", "kind": "queue" | "stream", "pattern"}]}."""
        return self.exchange_table().info(name)

    def bind(self, exchange: str, target: str, pattern: str = "#") -> None:
        """Bind a queue or a stream (by name) to an exchange. Topic ``pattern``: words
        split on ".", ``*`` one word, ``#`` zero or more (a fanout exchange ignores it).
        QueueNotFound if no queue or stream has that name; ValueError if both do."""
        check_queue_name(target)
        reg = self._reg()
        is_queue = is_stream = False
        if reg is not None:
            with reg:
                self._clean_stale(reg)
                is_queue = reg.find(target)[1] == LIVE
                is_stream = reg.find(_STREAM + target)[1] == LIVE
        if is_queue and is_stream:
            raise ValueError(f"both a queue and a stream are named {target!r}: an exchange cannot tell which to bind")
        if not (is_queue or is_stream):
            raise QueueNotFound(f"no queue or stream {target!r} in namespace {self.namespace!r} to bind: "
                                "create it first")
        self.exchange_table().bind(exchange, "q" if is_queue else "s", target, pattern)

    def unbind(self, exchange: str, target: str, pattern: str | None = None) -> int:
        """Drop the bindings of ``target`` to ``exchange`` (only the one of ``pattern``,
        if given); returns how many went."""
        return self.exchange_table().unbind(exchange, target, pattern)

    def publish(self, exchange: str, body: bytes, routing_key: str = "", headers: dict | None = None,
                dedup_id: str | None = None, timeout: float | None = None) -> int:
        """Copy a message into every queue and stream the exchange routes ``routing_key``
        to; returns how many got it. A full queue is waited for up to ``timeout`` seconds
        (None: for ever), then QueueFull. Not atomic across targets: a publisher that
        crashes or gets an error retries with the same ``dedup_id`` (see docs/DESIGN.md,
        Exchanges)."""
        return len(self.exchange_table().publish(exchange, body, routing_key, headers, dedup_id, timeout))

    # ---------------------------------------------------------------- keyed stores (engine/store.py)
    def store(self, name: str = "default") -> "Store":
        """The keyed store ``name`` (``shmq.engine.store.Store``: values, counters and sets
        under str keys, with expiry), made on first use (its name as a queue's). A store
        is a create: it makes the namespace if it has none. Closed with this broker."""
        from .store import Store

        check_queue_name(name)
        group = self._reg(make=True).group
        kv = Store(self.namespace, name, group)
        stores = self.__dict__.setdefault("_stores", weakref.WeakSet())
        stores.add(kv)
        return kv

    def list_stores(self) -> list[str]:
        """Names of the namespace's keyed stores, sorted."""
        from .store import store_names

        return store_names(self.namespace)

    def delete_store(self, name: str) -> bool:
        """Delete the keyed store ``name`` and every key in it; False if there was none.
        Handles elsewhere find it empty (a new store) at their next call."""
        from .store import unlink_store

        check_queue_name(name)
        reg = self._reg()
        return unlink_store(self.namespace, name, shared=reg is not None and reg.group is not None)

    # ---------------------------------------------------------------- request/reply (engine/queues/rpc.py)
    def request(self, queue: str, body: bytes, headers: dict | None = None, timeout: float | None = None) -> bytes:
        """Put a request into ``queue`` and wait for a worker's ``Delivery.reply``; returns
        the reply's body. RequestTimeout after ``timeout`` seconds (None: wait for ever);
        the reply queue is removed whatever happens."""
        from .queues import rpc

        return rpc.request(self, queue, body, headers, timeout)


# what an existing queue or stream is compared on, when a create with exist_ok finds it:
# its settings (``Queue.settings()``, a stream's attributes), with create's defaults
_QUEUE_DEFAULTS = {name: s.default for name, s in QUEUE.rows.items()}
_STREAM_DEFAULTS = {name: STREAM.rows[name].default for name in STREAM_SETTINGS}


def stream_settings(s) -> dict:
    """A stream's settings (a handle's), as ``create_stream`` takes them."""
    return {k: getattr(s, k) for k in _STREAM_DEFAULTS}


def check_stream_settings(settings: dict) -> dict:
    """``_live_settings`` of a stream's whole ``settings`` (``stream_settings``' form, changed):
    ValueError or TypeError as ``update_stream`` would raise them, nothing written."""
    return _live_settings(settings["max_bytes"], settings["max_message_bytes"], settings["retention_bytes"],
                          settings["retention_seconds"], settings["timestamp_type"], settings["compression"],
                          settings["segment_bytes"], settings["compact"], settings["delete_retention_seconds"],
                          settings["min_cleanable_dirty_ratio"], settings["max_compaction_lag_seconds"])


def _live_settings(max_bytes, max_message_bytes, retention_bytes, retention_seconds, timestamp_type, compression,
                   segment_bytes, compact=STREAM.compact, delete_retention_seconds=STREAM.delete_retention_seconds,
                   min_cleanable_dirty_ratio=STREAM.min_cleanable_dirty_ratio,
                   max_compaction_lag_seconds=STREAM.max_compaction_lag_seconds) -> dict:
    """The stream settings a live stream changes, checked, as its header holds them (``layout.STREAM_LIVE``'s
    fields but the partition count)."""
    maxmsg = min(_positive_int(max_message_bytes, "max_message_bytes"), max_bytes - L.REC_SIZE)
    if retention_seconds is not None and (isinstance(retention_seconds, bool)
                                          or not isinstance(retention_seconds, (int, float))):
        raise TypeError(f"retention_seconds must be a number of seconds or None, not {retention_seconds!r}")
    for value, what in ((retention_bytes, "retention_bytes"), (retention_seconds, "retention_seconds"),
                        (segment_bytes, "segment_bytes")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not
                                  0 < value < (2**63 / 1e9 if what == "retention_seconds" else 2**63)):
            raise ValueError(f"{what} must be a positive number or None, not {value!r}")
    if timestamp_type not in L.TIMESTAMP_TYPE:
        raise ValueError(f"timestamp_type must be 'create_time' or 'log_append_time', not {timestamp_type!r}")
    if compression not in L.COMPRESSION:
        raise ValueError(f"compression must be one of {', '.join(L.COMPRESSION)}, not {compression!r}")
    if not isinstance(compact, bool):
        raise TypeError(f"compact must be True or False, not {compact!r}")
    delete_ns = _seconds(delete_retention_seconds, "delete_retention_seconds")
    if isinstance(min_cleanable_dirty_ratio, bool) or not isinstance(min_cleanable_dirty_ratio, (int, float)) \
            or not 0 <= min_cleanable_dirty_ratio <= 1:
        raise ValueError(f"min_cleanable_dirty_ratio must be a number from 0 to 1, not {min_cleanable_dirty_ratio!r}")
    lag_ns = 0 if max_compaction_lag_seconds is None else \
        _seconds(max_compaction_lag_seconds, "max_compaction_lag_seconds", allow_zero=False)
    return {"max_message_bytes": maxmsg, "retention_bytes": int(retention_bytes or 0),
            "retention_ns": int((retention_seconds or 0) * 1e9), "timestamp_type": L.TIMESTAMP_TYPE[timestamp_type],
            "compression": L.COMPRESSION[compression], "segment_bytes": int(segment_bytes or 0),
            "compact": int(compact), "delete_retention_ns": delete_ns + 1,
            "dirty_ratio_ppm": round(min_cleanable_dirty_ratio * 1e6) + 1, "max_compaction_lag_ns": lag_ns}


def _check_ring(max_bytes: int, each: str) -> None:
    """ValueError for a ring larger than one can be (a record's length is a u32)."""
    if max_bytes > L.MAX_RING_BYTES:
        raise ValueError(f"max_bytes must be at most {L.MAX_RING_BYTES} (4 GiB - 64 KiB){each}, not {max_bytes}")


def _asked(defaults: dict, args: dict) -> dict:
    """The settings a create asks for: those of its ``args`` given other than their
    defaults (one left at its default, or given as it, takes the existing one's)."""
    return {k: args[k] for k, default in defaults.items() if args[k] != default}


def _differences(asked: dict, have: dict, as_held) -> str:
    """Each asked setting that ``have`` does not hold as ``as_held(setting, value)``, with
    both values, held as they would be (``visibility_timeout 30.0 (asked 60.0), ...``,
    the same on both transports); "" if none."""
    held = {k: as_held(k, v) for k, v in asked.items()}
    return ", ".join(f"{k} {have[k]!r} (asked {v!r})" for k, v in held.items() if v != have[k])


def _held_seconds(value):
    """Seconds as a queue or stream holds them: whole nanoseconds."""
    return None if value is None else int(value * 1e9) / 1e9


def _queue_as_held(key, value, lanes):
    """A (checked) ``create_queue`` setting as a queue of ``lanes`` lanes holds it, in
    ``Queue.settings()``'s form."""
    if key == "max_bytes":
        return L.align(value // lanes) * lanes
    if key == "priority_aging":  # whole milliseconds, at least one
        return None if value is None else max(int(value * 1e9) // 1_000_000, 1) * 1_000_000 / 1e9
    if key == "expires":  # whole milliseconds, at least one
        return None if value is None else (_lifetime(False, value) >> L.LIFE_EXPIRES_SHIFT) / 1000
    if key in QUEUE_SECONDS:
        return _held_seconds(value)
    if key == "retry_backoff":
        return float(value)
    return value


def _lifetime(auto_delete, expires) -> int:
    """Lane 0's lifetime word (``layout.LIFETIME_OFF``) for ``auto_delete`` and ``expires``
    (seconds, or None: never), checked."""
    if not isinstance(auto_delete, bool):
        raise TypeError(f"auto_delete must be a bool, not {type(auto_delete).__name__}")
    expires_ms = 0 if expires is None else -(-_seconds(expires, "expires", allow_zero=False) // 1_000_000)
    return (L.LIFE_AUTO_DELETE if auto_delete else 0) | expires_ms << L.LIFE_EXPIRES_SHIFT


def _delete_unused(namespace: str, name: str) -> str | None:
    """``lifetime``'s deleter: queue ``name`` deleted, with its bindings, if it is unused now."""
    try:
        b = Broker(namespace, create=False)
    except NamespaceNotFound:
        return None
    try:
        return b._delete(name, unused=True)
    finally:
        b.close()


lifetime.set_deleter(_delete_unused)


def _stream_as_held(key, value, max_bytes):
    """A (checked) ``create_stream`` setting as a stream of ``max_bytes`` (aligned) holds it."""
    if key == "max_bytes":
        return L.align(value)
    if key == "max_message_bytes":
        return min(value, max_bytes - L.REC_SIZE)
    if key in ("retention_bytes", "segment_bytes"):
        return None if value is None else int(value)
    if key in STREAM_SECONDS:
        return _held_seconds(value)
    if key == "min_cleanable_dirty_ratio":
        return round(value * 1e6) / 1e6
    return value


def _check_visibility(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("visibility_timeout must be a number of seconds")
    if not 0 < value < 10**9:
        raise ValueError(f"visibility_timeout must be > 0 seconds, not {value!r}")


def _check_dead_letter_name(name, dlq):
    if dlq is not None:
        check_queue_name(dlq)
        if dlq == name:
            raise ValueError("a queue cannot be its own dead-letter queue")


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be positive, not {value}")
    return value


def _seconds(value, what, allow_zero=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"{what} must be a number of seconds, not {value!r}")
    if value < 0 or (not allow_zero and value == 0) or value > 10**9:
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'} seconds (at most 1e9), not {value!r}")
    return int(value * 1e9)


def _options(priorities, message_ttl, dedup_window, retry_delay, retry_backoff, retry_delay_max, aging):
    """The options block's values (``layout.OPTS``), checked."""
    if isinstance(priorities, bool) or not isinstance(priorities, int) or not 1 <= priorities <= L.MAX_PRIORITIES:
        raise ValueError(f"priorities must be an int in 1..{L.MAX_PRIORITIES}, not {priorities!r}")
    ttl = 0 if message_ttl is None else _seconds(message_ttl, "message_ttl", allow_zero=False)
    window = _seconds(dedup_window, "dedup_window")
    retry = _seconds(retry_delay, "retry_delay")
    if isinstance(retry_backoff, bool) or not isinstance(retry_backoff, (int, float)) or not 1 <= retry_backoff <= 1000:
        raise ValueError(f"retry_backoff must be a number in 1..1000, not {retry_backoff!r}")
    retry_max = 0 if retry_delay_max is None else _seconds(retry_delay_max, "retry_delay_max", allow_zero=False)
    aging_ms = 0 if aging is None else _seconds(aging, "priority_aging", allow_zero=False) // 1_000_000
    if aging_ms >= 2**32:
        raise ValueError(f"priority_aging must be at most {(2**32 - 1) / 1000:.0f} seconds, not {aging!r}")
    return priorities, max(aging_ms, 1) if aging is not None else 0, ttl, window, retry, float(retry_backoff), retry_max


def _shm_path(name: str) -> str:
    """The file in /dev/shm of the segment ``name``."""
    return os.path.join(SHM_DIR, name.lstrip("/"))
