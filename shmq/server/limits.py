"""What clients may cost the server: ``Limits`` (the flags), the frame boundaries a
connection tracks, the server-wide buffer ``Budget`` for big frames, and each
connection's ``Clocks`` (frame and idle deadlines). docs/PROTOCOL.md, Limits.

Strategy: nothing a client sends may grow the server without bound or stall it. A
connection reads only as many bytes as it may hold: up to SMALL_FRAME_BYTES of small
frames, and a bigger frame only once its whole declared size is reserved from the
budget (first come first served, never partially, so every reader can finish its frame
and no one deadlocks). The frame timeout runs while a connection waits for budget too,
so no one holds bytes or a place in line longer than that. These are plain objects,
no I/O: the connection calls them and acts on their answers.
"""

import asyncio
from collections import deque
from dataclasses import dataclass

from ..busypoll import DEFAULT_BUSY_POLL_US, check_busy_poll_us
from ..protocol import HEADER_SIZE
from ..protocol.frames import unpack_length

__all__ = ["Limits", "Boundaries", "Budget", "Clocks", "SMALL_FRAME_BYTES", "PRE_AUTH_MAX_FRAME_BYTES"]

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
