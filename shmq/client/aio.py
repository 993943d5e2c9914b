"""The asyncio TCP client: ``broker = await shmq.aio.connect("tcp://host:port")``.

Strategy: the calls and the connection's state are the sans-IO core's
(``shmq.client.core``); this module moves their bytes over one stream, many requests
in flight. Each request waits on a future keyed by its msg id; the connection's protocol
(``_Protocol``) feeds the core what arrives, as it arrives, and wakes the requests it
answers, in whatever order the server sends them, so a waiting ``get`` never holds back
a ``put`` on the same connection.
A request whose task is cancelled is forgotten, and what its late reply takes for the
connection (a CONSUME's messages) the core gives back. When the connection ends (lost,
closed, or an error with msg id 0 such as too many connections) every waiting request
raises why; a call after that connects again first, as ``options.ConnectOptions`` say,
and runs on one connection from start to end, so nothing is ever sent twice. In a
child of fork() the parent's connection and event loop are not the child's: the first
call there connects anew in the child's own event loop (``_forked``). A plain get, put
and ack(wait=False) take the fast path the blocking client's take (``remote``).
"""

import asyncio
import contextlib
import functools
import os

from ..busypoll import LoopSpin
from ..errors import BrokerUnavailable, ShmqError
from ..model import keepalive
from ..protocol import MsgType
from ..tls import describe, note_refused
from . import forks
from .connection import Outbox
from .heartbeat import DEAD, PING, Beat
from .core import BrokerCalls, DeliveryCalls, QueueCalls, came_back
from .plain import PlainQueueCalls
from .options import ConnectOptions, tls_context
from .multiconsumer import MultiConsumerCalls
from .streams import ConsumerCalls, StreamCalls
from .stores import StoreCalls
from .transactions import TransactionalCalls
from .subscription import SubscriptionCalls
from .transport import AsyncTransport, _polled, _resuming

__all__ = ["connect", "AsyncBroker", "AsyncQueue", "AsyncDelivery", "AsyncSubscription", "AsyncStream",
           "AsyncConsumer", "AsyncMultiConsumer", "AsyncStore"]


async def connect(url: str, token: str | None = None, **options):
    """Open a connection to ``shmq server`` and say HELLO (with ``token``, else the url's,
    else $SHMQ_TOKEN, else your own server's token on this host: see shmq.auth).
    ``options``: ``shmq.connect``'s (timeouts, reconnecting: ``options.ConnectOptions``).
    (``shmq.aio.connect`` with no url attaches locally instead: ``engine.aio``.)"""
    broker = AsyncBroker(url, token, **options)
    await broker._open()
    return broker


class _Done:
    """An awaitable that is done at once, with None (what a call that needs no I/O returns)."""

    __slots__ = ()

    def __await__(self):
        return iter(())


_DONE = _Done()


class AsyncDelivery(DeliveryCalls):
    """A leased message; ``await d.ack()`` / ``nack()`` / ``reject()`` / ``extend()``."""

    __slots__ = ()

    def ack(self, wait: bool = True):
        if not wait and not self._settled and self._sub is None:
            q = self._q
            link = q._broker._link
            if (link is not None and self._conn is link.core and not self._conn.failed and not q.closed
                    and link.writer is not None and not link.writer.transport.get_write_buffer_size()):
                self._settled = True  # the plain case: the ack encoded from the queue's shape, held
                link.hold(link.core.post_shaped(q._ack_shape, self._tag))
                return _DONE
        return DeliveryCalls.ack(self, wait)

    ack.__doc__ = DeliveryCalls.ack.__doc__

    def keepalive(self, every: float | None = None) -> "keepalive.Keepalive":
        """Renew the lease in the background, by a task on the running loop, every
        ``every`` seconds (None: a third of the queue's visibility timeout, asked once per
        queue handle), each time to ``3 * every`` from now, until ``stop()`` or the
        delivery is settled. ``async with d.keepalive(): ...`` (or ``with``) stops it at
        the end of the block."""
        return keepalive.in_task(self, every, self._q._visibility_timeout)


class AsyncSubscription(SubscriptionCalls):
    """``async for d in q.consume(prefetch=N)``: deliveries pushed by the server;
    ``await aclose()`` (or leaving its ``async with``, or dropping it) cancels it."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        d = await _resuming(self, lambda: self._q._drive(self._next()))
        if d is None:
            raise StopAsyncIteration
        return d

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel: no more pushes; what was pushed and not handed out is ready again."""
        self.close()

    def close(self) -> None:
        self._close(self._q._broker._post)

    def __del__(self):
        if not self.closed:
            try:
                self.close()
            except Exception:
                pass  # a closed connection released everything already


