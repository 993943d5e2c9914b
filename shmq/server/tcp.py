"""The TCP front of ``shmq server``: DEADBEEF frames in, engine calls, frames out.

Strategy: one asyncio event loop, one protocol object per connection, no thread and no
task per client. Every engine call the loop makes is non-blocking (``put_nowait``,
``get_many(timeout=0)``, settles): they hold a queue's lock for microseconds. Requests
are handled as they arrive and replies carry the request's msg id, so a waiting CONSUME
never holds back the replies behind it. Deliveries belong to the connection that
received them; when it closes, every one it did not settle is ready again at once.

Nothing a client sends may grow the server without bound or stall it (docs/PROTOCOL.md,
Limits). A waiting CONSUME is a small record in its queue's FIFO (``_QueueWaiters``)
plus one loop timer, not a coroutine: a put serves the first waiter only, and closing a
connection with many waiters just marks them done. Connections, waiting CONSUMEs per
connection and bytes of unfinished frames are capped. A connection reads only as many
bytes as it may hold (a ``BufferedProtocol`` over one shared receive buffer): up to
64 KiB of small frames, and a bigger frame only once its whole declared length is
reserved from the server-wide budget (``_Budget``, first come first served, so readers
never hold part of the budget while waiting for more: no deadlock). Before a HELLO with
the token, frames are at most 4 KiB. One sweeper task closes connections whose frame
takes too long or that stay idle.
"""

import asyncio
import hmac
import itertools
import logging
from collections import deque
from dataclasses import dataclass

from .. import __version__
from ..engine.broker import Broker
from ..errors import (
    DeliveryExpired,
    LimitExceeded,
    LockTimeout,
    MessageTooLarge,
    ProtocolError,
    QueueEmpty,
    QueueExists,
    QueueFull,
    QueueNotFound,
    ShmqError,
    StorageError,
)
from ..protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    FrameDecoder,
    MsgType,
    Status,
    encode_error,
    encode_reply,
    validate_request,
)

__all__ = ["TcpServer", "Limits", "SMALL_FRAME_BYTES", "PRE_AUTH_MAX_FRAME_BYTES"]

log = logging.getLogger("shmq.server")

LOCK_TIMEOUT_S = 0.25  # the longest the loop waits for a queue's lock (then LOCK_TIMEOUT)
_READ_CHUNK = 256 * 1024  # the shared receive buffer: most bytes one read takes
_RECORD_OVERHEAD = 128  # bytes a message adds to a CONSUME reply besides body and headers
SMALL_FRAME_BYTES = 64 * 1024  # unfinished-frame bytes a connection may hold without a reservation
PRE_AUTH_MAX_FRAME_BYTES = 4096  # largest frame payload before a HELLO with the token
_LINGER_S = 1.0  # how long a connection closed for a fault drops its client's bytes
_MAX_LINGERING = 256  # refused connections lingering at once; beyond, closed at once
_NOTHING = ()  # the deliveries of a CONSUME that waited in vain

# engine exceptions -> reply status (the client maps them back)
_STATUS_OF = (
    (StorageError, Status.STORAGE),
    (LockTimeout, Status.LOCK_TIMEOUT),
    (LimitExceeded, Status.LIMIT_EXCEEDED),
    (QueueNotFound, Status.NO_SUCH_QUEUE),
    (QueueExists, Status.QUEUE_EXISTS),
    (QueueFull, Status.QUEUE_FULL),
    (MessageTooLarge, Status.TOO_LARGE),
    (DeliveryExpired, Status.UNKNOWN_DELIVERY),
    (ProtocolError, Status.BAD_REQUEST),
    (ValueError, Status.BAD_REQUEST),
    (TypeError, Status.BAD_REQUEST),
)


