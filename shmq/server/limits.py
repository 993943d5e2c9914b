"""What clients may cost the server: ``Limits`` (the flags), the frame boundaries a
connection tracks, the server-wide buffer ``Budget`` for big frames, each
connection's ``Clocks`` (frame and idle deadlines), and its file descriptors
(``Descriptors``: what its queues, streams and connections may hold beside a reserve,
and the connection limit that fits). docs/PROTOCOL.md, Limits; docs/OPERATIONS.md,
File descriptors.

Strategy: nothing a client sends may grow the server without bound or stall it. A
connection reads only as many bytes as it may hold: up to SMALL_FRAME_BYTES of small
frames, and a bigger frame only once its whole declared size is reserved from the
budget (first come first served, never partially, so every reader can finish its frame
and no one deadlocks). The frame timeout runs while a connection waits for budget too,
so no one holds bytes or a place in line longer than that. These are plain objects,
no I/O: the connection calls them and acts on their answers.
"""

import asyncio
import os
import resource
from collections import deque
from dataclasses import dataclass

from ..busypoll import DEFAULT_BUSY_POLL_US, check_busy_poll_us
from ..engine.shm.segment import SEGMENT_FDS
from ..engine.store import STORE_FDS
from ..formats.logfiles import LOG_FDS
from ..protocol import HEADER_SIZE
from ..protocol.frames import unpack_length

__all__ = ["Limits", "Boundaries", "Budget", "Clocks", "SMALL_FRAME_BYTES", "PRE_AUTH_MAX_FRAME_BYTES",
           "Census", "Descriptors", "Fit", "raise_fd_limit", "open_fds", "CONNECTION_FDS", "RESERVE_FDS",
           "MAX_LINGERING"]

SMALL_FRAME_BYTES = 64 * 1024  # unfinished-frame bytes a connection may hold without a reservation
PRE_AUTH_MAX_FRAME_BYTES = 4096  # largest frame payload before a HELLO with the token


