"""Local asyncio: ``broker = await shmq.aio.connect()`` (or ``connect(namespace=...)``)
attaches to the namespace's shared memory with the asyncio TCP client's API.

Strategy: every call is the local engine's own, made on the loop with its non-blocking
form (``get_nowait``, ``put(timeout=0)``, ``read(timeout=0)``, ``poll(timeout=0)``), which
never sleeps. A call that must wait (a get on an empty queue, a put on a full one, a
read or poll at a stream's end) waits on a ``_Bell`` of the broker: one per waited queue
or stream (and one per queue waited for room), each a future per waiting call plus the
``doze.Doorbell`` thread, which sleeps as a registered consumer (or producer) of the
shared memory and wakes the loop with ``call_soon_threadsafe`` when data (or room) may
have come. Woken, each waiting call tries again itself, so a call cancelled while it
waits has taken nothing. An idle broker holds no thread: a doorbell with nothing to wait
for ends after ``Doorbell.IDLE_S``. The stamp a call waits from is taken before its
try, so whatever comes after the try wakes it.
"""

import asyncio
import functools
import time
from collections import deque

from ..model import arrays
from . import doze, maintenance
from .queues import rpc
from .broker import Broker, default_namespace
from ..errors import QueueEmpty, QueueFull, RequestTimeout
from ..model import faces, keepalive
from ..model.checks import check_wait, seconds_ns
from ..model.processing import Processing
from ..model.settings import STREAM_INFO
from ..model.steps import Pause, Run, retry_while_full
from .doze import Doorbell

__all__ = ["connect", "LocalAsyncBroker", "LocalAsyncQueue", "LocalAsyncDelivery", "LocalAsyncSubscription",
           "LocalAsyncStream", "LocalAsyncConsumer", "LocalAsyncMultiConsumer", "LocalAsyncStore"]

WAIT_SLICE_S = 1.0  # a waiting call tries again at least this often (a missed ring costs a slice)
_FIELDS = ("id", "body", "headers", "attempt", "queue", "priority", "group", "enqueued_at")  # a delivery's


async def connect(namespace: str | None = None, create: bool = True, token: str | None = None,
                  **options) -> "LocalAsyncBroker":
    """Attach to ``namespace`` on this host (None: $SHMQ_NAMESPACE, else "shmq"), as
    ``shmq.connect()`` does: NamespaceNotFound with ``create=False`` if it does not exist.
    ``token`` and ``options`` are for tcp:// urls: ValueError."""
    if options or token is not None:
        given = sorted(options) + (["token"] if token is not None else [])
        raise ValueError(f"{', '.join(given)}: options of tcp:// urls, not of a local attach")
    return LocalAsyncBroker(Broker(default_namespace() if namespace is None else namespace, create=create))