@dataclass(frozen=True)
class Limits:
    """What clients may cost the server; the flags of ``shmq server`` (docs/PROTOCOL.md, Limits)."""

    max_connections: int = 1024
    max_waiting_per_connection: int = 256
    max_buffered_bytes: int = 64 * 2**20
    frame_timeout: float = 30.0
    idle_timeout: float = 300.0

    def __post_init__(self):
        for name in ("max_connections", "max_waiting_per_connection", "max_buffered_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        for name in ("frame_timeout", "idle_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")


class _Boundaries:
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
        while i < n:
            if not self.need:
                if not self.got and n - i >= HEADER_SIZE:  # a whole header in this chunk
                    self.need = HEADER_SIZE + int.from_bytes(data[i + 4 : i + 8], "big")
                else:
                    take = min(HEADER_SIZE - self.got, n - i)
                    self.head += data[i : i + take]
                    self.got += take
                    i += take
                    if self.got < HEADER_SIZE:
                        break
                    self.need = HEADER_SIZE + int.from_bytes(self.head[4:8], "big")
                    self.head.clear()
            take = min(self.need - self.got, n - i)
            self.got += take
            i += take
            if self.got == self.need:
                ended += 1
                self.need = self.got = 0
        return ended


class _Budget:
    """The server-wide bytes for frames bigger than SMALL_FRAME_BYTES.

    A connection reserves a big frame's whole declared size before reading its payload,
    or waits, paused, in a FIFO; it gives the bytes back when the frame is complete (or
    the connection closes). A reservation is never partial, so every reader can finish
    its frame; the frame timeout (which runs while a connection waits too) bounds how
    long anyone holds bytes or a place in line.
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


class _Waiter:
    """One waiting CONSUME: who asked, for what; ``timer`` answers it empty at its deadline."""

    __slots__ = ("conn", "group", "msg_id", "most", "vis", "max_bytes", "timer", "done")

    def __init__(self, conn, group, msg_id, most, vis, max_bytes):
        self.conn = conn
        self.group = group
        self.msg_id = msg_id
        self.most = most
        self.vis = vis
        self.max_bytes = max_bytes
        self.timer = None
        self.done = False


class _QueueWaiters:
    """The CONSUMEs waiting on one queue, first come first served.

    ``serve`` hands ready messages to the waiters in order and stops at the first that
    finds the queue empty: one message wakes one waiter. Puts made by this server's loop
    schedule a ``serve`` (``TcpServer.notify``). Puts by other processes (local producers
    writing to shared memory), leases expiring and delays ending are seen by a poller task
    that reads the queue's ready count — one word, no lock, no syscall — with a short
    backoff while anyone waits, so no thread ever competes with the loop for the GIL.
    Finished or dropped waiters leave the FIFO lazily; it is compacted when they are most
    of it, so dropping n waiters costs O(n).
    """

    POLL_S = (0.0002, 0.002)  # first and longest pause between reads of the ready count

    def __init__(self, server, q):
        self.server = server
        self.q = q
        self.fifo = deque()
        self.live = 0
        self._poller = None
        self._scheduled = False

    def add(self, w, deadline):
        self.fifo.append(w)
        self.live += 1
        w.timer = self.server.loop.call_at(deadline, self.finish, w, _NOTHING)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll())

    def finish(self, w, result):
        """Answer ``w`` with deliveries or an exception (once)."""
        if self._end(w):
            w.conn.answer(w, result)

    def drop(self, w):
        """Forget ``w`` without an answer: its connection is closing."""
        self._end(w)

    def _end(self, w) -> bool:
        if w.done:
            return False
        w.done = True
        w.timer.cancel()
        self.live -= 1
        if len(self.fifo) > 2 * self.live + 64:
            self.fifo = deque(x for x in self.fifo if not x.done)
        return True

    def schedule(self):
        if self.live and not self._scheduled:
            self._scheduled = True
            self.server.loop.call_soon(self._scheduled_serve)

    def _scheduled_serve(self):
        self._scheduled = False
        self.serve()

    def serve(self) -> bool:
        """Hand ready messages to the waiters in order; True if one got messages."""
        served = False
        while self.fifo:
            w = self.fifo[0]
            if w.done:
                self.fifo.popleft()
                continue
            try:
                result = self.q.get_many(w.most, timeout=0, visibility_timeout=w.vis, max_bytes=w.max_bytes)
                served = True
            except QueueEmpty:
                break
            except Exception as e:  # deleted, lock timeout...: the waiter hears of it
                result = e
            self.fifo.popleft()
            self.finish(w, result)
        return served

    def answer_all(self, result):
        """Answer every waiter with ``result`` (stop, queue deleted)."""
        while self.fifo:
            self.finish(self.fifo.popleft(), result)
        if self._poller is not None:
            self._poller.cancel()

    async def _poll(self):
        pause = self.POLL_S[0]
        while self.live:
            try:
                ready = self.q.ready_hint()
            except ShmqError:
                ready = True  # deleted or closed: let the waiters find out
            if ready and self.serve():
                pause = self.POLL_S[0]
            else:
                pause = min(pause * 2, self.POLL_S[1])
            await asyncio.sleep(pause)


class _Connection(asyncio.BufferedProtocol):
    """One client connection: its decoder, its deliveries, its waiting CONSUMEs, its clocks."""

    _tags = itertools.count(1)

    def __init__(self, server):
        self.server = server
        self.transport = None
        self.peer = None
        self.authed = server.token is None
        self.decoder = FrameDecoder(server.max_frame_bytes if self.authed else PRE_AUTH_MAX_FRAME_BYTES)
        self.bounds = _Boundaries()
        self.deliveries = {}  # tag -> Delivery
        self.waiters = set()  # this connection's waiting CONSUMEs
        self.reserved = 0  # budget bytes held for the open frame
        self.budget_wait = False  # in line for budget: paused (its frame clock runs on)
        self.write_paused = False  # the client does not read its replies: take no requests
        self.reading = True
        self.closing = False
        self.refused = False  # over the connection cap: the error frame, then close
        self.lingering = False  # a refused one, counted in server.lingering
        self.eof_sent = False
        self.frame_started = None  # loop time the open frame's first byte came
        self.last_active = server.loop.time()
        self.said_waiting_limit = False
        self._abort = None

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport):
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        if not self.server.admit(self):
            self.refuse()

    def get_buffer(self, sizehint):
        room = self.room() if not self.closing else _READ_CHUNK  # a closing one's bytes are dropped
        return self.server.rview[: min(max(room, 1), _READ_CHUNK)]  # an empty buffer is an error

    def buffer_updated(self, nbytes):
        if self.closing:
            return
        try:
            self.received(self.server.rview[:nbytes])
        except Exception:  # a bug must cost this connection, never the server
            log.exception("%s: internal error; closing", self.peer)
            self.shut()

    def eof_received(self):
        if not self.closing:
            self.shut(linger=False)
        return False  # the transport closes, once what is written is sent

    def pause_writing(self):
        self.write_paused = True
        self.update_reading()

    def resume_writing(self):
        self.write_paused = False
        if not self.closing:
            self.process()
            if not self.closing:
                self.account()

    def connection_lost(self, exc):
        if self._abort is not None:
            self._abort.cancel()
        self.closing = True
        if self.refused:
            if self.lingering:
                self.server.lingering -= 1
            return
        self.drop_waiters()
        self.release_deliveries()
        self.server.budget.forget(self)
        self.server.connection_gone(self)

    # ------------------------------------------------------------------ reading
    def room(self) -> int:
        """How many more bytes this connection may take now."""
        if self.reserved:
            return self.reserved - self.bounds.got
        limit = SMALL_FRAME_BYTES if self.authed else PRE_AUTH_MAX_FRAME_BYTES + HEADER_SIZE
        return limit - self.decoder.buffered

    def received(self, data):
        self.decoder.feed(data)
        ended = self.bounds.advance(data)
        if ended and self.reserved:
            self.server.budget.release(self)  # a reserved read ends where its frame does
        if not self.bounds.got:
            self.frame_started = None
        elif ended or self.frame_started is None:
            self.frame_started = self.server.loop.time()
        self.process()
        if not self.closing:
            self.account()

    def account(self):
        """Reserve budget for the open frame if it is big, then read on or pause."""
        need = self.bounds.need
        if (need > SMALL_FRAME_BYTES and not self.reserved and not self.budget_wait
                and need <= self.decoder.max_frame_bytes + HEADER_SIZE):
            if not self.server.budget.reserve(self, need):
                log.debug("%s: waits for %d bytes of the buffer budget", self.peer, need)
        self.update_reading()

    def update_reading(self):
        want = not (self.closing or self.write_paused or self.budget_wait) and self.room() > 0
        if want != self.reading:
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def process(self):
        """Handle the complete frames the decoder holds, while the client reads replies."""
        while not self.closing and not self.write_paused:
            try:
                frame = self.decoder.next_frame()
            except ProtocolError as e:
                self.protocol_error(e)
                continue
            if frame is None:
                return
            self.last_active = self.server.loop.time()
            self.dispatch(frame)

    def protocol_error(self, e):
        reason = str(e)
        if not self.authed and e.status == Status.TOO_LARGE:
            reason = f"before a HELLO with the token, frames may be at most {PRE_AUTH_MAX_FRAME_BYTES} bytes"
        self.send(encode_error(getattr(e, "msg_type", 0), e.msg_id, e.status, reason))
        if e.fatal:
            self.shut(f"{reason}; closing")

    # ------------------------------------------------------------------ writing, closing
    def send(self, data: bytes):
        if not self.eof_sent and not self.transport.is_closing():
            self.transport.write(data)

    def refuse(self):
        """Over the connection cap: a LIMIT_EXCEEDED frame (msg id 0), then close."""
        server = self.server
        self.refused = self.closing = True
        if server.stopping:
            self.send(encode_error(0, 0, Status.LIMIT_EXCEEDED, "the server is stopping"))
        else:
            self.send(encode_error(0, 0, Status.LIMIT_EXCEEDED,
                                   f"too many connections (the server's limit is {server.limits.max_connections})"))
            server.note_refused()
        if server.lingering >= _MAX_LINGERING:  # a storm of connections: no time for each
            self.transport.close()
            return
        server.lingering += 1
        self.lingering = True
        self.linger()

    def shut(self, reason=None, linger=True):
        """Close: waiting CONSUMEs are dropped and deliveries are ready again at once.
        With ``linger`` (a client's fault), see ``linger``; else the written replies
        leave within the frame timeout, or the connection is aborted."""
        if self.closing:
            return
        self.closing = True
        if reason:
            log.info("%s: %s", self.peer, reason)
        self.drop_waiters()
        self.release_deliveries()
        self.server.budget.forget(self)
        if linger:
            self.linger()
            return
        self.transport.close()
        self._abort = self.server.loop.call_later(self.server.limits.frame_timeout, self.transport.abort)

    def linger(self):
        """FIN after the written replies, then read and drop what the client still sends
        until it closes too, for a second at most. Closing a socket that has unread bytes
        resets the connection, and a reset makes the client drop our error frame unread."""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.eof_sent = True
        try:
            self.transport.write_eof()
        except OSError:  # the client is gone already
            self.transport.abort()
            return
        if not self.reading:
            self.reading = True
            self.transport.resume_reading()
        self._abort = self.server.loop.call_later(_LINGER_S, self.transport.abort)

    def check_clocks(self, now):
        """Called by the sweeper: close on a frame past its deadline, or when idle."""
        limits = self.server.limits
        if self.closing:
            return
        if self.frame_started is not None and now - self.frame_started > limits.frame_timeout:
            self.send(encode_error(0, 0, Status.LIMIT_EXCEEDED,
                                   f"a frame must arrive whole within {limits.frame_timeout:g}s"))
            self.shut(f"a frame took longer than {limits.frame_timeout:g}s; closing")
            return
        idle = limits.idle_timeout if self.authed else min(limits.idle_timeout, limits.frame_timeout)
        if (not self.waiters and self.frame_started is None and not self.budget_wait
                and now - self.last_active > idle):
            self.shut(f"idle for {idle:g}s; closing" if self.authed else f"no HELLO within {idle:g}s; closing")

    def drop_waiters(self):
        for w in self.waiters:
            w.group.drop(w)
        self.waiters.clear()

    def release_deliveries(self):
        """Every delivery this connection did not settle is ready again at once."""
        by_queue = {}
        for d in self.deliveries.values():
            by_queue.setdefault(d.queue, []).append(d)
        if self.deliveries:
            log.info("%s: closed holding %d deliveries: ready again", self.peer, len(self.deliveries))
        self.deliveries.clear()
        for name, ds in by_queue.items():
            try:
                self.server.queue(name).nack_many(ds)  # requeued now
            except (DeliveryExpired, QueueNotFound):
                continue
            except ShmqError as e:
                log.warning("%s: could not release %d deliveries of %s: %s", self.peer, len(ds), name, e)
                continue
            self.server.notify(name)

    # ------------------------------------------------------------------ requests
    def dispatch(self, frame):
        if frame.is_reply:
            self.send(encode_error(frame.request_type, frame.msg_id, Status.BAD_REQUEST, "clients send requests"))
            return
        if not self.authed and frame.type != MsgType.HELLO:
            self.send(encode_error(frame.type, frame.msg_id, Status.UNAUTHORIZED, "say HELLO with the token first"))
            self.shut("a request before HELLO; closing")
            return
        if frame.type == MsgType.CONSUME:
            self.consume(frame)
            return
        self.reply(frame, self.handle)

    def reply(self, frame, handler):
        try:
            fields = validate_request(frame)
            payload = handler(frame.type, fields)
        except Unauthorized as e:
            self.send(encode_error(frame.type, frame.msg_id, Status.UNAUTHORIZED, str(e)))
            self.shut(f"{e}; closing")
            return
        except Exception as e:  # every error becomes an error reply; the server lives on
            self.send(encode_error(frame.type, frame.msg_id, _status_of(e), _reason(e)))
            return
        self.send(encode_reply(frame.type, frame.msg_id, payload))

    def handle(self, msg_type, f):
        server = self.server
        if msg_type == MsgType.HELLO:
            if server.token is not None:
                if not hmac.compare_digest(str(f.get("token") or "").encode(), server.token.encode()):
                    raise Unauthorized("wrong or missing token")
                self.authed = True
                self.decoder.max_frame_bytes = server.max_frame_bytes
            return {"server": "shmq", "version": __version__, "max_frame_bytes": server.max_frame_bytes}
        if msg_type == MsgType.PING:
            return {}
        if msg_type == MsgType.LIST:
            return {"queues": server.broker.list_queues()}
        if msg_type == MsgType.CREATE:
            vis = f.get("visibility_timeout_ms")
            extra = {"durability": f["durability"]} if "durability" in f else {}
            q = server.broker.create_queue(
                f["queue"],
                max_bytes=f.get("max_bytes", 64 * 2**20),
                max_message_bytes=f.get("max_message_bytes"),
                visibility_timeout=30.0 if vis is None else vis / 1000,
                max_deliveries=f.get("max_deliveries"),
                dead_letter_queue=f.get("dead_letter_queue"),
                exist_ok=bool(f.get("exist_ok", False)),
                **extra,
            )
            try:
                if server.on_create is not None:
                    server.on_create(q)
            finally:
                q.close()
            return {}
        if msg_type == MsgType.DELETE:
            server.forget(f["queue"])
            server.broker.delete_queue(f["queue"])
            return {}
        q = server.queue(f["queue"])
        if msg_type == MsgType.PRODUCE:
            msg_id = q.put_nowait(f["body"], f.get("headers"))
            server.notify(q.name)
            return {"id": msg_id}
        if msg_type == MsgType.PRODUCE_BATCH:
            items = [(m["body"], m.get("headers")) for m in f["messages"]]
            ids = q.put_many(items, timeout=0)
            server.notify(q.name)
            return {"ids": ids}
        if msg_type == MsgType.STATS:
            s = q.stats()
            return {
                "ready": s.ready, "in_flight": s.in_flight,
                "oldest_ready_age_ms": int(s.oldest_ready_age_s * 1000), "bytes_used": s.bytes_used,
                "max_bytes": s.max_bytes, "enqueued_total": s.enqueued_total, "acked_total": s.acked_total,
                "redelivered_total": s.redelivered_total, "dead_lettered_total": s.dead_lettered_total,
                "consumers_waiting": s.consumers_waiting, "producers_waiting": s.producers_waiting,
                "delayed": s.delayed, "purged_total": s.purged_total,
            }
        if msg_type == MsgType.PURGE:
            return {"purged": q.purge()}
        if msg_type == MsgType.ACK:
            ds = self.take_deliveries(q, f["deliveries"], keep=False)
            acked = q.ack_many(ds) if ds else 0
            return {"acked": acked}
        if msg_type == MsgType.NACK:
            ds = self.take_deliveries(q, f["deliveries"], keep=False)
            if f.get("requeue", True):
                q.nack_many(ds, f.get("delay_ms", 0) / 1000)
                server.notify(q.name)
            else:
                q.reject_many(ds)
            return {}
        if msg_type == MsgType.REJECT:
            q.reject_many(self.take_deliveries(q, f["deliveries"], keep=False))
            return {}
        if msg_type == MsgType.EXTEND:
            for d in self.take_deliveries(q, f["deliveries"], keep=True):
                d.extend(f["visibility_ms"] / 1000)
            return {}
        raise ProtocolError(f"unsupported request type {msg_type:#04x}", Status.BAD_REQUEST)

    def take_deliveries(self, q, tags, keep):
        """The deliveries named by ``tags`` (all of this connection and queue), or
        DeliveryExpired naming the unknown ones (and touching none)."""
        unknown = [t for t in tags if t not in self.deliveries or self.deliveries[t].queue != q.name]
        if unknown:
            raise DeliveryExpired(f"unknown deliveries on this connection: {unknown[:10]}")
        if keep:
            return [self.deliveries[t] for t in tags]
        return [self.deliveries.pop(t) for t in tags]

    def consume(self, frame):
        """Answer at once when messages are ready (or ``wait_ms`` is 0), else wait in the
        queue's FIFO — up to the per-connection limit, past which LIMIT_EXCEEDED."""
        server = self.server
        try:
            f = validate_request(frame)
            q = server.queue(f["queue"])
            most = f["max"]
            vis = None if f.get("visibility_ms") is None else f["visibility_ms"] / 1000
            # the reply must fit in a frame: bodies and headers, plus per-message framing
            max_bytes = max(server.max_frame_bytes - 1024 - most * _RECORD_OVERHEAD, 0)
            try:
                ds = q.get_many(most, timeout=0, visibility_timeout=vis, max_bytes=max_bytes)
            except QueueEmpty:
                if not f["wait_ms"] or server.stopping:
                    ds = _NOTHING
                else:
                    self.wait(frame.msg_id, q, most, vis, max_bytes, f["wait_ms"])
                    return
        except Exception as e:
            self.send(encode_error(frame.type, frame.msg_id, _status_of(e), _reason(e)))
            return
        self.send(encode_reply(frame.type, frame.msg_id, {"messages": self.lease(ds)}))

    def wait(self, msg_id, q, most, vis, max_bytes, wait_ms):
        limit = self.server.limits.max_waiting_per_connection
        if len(self.waiters) >= limit:
            if not self.said_waiting_limit:
                self.said_waiting_limit = True
                log.info("%s: reached its limit of %d waiting CONSUMEs; refusing more", self.peer, limit)
            raise LimitExceeded(f"too many waiting CONSUMEs on this connection (the limit is {limit}): "
                                f"wait for replies before sending more")
        group = self.server.waiters_of(q)
        w = _Waiter(self, group, msg_id, most, vis, max_bytes)
        group.add(w, self.server.loop.time() + wait_ms / 1000)
        self.waiters.add(w)

    def answer(self, w, result):
        """The end of a wait: messages (maybe none) or an error."""
        self.waiters.discard(w)
        self.last_active = self.server.loop.time()
        if isinstance(result, BaseException):
            self.send(encode_error(MsgType.CONSUME, w.msg_id, _status_of(result), _reason(result)))
        else:
            self.send(encode_reply(MsgType.CONSUME, w.msg_id, {"messages": self.lease(result)}))

    def lease(self, ds):
        """The wire form of leased deliveries; they belong to this connection from now."""
        out = []
        for d in ds:
            tag = next(self._tags)
            self.deliveries[tag] = d
            out.append({"id": d.id, "delivery": tag, "body": d.body, "headers": d.headers, "attempt": d.attempt})
        return out


class Unauthorized(Exception):
    pass


def _status_of(exc):
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return status
    if not isinstance(exc, ShmqError):
        log.error("internal error", exc_info=exc)
    return Status.INTERNAL


def _reason(exc):
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:500]


class TcpServer:
    """Serves one namespace over TCP until ``stop``, within ``limits``."""

    def __init__(self, broker: Broker, host="127.0.0.1", port=7878, token=None,
                 max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, on_create=None, limits: Limits | None = None):
        self.limits = limits if limits is not None else Limits()
        if self.limits.max_buffered_bytes < max_frame_bytes + HEADER_SIZE:
            raise ValueError(f"max_buffered_bytes ({self.limits.max_buffered_bytes}) must hold one whole frame: "
                             f"at least max_frame_bytes + {HEADER_SIZE} = {max_frame_bytes + HEADER_SIZE}")
        self.broker = broker
        self.on_create = on_create  # called with each queue this server creates
        self.host = host
        self.port = port
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.connections = set()
        self.lingering = 0  # refused connections not yet closed
        self.stopping = False
        self.budget = _Budget(self.limits.max_buffered_bytes)
        self.rview = memoryview(bytearray(_READ_CHUNK))  # every connection reads into it, in turn
        self.loop = None
        self._queues = {}
        self._waiters = {}  # queue name -> _QueueWaiters
        self._refused = 0  # connections refused since the cap was last reached
        self._server = None
        self._sweeper = None
        self._all_gone = None

    def queue(self, name):
        """A cached handle on queue ``name`` (re-attached after a delete + create)."""
        q = self._queues.get(name)
        if q is not None:
            if not q.deleted:
                return q
            self.forget(name)
        q = self._queues[name] = self.broker.queue(name)
        q.lock_timeout = LOCK_TIMEOUT_S  # a stopped local lock holder stalls the loop this long at most
        return q

    def forget(self, name):
        """Drop the handle on ``name``; whoever waits on it hears that it was deleted."""
        q = self._queues.pop(name, None)
        group = self._waiters.pop(name, None)
        if group is not None:
            group.answer_all(QueueNotFound(f"queue {name!r} was deleted"))
        if q is not None:
            q.close()

    def notify(self, name):
        """Messages were just made ready by this loop: serve that queue's waiting CONSUMEs
        once the current request is answered (the poller is for other processes)."""
        group = self._waiters.get(name)
        if group is not None:
            group.schedule()

    def waiters_of(self, q):
        group = self._waiters.get(q.name)
        if group is None or group.q is not q:
            group = self._waiters[q.name] = _QueueWaiters(self, q)
        return group

    # ------------------------------------------------------------------ connections
    def admit(self, conn) -> bool:
        if self.stopping or len(self.connections) >= self.limits.max_connections:
            return False
        self.connections.add(conn)
        return True

    def note_refused(self):
        self._refused += 1
        if self._refused == 1:
            log.info("%d connections open, the limit (--max-connections): refusing new ones",
                     len(self.connections))

    def connection_gone(self, conn):
        self.connections.discard(conn)
        if self._refused and len(self.connections) < self.limits.max_connections:
            log.info("accepting connections again; %d refused meanwhile", self._refused)
            self._refused = 0
        if not self.connections and self._all_gone is not None and not self._all_gone.done():
            self._all_gone.set_result(None)

    async def _sweep(self):
        """Every so often, close the connections past a deadline (frame or idle)."""
        limits = self.limits
        tick = min(max(min(limits.frame_timeout, limits.idle_timeout) / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(tick)
            now = self.loop.time()
            for conn in list(self.connections):
                conn.check_clocks(now)

    async def start(self):
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: _Connection(self), self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self._sweeper = self.loop.create_task(self._sweep())
        return self

    async def stop(self):
        """Stop accepting, answer what is in flight (waiting CONSUMEs get what is
        there, possibly nothing), then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for group in list(self._waiters.values()):
            group.serve()
            group.answer_all(_NOTHING)
        if self.connections:
            self._all_gone = self.loop.create_future()
            for conn in list(self.connections):
                conn.shut(linger=False)
            try:
                await asyncio.wait_for(asyncio.shield(self._all_gone), 5)
            except asyncio.TimeoutError:
                for conn in list(self.connections):
                    conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
        for name in list(self._queues):
            self.forget(name)
