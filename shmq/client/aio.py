"""The asyncio TCP client: ``broker = await shmq.client.aio.connect("tcp://host:port")``.

Strategy: one connection, many requests in flight. Each request gets a future keyed by
its msg id; one reader task feeds the sans-IO decoder and resolves futures as replies
arrive, in whatever order the server sends them — so a waiting ``get`` never holds
back a ``put`` on the same connection. Errors are the same exceptions as everywhere.
"""

import asyncio
import itertools

from ..auth import client_token, refused
from ..errors import BrokerUnavailable, QueueEmpty, QueueFull, ShmqError, Unauthorized
from ..protocol import FrameDecoder, MsgType, Status, encode_request
from .remote import (
    CONSUME_SLICE_MS,
    PUT_RETRY_S,
    WireDelivery,
    _message,
    _ms,
    consume_fields,
    create_fields,
    error_from_reply,
    parse_url,
    stats_from_reply,
)

__all__ = ["connect", "AsyncBroker", "AsyncQueue", "AsyncDelivery"]


async def connect(url: str, token: str | None = None) -> "AsyncBroker":
    """Open a connection to ``shmq server`` and say HELLO (with ``token``, else
    $SHMQ_TOKEN, else your own server's token on this host: see shmq.auth)."""
    broker = AsyncBroker(url, token)
    await broker._open()
    return broker


