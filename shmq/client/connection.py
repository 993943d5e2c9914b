"""One TCP connection's state, sans-IO (h11's way): requests numbered and encoded, bytes in,
replies matched to requests by msg id in any order, pushes kept per subscription, the
errors of requests nobody waits for deferred, and what an abandoned request took given
back. Error replies become the engine's exceptions through the one table
(``protocol.status``); an error with msg id 0 answers the whole connection (too many
connections, a frame timeout, bad magic): like a lost connection, it ends every waiting
request and every later one. A request that was sent and is left unanswered when the
connection ends raises OutcomeUnknown (it may have been carried out); one never sent, why
the connection ended. In a child of fork() the parent's connection's state says so
(``forked``): nothing bound to it is this process's. No socket here: ``remote`` and
``aio`` move the bytes; ``core`` writes the calls.
"""

import functools
import logging
import time
from collections import deque

from ..errors import BrokerUnavailable, OutcomeUnknown, ProtocolError
from ..protocol import REPLY_BIT, Frame, FrameDecoder, MsgType, PushType, Status, encode_request, error_from_reply
from ..protocol.cwire import replies as _c_replies
from ..protocol.frames import UNPACK, decode_payload, unpackb

__all__ = ["ClientCore", "Outbox", "HELLO_MSG_ID", "MAX_REPLY_BYTES", "PENDING_BYTES"]

MAX_REPLY_BYTES = 2**31 - 1  # the client trusts its server's reply sizes
# HELLO's msg id: its header then ends in CR LF, so a peer that reads lines (an HTTP server)
# answers at once, and the client learns it reached no shmq server without waiting out a timeout
HELLO_MSG_ID = 0x0D0A
_DELIVER = PushType.DELIVER | REPLY_BIT
# abandoned, what they took is given back (a POLL's records: its member seeks back to them)
_GIVEN_BACK = (MsgType.CONSUME, MsgType.SUBSCRIBE, MsgType.JOIN, MsgType.POLL, MsgType.POLL_MANY)
_PUTS = (MsgType.PRODUCE, MsgType.PRODUCE_BATCH)  # posted unanswered at the end: whether they landed is unknown
BATCH_BYTES = 64 * 1024  # puts sent without waiting are gathered into one PRODUCE_BATCH up to about this size
PENDING_BYTES = 64 * 1024  # requests sent without waiting that a transport holds, at most, before it writes them
BATCH_MESSAGES = 1024  # ... and this many messages
_MESSAGE_KEYS = ("body", "headers")  # a PRODUCE's fields that are its message's; the others but "queue" are options
_log = logging.getLogger("shmq.client")


def _type_name(t) -> str:
    try:
        return MsgType(t).name
    except ValueError:
        return f"0x{t:02X}"


class _ErrorOf:
    """An error that came inside a reply — a DELIVER push that ends its subscription, a
    message a per-message PRODUCE_BATCH refused — read as an error reply
    (``error_from_reply``)."""

    def __init__(self, status, payload):
        self.status = status if type(status) is int else Status.INTERNAL
        self.payload = payload
        self.msg_id = 0


class Outbox:
    """The bytes of requests sent without waiting that a transport holds for its next
    write (so an ack and the next get leave in one), up to PENDING_BYTES."""

    __slots__ = ("parts", "size")

    def __init__(self):
        self.parts = []
        self.size = 0

    def __bool__(self):
        return bool(self.parts)

    def hold(self, data: bytes) -> bool:
        """Keep ``data``; True once PENDING_BYTES are held: write them now (``take``)."""
        if data:
            self.parts.append(data)
            self.size += len(data)
        return self.size >= PENDING_BYTES

    def take(self, data: bytes = b"") -> bytes:
        """What is held, then ``data``, as one bytes to write; nothing is held after."""
        if not self.parts:
            return data
        self.parts.append(data)
        out = b"".join(self.parts)
        self.parts.clear()
        self.size = 0
        return out


