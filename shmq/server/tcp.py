"""The TCP front of ``shmq server``: DEADBEEF frames in, engine calls, frames out.

Strategy: one asyncio event loop, one coroutine per connection, no thread per client.
Every engine call the loop makes is non-blocking (``put_nowait``, ``get_many(timeout=0)``,
settles): they hold a queue's lock for microseconds. The only waiting — a CONSUME with
``wait_ms`` on an empty queue — is an asyncio wait on a per-queue event
(``_ReadyWatch``): a thousand waiting consumers cost one event and one poller task per
queue, not a thread each. Requests
are handled as they arrive and replies carry the request's msg id, so a waiting
CONSUME never holds back the replies behind it. Deliveries belong to the connection
that received them; when it closes, every one it did not settle is ready again at once.
"""

import asyncio
import hmac
import itertools
import logging

from .. import __version__
from ..broker import Broker
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
    FrameDecoder,
    MsgType,
    Status,
    encode_error,
    encode_reply,
    validate_request,
)

__all__ = ["TcpServer"]

log = logging.getLogger("shmq.server")

_READ_CHUNK = 256 * 1024
_RECORD_OVERHEAD = 128  # bytes a message adds to a CONSUME reply besides body and headers

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


class _ReadyWatch:
    """Wakes the CONSUMEs waiting on one queue when a message may be ready.

    Puts made by this server's own loop wake them directly (``TcpServer.notify``).
    Puts by other processes (local producers writing to shared memory) are seen by a
    poller task that reads the queue's ready count — one word, no lock, no syscall —
    with a short backoff while anyone waits, so no thread and no semaphore wake-up
    ever competes with the event loop for the GIL.
    """

    POLL_S = (0.0002, 0.002)  # first and longest pause between reads of the ready count

    def __init__(self, queue):
        self._queue = queue
        self._event = asyncio.Event()
        self._waiters = 0
        self._poller = None

    async def wait(self, timeout):
        """Wait until a message may be ready (or ``timeout`` seconds)."""
        self._waiters += 1
        event = self._event
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiters -= 1

    def _fire(self):
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def _poll(self):
        pause = self.POLL_S[0]
        while self._waiters > 0:
            try:
                ready = self._queue.ready_hint()
            except ShmqError:
                ready = True  # deleted or closed: let the waiters find out
            if ready:
                self._fire()
                pause = self.POLL_S[0]
            else:
                pause = min(pause * 2, self.POLL_S[1])
            await asyncio.sleep(pause)

    def stop(self):
        if self._poller is not None:
            self._poller.cancel()
        self._fire()