class AsyncBroker:
    """The broker API, awaitable: create_queue, queue, list_queues, delete_queue, close."""

    def __init__(self, url, token=None):
        self.url = url
        self.token = token
        self.host, self.port = parse_url(url)
        self.endpoint = f"{self.host}:{self.port}"
        self._ids = itertools.count(1)
        self._pending = {}
        self._writer = None
        self._reader_task = None
        self.server_info = None

    async def _open(self):
        try:
            reader, self._writer = await asyncio.open_connection(self.host, self.port)
        except OSError as e:
            raise BrokerUnavailable(f"cannot connect to {self.endpoint}: {e.strerror or e}") from None
        self._reader_task = asyncio.create_task(self._read(reader))
        hello = {"client": "shmq-python-aio"}
        token, source = client_token(self.token, self._writer.get_extra_info("sockname"),
                                     self._writer.get_extra_info("peername"))
        if token is not None:
            hello["token"] = token
        try:
            self.server_info = await self.request(MsgType.HELLO, hello)
        except Unauthorized as e:
            await self.close()
            raise refused(self.endpoint, source, e) from None

    async def _read(self, reader):
        decoder = FrameDecoder(2**31 - 1)
        error = None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                decoder.feed(data)
                for frame in decoder.frames():
                    fut = self._pending.pop(frame.msg_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
        except (OSError, ShmqError) as e:
            error = e
        finally:
            exc = BrokerUnavailable(f"lost the connection to {self.endpoint}" + (f": {error}" if error else ""))
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(exc)
            self._pending.clear()

    async def request(self, msg_type, payload=None) -> dict:
        if self._writer is None or self._writer.is_closing() or self._reader_task.done():
            raise BrokerUnavailable(f"connection to {self.endpoint} is closed")
        msg_id = next(self._ids) & 0xFFFFFFFF
        fut = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        self._writer.write(encode_request(msg_type, msg_id, payload))
        await self._writer.drain()
        frame = await fut
        if frame.status != Status.OK:
            raise error_from_reply(frame, self.endpoint)
        return frame.payload

    async def close(self):
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
            self._writer = None
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def queue(self, name) -> "AsyncQueue":
        await self.request(MsgType.STATS, {"queue": name})
        return AsyncQueue(self, name)

    async def create_queue(self, name, max_bytes=64 * 2**20, max_message_bytes=None, visibility_timeout=30.0,
                           max_deliveries=None, dead_letter_queue=None, exist_ok=False,
                           durability=None) -> "AsyncQueue":
        await self.request(MsgType.CREATE, create_fields(name, max_bytes, max_message_bytes, visibility_timeout,
                                                         max_deliveries, dead_letter_queue, exist_ok, durability))
        return AsyncQueue(self, name)

    async def delete_queue(self, name):
        await self.request(MsgType.DELETE, {"queue": name})

    async def list_queues(self) -> list[str]:
        return (await self.request(MsgType.LIST))["queues"]


class AsyncDelivery(WireDelivery):
    """A leased message; ``await d.ack()`` / ``nack()`` / ``reject()`` / ``extend()``."""

    __slots__ = ()

    async def ack(self):
        await self._q._call(MsgType.ACK, deliveries=[self._tag])

    async def nack(self, requeue=True, delay=0.0):
        await self._q._call(MsgType.NACK, deliveries=[self._tag], requeue=requeue, delay_ms=_ms(delay, "delay"))

    async def reject(self):
        await self._q._call(MsgType.REJECT, deliveries=[self._tag])

    async def extend(self, seconds):
        await self._q._call(MsgType.EXTEND, deliveries=[self._tag], visibility_ms=_ms(seconds, "seconds"))


class AsyncQueue:
    """The Queue API, awaitable; ``async for d in q`` yields deliveries forever."""

    def __init__(self, broker, name):
        self._broker = broker
        self.name = name

    async def _call(self, msg_type, **fields):
        fields["queue"] = self.name
        return await self._broker.request(msg_type, fields)

    async def put(self, body, headers=None, timeout=None) -> int:
        return await self._retry_full(lambda: self._call(MsgType.PRODUCE, **_message(body, headers)), "id", timeout)

    async def put_nowait(self, body, headers=None) -> int:
        return (await self._call(MsgType.PRODUCE, **_message(body, headers)))["id"]

    async def put_many(self, bodies, timeout=None) -> list[int]:
        messages = [_message(*(b if type(b) is tuple else (b, None))) for b in bodies]
        if not messages:
            return []
        return await self._retry_full(lambda: self._call(MsgType.PRODUCE_BATCH, messages=messages), "ids", timeout)

    async def _retry_full(self, attempt, key, timeout):
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + _ms(timeout, "timeout") / 1000
        pause = PUT_RETRY_S[0]
        while True:
            try:
                return (await attempt())[key]
            except QueueFull:
                if deadline is not None and loop.time() + pause > deadline:
                    raise
                await asyncio.sleep(pause)  # backpressure: the server answered QUEUE_FULL at once
                pause = min(pause * 2, PUT_RETRY_S[1])

    async def get(self, timeout=None, visibility_timeout=None) -> AsyncDelivery:
        return (await self.get_many(1, timeout, visibility_timeout))[0]

    async def get_nowait(self, visibility_timeout=None) -> AsyncDelivery:
        return (await self.get_many(1, 0, visibility_timeout))[0]

    async def get_many(self, max_messages=64, timeout=None, visibility_timeout=None) -> list[AsyncDelivery]:
        fields = consume_fields(max_messages, visibility_timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + _ms(timeout, "timeout") / 1000
        while True:
            wait = CONSUME_SLICE_MS
            if deadline is not None:
                wait = max(0, min(wait, round((deadline - loop.time()) * 1000)))
            reply = await self._call(MsgType.CONSUME, wait_ms=wait, **fields)
            if reply["messages"]:
                return [AsyncDelivery(self, m) for m in reply["messages"]]
            if deadline is not None and loop.time() >= deadline:
                raise QueueEmpty(f"queue {self.name!r} is empty")

    async def ack_many(self, deliveries) -> int:
        tags = [d._tag for d in deliveries]
        return (await self._call(MsgType.ACK, deliveries=tags))["acked"] if tags else 0

    async def stats(self):
        return stats_from_reply(await self._call(MsgType.STATS))

    async def purge(self) -> int:
        return (await self._call(MsgType.PURGE))["purged"]

    def __aiter__(self):
        return self

    async def __anext__(self) -> AsyncDelivery:
        return await self.get()
