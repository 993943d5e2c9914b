"""Core NATS (plain publish-subscribe, no JetStream) over loopback with nats-py, on a
``nats-server`` of the run's own: no acks, no persistence, no redelivery.

A case is one subject. The sender publishes (``nc.publish``: nats-py buffers the
command and its flusher task writes it) one message per call, or 64 in one turn of its
event loop (batched); at the end of a run it flushes (a PING the server answers once it
has everything before it). The receiver's subscription hands every message to a
callback that appends it to a deque; a receive takes from the deque and runs the event
loop only when it is empty, so a loop turn brings in everything the socket has.

Core NATS has no flow control: a subscriber that falls too far behind is cut off by the
server as a slow consumer (its messages lost), which ends the case as an error. A
message published before the subscription reaches nobody, so a sender first asks its
subscriber, once, by request-reply on ``<subject>.ready``. nats-py is asyncio-only: each
End runs its own event loop and drives one call at a time (a turn costs ~9 us here,
which bounds the per-message sender). A subject has no queue that consumers share
without losing what a leaving one had buffered, so only 1 -> 1 runs.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import time

import nats
import nats.errors

from bench.adapters import Adapter, End
from bench.plan import START_TIMEOUT
from bench.servers import NatsServer

READY_ASK_S = 0.05  # a sender's wait for its subscriber's answer, before it asks again
_TIMEOUTS = (asyncio.TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError)


class NatsCoreEnd(End):
    """A publisher or a subscriber on one subject; the spec is (server URL, subject)."""

    def __init__(self, spec, role):
        url, self._subject = spec
        self._errors = []
        self._closing = False
        self._arrived = None
        self._loop = asyncio.new_event_loop()
        self._run = self._loop.run_until_complete
        self._nc = self._run(nats.connect(url, error_cb=self._on_error, closed_cb=self._on_closed,
                                          allow_reconnect=False))
        self._ready = role == "recv"
        if role == "recv":
            self._inbox = collections.deque()
            self._arrived = asyncio.Event()
            # no client-side limit: the deque holds what the loop read; the server bounds the rest
            self._run(self._nc.subscribe(self._subject, cb=self._on_msg, pending_msgs_limit=0,
                                         pending_bytes_limit=0))
            self._run(self._nc.subscribe(f"{self._subject}.ready", cb=self._on_ready))
            self._run(self._nc.flush())  # the server has both subscriptions

    async def _on_error(self, exc):
        self._errors.append(exc)

    async def _on_closed(self):
        if not self._closing:  # the server cut it off (a slow consumer): a waiting receive must not hang
            self._errors.append(ConnectionError("the NATS connection was closed"))
            if self._arrived is not None:
                self._arrived.set()

    async def _on_msg(self, msg):
        self._inbox.append(msg.data)
        self._arrived.set()

    async def _on_ready(self, msg):
        await msg.respond(b"")

    def _check(self):
        if self._errors:
            raise RuntimeError(f"nats-py reported: {self._errors[0]!r}")

    async def _ask(self):
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                await self._nc.request(f"{self._subject}.ready", b"", timeout=READY_ASK_S)
                return
            except _TIMEOUTS:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no NATS subscriber on {self._subject} within {START_TIMEOUT:.0f}s") from None
                await asyncio.sleep(READY_ASK_S)

    def _await_subscriber(self):
        if not self._ready:
            self._run(self._ask())
            self._ready = True

    def send(self, body):
        self._await_subscriber()
        self._run(self._nc.publish(self._subject, body))

    async def _publish_many(self, bodies):
        for body in bodies:
            await self._nc.publish(self._subject, body)

    def send_batch(self, bodies):
        self._await_subscriber()
        self._run(self._publish_many(bodies))

    def flush(self):
        """Everything published has left: the server answered a PING sent after it."""
        self._run(self._nc.flush())
        self._check()

    async def _wait(self):
        await self._arrived.wait()
        self._arrived.clear()

    def recv(self):
        while not self._inbox:
            self._check()
            self._run(self._wait())
        return self._inbox.popleft()

    def recv_batch(self, limit):
        while not self._inbox:
            self._check()
            self._run(self._wait())
        inbox = self._inbox
        return [inbox.popleft() for _ in range(min(limit, len(inbox)))]

    def close(self):
        self._closing = True
        try:
            self._run(self._nc.close())
        finally:
            self._loop.close()


class NatsCore(Adapter):
    """A ``nats-server`` for the run; one subject per case (nothing to make or drop on the server)."""

    name = "nats-core"
    End = NatsCoreEnd

    @classmethod
    def probe(cls):
        return "nats-server not on PATH" if shutil.which("nats-server") is None else None

    def __init__(self):
        self._server = NatsServer()
        self._count = 0

    def make(self, ctx, size):
        self._count += 1
        return (self._server.url, f"bench.c{self._count}")

    def unsupported(self, job):
        if job.pairs > 1:
            return "a queue group drops what a leaving member had buffered: only 1 -> 1 runs"
        return None

    def close(self):
        self._server.close()
        return []
