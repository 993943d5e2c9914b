"""The asyncio TCP client: ``broker = await shmq.client.aio.connect("tcp://host:port")``.

Strategy: the calls and the connection's state are the sans-IO core's
(``shmq.client.core``); this module moves their bytes over one stream, many requests
in flight. Each request waits on a future keyed by its msg id; one reader task feeds
the core what arrives and wakes the requests it answers, in whatever order the server
sends them, so a waiting ``get`` never holds back a ``put`` on the same connection.
When the connection ends (lost, closed, or an error with msg id 0 such as too many
connections) every waiting request, and every later one, raises why.
"""

import asyncio
from collections import deque

from ..errors import BrokerUnavailable
from ..protocol import MsgType
from ..protocol.forms import from_pairs, max_records_field
from .core import BrokerCalls, DeliveryCalls, Pause, Post, QueueCalls, Receive, Run, Send, driven
from .streams import ConsumerCalls, StreamCalls
from .subscription import SubscriptionCalls

__all__ = ["connect", "AsyncBroker", "AsyncQueue", "AsyncDelivery", "AsyncSubscription", "AsyncStream",
           "AsyncConsumer"]


async def connect(url: str, token: str | None = None) -> "AsyncBroker":
    """Open a connection to ``shmq server`` and say HELLO (with ``token``, else
    $SHMQ_TOKEN, else your own server's token on this host: see shmq.auth)."""
    broker = AsyncBroker(url, token)
    await broker._open()
    return broker


class AsyncDelivery(DeliveryCalls):
    """A leased message; ``await d.ack()`` / ``nack()`` / ``reject()`` / ``extend()``."""

    __slots__ = ()


class AsyncSubscription(SubscriptionCalls):
    """``async for d in q.consume(prefetch=N)``: deliveries pushed by the server;
    ``await aclose()`` (or leaving its ``async with``, or dropping it) cancels it."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        d = await self._q._drive(self._next())
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


class AsyncQueue(QueueCalls):
    """The Queue API, awaitable; ``async for d in q`` yields deliveries forever."""

    _delivery_class = AsyncDelivery
    _subscription_class = AsyncSubscription

    def __aiter__(self):
        return self

    async def __anext__(self) -> AsyncDelivery:
        return await self.get()


class AsyncConsumer(ConsumerCalls):
    """The Consumer API, awaitable; ``async with`` leaves on exit, ``async for r in c``
    yields records one by one, for ever. Iteration polls batches of up to 500 and hands
    them out one at a time: ``poll`` returns what it still holds first, and ``commit()``
    commits up to the record last handed out, never past one not yet seen."""

    def __init__(self, *args):
        super().__init__(*args)
        self._buffer = deque()  # polled by the iteration, not yet handed out

    @driven
    def poll(self, max_records: int = 500, timeout: float = 1.0):
        if not self._buffer:
            return (yield from ConsumerCalls.poll.__wrapped__(self, max_records, timeout))
        self._fields()  # raises once closed
        n = max_records_field(max_records)
        return [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]

    @driven
    def commit(self, offsets: dict | None = None):
        if offsets is None and self._buffer:
            offsets = from_pairs((yield Send(MsgType.ASSIGNMENT, self._fields()))["positions"])
            for r in self._buffer:
                offsets[r.partition] = min(offsets.get(r.partition, r.offset), r.offset)
        return (yield from ConsumerCalls.commit.__wrapped__(self, offsets))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._buffer:
            self._buffer.extend(await self._poll_until_some())
        return self._buffer.popleft()

    @driven
    def _poll_until_some(self):
        return (yield from self._poll({**self._fields(), "max": 500}, None))


class AsyncStream(StreamCalls):
    """The Stream API, awaitable."""

    _consumer_class = AsyncConsumer


class AsyncBroker(BrokerCalls):
    """The broker API, awaitable: create_queue, queue, list_queues, delete_queue,
    create_stream, stream, list_streams, delete_stream, the exchanges (create_exchange,
    bind, unbind, publish, list_exchanges, exchange_info, delete_exchange), request,
    ping, close. A waiting ``request`` holds back nothing else on the connection."""

    _queue_class = AsyncQueue
    _stream_class = AsyncStream

    def __init__(self, url, token=None):
        super().__init__(url, token)
        self._pending = {}  # msg id -> a future set once the core knows its outcome
        self._pushed = {}  # subscription id -> a future set when something is pushed for it
        self._core.on_push = self._on_push
        self._writer = None
        self._reader_task = None
        self.server_info = None

    async def _open(self):
        try:
            reader, self._writer = await asyncio.open_connection(self.host, self.port)
        except OSError as e:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {e.strerror or e}") from None
        self._reader_task = asyncio.create_task(self._read(reader))
        try:
            self.server_info = await self._hello("shmq-python-aio", self._writer.get_extra_info("sockname"),
                                                 self._writer.get_extra_info("peername"))
        except BaseException:
            await self.close()
            raise

    async def close(self):
        self._wake(self._core.close())
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # ---------------------------------------------------------------- transport
    async def _read(self, reader):
        """Feed the core what arrives until the connection ends."""
        try:
            while not self._core.failed:
                self._wake(self._core.receive_data(await reader.read(65536)))
        except Exception as e:  # OSError; anything else must not leave requests waiting either
            self._wake(self._core.connection_lost(e))
        finally:
            self._writer.close()
            for sid in list(self._pushed):
                self._on_push(sid)

    def _on_push(self, sid):
        waiter = self._pushed.pop(sid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _post(self, msg_type, payload=None) -> None:
        """Send one request without waiting for its reply (``ClientCore.post``)."""
        self._writer.write(self._core.post(msg_type, payload))  # raises once the connection has ended

    async def _receive(self, sid) -> None:
        """Wait until something is pushed for subscription ``sid``."""
        core = self._core
        while not core.pushes(sid):
            if core.failed:
                raise core.ended_error()
            waiter = self._pushed[sid] = asyncio.get_running_loop().create_future()
            await waiter

    def _wake(self, msg_ids):
        for msg_id in msg_ids:
            answered = self._pending.pop(msg_id, None)
            if answered is not None and not answered.done():
                answered.set_result(None)

    async def _request(self, msg_type, payload=None) -> dict:
        """Send one request and return its reply payload (or raise its error)."""
        msg_id, data = self._core.send(msg_type, payload)  # raises once the connection has ended
        answered = self._pending[msg_id] = asyncio.get_running_loop().create_future()
        try:
            self._writer.write(data)
            await self._writer.drain()
            await answered
        except OSError as e:
            self._wake(self._core.connection_lost(e))
        finally:
            self._pending.pop(msg_id, None)
            if not answered.done() or answered.cancelled():  # its caller is gone: drop the reply
                self._core.forget(msg_id)
        return self._core.result(msg_id)

    async def _drive(self, call):
        """Run one call of the core: send its requests, sleep its pauses, return its result."""
        run = Run(call)
        for step in run:
            try:
                if isinstance(step, Pause):
                    run.send(await asyncio.sleep(step.seconds))
                elif isinstance(step, Post):
                    self._post(step.msg_type, step.payload)
                    await self._writer.drain()
                    run.send(None)
                elif isinstance(step, Receive):
                    run.send(await self._receive(step.sid))
                else:
                    run.send(await self._request(step.msg_type, step.payload))
            except Exception as e:
                run.throw(e)
        return run.result
