"""One client connection (``Connection``, an asyncio ``BufferedProtocol``), the object the
server revolves around: bytes in, frames out, its limits enforced, each request to its
handler in ``HANDLERS``.

Strategy: no task and no thread per client. The connection reads only as many bytes as
it may hold (into one receive buffer all connections share, in turn), feeds them to the
sans-IO decoder, and hands each request to its handler as it arrives; replies carry the
request's msg id, so a waiting CONSUME, READ or POLL never holds back the replies
behind it. The replies to the requests of one read leave in one write (pipelined
requests: one system call, not one per reply), or every WRITE_BATCH bytes. Every error
becomes an error reply (``status_of``), and a bug costs its connection at most, never
the server. Closing — for a fault, an EOF, idleness or a stop — drops the connection's
waiting requests, makes every delivery it held ready again at once, and takes its
consumer-group members out of their groups.
"""

import asyncio
import logging

from ..errors import LimitExceeded, ProtocolError, ShmqError, Unauthorized
from ..logs import peer_text
from ..protocol import (HEADER_SIZE, REPLY_BIT, FrameDecoder, MsgType, PushType, Status, encode_error,
                        encode_reply)
from ..protocol.requests import check_request
from ..protocol.status import error_details, reason_of, status_of
from .handlers import (HANDLERS, PLAIN, BlockingAppend, OffLoop, OnLoop, Wait, give_back_consumers, plain_args,
                       plain_take, waiting_consume)
from .leases import Leases
from .members import Members
from .subscriptions import Subscriptions
from .limits import PRE_AUTH_MAX_FRAME_BYTES, SMALL_FRAME_BYTES, Boundaries, Clocks
from .waiters import Waiter

__all__ = ["Connection", "READ_CHUNK", "error_frame"]

log = logging.getLogger("shmq.server")

READ_CHUNK = 256 * 1024  # the shared receive buffer: most bytes one read takes
WRITE_BATCH = 256 * 1024  # replies gathered while handling one read are written at this size at most
_LINGER_S = 1.0  # how long a connection closed for a fault drops its client's bytes


def error_frame(msg_type, msg_id, exc) -> bytes:
    """The error reply that answers ``exc``. An exception that is not a shmq error and has
    no status of its own is a bug: logged, with its traceback, once."""
    status = status_of(exc)
    if status == Status.INTERNAL and not isinstance(exc, ShmqError):
        log.error("internal error", exc_info=exc)
    return encode_error(msg_type, msg_id, status, reason_of(exc), error_details(exc))


def _status_name(status) -> str:
    try:
        return Status(status).name
    except ValueError:
        return str(status)


def _reply_of_append(conn, reply, result):
    return reply(result)


_BEAT = encode_reply(PushType.HEARTBEAT, 0)  # a HEARTBEAT push: msg id 0, status 0, {}
# read per request: a module name costs less than an enum's attribute
_HELLO, _CONSUME, _OK = MsgType.HELLO, MsgType.CONSUME, Status.OK
_plain_of = PLAIN.get  # request type -> (check, handler) of its plain shape, or None