class _Connection:
    """One client connection: its decoder, its deliveries, its in-flight requests."""

    _tags = itertools.count(1)

    def __init__(self, server, reader, writer):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername")
        self.decoder = FrameDecoder(server.max_frame_bytes)
        self.authed = server.token is None
        self.deliveries = {}  # tag -> Delivery
        self.tasks = set()
        self.closing = False

    # ------------------------------------------------------------------ I/O
    async def run(self):
        try:
            while not self.closing:
                data = await self.reader.read(_READ_CHUNK)
                if not data:
                    break
                self.decoder.feed(data)
                while not self.closing:
                    try:
                        frame = self.decoder.next_frame()
                    except ProtocolError as e:
                        self.send(encode_error(getattr(e, "msg_type", 0), e.msg_id, e.status, str(e)))
                        if e.fatal:
                            log.info("%s: %s; closing", self.peer, e)
                            self.closing = True
                        continue
                    if frame is None:
                        break
                    self.dispatch(frame)
                await self.writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            await self.close()

    def send(self, data: bytes):
        if not self.writer.is_closing():
            self.writer.write(data)

    async def close(self):
        self.closing = True
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.release_deliveries()
        try:
            await self.writer.drain()
        except ConnectionError:
            pass
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass
        self.server.connections.discard(self)

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
                self.server.queue(name)._settle(ds, 2, 0.0)  # nack, requeue now
            except (DeliveryExpired, QueueNotFound):
                pass
            except ShmqError as e:
                log.warning("%s: could not release %d deliveries of %s: %s", self.peer, len(ds), name, e)

    # ------------------------------------------------------------------ requests
    def dispatch(self, frame):
        if frame.is_reply:
            self.send(encode_error(frame.request_type, frame.msg_id, Status.BAD_REQUEST, "clients send requests"))
            return
        if not self.authed and frame.type != MsgType.HELLO:
            self.send(encode_error(frame.type, frame.msg_id, Status.UNAUTHORIZED, "say HELLO with the token first"))
            self.closing = True
            return
        if frame.type == MsgType.CONSUME:
            task = asyncio.ensure_future(self.handle_async(frame))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        self.reply(frame, self.handle)

    def reply(self, frame, handler):
        try:
            fields = validate_request(frame)
            payload = handler(frame.type, fields)
        except Unauthorized as e:
            self.send(encode_error(frame.type, frame.msg_id, Status.UNAUTHORIZED, str(e)))
            self.closing = True
            return
        except Exception as e:  # every error becomes an error reply; the server lives on
            self.send(encode_error(frame.type, frame.msg_id, _status_of(e), _reason(e)))
            return
        self.send(encode_reply(frame.type, frame.msg_id, payload))

    async def handle_async(self, frame):
        try:
            fields = validate_request(frame)
            payload = await self.consume(fields)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.send(encode_error(frame.type, frame.msg_id, _status_of(e), _reason(e)))
            return
        self.send(encode_reply(frame.type, frame.msg_id, payload))
        try:
            await self.writer.drain()
        except ConnectionError:
            pass

    def handle(self, msg_type, f):
        server = self.server
        if msg_type == MsgType.HELLO:
            if server.token is not None:
                if not hmac.compare_digest(str(f.get("token") or "").encode(), server.token.encode()):
                    raise Unauthorized("wrong or missing token")
                self.authed = True
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
                q._settle(ds, 2, f.get("delay_ms", 0) / 1000)
                server.notify(q.name)
            else:
                q._dead_letter(ds, "rejected")
            return {}
        if msg_type == MsgType.REJECT:
            q._dead_letter(self.take_deliveries(q, f["deliveries"], keep=False), "rejected")
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

    async def consume(self, f):
        server = self.server
        name, wait_ms = f["queue"], f.get("wait_ms", 0)
        vis_ms = f.get("visibility_ms")
        q = server.queue(name)
        most = f.get("max", 1)
        # the reply must fit in a frame: bodies and headers, plus per-message framing
        budget = server.max_frame_bytes - 1024 - most * _RECORD_OVERHEAD
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            try:
                ds = q.get_many(most, timeout=0, visibility_timeout=None if vis_ms is None else vis_ms / 1000,
                                max_bytes=max(budget, 0))
                break
            except QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0 or server.stopping:
                    return {"messages": []}
                await server.watch(q).wait(remaining)
        out = []
        for d in ds:
            tag = next(self._tags)
            self.deliveries[tag] = d
            out.append({"id": d.id, "delivery": tag, "body": d.body, "headers": d.headers, "attempt": d.attempt})
        if self.closing:  # the client left while we waited: give them back
            self.release_deliveries()
        return {"messages": out}


class Unauthorized(Exception):
    pass


def _status_of(exc):
    for cls, status in _STATUS_OF:
        if isinstance(exc, cls):
            return status
    if not isinstance(exc, ShmqError):
        log.exception("internal error")
    return Status.INTERNAL


def _reason(exc):
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:500]


class TcpServer:
    """Serves one namespace over TCP until ``stop``."""

    def __init__(self, broker: Broker, host="127.0.0.1", port=7878, token=None,
                 max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, on_create=None):
        self.broker = broker
        self.on_create = on_create  # called with each queue this server creates
        self.host = host
        self.port = port
        self.token = token
        self.max_frame_bytes = max_frame_bytes
        self.connections = set()
        self.stopping = False
        self._queues = {}
        self._watches = {}
        self._server = None

    def queue(self, name):
        """A cached handle on queue ``name`` (re-attached after a delete + create)."""
        q = self._queues.get(name)
        if q is not None:
            if not q.deleted:
                return q
            self.forget(name)
        q = self._queues[name] = self.broker.queue(name)
        return q

    def forget(self, name):
        q = self._queues.pop(name, None)
        watch = self._watches.pop(name, None)
        if watch is not None:
            watch.stop()
        if q is not None:
            q.close()

    def notify(self, name):
        """Messages were just put by this loop: wake its waiting CONSUMEs directly
        (the poller is for puts by other processes)."""
        watch = self._watches.get(name)
        if watch is not None and watch._waiters:
            watch._fire()

    def watch(self, q):
        w = self._watches.get(q.name)
        if w is None or w._queue is not q:
            w = self._watches[q.name] = _ReadyWatch(q)
        return w

    async def start(self):
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=_READ_CHUNK,
                                                  backlog=1024)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self

    async def _serve(self, reader, writer):
        conn = _Connection(self, reader, writer)
        self.connections.add(conn)
        await conn.run()

    async def stop(self):
        """Stop accepting, answer what is in flight (waiting CONSUMEs get what is
        there, possibly nothing), then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for watch in self._watches.values():
            watch._fire()
        tasks = [t for conn in self.connections for t in conn.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for conn in list(self.connections):
            await conn.close()
        if self._server is not None:
            await self._server.wait_closed()
        for name in list(self._queues):
            self.forget(name)
        for watch in self._watches.values():
            watch.stop()