# ---------------------------------------------------------------- the connection
class ClientCore:
    """One connection's state, without its socket: requests out, replies in by msg id."""

    def __init__(self, endpoint: str, max_reply_bytes: int = MAX_REPLY_BYTES):
        self.endpoint = endpoint
        self._decoder = FrameDecoder(max_reply_bytes)
        self._last_id = 0
        self._waiting = set()  # msg ids sent and not yet answered
        self._unanswered = set()  # msg ids left waiting when the connection ended (``result``)
        self._replies = {}  # msg id -> its reply frame's fields (``next_parts``), until result() takes it
        self._raw = set()  # msg ids whose OK reply's payload is kept as bytes (``send_shaped(raw=True)``)
        self.answered = self._replies.__contains__  # answered(msg_id): its reply is in (a C call, for wait loops)
        self._end = None  # () -> the exception that ended the connection
        self.failed = False  # whether it has ended (lost, closed, or an error with msg id 0): ``_end`` is set
        self.ended_at = None  # time.monotonic() when it ended: an outage's start (``options.outage_end``)
        self._unwaited = {}  # msg id posted without waiting -> its type if its error is raised later, else False
        self._deferred = None  # the first error of an unwaited request, raised by the next call
        self._pushes = {}  # subscription id -> deque of pushed messages (and its end, an exception)
        self._cancelled = set()  # subscriptions cancelled: what is still pushed for them was given back
        self._abandoned = {}  # msg id -> (type, fields) of a request whose caller went away (``forget``)
        self._outbox = []  # requests the core itself sends: the give-backs of abandoned ones
        self._first = b""  # the first bytes read, until a frame is: what a peer that is no shmq server said
        self.on_push = None  # called with a subscription id when a push for it arrives (asyncio)
        # puts sent without waiting, gathered (``post``): [queue, options, messages, bytes, whether
        # they are bodies alone]
        self._batch = None
        self.gathers = False  # whether the server takes PRODUCE_BATCH's ``each`` (``greeted``)
        self.compact = False  # whether it takes ``rows`` and bodies alone as ``messages`` (``greeted``)
        self.forked_from = None  # in a child of fork(): the pid of the process whose connection this is
        self.reads = 0  # reads fed in: a heartbeat's sign of life (``heartbeat.Beat``)

    def send(self, msg_type: int, payload: dict | None = None, check: bool = True) -> tuple[int, bytes]:
        """A new msg id and the request's bytes; raises why the connection ended, if it has
        (and, with ``check``, the error of an earlier request sent without waiting)."""
        msg_id, before = self._open(check, msg_type == MsgType.HELLO)
        data = encode_request(msg_type, msg_id, payload)
        return msg_id, before + data if before else data

    def send_shaped(self, shape, value, raw: bool = False) -> tuple[int, bytes]:
        """``send`` of a request of ``shape`` (``protocol.shapes``) with ``value``: the same
        checks, bookkeeping and bytes, encoded from the shape's (a get's CONSUME, a put).
        ``raw``: its reply's payload, if OK, is kept as its bytes (``result`` gives them:
        the caller reads them, or ``decode`` does)."""
        msg_id, before = self._open(True)
        data = shape.frame(msg_id, value)
        if raw:
            self._raw.add(msg_id)
        return msg_id, before + data if before else data

    def decode(self, payload) -> dict:
        """A payload ``result`` gave as bytes (``send_shaped(raw=True)``), decoded; bytes that
        are no payload end the connection, as ``receive_data`` ends it (ProtocolError)."""
        try:
            return decode_payload(payload)
        except ProtocolError as e:
            self._ended(functools.partial(ProtocolError, str(e), e.status, e.msg_id, e.fatal))
            raise

    def post_shaped(self, shape, value) -> bytes:
        """``post`` of a request of ``shape`` with ``value`` (an ACK sent without waiting;
        never a PRODUCE, which ``post`` gathers)."""
        msg_id, before = self._open(False)
        self._unwaited[msg_id] = shape.msg_type
        data = shape.frame(msg_id, value)
        return before + data if before else data

    def _open(self, check: bool, hello: bool = False) -> tuple[int, bytes]:
        """A new request's msg id, waited for from now, and the bytes to write before it
        (the puts gathered, now sent: b"" if none); raises why the connection ended, if it
        has (and, with ``check``, the error of an earlier request sent without waiting)."""
        if self._end is not None:
            raise self._end()
        if check and self._deferred is not None:
            self.raise_deferred()
        before = self.batched() if self._batch is not None else b""  # the puts gathered go first
        if hello:  # the first request: no other is in flight to share its id
            msg_id = HELLO_MSG_ID
        else:  # 1 .. 2**32-1: msg id 0 speaks for the connection
            msg_id = self._last_id = self._last_id % 0xFFFFFFFF + 1
        self._waiting.add(msg_id)
        return msg_id, before

    def receive_data(self, data) -> list[int]:
        """Take bytes read off the connection (b"" once the server closed it); returns the
        msg ids whose outcome is now known, for ``result``."""
        if not data:
            return self.connection_lost("connection closed by the server")
        if self._end is not None:
            return []
        self.reads += 1
        if self._first is not None:
            self._first = (self._first + data)[:40]
        decoder = self._decoder
        waiting = self._waiting
        done = []
        if _c_replies is not None and not decoder.buffered:  # the replies at its start taken in C (``cwire``)
            used, done = _c_replies(data, decoder.max_frame_bytes, waiting, self._unwaited, self._abandoned, self._raw,
                                    self._replies, unpackb, UNPACK)
            if used:
                self._first = None
                if used == len(data):
                    return done
                data = memoryview(data)[used:]
        decoder.feed(data)
        try:
            # a frame's fields as a tuple (type, msg id, payload, status, version): a reply is
            # kept so, and a Frame made only for an error
            raw = self._raw
            while (parts := decoder.next_parts(raw)) is not None:
                self._first = None
                msg_id = parts[1]
                if msg_id in waiting:
                    waiting.discard(msg_id)
                    if raw:
                        raw.discard(msg_id)
                    if self._unwaited and msg_id in self._unwaited:
                        if self._unwaited.pop(msg_id):
                            payload = parts[2]
                            if parts[3] != Status.OK:
                                self._defer(error_from_reply(Frame(*parts), self.endpoint), parts[0])
                            elif type(payload) is dict and payload.get("refused"):  # gathered puts
                                _i, status, text = payload["refused"][0]
                                self._defer(error_from_reply(_ErrorOf(status, {"error": text}), self.endpoint),
                                            parts[0])
                        continue
                    if self._abandoned and msg_id in self._abandoned:
                        if parts[3] == Status.OK:
                            self._give_back(*self._abandoned.pop(msg_id), parts[2])
                        else:
                            del self._abandoned[msg_id]
                        continue
                    self._replies[msg_id] = parts
                    done.append(msg_id)
                elif msg_id == 0 and parts[3] != Status.OK:
                    return done + self._ended(functools.partial(error_from_reply, Frame(*parts), self.endpoint))
                elif msg_id == 0 and parts[0] == _DELIVER:
                    self._pushed(parts[2])
        except ProtocolError as e:  # the server's bytes cannot be read: the connection is over
            text = str(e) if self._first is None else \
                f"{self.endpoint} is not an shmq server: it answered {self._first!r} ({e})"
            return done + self._ended(functools.partial(ProtocolError, text, e.status, e.msg_id, e.fatal))
        return done

    def post(self, msg_type: int, payload: dict | None = None) -> bytes:
        """The bytes of a request nobody waits for (``ack(wait=False)``, CANCEL): its reply
        is dropped when it comes, an error reply logged and raised by the next call.

        A PRODUCE (without ``group`` or ``dedup_id``) is gathered instead with the puts
        posted before it to the same queue with the same options, and they go as one
        PRODUCE_BATCH with ``each`` — each message put or refused on its own, as the
        PRODUCEs would have been — when any other request is sent, when ``batched()`` is
        called (a transport's linger), or once the batch is full: b"" until then. Only
        to a server that says it takes ``each`` (``greeted``)."""
        if msg_type == MsgType.PRODUCE and self.gathers and "group" not in payload and "dedup_id" not in payload:
            options = {k: v for k, v in payload.items() if k != "queue" and k not in _MESSAGE_KEYS}
            return self.gather(payload["queue"], {k: payload[k] for k in _MESSAGE_KEYS if k in payload}, options)
        msg_id, data = self.send(msg_type, payload, check=False)
        self._unwaited[msg_id] = msg_type
        return data

    def gather(self, queue: str, message, options: dict) -> bytes:
        """``post``'s gathering of a PRODUCE of ``message`` (its body and headers; or, to
        a server that says ``compact``, a bytes body alone) with ``options`` (none of them
        ``group`` or ``dedup_id``; ``gathers`` true): the bytes to write now (a batch it
        closed), or b""."""
        batch = self._batch
        out = b""
        if batch is not None and (batch[0] != queue or batch[1] != options):
            out = self.batched()
            batch = None
        if batch is None:
            batch = self._batch = [queue, options, [], 0, True]
        batch[2].append(message)
        if type(message) is bytes:
            batch[3] += len(message) + 16
        else:
            batch[3] += len(message["body"]) + 16
            batch[4] = False  # not bodies alone
        if batch[3] >= BATCH_BYTES or len(batch[2]) >= BATCH_MESSAGES:
            out += self.batched()
        return out

    @property
    def gathering(self) -> bool:
        """Whether puts are gathered, not written yet (``batched`` gives their bytes)."""
        return self._batch is not None

    def greeted(self, server_info: dict) -> None:
        """The HELLO reply came: what the server takes."""
        self.gathers = server_info.get("produce_each") is True
        self.compact = server_info.get("compact") is True

    def batched(self) -> bytes:
        """The bytes of the puts gathered by ``post`` (one PRODUCE_BATCH, or a PRODUCE for
        one), now sent; b"" if none."""
        batch, self._batch = self._batch, None
        if batch is None or self._end is not None:
            return b""
        queue, options, messages, _, bodies = batch
        if not bodies:  # bodies alone go as they are (compact), else every message as a map
            messages = [{"body": m} if type(m) is bytes else m for m in messages]
        if len(messages) == 1:
            m = messages[0]
            msg_type, payload = MsgType.PRODUCE, {"queue": queue, **({"body": m} if bodies else m), **options}
        else:
            msg_type, payload = MsgType.PRODUCE_BATCH, {"queue": queue, "messages": messages, "each": True, **options}
        msg_id, data = self.send(msg_type, payload, check=False)
        self._unwaited[msg_id] = msg_type
        return data

    def _defer(self, error, reply_type: int):
        _log.warning("%s: a request sent without waiting (%s) failed: %s", self.endpoint,
                     _type_name(reply_type & 0x7F), error)
        if self._deferred is None:
            self._deferred = error

    def raise_deferred(self) -> None:
        """Raise (once) the error of an earlier request sent without waiting, if one failed."""
        error, self._deferred = self._deferred, None
        if error is not None:
            raise error

    def _pushed(self, p):
        sid = p.get("subscription")
        if type(sid) is not int or sid in self._cancelled:
            return  # given back by its CANCEL
        buf = self._pushes.get(sid)
        if buf is None:  # pushed before the SUBSCRIBE reply was read (setdefault: another thread may be at it)
            buf = self._pushes.setdefault(sid, deque())
        buf.extend(p.get("messages") or ())
        if "status" in p:  # the server ended it
            buf.append(error_from_reply(_ErrorOf(p["status"], p), self.endpoint))
        if self.on_push is not None:
            self.on_push(sid)

    def pushes(self, sid: int) -> deque:
        """The messages pushed for subscription ``sid`` not yet taken (a live deque; its
        iteration may take from it while another thread reads the socket)."""
        buf = self._pushes.get(sid)
        if buf is None:
            buf = self._pushes.setdefault(sid, deque())
        return buf

    def unsubscribe(self, sid: int) -> None:
        """Subscription ``sid`` is cancelled: drop what it holds and what still comes for it."""
        self._pushes.pop(sid, None)
        self._cancelled.add(sid)

    def ended_error(self) -> Exception:
        """Why the connection ended (it has)."""
        return self._end()

    def done(self, msg_id: int) -> bool:
        """Whether ``result(msg_id)`` has an answer (a reply, or the connection's end)."""
        return msg_id in self._replies or self._end is not None

    def result(self, msg_id: int, msg_type: int | None = None) -> dict:
        """The payload of the reply to ``msg_id`` (a ``msg_type`` request), else raises its
        error, or why the connection ended before it was answered."""
        parts = self._replies.pop(msg_id, None)
        if parts is None:
            if self._end is None:
                raise RuntimeError(f"request {msg_id} has no answer yet")  # a transport's bug
            raise self._unanswered_error(msg_id, msg_type)
        if parts[3] != Status.OK:
            raise error_from_reply(Frame(*parts), self.endpoint)
        return parts[2]

    def forget(self, msg_id: int, msg_type: int | None = None, fields: dict | None = None) -> None:
        """The caller of request ``msg_id`` (of ``msg_type``, with ``fields``) went away (a
        cancelled task): drop its reply. What a CONSUME, SUBSCRIBE or JOIN answered, now or
        later, took for this connection is given back, as nobody will settle or use it:
        the leased messages nacked (ready at once; as after a disconnect, the attempt
        counts), the subscription cancelled, the member gone (``outgoing``)."""
        parts = self._replies.pop(msg_id, None)
        self._unanswered.discard(msg_id)
        self._raw.discard(msg_id)
        if parts is not None and type(parts[2]) is bytes:  # (kept raw: read now)
            parts = (parts[0], parts[1], decode_payload(parts[2]), *parts[3:])
        if msg_type not in _GIVEN_BACK:
            self._waiting.discard(msg_id)
        elif parts is not None:
            if parts[3] == Status.OK:
                self._give_back(msg_type, fields, parts[2])
        elif msg_id in self._waiting:
            self._abandoned[msg_id] = (msg_type, fields)

    def _give_back(self, msg_type, fields, reply):
        if self._end is not None:
            return  # the server gave back everything of the connection
        if msg_type == MsgType.CONSUME:
            tags = [m[1] if type(m) is list else m["delivery"] for m in reply.get("messages") or ()]
            if tags:
                self._quietly(MsgType.NACK, {"queue": fields["queue"], "deliveries": tags, "unseen": True})
        elif msg_type == MsgType.SUBSCRIBE:
            self.unsubscribe(reply["subscription"])
            self._quietly(MsgType.CANCEL, {"subscription": reply["subscription"], "delivered": 0})
        elif msg_type == MsgType.JOIN:
            self._quietly(MsgType.LEAVE, {"stream": fields["stream"], "member": reply["member"]})
        elif msg_type == MsgType.POLL:
            self._seek_back(fields["stream"], fields["member"], reply.get("records"))
        else:  # POLL_MANY
            for (stream, member), poll in zip(fields["members"], reply.get("polls") or ()):
                self._seek_back(stream, member, poll.get("records"))

    def _seek_back(self, stream, member, records):
        """The member of an abandoned POLL reads its records again: it moved past them at
        the server, and nobody was handed them (a partition it lost since: refused, quietly)."""
        first = {}
        for r in records or ():
            p = r["partition"]
            first[p] = min(first.get(p, r["offset"]), r["offset"])
        for p, offset in first.items():
            self._quietly(MsgType.SEEK, {"stream": stream, "member": member, "partitions": [p], "offset": offset})

    def _quietly(self, msg_type, fields):
        msg_id, data = self.send(msg_type, fields, check=False)
        self._unwaited[msg_id] = False  # an error is nobody's: a queue deleted meanwhile has nothing to give back
        self._outbox.append(data)

    def outgoing(self) -> bytes:
        """The requests the core sends by itself (``forget``'s give-backs), to write after
        ``receive_data`` and ``forget``; b"" if none."""
        if not self._outbox:
            return b""
        data, self._outbox = b"".join(self._outbox), []
        return data

    def _unanswered_error(self, msg_id, msg_type):
        """Why request ``msg_id`` has no reply, the connection having ended: OutcomeUnknown
        if it was sent and the connection was lost, dropped or closed before its reply
        (a HELLO's is the connect's failure); else the end's own error."""
        error = self._end()
        if msg_id not in self._unanswered or msg_type == MsgType.HELLO or not isinstance(error, BrokerUnavailable):
            return error
        self._unanswered.discard(msg_id)
        what = "request" if msg_type is None else _type_name(msg_type)
        return OutcomeUnknown(f"{error} (the {what} was sent: whether it was carried out is unknown)")

    def not_sent(self, msg_id: int) -> None:
        """Request ``msg_id`` did not leave whole (its write failed, then the connection
        ended): the server never read it, so its error is the end's, not OutcomeUnknown."""
        self._unanswered.discard(msg_id)
        self._waiting.discard(msg_id)

    def forked(self, pid: int) -> None:
        """This is a child of fork(), and this connection process ``pid``'s: it ends here
        (the parent's socket is not this process's to use), and what was bound to it
        (leases, subscriptions, group members) is the parent's (the first one's, if
        this child's parent inherited it unused)."""
        if self.forked_from is None:
            self.forked_from = pid
        self._ended(functools.partial(
            BrokerUnavailable, f"the connection to {self.endpoint} is process {self.forked_from}'s, of which this "
                               "process is a fork: what was bound to it stays that process's"))
        self._unanswered = set()  # the parent's requests: none is this process's to answer
        self._deferred = None  # nor their errors

    def carry_over(self, lost: "ClientCore") -> None:
        """This connection replaces ``lost``: an error of ``lost``'s requests sent without
        waiting (``post``), not raised yet, is raised by this one's next call."""
        if self._deferred is None:
            self._deferred, lost._deferred = lost._deferred, None

    def connection_lost(self, reason) -> list[int]:
        """The socket broke (``reason``: an OSError or a text); returns the msg ids it ends."""
        return self._ended(functools.partial(BrokerUnavailable, f"lost the connection to {self.endpoint}: {reason}"))

    def heart_stopped(self, seconds: float) -> list[int]:
        """Nothing came within ``seconds`` of a heartbeat's PING: the server is taken for
        dead and the connection dropped; returns the msg ids it ends."""
        return self._ended(functools.partial(
            BrokerUnavailable, f"{self.endpoint} did not answer a heartbeat PING within {seconds:g}s; "
                               "the connection is dropped"))

    def timed_out(self, msg_type: int, seconds: float) -> list[int]:
        """No reply to a ``msg_type`` request came within ``seconds``: the connection is
        dropped (a late reply would come to nobody); returns the msg ids it ends."""
        hint = ": is it an shmq server?" if msg_type == MsgType.HELLO else "; the connection is dropped"
        return self._ended(functools.partial(
            BrokerUnavailable, f"no reply to {_type_name(msg_type)} from {self.endpoint} within {seconds:g}s{hint}"))

    def close(self) -> list[int]:
        """This side closes the connection; returns the msg ids it ends."""
        return self._ended(functools.partial(BrokerUnavailable, f"connection to {self.endpoint} is closed"))

    def _ended(self, error) -> list[int]:
        if self._end is None:  # the first reason is the one every later call hears
            self._end = error
            self.failed = True
            self.ended_at = time.monotonic()
        ended, self._waiting = self._waiting, set()
        self._raw.clear()
        self._unanswered |= ended
        unwaited = self._unwaited
        puts = sum(1 for i in ended if unwaited.get(i) in _PUTS)
        kept = len(self._batch[2]) if self._batch is not None else 0  # gathered, never sent
        self._batch = None
        if (puts or kept) and self._deferred is None:
            end = self._end()
            if isinstance(end, BrokerUnavailable):  # the next call (``flush``) says so, once
                said = []
                if puts:
                    said.append(f"{puts} put{'s' if puts > 1 else ''} sent without waiting {'were' if puts > 1 else 'was'}"
                                f" not answered: whether {'they' if puts > 1 else 'it'} landed is unknown")
                if kept:
                    said.append(f"{kept} put{'s' if kept > 1 else ''} without waiting {'were' if kept > 1 else 'was'} "
                                "never sent")
                self._deferred = (OutcomeUnknown if puts else BrokerUnavailable)(f"{end} ({'; '.join(said)})")
        return sorted(ended)
