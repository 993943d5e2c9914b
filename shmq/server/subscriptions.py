"""The subscriptions of one connection (SUBSCRIBE, docs/PROTOCOL.md): deliveries pushed to
the client while it holds fewer than ``prefetch`` of them un-acked (RabbitMQ's
``basic.qos``), and what is given back when it cancels or goes away.

Strategy: a subscription waits for messages exactly as a waiting CONSUME does, as a
``Waiter`` in its queue's line (``waiters.QueueWaiters``: first come first served, tried
again with the engine's non-blocking ``get_many``). It is its waiter's ``conn``, so the
line's answer comes back here (``answer``), goes out as one DELIVER push, and the
subscription lines up again while it has room. A waiter is in the line only while it has
room, so it never holds up the waiters behind it. Room comes back when the client settles
a pushed delivery (``Leases`` calls ``settled``); the refill runs once per loop turn, so
the acks that came in one read cost one push. Nothing is pushed while the client does not
read its frames (the transport paused writing): a connection's memory stays bounded by
its write buffer and one frame, whatever the prefetch. A push is answered by nobody, so
a subscription counts as a waiting request for the idle timeout.
"""

import itertools
import functools
import logging
from collections import deque
from itertools import repeat

from ..engine import maintenance
from ..errors import LimitExceeded, LockTimeout, QueueEmpty
from ..protocol import REPLY_BIT, Frame, PushType, encode_frame
from ..protocol.status import reason_of, status_of
from .handlers.answers import reply_budget
from .waiters import Waiter

__all__ = ["Subscription", "Subscriptions"]

log = logging.getLogger("shmq.server")

_LINE_S = 3600.0  # a waiter's deadline in its line; at it the subscription lines up again
_DELIVER = PushType.DELIVER | REPLY_BIT


def _take(args):
    return args[0].take()