class AsyncQueue(PlainQueueCalls):
    """The Queue API, awaitable; ``async for d in q`` yields deliveries forever."""

    _delivery_class = AsyncDelivery
    _subscription_class = AsyncSubscription

    async def _visibility_timeout(self) -> float:
        """The queue's visibility timeout, asked once per handle (a keepalive's default)."""
        if self._lease_s is None:
            self._lease_s = (await self.settings())["visibility_timeout"]
        return self._lease_s

    def __aiter__(self):
        return self

    async def __anext__(self) -> AsyncDelivery:
        try:
            return await self.get()
        except BrokerUnavailable:
            if not self._broker._lost():
                raise
        while True:  # a loop of gets rides the outage out (``AsyncBroker._outlast``), as ``consume()`` does
            await self._broker._outlast()
            try:
                return await self.get()
            except BrokerUnavailable:
                if not self._broker._lost():
                    raise

    def put(self, body, headers=None, timeout=None, *, priority=0, delay=0.0, ttl=None, group=None, dedup_id=None,
            wait=True):
        if wait and self._plain_put(body, headers, timeout, self._options_given(priority, delay, ttl, group, dedup_id)):
            return self._broker._put_plain(self, body)
        return QueueCalls.put(self, body, headers, timeout, priority=priority, delay=delay, ttl=ttl, group=group,
                              dedup_id=dedup_id, wait=wait)

    put.__doc__ = QueueCalls.put.__doc__

    def ack_many(self, deliveries, wait: bool = True):
        link = self._broker._link
        if link is not None and not link.core.failed and link.writer is not None:
            tags = self._plain_tags(deliveries, link.core)
            if tags is not None:
                if wait:
                    return self._broker._ack_many_plain(link, self, tags)
                if not link.writer.transport.get_write_buffer_size():  # (else the general path waits for room)
                    link.hold(link.core.post_shaped(self._shapes()[1], tags))
                    for d in deliveries:
                        d._settled = True
                    return _DONE
        return QueueCalls.ack_many(self, deliveries, wait)

    ack_many.__doc__ = QueueCalls.ack_many.__doc__