@dataclass(frozen=True)
class Limits:
    """What clients may cost the server; the flags of ``shmq server`` (docs/PROTOCOL.md, Limits)."""

    max_connections: int = 1024
    max_waiting_per_connection: int = 256
    max_buffered_bytes: int = 64 * 2**20
    frame_timeout: float = 30.0
    idle_timeout: float = 300.0
    max_subscriptions_per_connection: int = 64  # SUBSCRIBEs open at once on one connection
    max_prefetch: int = 10_000  # the most un-acked deliveries one SUBSCRIBE may ask pushed
    busy_poll_us: int = DEFAULT_BUSY_POLL_US  # the longest spin of the loop after a read (shmq.busypoll); 0: none

    def __post_init__(self):
        for name in ("max_connections", "max_waiting_per_connection", "max_buffered_bytes",
                     "max_subscriptions_per_connection", "max_prefetch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        for name in ("frame_timeout", "idle_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        check_busy_poll_us(self.busy_poll_us)

    @property
    def sweep_interval(self) -> float:
        """How often the server looks for connections past a deadline."""
        return min(max(min(self.frame_timeout, self.idle_timeout) / 4, 0.01), 1.0)


class Boundaries:
    """Where frames end in one connection's byte stream, from each header's length field.

    Kept apart from the decoder, which may still hold complete frames it has not parsed
    (while the client does not read its replies): this one always knows the open frame.
    """

    __slots__ = ("head", "need", "got")

    def __init__(self):
        self.head = bytearray()  # the open frame's header bytes, while fewer than 16 are in
        self.need = 0  # the open frame's size, header included; 0 until its header is in
        self.got = 0  # bytes of the open frame received

    def advance(self, data) -> int:
        """Account for received ``data``; returns how many frames it completed."""
        ended = 0
        i, n = 0, len(data)
        if not self.got:  # at a frame's start, as reads of whole frames always are
            while n - i >= HEADER_SIZE:
                end = i + HEADER_SIZE + unpack_length(data, i)[0]
                if end > n:
                    break
                ended += 1
                i = end
        while i < n:
            if not self.need:
                if not self.got and n - i >= HEADER_SIZE:  # a whole header in this chunk
                    self.need = HEADER_SIZE + unpack_length(data, i)[0]
                else:
                    take = min(HEADER_SIZE - self.got, n - i)
                    self.head += data[i : i + take]
                    self.got += take
                    i += take
                    if self.got < HEADER_SIZE:
                        break
                    self.need = HEADER_SIZE + unpack_length(self.head)[0]
                    self.head.clear()
            take = min(self.need - self.got, n - i)
            self.got += take
            i += take
            if self.got == self.need:
                ended += 1
                self.need = self.got = 0
        return ended


class Budget:
    """The server-wide bytes for frames bigger than SMALL_FRAME_BYTES.

    A connection reserves a big frame's whole declared size before reading its payload,
    or waits, paused, in a FIFO; it gives the bytes back when the frame is complete (or
    the connection closes). A reservation is never partial, so every reader can finish
    its frame; the frame timeout (which runs while a connection waits too) bounds how
    long anyone holds bytes or a place in line. A connection has ``reserved``,
    ``budget_wait``, ``bounds`` and ``update_reading()``.
    """

    def __init__(self, limit):
        self.limit = limit
        self.used = 0
        self.waiting = deque()

    def reserve(self, conn, need) -> bool:
        if not self.waiting and self.used + need <= self.limit:
            self.used += need
            conn.reserved = need
            return True
        self.waiting.append(conn)
        conn.budget_wait = True
        return False

    def release(self, conn):
        if conn.reserved:
            self.used -= conn.reserved
            conn.reserved = 0
            self._grant()

    def forget(self, conn):
        """``conn`` is closing: its reservation or its place in line goes."""
        if conn.budget_wait:
            conn.budget_wait = False
            self.waiting.remove(conn)
            self._grant()
        self.release(conn)

    def _grant(self):
        while self.waiting and self.used + self.waiting[0].bounds.need <= self.limit:
            conn = self.waiting.popleft()
            conn.budget_wait = False
            conn.reserved = conn.bounds.need
            self.used += conn.reserved
            conn.update_reading()


class Clocks:
    """One connection's deadlines: its open frame must be whole within ``frame_timeout``
    of its first byte, and it must not stay idle (no frame in progress, holding nothing)
    past ``idle_timeout`` — past ``frame_timeout`` before HELLO. A connection that holds
    something (a waiting request, a subscription, a delivery, a group member, a place in
    line for budget) is not idle however quiet: its idle clock starts when it lets go."""

    __slots__ = ("limits", "frame_started", "last_active")

    def __init__(self, limits: Limits, now: float):
        self.limits = limits
        self.frame_started = None  # loop time the open frame's first byte came
        self.last_active = now  # loop time of the last request or answered CONSUME

    def received(self, now, open_bytes, ended):
        """Bytes came: ``open_bytes`` of a frame still open, after ``ended`` frames ended."""
        if not open_bytes:
            self.frame_started = None
        elif ended or self.frame_started is None:
            self.frame_started = now

    def overdue(self, now, authed, holding):
        """None while within the deadlines; else (the error frame's text, or None for
        none, and the reason to log). ``holding``: the connection holds something now."""
        limits = self.limits
        if self.frame_started is not None and now - self.frame_started > limits.frame_timeout:
            return (f"a frame must arrive whole within {limits.frame_timeout:g}s",
                    f"a frame took longer than {limits.frame_timeout:g}s; closing")
        if holding:
            self.last_active = now
            return None
        idle = limits.idle_timeout if authed else min(limits.idle_timeout, limits.frame_timeout)
        if self.frame_started is None and now - self.last_active > idle:
            return None, (f"idle for {idle:g}s; closing" if authed else f"no HELLO within {idle:g}s; closing")
        return None


async def sweep(listener):
    """Every so often, close the connections of ``listener`` (the DEADBEEF front or the
    Kafka listener) that are past a deadline (frame or idle)."""
    while True:
        await asyncio.sleep(listener.limits.sweep_interval)
        now = listener.loop.time()
        for conn in list(listener.connections):
            conn.check_clocks(now)


# ---------------------------------------------------------------------- file descriptors
CONNECTION_FDS = 1  # a client connection (either port, TLS or not): its socket
RESERVE_FDS = 64  # kept free beside what the objects and connections hold: a snapshot's files and its directory's
# fsync, a log's next generation, the data dir's listing, a create's or a REQUEST's reply queue, /proc reads
BASE_FDS = 32  # the server's own (stdio, its listening sockets, the event loop's, its lock file, the brokers'
# registries), when it cannot count them (no /proc)
MAX_LINGERING = 256  # refused connections kept open at most (each a descriptor) while their error frame leaves
MIN_CONNECTIONS = 1  # a limit lowered to fit never goes below this


@dataclass(frozen=True)
class Census:
    """What a namespace holds, as descriptors count it (``Housekeeper.census``)."""

    queues: int = 0
    lanes: int = 0  # every queue's lanes (a queue without lanes: one)
    logged_lanes: int = 0  # of them, the lanes of "wal" queues (a log each)
    streams: int = 0
    partitions: int = 0
    filed_partitions: int = 0  # partitions of "snapshot" and "wal" streams (a log or a high-water file each)
    stores: int = 0
    largest: int = 0  # what one handle on the biggest of them holds (a snapshot's, a backup's, passing)


def object_fds(lanes=0, logged_lanes=0, streams=0, partitions=0, filed_partitions=0, stores=0) -> int:
    """Descriptors one handle on each of these holds, at most: a segment per lane, per
    stream (its groups' table) and per partition (``SEGMENT_FDS``), a file per logged lane
    and per durable partition (``LOG_FDS``), SQLite's files per keyed store (``STORE_FDS``)."""
    return (lanes + streams + partitions) * SEGMENT_FDS + (logged_lanes + filed_partitions) * LOG_FDS \
        + stores * STORE_FDS


@dataclass(frozen=True)
class Fit:
    """What ``Descriptors.fit`` found: the descriptors the server may hold (``need``), of
    its ``limit``, by part, and the connection limit per port that keeps the reserve."""

    limit: int
    need: int
    base: int
    objects: int
    reserve: int
    connections: int  # the --max-connections asked for, per port
    ports: int
    max_connections: int  # what fits, per port (``connections`` when everything fits)
    max_lingering: int
    census: Census

    @property
    def fits(self) -> bool:
        return self.need <= self.limit

    @property
    def lowered(self) -> bool:
        return self.max_connections < self.connections

    @property
    def overfull(self) -> bool:
        """Whether the objects alone leave less than the reserve (no connection limit helps)."""
        return self.base + self.objects + self.reserve + MIN_CONNECTIONS * self.ports > self.limit

    def suggested(self) -> int:
        """A limit to ask for: what is needed now and a quarter more, in thousands."""
        return -(-self.need * 5 // 4 // 1024) * 1024

    def line(self) -> str:
        """The one line the log says about it."""
        c = self.census
        held = (f"{self.objects} for {c.queues} queue(s) ({c.lanes} lane(s)), {c.streams} stream(s) "
                f"({c.partitions} partition(s)) and {c.stores} keyed store(s), "
                f"{self.connections * self.ports * CONNECTION_FDS} for --max-connections {self.connections}"
                f"{f' on each of {self.ports} ports' if self.ports > 1 else ''}, {self.reserve} in reserve for "
                f"snapshots, logs and housekeeping, {self.base} of its own")
        if self.fits:  # (a line a terminal shows at start: no word of connections, which are debug lines)
            return (f"file descriptors: at most {self.need} of its limit of {self.limit} ({self.objects} for "
                    f"{c.queues} queue(s), {c.streams} stream(s) and {c.stores} keyed store(s), "
                    f"{self.connections * self.ports * CONNECTION_FDS} for its clients, {self.reserve} in reserve, "
                    f"{self.base} of its own)")
        fix = (f"raise its limit (LimitNOFILE={self.suggested()} in its systemd unit, ulimit -n {self.suggested()} "
               "before it starts in a shell)")
        if self.overfull:
            return (f"file descriptors: its queues and streams alone need more than its limit of {self.limit}: "
                    f"{self.need} at most ({held}); snapshots, logs and housekeeping may fail for want of them, and "
                    f"--max-connections is lowered to {self.max_connections}: {fix}")
        return (f"file descriptors: it may need {self.need}, more than its limit of {self.limit} ({held}): "
                f"--max-connections lowered to {self.max_connections}, so that snapshots, logs and housekeeping "
                f"keep theirs; {fix}, or give a lower --max-connections")

    def fields(self) -> dict:
        """The log line's fields (event ``descriptors``)."""
        c = self.census
        fields = {"event": "descriptors", "limit": self.limit, "need": self.need, "queues": c.queues,
                  "lanes": c.lanes, "streams": c.streams, "partitions": c.partitions, "stores": c.stores,
                  "reserve": self.reserve, "base": self.base}
        if not self.fits:  # (what was asked, and what fits)
            fields.update(connections=self.connections, max_connections=self.max_connections,
                          suggested=self.suggested())
        return fields


class Descriptors:
    """The server's file descriptors: its limit (RLIMIT_NOFILE's soft limit, raised to the
    hard one at start: ``raise_fd_limit``), its own (``base``), what every queue, stream and
    keyed store costs each of the handles the server keeps on it (``queue_holders``:
    the TCP front, the housekeeper, the log syncer, the metrics exporter;
    ``stream_holders`` add the Kafka listener's), its connections, and a reserve. ``fit``
    says whether the connections asked for fit beside the rest, and else the limit that
    does, so that snapshots, logs and housekeeping never run out (docs/OPERATIONS.md,
    File descriptors)."""

    def __init__(self, limit: int, base: int, connections: int, ports: int = 1, queue_holders: int = 2,
                 stream_holders: int = 2, store_holders: int = 2):
        self.limit = limit
        self.base = base
        self.connections = connections
        self.ports = ports
        self.queue_holders = queue_holders
        self.stream_holders = stream_holders
        self.store_holders = store_holders

    def lingering(self) -> int:
        """Refused connections that may stay open while their error frame leaves, per port."""
        return min(MAX_LINGERING, max(4, self.limit // 32))

    def fit(self, census: Census) -> Fit:
        c = census
        objects = (object_fds(lanes=c.lanes, logged_lanes=c.logged_lanes) * self.queue_holders
                   + object_fds(streams=c.streams, partitions=c.partitions, filed_partitions=c.filed_partitions)
                   * self.stream_holders + object_fds(stores=c.stores) * self.store_holders)
        lingering = self.lingering()
        reserve = RESERVE_FDS + c.largest + lingering * self.ports
        room = (self.limit - self.base - objects - reserve) // (self.ports * CONNECTION_FDS)
        cap = self.connections if room >= self.connections else max(room, MIN_CONNECTIONS)
        need = self.base + objects + reserve + self.connections * self.ports * CONNECTION_FDS
        return Fit(self.limit, need, self.base, objects, reserve, self.connections, self.ports, cap, lingering,
                   census)


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (an unlimited hard limit:
    to the kernel's most, fs.nr_open) and return the soft limit it has then."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                want = int(f.read())
        except (OSError, ValueError):
            want = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def open_fds(skip=None) -> int | None:
    """How many descriptors this process has open now, less those whose target ``skip``
    (a path -> bool) says to leave out; None where /proc cannot say."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    n = 0
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own, closed since)
            continue
        if skip is None or not skip(target):
            n += 1
    return n