def _at_once(name):
    """A coroutine method that makes the wrapped handle's ``name`` call, which never waits."""

    async def call(self, *args, **kwargs):
        return getattr(self._h, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"The local handle's ``{name}`` (which never waits)."
    return call


def _checked(timeout):
    if timeout is not None:
        seconds_ns(timeout, "timeout")
    return timeout


class _RoomBell(Doorbell):
    """A doorbell that sleeps as a producer waiting for room."""

    sleep = staticmethod(doze.doze_room)
    look = staticmethod(doze.room_stamp)


class _Bell:
    """The calls of one loop waiting on one queue or stream (``handle``, the bell's own):
    the line ``Doorbell`` rings."""

    def __init__(self, loop, handle, room=False):
        self.loop = loop
        self.handle = handle
        self.waiters = set()
        self.scheduled = False  # (a Doorbell's line: every ring is scheduled)
        self.bell = (_RoomBell if room else Doorbell)(self)

    @property
    def live(self) -> int:
        return len(self.waiters)

    def stamp(self):
        return self.bell.look(self.handle)

    def rang(self):
        """Wake every waiting call: each tries again."""
        waiters, self.waiters = self.waiters, set()
        for f in waiters:
            if not f.done():
                f.set_result(None)

    def enter(self, seen):
        """A future the next ring sets, for a call that tried after ``seen`` (a stamp)."""
        f = self.loop.create_future()
        self.waiters.add(f)
        self.bell.arm(seen)
        return f

    def stop(self):
        self.bell.stop()
        self.rang()


async def _until(bells, attempt, timeout):
    """``attempt()`` until it returns something other than None, waiting between tries
    until one of ``bells()`` rings (or a slice passes), for ``timeout`` seconds (None:
    for ever); None if nothing came by then. A first try that finds something costs no
    bell; each later one follows the stamps it waits from."""
    got = attempt()
    if got is not None or timeout == 0:
        return got
    loop = asyncio.get_running_loop()
    until = None if timeout is None else loop.time() + timeout
    while True:
        rung = bells()
        seen = [b.stamp() for b in rung]
        got = attempt()
        if got is not None:
            return got
        left = None if until is None else until - loop.time()
        if left is not None and left <= 0:
            return None
        pause = WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S)
        if not rung:  # nothing to wait on yet (a consumer of a pattern no stream matches): a slice
            await asyncio.sleep(pause)
            continue
        waiting = [b.enter(stamp) for b, stamp in zip(rung, seen)]
        try:
            await asyncio.wait(waiting, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for b, f in zip(rung, waiting):
                b.waiters.discard(f)
                f.cancel()


def _or_none(call, *args, **kwargs):
    """``call``'s result, None for QueueEmpty / QueueFull."""
    try:
        return call(*args, **kwargs)
    except (QueueEmpty, QueueFull):
        return None


class LocalAsyncDelivery:
    """A leased message of a local queue; ``await d.ack()`` / ``nack()`` / ``reject()`` /
    ``extend()`` / ``reply()``. Its fields are the local ``Delivery``'s."""

    __slots__ = ("_d", "_q")

    def __init__(self, q, d):
        self._q = q
        self._d = d

    def __getattr__(self, name):  # id, body, headers, attempt, queue, priority, group, enqueued_at, view
        return getattr(self._d, name)

    def __dir__(self):
        return sorted({*object.__dir__(self), *_FIELDS})

    def __repr__(self):
        return repr(self._d)

    def array(self, copy: bool = False):
        """The local ``Delivery.array``: a read-only view where the body lies (its settle
        raises BufferError while the array lives), or with ``copy`` an array of its own."""
        return self._d.array(copy)

    async def ack(self, wait: bool = True) -> None:
        """Done with it (``wait``: the TCP client's; a local ack is always confirmed)."""
        self._d.ack()

    async def nack(self, requeue: bool = True, delay: float | None = None) -> None:
        self._d.nack(requeue, delay)

    async def reject(self) -> None:
        self._d.reject()

    async def extend(self, seconds: float) -> None:
        self._d.extend(seconds)

    async def reply(self, body, headers=None) -> bool:
        return self._d.reply(body, headers)

    def process(self, requeue: bool = True, renew: bool = False) -> Processing:
        """``async with d.process(): ...``: ack when the block succeeds, else nack (or reject)."""
        return Processing(self, requeue, renew)

    def keepalive(self, every: float | None = None) -> "keepalive.Keepalive":
        """Renew the lease by a task on the running loop (the asyncio client's keepalive)."""
        return keepalive.in_task(self, every, self._q._visibility_timeout)


class LocalAsyncSubscription:
    """``async for d in q.consume(prefetch=N)``: up to ``prefetch`` deliveries taken ahead;
    ``await aclose()`` (or leaving its ``async with``) makes those not handed out ready again."""

    def __init__(self, q, prefetch, visibility_timeout=None):
        if type(prefetch) is not int or prefetch < 1:
            raise ValueError(f"prefetch must be a positive int, not {prefetch!r}")
        self._q = q
        self.prefetch = prefetch
        self._visibility = visibility_timeout
        self._buffer = deque()
        self.id = None  # (over TCP: the server's number for it)
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.closed:
            raise StopAsyncIteration
        if not self._buffer:
            self._buffer.extend(await self._q.get_many(self.prefetch, None, self._visibility))
            if self.closed:  # closed while it waited: what came goes back
                self.close()
                raise StopAsyncIteration
        return self._buffer.popleft()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Cancel: what was taken and not handed out is ready again (no attempt counted)."""
        self.closed = True
        unseen, self._buffer = [d._d for d in self._buffer], deque()
        if unseen:
            maintenance.release_many(self._q._h, unseen)


class LocalAsyncQueue:
    """The Queue API of the asyncio client on a local queue; ``async for d in q`` yields
    deliveries for ever. Waits never block the loop (the module's strategy)."""

    def __init__(self, broker, handle):
        self._broker = broker
        self._h = handle
        self.name = handle.name
        self.serializer = getattr(handle, "serializer", None)
        self.closed = False

    def __repr__(self):
        return f"<shmq.LocalAsyncQueue {self._h.namespace}/{self.name}>"

    def close(self) -> None:
        """Let go of the handle (the queue stays)."""
        self.closed = True
        self._h.close()

    def _wrap(self, ds):
        return [LocalAsyncDelivery(self, d) for d in ds]

    async def _visibility_timeout(self) -> float:
        return self._h.settings()["visibility_timeout"]

    def __aiter__(self):
        return self

    async def __anext__(self) -> LocalAsyncDelivery:
        return await self.get()

    # ---------------------------------------------------------------- puts
    async def _room(self, put, timeout):
        got = await _until(lambda: [self._broker._bell(self._h, True)], lambda: _or_none(put),
                           _checked(timeout))
        return put() if got is None else got  # the last try raises QueueFull as the engine says it

    async def put(self, body, headers=None, timeout=None, **options) -> int:
        """Put one message (``options``: priority, delay, ttl, group, dedup_id); a full queue
        is waited for up to ``timeout`` seconds (None: for ever), then QueueFull."""
        return await self._room(functools.partial(self._h.put, body, headers, 0, **options), timeout)

    async def put_array(self, a, headers=None, timeout=None, **options) -> int:
        """``Queue.put_array``: the array's bytes copied once into the queue, its layout in a header."""
        body, headers = arrays.to_message(a, headers)
        return await self.put(body, headers, timeout, **options)

    async def put_many(self, bodies, timeout=None, **options) -> list[int]:
        """Put a batch, all or none; a full queue is waited for as ``put``'s."""
        bodies = list(bodies)
        return await self._room(functools.partial(self._h.put_many, bodies, 0, **options), timeout)

    put_nowait = _at_once("put_nowait")
    flush = _at_once("flush")

    # ---------------------------------------------------------------- gets
    async def _take(self, take, timeout):
        got = await _until(lambda: [self._broker._bell(self._h)], lambda: _or_none(take), _checked(timeout))
        return take() if got is None else got  # the last try raises QueueEmpty as the engine says it

    async def get(self, timeout=None, visibility_timeout=None, ack=True, copy=True) -> LocalAsyncDelivery:
        """The next message, leased; waits up to ``timeout`` seconds (None: for ever), then QueueEmpty."""
        d = await self._take(functools.partial(self._h.get_nowait, visibility_timeout, ack, copy), timeout)
        return LocalAsyncDelivery(self, d) if ack else d

    async def get_nowait(self, visibility_timeout=None, ack=True, copy=True):
        d = self._h.get_nowait(visibility_timeout, ack, copy)
        return LocalAsyncDelivery(self, d) if ack else d

    async def get_many(self, max_messages=64, timeout=None, visibility_timeout=None, max_bytes=None, ack=True,
                       copy=True) -> list:
        """Up to ``max_messages`` as soon as one is there; QueueEmpty after ``timeout``."""
        take = functools.partial(self._h.get_many, max_messages, 0, visibility_timeout, max_bytes, ack, copy)
        ds = await self._take(take, timeout)
        return self._wrap(ds) if ack else ds

    def consume(self, prefetch: int = 100, visibility_timeout=None) -> LocalAsyncSubscription:
        return LocalAsyncSubscription(self, prefetch, visibility_timeout)

    peek = _at_once("peek")
    stats = _at_once("stats")
    settings = _at_once("settings")
    purge = _at_once("purge")
    add_consumer = _at_once("add_consumer")
    remove_consumer = _at_once("remove_consumer")

    # ---------------------------------------------------------------- settles
    async def ack_many(self, deliveries, wait: bool = True) -> int:
        deliveries = list(deliveries)
        keepalive.settling(deliveries)
        return self._h.ack_many([d._d for d in deliveries])

    async def nack_many(self, deliveries, delay: float | None = None) -> int:
        deliveries = list(deliveries)
        keepalive.settling(deliveries)
        return self._h.nack_many([d._d for d in deliveries], delay)

    async def reject_many(self, deliveries) -> None:
        deliveries = list(deliveries)
        keepalive.settling(deliveries)
        return self._h.reject_many([d._d for d in deliveries])


class LocalAsyncConsumer:
    """A consumer-group member on a local stream, awaitable; ``async with`` leaves on exit,
    ``async for r in c`` yields records one by one, for ever."""

    def __init__(self, broker, handle, names, stream=None):
        self._broker = broker
        self._h = handle
        self._names = names  # the streams whose appends wake its poll
        self._buffer = deque()
        self.group, self.auto_offset_reset = handle.group, handle.auto_offset_reset
        self.on_assign, self.on_revoke = handle.on_assign, handle.on_revoke
        if stream is not None:
            self.stream = stream

    def membership(self) -> tuple:
        """(group, member id, generation, owned partitions): what a transaction's commit of
        its offsets is fenced by (``Consumer.membership``)."""
        return self._h.membership()

    def positions(self) -> dict:
        """{partition: next offset} of each owned partition, not past a record the
        iteration holds (what a transaction commits for it by default)."""
        out = self._h.positions()
        for r in self._buffer:
            out[r.partition] = min(out.get(r.partition, r.offset), r.offset)
        return out

    async def poll(self, max_records: int = 500, timeout: float = 1.0) -> list:
        """Records of the owned partitions, waiting up to ``timeout`` seconds for the first
        (records the iteration holds come first)."""
        if self._buffer:
            n = min(max_records, len(self._buffer))
            return [self._buffer.popleft() for _ in range(n)]
        return await self._poll(max_records, _checked(timeout))

    async def _poll(self, max_records, timeout):
        bells = lambda: [self._broker._stream_bell(name) for name in self._names()]  # noqa: E731 (none: slices)
        return await _until(bells, lambda: self._h.poll(max_records, 0) or None, timeout) or []

    async def __anext__(self):
        while not self._buffer:
            if self._h._closed:
                raise StopAsyncIteration
            self._buffer.extend(await self._poll(500, None))
        return self._buffer.popleft()

    def __aiter__(self):
        return self

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def commit(self, offsets: dict | None = None) -> None:
        self._h.commit(offsets)

    async def close(self) -> None:
        self._buffer.clear()
        self._h.close()



class LocalAsyncMultiConsumer(LocalAsyncConsumer):
    """One member over several streams or a pattern (``broker.consumer``), awaitable."""

    def __init__(self, broker, handle, names):
        super().__init__(broker, handle, names)
        self.subscribed = handle.subscribed

    async def subscription(self) -> list[str]:
        return self._h.subscription()


class LocalAsyncStream:
    """The Stream API of the asyncio client on a local stream."""

    def __init__(self, broker, handle):
        self._broker = broker
        self._h = handle
        self.name = handle.name
        for name in STREAM_INFO:  # (the settings a remote handle has)
            setattr(self, name, getattr(handle, name))

    def __repr__(self):
        return f"<shmq.LocalAsyncStream {self._h.namespace}/{self.name}>"

    async def read(self, p: int, offset: int, max_records: int = 1000, timeout: float = 0.0) -> list:
        """Records of partition ``p`` from ``offset``, waiting up to ``timeout`` seconds for
        the first (None: for ever)."""
        read = functools.partial(self._h.read, p, offset, max_records, 0)
        return await _until(lambda: [self._broker._stream_bell(self.name)], lambda: read() or None,
                            _checked(timeout)) or []

    async def consumer(self, group: str, auto_offset_reset: str = "earliest", **options) -> LocalAsyncConsumer:
        c = self._h.consumer(group, auto_offset_reset, **options)
        return LocalAsyncConsumer(self._broker, c, lambda: [self.name], self)



class LocalAsyncStore:
    """The keyed store API of the asyncio client on a local store (``engine.store.Store``):
    each call the store's own, on the loop (a few microseconds); a ``get`` that waits
    looks at the store's stamp between pauses on the loop (as the store's own wait does)."""

    def __init__(self, handle):
        self._h = handle
        self.name = handle.name

    def __repr__(self):
        return f"<shmq.LocalAsyncStore {self._h.namespace}/{self.name}>"

    def close(self) -> None:
        self._h.close()

    async def get(self, key: str, timeout: float = 0.0):
        """The value of ``key`` or None; ``timeout`` > 0: wait up to that long for it (the
        store's own wait, on the loop: a watch of its -wal read as a socket, and pauses)."""
        from . import walwatch
        from .store import POLL_MAX_S, POLL_MIN_S, WATCHED_S

        value = self._h.get(key)
        if value is not None or not check_wait(timeout):
            return value
        loop, rang = asyncio.get_running_loop(), asyncio.Event()
        bell = walwatch.watch(self._h.path + "-wal")  # before the first look: whatever comes after rings
        if bell is not None:
            loop.add_reader(bell.fd, lambda: (bell.drain(), rang.set()))
        until, pause, seen = time.monotonic() + timeout, POLL_MIN_S, None
        try:
            while True:
                stamp = self._h.stamp()
                if stamp != seen:
                    seen = stamp
                    value = self._h.get(key)
                    if value is not None:
                        return value
                left = until - time.monotonic()
                if left <= 0:
                    return None
                try:
                    await asyncio.wait_for(rang.wait(), min(pause, left))
                    rang.clear()
                    pause = POLL_MIN_S  # (the index may say the commit is done a moment after the ring)
                except asyncio.TimeoutError:
                    pause = min(pause * 2, WATCHED_S if bell is not None else POLL_MAX_S)
        finally:
            if bell is not None:
                loop.remove_reader(bell.fd)
                bell.close()


class LocalAsyncBroker:
    """The asyncio client's broker API on a local namespace: create_queue, queue,
    list_queues, delete_queue, update_queue, declare_queue, redrive, the streams
    (create_stream, stream, list_streams, delete_stream, consumer), the exchanges
    (create_exchange, bind, unbind, publish, list_exchanges, exchange_info,
    delete_exchange), request, ping, close."""

    def __init__(self, broker: Broker):
        self._h = broker
        self.namespace = broker.namespace
        self._bells = {}  # (kind, name) -> _Bell

    def __repr__(self):
        return f"<shmq.LocalAsyncBroker {self.namespace}>"

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        """Stop the doorbells and let go of the namespace (what is leased stays leased
        until settled by another handle or its lease lapses)."""
        bells, self._bells = self._bells, {}
        for b in bells.values():
            b.stop()
            b.handle.close()
        self._h.close()

    def _bell(self, h, room=False) -> _Bell:
        """The bell of queue ``h``'s name (for room: ``room``)."""
        return self._ring(("room" if room else "queue", h.name), h)

    def _stream_bell(self, name) -> _Bell:
        return self._ring(("stream", name), None)

    def _ring(self, key, h) -> _Bell:
        """The bell of ``key``; made anew when its handle finds its queue or stream deleted
        (one of the same name may have come since) or it rings another event loop (a
        later ``asyncio.run``, a child of fork())."""
        b = self._bells.get(key)
        loop = asyncio.get_running_loop()
        if b is None or b.loop is not loop or b.handle.deleted:
            if b is not None:
                self._forget(key)
            handle = doze.twin(h) if h is not None else self._h.stream(key[1])
            b = self._bells[key] = _Bell(loop, handle, room=key[0] == "room")
        return b

    # ---------------------------------------------------------------- queues
    async def queue(self, name: str, serializer=None) -> LocalAsyncQueue:
        return LocalAsyncQueue(self, self._h.queue(name, serializer=serializer))

    async def create_queue(self, name, *args, **kwargs) -> LocalAsyncQueue:
        return LocalAsyncQueue(self, self._h.create_queue(name, *args, **kwargs))

    async def declare_queue(self, name: str, serializer=None, **settings) -> LocalAsyncQueue:
        return LocalAsyncQueue(self, self._h.declare_queue(name, serializer, **settings))

    # ---------------------------------------------------------------- streams
    async def stream(self, name: str) -> LocalAsyncStream:
        return LocalAsyncStream(self, self._h.stream(name))

    async def create_stream(self, name, *args, **kwargs) -> LocalAsyncStream:
        return LocalAsyncStream(self, self._h.create_stream(name, *args, **kwargs))

    async def consumer(self, group: str, streams=None, pattern=None, auto_offset_reset: str = "earliest",
                       **options) -> LocalAsyncMultiConsumer:
        c = self._h.consumer(group, streams, pattern, auto_offset_reset, **options)
        return LocalAsyncMultiConsumer(self, c, c.subscription)

    # ---------------------------------------------------------------- transactions
    async def transactional(self, transactional_id: str, timeout: float = 60.0):
        """A transactional producer (``Broker.transactional``), on a connection of its own to
        the namespace's server; ``await p.aclose()`` (or ``async with``) closes it."""
        return await faces.transactional_async(self.namespace, transactional_id, timeout)

    # ---------------------------------------------------------------- keyed stores
    async def store(self, name: str = "default") -> LocalAsyncStore:
        return LocalAsyncStore(self._h.store(name))

    # ---------------------------------------------------------------- exchanges, request/reply
    async def publish(self, exchange: str, body, routing_key: str = "", headers=None, dedup_id=None,
                      timeout=None) -> int:
        """Copy a message into every target the exchange routes ``routing_key`` to; how many
        got it. As over TCP: a full queue raises QueueFull, the targets before it having
        the message; with a ``dedup_id`` the publish is tried again while a queue is full
        (``model.steps.retry_while_full``, the TCP clients' policy), for up to ``timeout`` seconds, repeats dropped."""
        publish = functools.partial(self._h.publish, exchange, body, routing_key, headers, dedup_id, 0)
        if dedup_id is None:
            return publish()
        run = Run(retry_while_full(None, timeout, time.monotonic))
        for step in run:
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                run.send(None)
                continue
            try:
                run.send(publish())
            except QueueFull as e:
                run.throw(e)
        return run.result

    async def request(self, queue: str, body, headers=None, timeout=None) -> bytes:
        """Put a request into ``queue`` and wait for a worker's reply; its body.
        RequestTimeout after ``timeout`` seconds (None: for ever)."""
        _checked(timeout)
        rpc.remove_orphans(self._h)
        call = rpc.Call(self._h, queue, body, headers, put_timeout=0)
        try:
            got = await _until(lambda: [self._bell(call.replies)], call.poll, timeout)
        finally:
            self._forget(("queue", call.reply_queue))
            call.close()
        if got is None:
            raise RequestTimeout(f"no reply to the request on queue {queue!r} within {timeout}s")
        return got[0]

    def _forget(self, key) -> None:
        b = self._bells.pop(key, None)
        if b is not None:
            b.stop()
            b.handle.close()



def _delegate(cls, names) -> None:
    """Give ``cls`` the calls ``names`` of its handle that never wait, as coroutine methods."""
    for name in names:
        setattr(cls, name, _at_once(name))


_delegate(LocalAsyncConsumer, ("assignment", "position", "seek", "seek_to_beginning", "seek_to_end", "pause",
                               "resume", "paused"))
_delegate(LocalAsyncStream, ("append", "append_many", "offsets", "stable", "publish", "published", "delete_records",
                             "groups", "committed", "lag", "reset", "stats"))
_delegate(LocalAsyncBroker, ("list_queues", "update_queue", "delete_queue", "redrive", "list_streams",
                             "delete_stream", "create_exchange", "delete_exchange", "list_exchanges", "exchange_info",
                             "bind", "unbind", "ping", "list_stores", "delete_store"))
_delegate(LocalAsyncStore, ("set", "get_many", "delete", "incr", "add", "members", "expire", "ttl", "keys", "clear",
                            "sweep"))
