"""What the blocking and the asyncio TCP clients' transports share, written once: a
call's run (its steps answered on a connection), a lost connection made again
(``_reconnected``: options.retries; ``_outlast``: a long-lived consumer's, up to
options.max_outage), the plain put, put_many and get paths, and an iteration or a poll
that rides an outage out. ``transport.py`` is the asyncio source (a base of
``aio.AsyncBroker``); ``transport_sync.py`` is written from it by ``python -m
shmq.mirrors`` (``await`` and ``async`` dropped, as httpcore's unasync does) for
``remote.RemoteBroker``, and a test fails while it is stale.

Each transport keeps its own I/O: ``_connect``, ``_drive``, ``_exchange``,
``_exchange_shaped``, ``_ready_link`` (the connection a fast path runs on, None if it
has ended), ``_post_step`` (a Post step's send), ``_close_lost`` (a lost connection
shut, before another is made), ``_installed``, ``_sleep`` and ``_opening`` (the lock one
caller reconnects under while the others wait for its outcome).
"""

import functools
import time

from ..errors import BrokerUnavailable, QueueFull
from ..protocol import MsgType
from ..protocol.payloads import ms
from .core import ClientCore, Pause, Post, QueueCalls, Receive, Run, Send, deadline
from .core import plain_messages, resumable, riding_out, slice_ms
from .plain import RAW_REPLIES

__all__ = ["AsyncTransport"]


def _one(step):
    return (yield step)