class _AsyncMember:
    """What an asyncio group member adds to its calls: ``async with`` (leaves on exit) and
    ``async for r in c``, records one by one, for ever, back by itself after a reconnect."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._closed:
            raise StopAsyncIteration
        return await _resuming(self, lambda: self._drive(self._next_record()))

    async def poll(self, max_records: int = 500, timeout: float = 1.0):
        """Records from the partitions this member owns and has not paused, from where it
        is on; waits up to ``timeout`` seconds for some, returns [] if none came. Calls
        on_revoke / on_assign first when the assignment moved, and commits when
        auto-commit is due. While its connection is lost it reconnects within ``timeout``
        (and returns [] if the server is not back by then), joining again when it is;
        BrokerUnavailable once the outage has lasted ``max_outage`` (``aio.connect``)."""
        if not self._outlasts():  # (the connection is up)
            try:
                return await super().poll(max_records, timeout)
            except BrokerUnavailable:
                if not self._outlasts():
                    raise
        return await _polled(self, super().poll, max_records, timeout)


class AsyncConsumer(_AsyncMember, ConsumerCalls):
    """The Consumer API, awaitable (``ConsumerCalls``: ``poll`` returns what the iteration
    still holds first, ``commit()`` never commits past a record not yet handed out).
    on_assign / on_revoke are plain functions, called in the poll."""


class AsyncMultiConsumer(_AsyncMember, MultiConsumerCalls):
    """The MultiConsumer API, awaitable."""


class AsyncStream(StreamCalls):
    """The Stream API, awaitable."""

    _consumer_class = AsyncConsumer


class AsyncTransactional(TransactionalCalls):
    """A transactional producer over asyncio (``await broker.transactional(...)``);
    ``async with p.transaction():`` commits at the end of the block, or aborts if it
    raises."""

    @contextlib.asynccontextmanager
    async def transaction(self):
        self.begin()
        try:
            yield self
        except BaseException:
            await self.abort()
            raise
        await self.commit()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()


class AsyncStore(StoreCalls):
    """The keyed store API (the local ``Store``'s), awaitable."""

    def close(self) -> None:
        """Nothing to release: the connection belongs to the broker."""


class _Link:
    """One connection: its core, its writer, the futures of its requests
    waiting for replies (by msg id) and of its subscriptions waiting for pushes (by id).

    Requests nobody waits for (``ack(wait=False)``, ``put(wait=False)``) are not written
    at once: they go with the next request written, or at the loop's next turn, whichever
    comes first (``hold``), so a loop of them costs one write, not one each."""

    __slots__ = ("core", "writer", "gone", "pending", "pushed", "out", "due", "heart", "spin")

    def __init__(self, core, writer):
        self.core = core
        self.writer = writer
        self.gone = None  # a future done once the connection is lost (``_Protocol``)
        self.pending = {}
        self.pushed = {}
        self.out = Outbox()  # posted requests' bytes not written yet
        self.due = False  # a ``flush`` is scheduled
        self.heart = None  # its heartbeat task (``AsyncBroker._beat``)
        self.spin = LoopSpin(None, 0)  # the loop looks for replies awake a while (``_connect`` sets it)

    @property
    def never(self) -> bool:
        """Not connected in this process (a child of fork()'s first call connects)."""
        return self.writer is None

    def hold(self, data) -> None:
        if self.out.hold(data):
            self.writer.write(self.out.take())
        if not self.due:
            self.due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def write(self, data) -> None:
        """Write what is held, then ``data``."""
        data = self.out.take(data)
        if data:
            self.writer.write(data)

    def flush(self) -> None:
        """Write the puts the core gathered and what is held."""
        self.due = False
        if self.core.failed or self.writer is None or self.writer.is_closing():
            return
        self.write(self.core.batched())


def _let_go(fd: int) -> None:
    """Drop this process's reference to the socket ``fd`` without touching the connection
    (no shutdown): /dev/null takes its number, so whatever still holds the number (the
    parent's transport, should this process finalize it) unregisters from the parent's
    epoll, and closes, nothing of the parent's."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


class AsyncBroker(AsyncTransport, BrokerCalls):
    """The broker API, awaitable: create_queue, queue, list_queues, delete_queue,
    create_stream, stream, list_streams, delete_stream, the exchanges (create_exchange,
    bind, unbind, publish, list_exchanges, exchange_info, delete_exchange), request,
    ping, close. A waiting ``request`` holds back nothing else on the connection."""

    _queue_class = AsyncQueue
    _stream_class = AsyncStream
    _store_class = AsyncStore
    _transactional_class = AsyncTransactional
    _multi_consumer_class = AsyncMultiConsumer

    @staticmethod
    async def _sleep(seconds):  # a call's pauses, and a reconnect's
        await asyncio.sleep(seconds)

    def __init__(self, url, token=None, **options):
        super().__init__(url, token)
        self.options = ConnectOptions(**options)
        self.server_info = None
        self._link = None
        self._closed = False
        self._opening = asyncio.Lock()  # one task reconnects, the others wait for its outcome
        self._rounds = 0  # reconnects given up, and the error of the last one
        self._gave_up = None

    def __repr__(self):
        return f"<shmq.AsyncBroker {self.url}>"

    async def _open(self):
        self._link = await self._connect(self._core)
        forks.track(self)

    async def close(self):
        """Close the connection; the handle never reconnects after this."""
        self._closed = True
        forks.untrack(self)
        link = self._link
        if link is not None:
            link.flush()  # what was sent without waiting goes before the close
            self._wake(link, link.core.close())
            await self._shut(link)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def _forked(self, parent: int) -> None:
        """In a child of fork() (only this thread runs): the connection is process
        ``parent``'s, and so is its event loop, whose epoll and self-pipe the child
        shares: nothing of them runs or closes here. The child's copy of the socket goes
        (``_let_go``), what was bound to the connection ends (``ClientCore.forked``), and
        the first call connects anew in the child's running event loop, with the same
        url, token and options. The child takes a fresh lock (one held at the fork, or
        bound to the parent's loop, would not do)."""
        self._opening = asyncio.Lock()
        old = self._link
        old.core.forked(parent)
        if old.writer is not None:
            sock = old.writer.get_extra_info("socket")
            if sock is not None and sock.fileno() >= 0:
                _let_go(sock.fileno())
        self._link = _Link(old.core, None)

    # ---------------------------------------------------------------- connecting
    async def _connect(self, core) -> _Link:
        """A new connection with ``core`` for its state, HELLO said, both within the
        connect limit; BrokerUnavailable if the endpoint cannot be reached."""
        limit = self.options.connect_limit
        tls = tls_context(self.url, self.options)  # (tcps:// or ssl=: the handshake is in the connect limit)
        loop = asyncio.get_running_loop()
        link = _Link(core, None)
        link.gone = loop.create_future()
        link.spin = LoopSpin(loop, self.options.busy_poll_us, link.pending.__len__)  # while replies are awaited
        try:
            async with asyncio.timeout(limit):
                transport, protocol = await loop.create_connection(
                    lambda: _Protocol(self, link, loop), self.host, self.port, ssl=tls,
                    server_hostname=self.host if tls else None)
        except TimeoutError:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: no answer within {limit:g}s") from None
        except OSError as e:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {describe(e, self.options.ssl)}") from None
        writer = link.writer = asyncio.StreamWriter(transport, protocol, None, loop)
        core.on_push = functools.partial(self._on_push, link)
        try:
            hello = BrokerCalls._hello.__wrapped__(self, "shmq-python-aio", writer.get_extra_info("sockname"),
                                                   writer.get_extra_info("peername"))
            self.server_info = await self._run(hello, link, limit)
            core.greeted(self.server_info)
        except BaseException as e:
            self._wake(link, core.close())
            await self._shut(link)
            note_refused(e, tls is not None)
            raise
        if self.options.heartbeat is not None:
            link.heart = asyncio.create_task(self._beat(link))
        return link

    async def _close_lost(self, lost) -> None:
        """Shut ``lost`` before another connection is made (``transport``'s reconnects),
        in an event loop of this process."""
        await self._shut(lost)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a child of fork() still in its parent's event loop
            raise ShmqError(f"this process is a fork of process {lost.core.forked_from}, whose event loop it "
                            "cannot use: call the broker from an event loop of this process (asyncio.run)") from None

    def _installed(self, link, lost) -> None:
        """``link`` is the connection from now on, instead of ``lost``. ``_opening`` held."""
        link.core.carry_over(lost.core)
        self._link, self._core = link, link.core
        came_back(self, lost.core)

    async def _beat(self, link):
        """``link``'s heartbeat (``heartbeat.Beat``): every ``options.heartbeat`` seconds,
        PING or drop it as dead (its waiting calls raise, subscriptions and group
        members come back on the next connection); ends with the connection."""
        every, core = self.options.heartbeat, link.core
        beat = Beat(core)
        while not core.failed:
            await asyncio.sleep(every)
            what = None if core.failed else beat.look()
            if what == PING:
                self._post_on(link, MsgType.PING, {})
                beat.posted()
            elif what == DEAD:
                self._wake(link, core.heart_stopped(every))
                link.writer.close()

    async def _shut(self, link):
        """Close ``link``'s stream and wait until the connection is gone."""
        if link.writer is None:
            return  # never connected in this process
        if link.heart is not None:
            link.heart.cancel()
        link.writer.close()
        try:
            await link.writer.wait_closed()
        except OSError:
            pass
        if link.gone is not None:
            await link.gone

    # ---------------------------------------------------------------- transport
    def _on_push(self, link, sid):
        waiter = link.pushed.pop(sid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _post(self, msg_type, payload=None) -> None:
        """Send one request without waiting for its reply (``ClientCore.post``)."""
        self._post_on(self._link, msg_type, payload)

    @staticmethod
    def _post_on(link, msg_type, payload=None) -> None:
        link.hold(link.core.post(msg_type, payload))  # raises once the connection has ended

    async def _receive(self, link, step) -> None:
        """Wait until something is pushed for subscription ``step.sid``."""
        core, sid = step.core, step.sid
        while not core.pushes(sid):
            if core.failed or core is not link.core:
                raise core.ended_error()
            waiter = link.pushed[sid] = asyncio.get_running_loop().create_future()
            await waiter

    @staticmethod
    def _wake(link, msg_ids):
        for msg_id in msg_ids:
            answered = link.pending.pop(msg_id, None)
            if answered is not None and not answered.done():
                answered.set_result(None)

    async def _exchange(self, link, msg_type, payload=None, limit=None) -> dict:
        """Send one request on ``link`` and return its reply's payload (or raise its error)."""
        msg_id, data = link.core.send(msg_type, payload)  # raises once the connection has ended
        if limit is None:
            limit = self.options.reply_limit(msg_type, payload)
        return await self._answered(link, msg_id, data, msg_type, payload, limit)

    async def _exchange_shaped(self, link, shape, value, limit, raw=False) -> dict:
        """``_exchange`` of a request of ``shape`` (``protocol.shapes``) with ``value``
        (``raw``: its reply's payload as its bytes, ``ClientCore.send_shaped``)."""
        msg_id, data = link.core.send_shaped(shape, value, raw)  # raises once the connection has ended
        return await self._answered(link, msg_id, data, shape.msg_type, shape.fixed, limit)

    async def _ack_many_plain(self, link, q, tags):
        """``q.ack_many(deliveries)`` of checked ``tags`` (``PlainQueueCalls._plain_tags``) on
        ``link``: an ACK encoded from the queue's shape."""
        limit = self.options.reply_limit(MsgType.ACK, None)
        return (await self._exchange_shaped(link, q._shapes()[1], tags, limit))["acked"]

    def _ready_link(self):
        """The connection a fast path runs on; None if there is none or it has ended: the
        call takes the general path, which connects again."""
        link = self._link
        return None if link is None or link.core.failed else link

    async def _post_step(self, link, step) -> None:
        """A call's Post step: held for the next write, then the transport's buffer drained."""
        self._post_on(link, step.msg_type, step.payload)
        try:
            await link.writer.drain()
        except OSError as e:  # as a write that fails: the connection has ended
            self._wake(link, link.core.connection_lost(e))

    async def _answered(self, link, msg_id, data, msg_type, fields, limit) -> dict:
        """Write request ``msg_id`` (``data``, a ``msg_type`` with ``fields``) and return its
        reply's payload (or raise its error), within ``limit`` seconds (None: no limit)."""
        core = link.core
        answered = link.pending[msg_id] = asyncio.get_running_loop().create_future()
        try:
            if limit is None:
                await self._written(link, data, answered)
            else:
                async with asyncio.timeout(limit):
                    await self._written(link, data, answered)
        except TimeoutError:  # this request's limit: a late reply would come to nobody
            self._wake(link, core.timed_out(msg_type, limit))
            link.writer.close()
        except OSError as e:
            self._wake(link, core.connection_lost(e))
        except BaseException:  # cancelled: its caller is gone; what the reply takes is given back
            core.forget(msg_id, msg_type, fields)
            out = core.outgoing()
            if out:
                link.writer.write(out)
            raise
        finally:
            link.pending.pop(msg_id, None)
        return core.result(msg_id, msg_type)

    @staticmethod
    async def _written(link, data, answered) -> None:
        """Write ``data`` (what is held goes first), wait while the transport's buffer is
        over its limit, then for ``answered``."""
        link.write(data)
        if link.writer.transport.get_write_buffer_size():  # (else drain has nothing to wait for)
            await link.writer.drain()
        link.spin.touch()
        await answered

    async def _drive(self, call):
        """Run one call of the core on the connection, made again first if it was lost."""
        link = self._link
        if link.core.failed:
            link = await self._reconnected(link)
        return await self._run(call, link)

class _Protocol(asyncio.StreamReaderProtocol):
    """A connection's protocol: what arrives goes to the core at once (no reader task in
    between: a reply wakes its request in the loop turn that read it), with what the core
    sends by itself (the give-backs of abandoned requests) written after; the end of the
    connection ends every request waiting on it. It has no StreamReader: the StreamWriter
    (``_Link.writer``), its drain and the close are asyncio's own."""

    def __init__(self, broker, link, loop):
        super().__init__(None, loop=loop)
        self._broker = broker
        self._link = link

    def data_received(self, data) -> None:
        link = self._link
        core = link.core
        wake = self._broker._wake
        try:
            wake(link, core.receive_data(data))
            out = core.outgoing()
            if out and not core.failed:
                link.writer.write(out)
        except Exception as e:  # anything must end the connection, not leave requests waiting
            wake(link, core.connection_lost(e))
        if core.failed and link.writer is not None:
            link.writer.close()

    def eof_received(self):
        super().eof_received()
        self._broker._wake(self._link, self._link.core.receive_data(b""))  # closed by the server
        return False  # (the transport closes)

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        link = self._link
        core = link.core
        if not core.failed:
            self._broker._wake(link, core.receive_data(b"") if exc is None else core.connection_lost(exc))
        for sid in list(link.pushed):
            self._broker._on_push(link, sid)
        if not link.gone.done():
            link.gone.set_result(None)