class Subscription:
    """One SUBSCRIBE of one connection on one queue handle."""

    __slots__ = ("conn", "id", "q", "prefetch", "vis", "rows", "unacked", "pushed", "waiter", "scheduled", "closed")

    def __init__(self, conn, sid, q, prefetch, vis, rows=False):
        self.conn = conn
        self.id = sid
        self.q = q
        self.prefetch = prefetch
        self.vis = vis  # visibility timeout in seconds, None: the queue's
        self.rows = rows  # the messages pushed as rows (SUBSCRIBE's ``rows``)
        self.unacked = {}  # tag -> its place in the order of pushes, for the pushed deliveries not yet settled
        self.pushed = 0  # messages pushed so far
        self.waiter = None  # its Waiter while it waits in the queue's line
        self.scheduled = False  # a fill is due at the next loop turn
        self.closed = False

    # ---------------------------------------------------------------- pushing
    def _paused(self) -> bool:
        conn = self.conn
        return self.closed or conn.closing or conn.write_paused or conn.server.stopping

    def take(self):
        """The line's try: up to ``room`` leased deliveries, None for none ready. Without
        room (or while the client does not read) it leaves the line: NOTHING."""
        room = self.prefetch - len(self.unacked)
        if room <= 0 or self._paused():
            return ()
        return self._get(room)

    def _get(self, room):
        budget = reply_budget(self.conn.server, room)
        try:
            return self.q.get_many(room, timeout=0, visibility_timeout=self.vis, max_bytes=budget)
        except QueueEmpty:
            return None

    def answer(self, w, result):
        """The line's answer to its waiter: deliveries to push, NOTHING (its deadline, or no
        room), or an exception (the queue was deleted, the server stops...)."""
        if self.waiter is w:
            self.waiter = None
        if self.closed:
            return
        if isinstance(result, BaseException):
            if isinstance(result, LockTimeout):  # a stopped local holder: try again later
                self._line_up()
                return
            self.end(result)
            return
        if result:
            self.push(result)
        self.fill()

    def push(self, ds):
        """One DELIVER frame of the deliveries ``ds``, held by the connection from now."""
        conn = self.conn
        messages = conn.leases.lease(self.q, ds, self, self.rows)
        conn.send(encode_frame(Frame(_DELIVER, 0, {"subscription": self.id, "messages": messages})))

    def held(self, tags):
        """``Leases`` holds deliveries pushed for this subscription under ``tags`` (in push order)."""
        n = self.pushed
        self.unacked.update(zip(tags, range(n, n + len(tags))))
        self.pushed = n + len(tags)

    def settled(self, tags):
        """The client settled pushed deliveries (or they were given back): room for more."""
        deque(map(self.unacked.pop, tags, repeat(None)), 0)  # (one C pass)
        self.schedule()

    def schedule(self):
        if not self.scheduled and not self.closed:
            self.scheduled = True
            self.conn.server.loop.call_soon(self.fill)

    def fill(self):
        """Push what is ready, up to the room there is; then wait in the queue's line."""
        self.scheduled = False
        if self.waiter is not None or self._paused():
            return
        while True:
            room = self.prefetch - len(self.unacked)
            if room <= 0:
                return  # a settle brings it back
            try:
                got = self._get(room)
            except LockTimeout:
                break  # the line's poller tries again
            except Exception as e:
                self.end(e)
                return
            if not got:
                break
            self.push(got)
            if self._paused():
                return  # the client's resume_writing calls fill again
        self._line_up()

    def _line_up(self):
        if self.closed or self.waiter is not None:
            return
        server = self.conn.server
        line = server.waiters_of(self.q)
        w = self.waiter = Waiter(self, line, 0, 0, _take, None, (self,))
        line.add(w, server.loop.time() + _LINE_S)

    # ---------------------------------------------------------------- ending
    def end(self, exc):
        """The server ends the subscription (its queue was deleted, ...): one last DELIVER
        says why, with the error's status."""
        if self.closed:
            return
        self.close()
        self.conn.send(encode_frame(Frame(_DELIVER, 0, {"subscription": self.id, "messages": [],
                                                        "status": int(status_of(exc)), "error": reason_of(exc)})))

    def cancel(self, delivered) -> int:
        """The client's CANCEL: it handed its user the first ``delivered`` messages pushed;
        the others still held are ready again now. Returns how many were given back."""
        back = [t for t, seq in self.unacked.items() if seq >= delivered]
        self.close()
        if not back:
            return 0
        q = self.q
        self.conn.leases.settle(q, back, functools.partial(maintenance.release_many, q))  # ready at once; no attempt counted
        self.conn.server.notify(q.name)
        return len(back)

    def close(self):
        """Push no more; the deliveries pushed stay the connection's, as CONSUME's do."""
        if self.closed:
            return
        self.closed = True
        if self.waiter is not None:
            self.waiter.line.drop(self.waiter)
            self.waiter = None
        self.conn.leases.unsubscribe(self.unacked)
        self.conn.subs.open.pop(self.id, None)


class Subscriptions:
    """The open subscriptions of one connection, by id (unique in the server process)."""

    _ids = itertools.count(1)

    __slots__ = ("conn", "open")

    def __init__(self, conn):
        self.conn = conn
        self.open = {}

    def __len__(self):
        return len(self.open)

    def subscribe(self, q, prefetch, vis, rows=False) -> int:
        """A new subscription on queue handle ``q``; its first push comes after the reply."""
        limits = self.conn.server.limits
        if prefetch > limits.max_prefetch:
            raise ValueError(f"SUBSCRIBE: prefetch must be at most {limits.max_prefetch} (the server's "
                             f"--max-prefetch), not {prefetch}")
        if len(self.open) >= limits.max_subscriptions_per_connection:
            raise LimitExceeded(f"too many subscriptions on this connection (the limit is "
                                f"{limits.max_subscriptions_per_connection}): cancel one first")
        sid = next(self._ids)
        s = self.open[sid] = Subscription(self.conn, sid, q, prefetch, vis, rows)
        s.schedule()
        return sid

    def cancel(self, sid, delivered) -> int:
        s = self.open.get(sid)
        if s is None:
            raise ValueError(f"CANCEL: no subscription {sid} on this connection")
        return s.cancel(delivered)

    def resume(self):
        """The client reads again: push to every subscription with room."""
        for s in list(self.open.values()):
            s.schedule()

    def close_all(self):
        for s in list(self.open.values()):
            s.close()