class AsyncTransport:
    """The shared half of a TCP client's broker (see the module's docstring)."""

    # ---------------------------------------------------------------- reconnecting
    async def _reconnected(self, lost):
        """The connection to use instead of ``lost``: one another caller made meanwhile, or
        a new one (``options``: retries, backoff); else why not (BrokerUnavailable naming
        the endpoint; ``lost``'s error if the handle was closed or does not reconnect)."""
        rounds = self._rounds
        async with self._opening:
            if self._link is not lost:
                return self._link
            first = lost.never  # a child of fork(): its own first connection, whatever ``reconnect`` says
            if self._closed or not (self.options.reconnect or first):
                lost.core.raise_deferred()  # pipelined puts unanswered (OutcomeUnknown): said once
                raise lost.core.ended_error()
            if self._rounds != rounds:  # another caller gave up while this one waited for it
                raise self._gave_up()
            await self._close_lost(lost)
            start, tries = time.monotonic(), 0
            for pause in self.options.pauses() if self.options.reconnect else (0.0,):
                if pause:
                    await self._sleep(pause)
                tries += 1
                try:
                    link = await self._connect(ClientCore(self.endpoint))
                except BrokerUnavailable as e:
                    error = e
                    continue
                self._installed(link, lost)
                return link
            self._rounds += 1
            spent = time.monotonic() - start
            self._gave_up = functools.partial(
                BrokerUnavailable, f"{error} (gave up reconnecting after {tries} tries in {spent:.1f}s)")
            raise self._gave_up()

    async def _outlast(self, until: float | None = None) -> bool:
        """A long-lived consumer's reconnect (``core.Resuming``, kombu's and Dramatiq's
        consumers): once the connection is lost, keep trying, with the jittered pauses
        capped at ``backoff[1]``, until ``options.max_outage`` seconds after the loss
        (``core.riding_out``: said once), not ``retries`` times. True once connected (at
        once if it is: by this caller or another); False at ``until`` (time.monotonic(),
        a poll's end; None: none) if the outage is not over by then; BrokerUnavailable
        once it has lasted ``max_outage``, or why there is no reconnecting (closed,
        ``reconnect=False``). Each try holds ``_opening``; the pauses do not, so a single
        call of another caller makes its own bounded tries meanwhile."""
        lost = self._link
        if not lost.core.failed:
            return True
        if not resumable(lost.core, self):  # closed, no reconnecting, or a child of fork()'s first connection
            await self._reconnected(lost)
            return True
        async with self._opening:  # (one outage, said once, whichever consumer finds it first)
            outage = riding_out(self, lost.core)
        await self._close_lost(lost)
        while True:
            async with self._opening:
                if self._link is not lost:
                    return True
                if self._closed:
                    raise lost.core.ended_error()
                if outage.due <= time.monotonic():  # (else another consumer's try just failed: its pause holds)
                    try:
                        link = await self._connect(ClientCore(self.endpoint))
                    except BrokerUnavailable as e:
                        outage.failed(e)
                    else:
                        self._installed(link, lost)
                        return True
            now = time.monotonic()
            if outage.lasted(now):
                raise outage.gave_up()
            pause = max(0.0, outage.due - now)
            if until is not None and now + pause >= until:
                await self._sleep(max(0.0, until - now))
                return False
            await self._sleep(pause)

    # ---------------------------------------------------------------- a call's run
    async def _run(self, call, link, limit=None):
        """Run ``call`` on ``link``: send its requests, sleep its pauses, return its result.
        ``limit``: seconds each reply may take (None: as ``options`` say)."""
        run = Run(call)
        for step in run:
            try:
                if isinstance(step, Pause):
                    run.send(await self._sleep(step.seconds))
                elif isinstance(step, Post):
                    run.send(await self._post_step(link, step))
                elif isinstance(step, Receive):
                    run.send(await self._receive(link, step))
                else:
                    run.send(await self._exchange(link, step.msg_type, step.payload, limit))
            except Exception as e:
                run.throw(e)
        return run.result

    async def _request(self, msg_type, payload=None) -> dict:
        """One request, as it is, and its reply's payload (or its error)."""
        return await self._drive(_one(Send(msg_type, payload)))

    # ---------------------------------------------------------------- the plain paths
    async def _get_plain(self, q, timeout, most=None):
        """``q.get(timeout)``, a plain one (``PlainQueueCalls._plain_get``): CONSUME of one
        message, a slice at a time, encoded from the queue's shape; with ``most``,
        ``q.get_many(most, timeout)``, a plain one (``_plain_get_many``)."""
        link = self._ready_link()
        if link is None:  # (the general path connects again first)
            return await (QueueCalls.get(q, timeout) if most is None else QueueCalls.get_many(q, most, timeout))
        clock = self._clock
        until = deadline(timeout, clock)
        shape, taken = q._consume_plan(most, link.core.compact)
        limit_of = self.options.reply_limit
        while True:
            wait = slice_ms(until, clock)
            reply = await self._exchange_shaped(link, shape, wait, limit_of(MsgType.CONSUME, {"wait_ms": wait}),
                                                RAW_REPLIES)
            d = taken(reply, until, clock)
            if d is not None:
                return d

    async def _put_plain(self, q, body):
        """``q.put(body)``, a plain one (``PlainQueueCalls._plain_put``): a PRODUCE encoded from
        the queue's shape; refused for a full queue, the general put retries."""
        link = self._ready_link()
        if link is not None:
            try:
                limit = self.options.reply_limit(MsgType.PRODUCE, None)
                return (await self._exchange_shaped(link, q._put_shape, body, limit))["id"]
            except QueueFull:
                pass
        return await QueueCalls.put(q, body)

    async def _put_many_plain(self, q, bodies):
        """``q.put_many(bodies)``, a plain one (``PlainQueueCalls._plain_put_many``): a
        PRODUCE_BATCH encoded from the queue's shape; refused for a full queue, the general
        put_many retries."""
        link = self._ready_link()
        if link is not None:
            try:
                limit = self.options.reply_limit(MsgType.PRODUCE_BATCH, None)
                messages = plain_messages(bodies, link.core)
                return (await self._exchange_shaped(link, q._shapes()[0], messages, limit))["ids"]
            except QueueFull:
                pass
        return await QueueCalls.put_many(q, bodies)


async def _resuming(owner, step):
    """``step()`` (an iteration's), run again after a loss ``owner`` comes back from
    (``core.Resuming``): on the broker's next connection, once the outage is ridden out
    (``_outlast``: up to ``options.max_outage``; past it, the error is raised, and
    iterating again rides out as long again)."""
    while True:
        try:
            return await step()
        except BrokerUnavailable:
            if not owner._resumes():
                raise
        try:
            await owner._broker_handle()._outlast()
        except BrokerUnavailable:
            owner._tried = None
            raise


async def _polled(member, poll, max_records, timeout):
    """``poll(max_records, timeout)`` of a group member whose connection is lost (or was
    lost in it): the outage ridden out within ``timeout`` (``_outlast``), then polled on
    the new connection for what is left of it (the member joins again first); [] if the
    server is not back by then, as a poll that finds nothing. A poll loop so goes on
    through a restart and raises only once the outage has lasted ``options.max_outage``."""
    ms(timeout, "timeout")  # (a poll checks it first; this one may not have got so far)
    until = time.monotonic() + timeout
    while await member._broker_handle()._outlast(until):
        try:
            return await poll(max_records, max(0.0, until - time.monotonic()))
        except BrokerUnavailable:
            if not member._outlasts():
                raise
    return []