class Connection(asyncio.BufferedProtocol):
    """One client connection: its decoder, its deliveries, its group members, its waiting
    requests, its clocks."""

    def __init__(self, server):
        self.server = server
        self.transport = None
        self.peer = None
        self.authed = server.token is None
        self.decoder = FrameDecoder(server.max_frame_bytes if self.authed else PRE_AUTH_MAX_FRAME_BYTES)
        self.bounds = Boundaries()
        self.clocks = Clocks(server.limits, server.loop.time())
        self.leases = Leases()  # the deliveries it holds
        self.members = Members()  # the group members it holds
        self.calls = set()  # its waiting REQUESTs' rpc.Calls: their reply queues go when it closes
        self.consumers = {}  # queue name -> (its created_at, consumers this connection registered): given back
        self.subs = Subscriptions(self)  # its SUBSCRIBEs: deliveries pushed to it
        self.waiters = set()  # its waiting CONSUMEs, READs and POLLs
        self.reserved = 0  # budget bytes held for the open frame
        self.budget_wait = False  # in line for budget: paused (its frame clock runs on)
        self.write_paused = False  # the client does not read its replies: take no requests
        self.reading = True
        self.closing = False
        self.refused = False  # over the connection cap: the error frame, then close
        self.lingering = False  # a refused one, counted in server.lingering
        self.eof_sent = False
        self.said_waiting_limit = False
        self._abort = None
        self.opened = server.loop.time()
        self.requests = 0  # frames handled (for the log line of its close)
        self.spin_epoch = -1  # the server's busy poll counted it in this epoch (``LoopSpin.crowded``)
        self.served_bytes = 0  # bytes of the last read that ``served`` took (the plain requests in C)
        self.close_reason = None  # why it closed, for that line
        self.said_slow = False  # "slow_client" logged once (it does not read its replies)
        self.out = None  # while ``process`` runs: the replies to write together (``send``, ``flush``)
        self.out_bytes = 0
        self.heartbeat = None  # seconds between HEARTBEAT pushes a HELLO asked for (``beat_every``), and the next's
        self.next_beat = None
        # each request's hook, chosen once (the server's metrics are set before it accepts): dispatch itself
        # with metrics off
        self.handle = server.metrics.timing(self.dispatch)
        self.plain = server.plain if self.authed else None  # the plain requests in C (``server.plain``), once authed

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport):
        self.transport = transport
        self.peer = peer_text(transport.get_extra_info("peername"))
        if not self.server.admit(self):
            self.refuse()
            return
        log.debug("connection opened", extra={"event": "connection_opened", "peer": self.peer,
                                              "connections": len(self.server.connections)})

    def get_buffer(self, sizehint):
        plain = self.plain
        if plain is not None and (view := plain.buffer(self)) is not None:
            return view  # holding nothing (the common case, in C): the first SMALL_FRAME_BYTES of the shared buffer
        room = self.room() if not self.closing else READ_CHUNK  # a closing one's bytes are dropped
        if self.reserved and not self.closing:
            self.decoder.expect(room)  # the rest of a big frame, its memory reserved: one allocation
        return self.server.rview[: min(max(room, 1), READ_CHUNK)]  # an empty buffer is an error

    def buffer_updated(self, nbytes):
        if self.closing:
            return
        try:
            plain = self.plain
            # the common read, whole in C: every frame plain, served and answered, and what ``take`` does
            # after (``Plain.read``: True); else what it served of the read's first frames, if it tried
            served = plain.read(self, nbytes) if plain is not None else None
            if served is not True:
                self.take(self.server.rview[:nbytes], served)
        except Exception:  # a bug must cost this connection, never the server
            log.exception("%s: internal error; closing", self.peer)
            self.shut()

    def take(self, data, served=None):
        """A read's bytes, the one way in for them: every request they complete handled in
        order and answered, the replies in one write (``process``), the rest held for the
        next read. ``Plain.read`` in C is the fast path of the same: a read whose every frame
        it serves ends there; one it served in part or not at all comes here with
        ``served``, its ``Plain.serve`` result (False: it served nothing; None: it did not
        try, or there is no C path). Frames a later read completes are offered to C from
        the decoder's bytes (``FrameDecoder.offer``); what C leaves is Python's, frame by frame."""
        bounds, replies, one, ended = self.bounds, None, None, 1
        if served:  # the first frames served in C: the rest from the first it left
            replies = self.served(served)
            data = data[self.served_bytes:]
        if not (bounds.got or self.write_paused or self.reserved):  # at a frame's start, taking requests
            one = self.decoder.one_frame(data)  # the usual read: one whole request, decoded in one call
        if one is None:
            self.decoder.feed(data)
            ended = bounds.advance(data)
            if ended and self.reserved:
                self.server.budget.release(self)  # a reserved read ends where its frame does
            if ended and served is None and self.plain is not None and not self.write_paused:
                # frames that came in more than one read (a big batch): the plain ones among the first
                # in C too, from the decoder's bytes
                replies = self.served(self.decoder.offer(self.plain.serve, self.leases, self.decoder.max_frame_bytes,
                                                          self.wait_plain))
        now = self.server.loop.time()
        self.server.spin.touch(self, now)  # the client's next request may follow its reply: looked for awake
        if bounds.got:  # a frame still open
            self.clocks.received(now, bounds.got, ended)
        else:
            self.clocks.frame_started = None  # (``received`` of whole frames, a call less)
        self.process(now, one, replies)
        if not self.closing and (bounds.got or not self.reading or self.write_paused or self.budget_wait):
            self.account()  # (else nothing to do: ``account``'s own first test, a call less)

    def served(self, served):
        """The replies of what ``server.plain`` served (``Plain.serve``'s result, None:
        nothing), its requests counted and the gets waiting on the queues it put to
        answered first (``AttachedHandles.notify``); ``served_bytes`` the bytes it took."""
        if served is None:
            return None
        self.served_bytes, replies, count, touched = served
        self.requests += count
        if touched:
            notify = self.server.queues.notify
            for name in dict.fromkeys(touched):
                notify(name)
        return replies

    def eof_received(self):
        if not self.closing:
            self.shut("closed by the client", linger=False)
        return False  # the transport closes, once what is written is sent

    def pause_writing(self):
        self.write_paused = True
        self.update_reading()
        if not self.said_slow and not self.closing:
            self.said_slow = True
            log.warning("%s: does not read its replies: taking no requests until it does", self.peer,
                        extra={"event": "slow_client", "peer": self.peer, "why": "not reading its replies",
                               "buffered_bytes": self.transport.get_write_buffer_size()})

    def resume_writing(self):
        self.write_paused = False
        if not self.closing:
            self.subs.resume()
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
        self.let_go()
        self.server.connection_gone(self)
        reason = self.close_reason or ("the server stopped" if self.server.stopping else
                                       f"lost: {exc}" if exc is not None else "closed")
        quiet = exc is None and self.close_reason in (None, "closed by the client")  # no fault: debug only
        log.log(logging.DEBUG if quiet else logging.INFO, "connection closed",
                extra={"event": "connection_closed", "peer": self.peer, "requests": self.requests, "reason": reason,
                       "duration_s": round(self.server.loop.time() - self.opened, 3)})

    # ------------------------------------------------------------------ reading
    def room(self) -> int:
        """How many more bytes this connection may take now."""
        if self.reserved:
            return self.reserved - self.bounds.got
        limit = SMALL_FRAME_BYTES if self.authed else PRE_AUTH_MAX_FRAME_BYTES + HEADER_SIZE
        return limit - self.decoder.buffered

    def account(self):
        """Reserve budget for the open frame if it is big, then read on or pause."""
        if not self.bounds.got and self.reading and not (self.write_paused or self.budget_wait):
            return  # at a frame boundary with every frame handled (nothing held): reading on, as it is
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

    def process(self, now=None, one=None, replies=None):
        """Handle the complete frames the decoder holds, while the client reads replies;
        their replies leave together at the end (or every WRITE_BATCH bytes), or with
        those of the ``process`` this one runs within. ``now``: the loop's time, if the
        caller has it. ``one``: the parts of a read's one frame (``FrameDecoder.one_frame``),
        which the decoder does not hold: that one alone. ``replies``: the replies of the
        read's first frames (served in C), which leave first."""
        if now is None:
            now = self.server.loop.time()
        outer = self.out is None
        if outer:
            self.out = []
        if replies:
            self.send(replies)
        next_parts, handle, clocks = self.decoder.next_parts, self.handle, self.clocks
        try:
            if one is not None:
                self.requests += 1
                clocks.last_active = now
                handle(one)
                return
            while not self.closing and not self.write_paused:
                try:
                    frame = next_parts()
                except ProtocolError as e:
                    self.protocol_error(e)
                    continue
                if frame is None:
                    return
                self.requests += 1
                clocks.last_active = now  # a handler takes microseconds: the time of the read does
                handle(frame)
                # Let go of its payload before the next one is decoded: the allocator reuses
                # the memory then, instead of faulting in fresh pages for every big batch.
                frame = None
        finally:
            if outer:
                self.flush()
                self.out = None

    def protocol_error(self, e):
        reason = str(e)
        if not self.authed and e.status == Status.TOO_LARGE:
            reason = f"before a HELLO with the token, frames may be at most {PRE_AUTH_MAX_FRAME_BYTES} bytes"
        log.warning("%s: protocol error: %s", self.peer, reason,
                    extra={"event": "protocol_error", "peer": self.peer, "status": _status_name(e.status),
                           "error": reason, "fatal": bool(e.fatal)})
        if not self.authed and not e.fatal and e.status != Status.UNSUPPORTED_VERSION:  # rules 6 and 3
            self.unauthorized(getattr(e, "msg_type", 0), e.msg_id, f"a malformed frame before HELLO: {reason}")
            return
        self.send(encode_error(getattr(e, "msg_type", 0), e.msg_id, e.status, reason))
        if e.fatal:
            self.shut(f"{reason}; closing")

    # ------------------------------------------------------------------ requests
    def dispatch(self, frame):
        """A request (a frame's parts, ``FrameDecoder.next_parts``) to its handler; the reply
        (or error reply) out, or the request in line. Returns the reply's status (None: the
        request waits), for the metrics."""
        msg_type, msg_id, payload, status, _version = frame
        if not self.authed and msg_type != _HELLO:  # a reply's type too: it has REPLY_BIT
            return self.unauthorized(msg_type & 0x7F, msg_id, "say HELLO with the token first",
                                     "a request before HELLO")
        if msg_type & REPLY_BIT:
            self.send(encode_error(msg_type & 0x7F, msg_id, Status.BAD_REQUEST, "clients send requests"))
            return Status.BAD_REQUEST
        try:
            plain = _plain_of(msg_type)
            if plain is not None and not status and (fields := plain[0](payload)) is not None:
                result = plain[1](self, msg_id, fields)  # a plain PRODUCE, CONSUME or ACK: its reply frame
                if type(result) is bytes:
                    self.send(result)
                    return _OK
                self.wait(msg_type, msg_id, result)  # a plain CONSUME that waits
                return
            fields = check_request(msg_type, msg_id, payload, status)  # first: it refuses unknown types
            result = HANDLERS[msg_type](self, fields)
            if type(result) is not dict:
                if type(result) is Wait:
                    self.wait(msg_type, msg_id, result)
                    return
                if type(result) is BlockingAppend:
                    self.append_when_room(msg_type, msg_id, result)
                    return
                if type(result) is OffLoop:
                    self.off_loop(msg_type, msg_id, result)
                    return
                if type(result) is OnLoop:
                    self.on_loop(msg_type, msg_id, result)
                    return
        except Unauthorized as e:
            return self.unauthorized(msg_type, msg_id, str(e))
        except Exception as e:  # every error becomes an error reply; the server lives on
            if not self.authed:  # a HELLO it cannot read (rule 6)
                return self.unauthorized(msg_type, msg_id, f"a malformed HELLO: {reason_of(e)}")
            self.send(error_frame(msg_type, msg_id, e))
            return status_of(e)
        self.send(encode_reply(msg_type, msg_id, result))
        return _OK

    def unauthorized(self, msg_type, msg_id, error, why=None):
        """Before a HELLO with the token, anything but that HELLO: UNAUTHORIZED with
        ``error``, then close (docs/PROTOCOL.md, rule 6; ``why`` for the log, else ``error``)."""
        self.send(encode_error(msg_type, msg_id, Status.UNAUTHORIZED, error))
        self.shut(f"{why or error}; closing")
        return Status.UNAUTHORIZED

    def authenticated(self):
        """A HELLO with the right token: every request and ``max_frame_bytes`` from now."""
        self.authed = True
        self.decoder.max_frame_bytes = self.server.max_frame_bytes
        self.plain = self.server.plain

    def wait(self, msg_type, msg_id, wait: Wait):
        """Put a request in its line, up to the per-connection limit (then LIMIT_EXCEEDED)."""
        self.check_waiting()
        args = plain_args(self, wait.args, msg_id) if wait.take is plain_take else wait.args  # (C makes its frame)
        self.line_up(Waiter(self, wait.line, msg_id, msg_type, wait.take, wait.reply, args), wait.wait_ms)

    def wait_plain(self, msg_id, q, most, rows, wait_ms) -> bool:
        """A CONSUME the plain path in C found nothing for, lined up as ``wait`` lines it up
        (True); False where the Python path must answer it (the server stops, the
        connection's waiting requests at their limit: ``check_waiting`` says so)."""
        server = self.server
        if server.stopping or len(self.waiters) >= server.limits.max_waiting_per_connection:
            return False
        take, reply, args = waiting_consume(self, msg_id, q, most, rows)
        self.line_up(Waiter(self, server.waiters_of(q), msg_id, _CONSUME, take, reply, args), wait_ms)
        return True

    def line_up(self, w, wait_ms):
        w.line.add(w, self.server.loop.time() + wait_ms / 1000)
        self.waiters.add(w)

    def append_when_room(self, msg_type, msg_id, append: BlockingAppend):
        """Hand an append that may wait for room to its stream's appender; it counts as a
        waiting request until it is answered."""
        self.check_waiting()
        w = Waiter(self, None, msg_id, msg_type, None, _reply_of_append, append.reply)
        self.waiters.add(w)
        name = append.stream.name
        self.server.appender(append.stream).submit(append.run, lambda result: self.appended(w, name, result))

    def off_loop(self, msg_type, msg_id, job: OffLoop):
        """Run a long request in a thread of the loop's executor; it counts as a waiting
        request until it is answered (a connection closed meanwhile gets no answer)."""
        self.check_waiting()
        w = Waiter(self, None, msg_id, msg_type, None, _reply_of_append, job.reply)
        self.waiters.add(w)
        self.server.loop.run_in_executor(None, job.run).add_done_callback(lambda done: self.ran(w, done))

    def on_loop(self, msg_type, msg_id, job: OnLoop):
        """Run a request's coroutine as a task of the loop; it counts as a waiting request
        until it is answered (a connection closed meanwhile gets no answer; the task runs
        on to its end)."""
        self.check_waiting()
        w = Waiter(self, None, msg_id, msg_type, None, _reply_of_append, job.reply)
        self.waiters.add(w)
        self.server.loop.create_task(job.coro).add_done_callback(lambda done: self.ran(w, done))

    def ran(self, w, done):
        if not w.done and not done.cancelled():
            w.done = True
            self.answer(w, done.exception() or done.result())

    def appended(self, w, name, result):
        self.server.streams.notify(name)
        if not w.done:  # else the connection closed meanwhile
            w.done = True
            self.answer(w, result)

    def check_waiting(self):
        """LIMIT_EXCEEDED when the connection has as many waiting requests as it may."""
        limit = self.server.limits.max_waiting_per_connection
        if len(self.waiters) >= limit:
            if not self.said_waiting_limit:
                self.said_waiting_limit = True
                log.info("%s: reached its limit of %d waiting CONSUMEs, READs and POLLs; refusing more", self.peer,
                         limit)
            raise LimitExceeded(f"too many waiting CONSUMEs, READs and POLLs on this connection (the limit is "
                                f"{limit}): wait for replies before sending more")

    def answer(self, w, result):
        """The end of a wait: what it got (maybe nothing) or an error."""
        self.waiters.discard(w)
        self.clocks.last_active = self.server.loop.time()
        if w.take is plain_take and type(result) is bytes:  # its reply frame, made in C (not a KV GET's value)
            self.send(result)
            return
        if isinstance(result, BaseException):
            self.send(error_frame(w.msg_type, w.msg_id, result))
            return
        try:
            payload = w.reply(self, w.args, result)
        except Exception as e:
            self.send(error_frame(w.msg_type, w.msg_id, e))
            return
        self.send(encode_reply(w.msg_type, w.msg_id, payload))

    # ------------------------------------------------------------------ writing, closing
    def send(self, data: bytes):
        out = self.out
        if out is not None:  # handling a read: written with the other replies
            out.append(data)
            self.out_bytes += len(data)
            if self.out_bytes >= WRITE_BATCH:
                self.flush()  # the transport may pause writing: process stops taking requests
            return
        if not self.eof_sent and not self.transport.is_closing():
            self.transport.write(data)

    def flush(self):
        """Write the replies gathered so far, in one write."""
        out = self.out
        if out:
            self.out = []
            self.out_bytes = 0
            if not self.eof_sent and not self.transport.is_closing():
                self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def refuse(self):
        """Over the connection cap: a LIMIT_EXCEEDED frame (msg id 0), then close."""
        server = self.server
        self.refused = self.closing = True
        self.send(encode_error(0, 0, Status.LIMIT_EXCEEDED, server.refusal()))  # (its limit, and why it is so)
        if not server.stopping:
            server.note_refused()
        if server.lingering >= server.max_lingering:  # a storm of connections, or descriptors to keep: no time for each
            self.transport.close()
            return
        server.lingering += 1
        self.lingering = True
        self.linger()

    def shut(self, reason=None, linger=True):
        """Close: waiting requests are dropped, deliveries are ready again at once and
        group members leave.
        With ``linger`` (a client's fault), see ``linger``; else the written replies
        leave within the frame timeout, or the connection is aborted."""
        if self.closing:
            return
        self.flush()  # the replies before, an error frame included, go first
        self.closing = True
        if reason:
            self.close_reason = reason  # said in the line of its close (connection_lost)
        self.let_go()
        if linger:
            self.linger()
            return
        self.transport.close()
        self._abort = self.server.loop.call_later(self.server.limits.frame_timeout, self.transport.abort)

    def let_go(self):
        """Drop the waiting requests, make the deliveries ready again, leave the groups,
        return the budget."""
        for w in self.waiters:
            if w.line is None:  # an append in its appender: it ends unanswered
                w.done = True
            else:
                w.line.drop(w)
        self.waiters.clear()
        self.subs.close_all()
        self.leases.release(self.server.notify, self.peer)
        self.members.release(self.server.streams.notify, self.peer)
        for call in self.calls:  # the reply queues of its requests (a late reply is dropped)
            self.server.forget(call.reply_queue)
            try:
                call.close()
            except ShmqError as e:
                log.warning("%s: cannot delete reply queue %s: %s", self.peer, call.reply_queue, e)
        self.calls.clear()
        give_back_consumers(self)  # (an auto-delete queue left with none goes)
        self.server.budget.forget(self)

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

    def holds(self) -> bool:
        """Whether it holds what makes a quiet connection not idle: a waiting request, a
        subscription, a delivery, a group member, or a place in line for budget."""
        return bool(self.waiters or self.subs or self.leases or self.members or self.budget_wait)

    def beat_every(self, ms: int) -> int:
        """Push a HEARTBEAT every ``ms`` milliseconds (a HELLO's ``heartbeat_ms``), at the
        sweeper's rounds (``Limits.sweep_interval``): returns the interval it keeps."""
        seconds = max(ms / 1000, self.server.limits.sweep_interval)
        self.heartbeat, self.next_beat = seconds, self.server.loop.time() + seconds
        return round(seconds * 1000)

    def check_clocks(self, now):
        """Called by the server's sweeper: close on a frame past its deadline, or when idle;
        push a HEARTBEAT when one is due."""
        if self.closing:
            return
        if self.heartbeat is not None and now >= self.next_beat:
            self.next_beat = now + self.heartbeat
            self.send(_BEAT)
        overdue = self.clocks.overdue(now, self.authed, self.holds())
        if overdue is not None:
            error, reason = overdue
            if error is not None:  # a frame past its deadline
                log.warning("%s: %s", self.peer, reason, extra={"event": "slow_client", "peer": self.peer,
                                                                "why": "frame timeout"})
                self.send(encode_error(0, 0, Status.LIMIT_EXCEEDED, error))
            self.shut(reason)
