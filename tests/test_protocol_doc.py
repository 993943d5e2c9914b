"""docs/PROTOCOL.md's examples, held true against a real server.

Each example in the page is a fenced block whose info string is ``frames NAME``: the bytes
the client sends (lines ``> ``) and the bytes the server answers (lines ``< ``), in hex, two
digits a byte, a note after them. ``..`` stands for a byte that varies (a timestamp, the
server's version: ``Spec.vary``, and floats past 1e9, and the namespace's name in a text).
``SPECS`` below gives each example what it needs: the request it sends
(the page's ``>`` bytes must be exactly its encoding), what the server must hold first
(made with the local API or with requests on the example's connection), and how many frames
the answer is. Each example runs on a server of its own, on a namespace of its own, with
the server's id counters from 1 — so the ids in the page (deliveries, members,
subscriptions) are the ones a fresh server gives.

``python -m tests.test_protocol_doc`` prints every example's block as the server answers
now (``--write``: into the page, in place): the notes and the ``..`` come from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import msgpack
import pytest

import shmq
from shmq.protocol import HEADER_SIZE, REQUEST_FIELDS, FrameDecoder, MsgType, PushType, Status, encode_request
from shmq.protocol.frames import REPLY_BIT

DOC = Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md"
TOKEN = "s3cret"  # the examples' server's token
VERSION = "0.1.0"  # the version the examples' server says (the page marks it as varying)
BACKUP_DIR = "/tmp/shmq-protocol-example"  # BACKUP's example writes here (a fixed path: its bytes are fixed)
MSG_ID = 7  # the examples' msg id, unless one says otherwise
PRODUCER_ID = (1_700_000_000_000 << 10) + 1  # the first producer id the examples' server gives (the page: varies)
_SETUP_IDS = itertools.count(1000)  # msg ids of the requests that set an example up

# ------------------------------------------------------------------ the page's blocks

_BLOCK = re.compile(r"^```frames[ \t]+(\S+)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
_BYTE = r"(?:[0-9a-f]{2}|\.\.)"
_LINE = re.compile(rf"^([<>]) ({_BYTE}(?: {{1,2}}{_BYTE})*)(?:  +(\S.*))?$")


@dataclass
class Block:
    name: str
    sent: bytes  # the client's bytes
    answer: list  # the server's bytes: an int each, None for ``..``
    line: int  # where the block starts in the page (1-based)


def blocks(text: str) -> list[Block]:
    """The page's ``frames`` blocks, in order; AssertionError for a line of another shape."""
    out = []
    for m in _BLOCK.finditer(text):
        sent, answer = [], []
        start = text.count("\n", 0, m.start()) + 1
        for n, line in enumerate(m[2].splitlines(), start + 1):
            if not line.strip():
                continue
            got = _LINE.match(line)
            assert got, f"docs/PROTOCOL.md:{n}: not a line of a frames block: {line!r}"
            tokens = got[2].split()
            if got[1] == ">":
                assert ".." not in tokens, f"docs/PROTOCOL.md:{n}: a request's bytes never vary"
                sent += [int(t, 16) for t in tokens]
            else:
                answer += [None if t == ".." else int(t, 16) for t in tokens]
        out.append(Block(m[1], bytes(sent), answer, start))
    return out


def frame_sizes(data) -> list:
    """The sizes of the whole frames ``data`` (a list of ints or None) holds, in order; the
    rest, if any, last (a length field may not vary)."""
    sizes, pos = [], 0
    while len(data) - pos >= HEADER_SIZE:
        length = data[pos + 4: pos + 8]
        assert None not in length, "a frame's length never varies"
        sizes.append(HEADER_SIZE + int.from_bytes(bytes(length), "big"))
        pos += sizes[-1]
    if pos != len(data):
        sizes.append(len(data) - pos)
    return sizes


def matches(answer: list, got: bytes) -> bool:
    return len(answer) == len(got) and all(a is None or a == b for a, b in zip(answer, got))


# ------------------------------------------------------------------ notes: a frame's bytes explained

_COLUMN = 58  # where the notes start
_PER_LINE = 16  # bytes on a line at most


def _item(data: bytes, pos: int):
    """The msgpack item at ``pos``: (kind, value or count, end of its header, end)."""
    b = data[pos]
    if b <= 0x7F:
        return "int", b, pos + 1, pos + 1
    if b >= 0xE0:
        return "int", b - 0x100, pos + 1, pos + 1
    if 0x80 <= b <= 0x8F:
        return "map", b & 0x0F, pos + 1, None
    if 0x90 <= b <= 0x9F:
        return "array", b & 0x0F, pos + 1, None
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return "str", data[pos + 1: pos + 1 + n].decode(), pos + 1, pos + 1 + n
    if b == 0xC0:
        return "nil", None, pos + 1, pos + 1
    if b in (0xC2, 0xC3):
        return "bool", b == 0xC3, pos + 1, pos + 1
    sizes = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
    if b in sizes:
        w = sizes[b]
        n = int.from_bytes(data[pos + 1: pos + 1 + w], "big")
        raw = data[pos + 1 + w: pos + 1 + w + n]
        if b <= 0xC6:
            return "bin", raw, pos + 1 + w, pos + 1 + w + n
        return "str", raw.decode(), pos + 1 + w, pos + 1 + w + n
    if b in (0xCA, 0xCB):
        w = 4 if b == 0xCA else 8
        value = msgpack.unpackb(data[pos: pos + 1 + w])
        return f"float{w * 8}", value, pos + 1, pos + 1 + w
    ints = {0xCC: (1, False), 0xCD: (2, False), 0xCE: (4, False), 0xCF: (8, False),
            0xD0: (1, True), 0xD1: (2, True), 0xD2: (4, True), 0xD3: (8, True)}
    if b in ints:
        w, signed = ints[b]
        return "int", int.from_bytes(data[pos + 1: pos + 1 + w], "big", signed=signed), pos + 1, pos + 1 + w
    if b in (0xDC, 0xDD, 0xDE, 0xDF):
        w = 2 if b in (0xDC, 0xDE) else 4
        return "array" if b <= 0xDD else "map", int.from_bytes(data[pos + 1: pos + 1 + w], "big"), pos + 1 + w, None
    raise ValueError(f"the examples use no msgpack type 0x{b:02x}")


def _parse(data: bytes, pos: int):
    """A tree of the msgpack value at ``pos``: (kind, value, start, header end, end, children);
    a map's children are (key node, value node) pairs."""
    kind, value, head, end = _item(data, pos)
    children = []
    if kind in ("map", "array"):
        at = head
        for _ in range(value):
            if kind == "map":
                k = _parse(data, at)
                v = _parse(data, k[4])
                children.append((k, v))
                at = v[4]
            else:
                v = _parse(data, at)
                children.append(v)
                at = v[4]
        end = at
    return kind, value, pos, head, end, children


def _say(kind, value) -> str:
    if kind == "str":
        return json.dumps(value, ensure_ascii=False)
    if kind == "bin":
        if value and all(32 <= c < 127 for c in value) and len(value) <= 24:
            return f'bin "{value.decode()}"'
        return f"bin, {len(value)} bytes"
    if kind == "nil":
        return "nil"
    if kind == "bool":
        return "true" if value else "false"
    if kind.startswith("float"):
        return f"{kind} {value!r}"
    if kind in ("map", "array"):
        return f"{kind} of {value}"
    return str(value)


def _hex(data, lo, hi, vary=False) -> list:
    return [".." if vary else f"{c:02x}" for c in data[lo:hi]]


def _scalar(node) -> bool:
    return node[0] not in ("map", "array")


def _is_time(node) -> bool:
    return node[0].startswith("float") and node[1] > 1e9  # (a float past 1e9: a timestamp)


def _flat(node) -> bool:
    """A scalar (not a timestamp), or an array of such, or of such arrays: one line's."""
    if node[0] == "array":
        return all(_flat(c) for c in node[5])
    return _scalar(node) and not _is_time(node)


def _shown(node) -> str:
    return f"[{', '.join(_shown(c) for c in node[5])}]" if node[0] == "array" else _say(node[0], node[1])


def _lines(data, node, depth, vary, hide, key=None, key_tokens=()) -> list:
    """(tokens, note) lines of ``node`` (with its map key's tokens before its own): a scalar
    on a line, an array of a few scalars on one, else a container's header, then its items
    a level deeper. The value of a key in ``vary`` and a timestamp are ``..``, and so is
    each ``hide`` string within a str."""
    kind, value, start, head, end, children = node
    label = "" if key is None else f"{json.dumps(key, ensure_ascii=False)}: "
    indent = "  " * depth
    lead = [*key_tokens, "|"] if key_tokens else []
    if key in vary or _is_time(node):
        said = f"{kind}, a timestamp" if _is_time(node) else _say(kind, value) if kind in ("str", "int") else kind
        return [([*lead, *_hex(data, start, end, True)], f"{indent}{label}{said} (varies)")]
    if kind == "str" and any(h in value for h in hide):
        tokens = _hex(data, start, end)
        raw = data[start:end]
        for h in hide:
            at = raw.find(h.encode())
            while at >= 0:
                tokens[at:at + len(h.encode())] = [".."] * len(h.encode())
                at = raw.find(h.encode(), at + 1)
        for h in hide:
            value = value.replace(h, "…")
        return [([*lead, *tokens], f"{indent}{label}{_say(kind, value)} (… varies)")]
    if _scalar(node):
        return [([*lead, *_hex(data, start, end)], f"{indent}{label}{_say(kind, value)}")]
    if kind == "array" and _flat(node) and end - start <= _PER_LINE:
        return [([*lead, *_hex(data, start, end)], f"{indent}{label}{_shown(node)}")]
    out = [([*lead, *_hex(data, start, head)], f"{indent}{label}{_say(kind, value)}")]
    for child in children:
        if kind == "map":
            k, v = child
            out += _lines(data, v, depth + 1, vary, hide, k[1], _hex(data, k[2], k[4]))
        else:
            out += _lines(data, child, depth + 1, vary, hide)
    return out


def _header_note(h: bytes) -> str:
    length, t, status, msg_id = (int.from_bytes(h[4:8], "big"), h[8], int.from_bytes(h[10:12], "big"),
                                 int.from_bytes(h[12:16], "big"))
    base = t & 0x7F
    if not t & REPLY_BIT:
        name = MsgType(base).name
    elif msg_id == 0 and base in (PushType.DELIVER, PushType.HEARTBEAT):
        name = f"{PushType(base).name} push"
    else:
        name = f"{MsgType(base).name} reply"
    said = f" {Status(status).name}" if t & REPLY_BIT else ""
    return f"header: length {length}, type 0x{t:02x} {name}, v1, status {status}{said}, msg id {msg_id}"


def annotate(direction: str, data: bytes, vary=frozenset(), hide=()) -> list:
    """The lines of a ``frames`` block for the frames ``data`` holds, sent in ``direction``
    (``>`` or ``<``); ``vary``: the map keys whose values vary, ``hide``: strings that vary
    within a str (shown as ``..``)."""
    out, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 4: pos + 8], "big")
        h = data[pos: pos + HEADER_SIZE]
        groups = [h[0:4], h[4:8], h[8:9], h[9:10], h[10:12], h[12:16]]
        head = "  ".join(" ".join(f"{c:02x}" for c in g) for g in groups)
        out.append(_line(direction, head, _header_note(h)))
        payload = data[pos + HEADER_SIZE: pos + HEADER_SIZE + length]
        if payload:
            for tokens, note in _lines(payload, _parse(payload, 0), 0, vary, hide):
                out += _wrapped(direction, tokens, note)
        pos += HEADER_SIZE + length
    return out


def _wrapped(direction, tokens, note) -> list:
    lines, row, count = [], [], 0
    for t in tokens:
        if t == "|":
            row.append(" ")  # a key and its value: two spaces apart
            continue
        if count == _PER_LINE:
            lines.append(row)
            row, count = [], 0
        row.append(t)
        count += 1
    lines.append(row)
    text = [" ".join(r).replace("   ", "  ").strip() for r in lines]
    return [_line(direction, t, note if i == 0 else "") for i, t in enumerate(text)]


def _line(direction, hexes, note) -> str:
    line = f"{direction} {hexes}"
    if note:
        line = f"{line.ljust(_COLUMN - 1)}  {note}" if len(line) < _COLUMN - 1 else f"{line}  {note}"
    return line.rstrip()


# ------------------------------------------------------------------ a server of the examples' own

class Wire:
    """The example's connection: ``ask`` a request (its reply, status OK), ``frames(n)``."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = FrameDecoder()
        self.raw = bytearray()

    def send(self, data: bytes):
        self.sock.sendall(data)

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes the server sends (raw)."""
        while len(self.raw) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self.raw += chunk
        data = bytes(self.raw[:n])
        del self.raw[:n]
        return data

    def frame(self) -> bytes:
        head = self.take(HEADER_SIZE)
        return head + self.take(int.from_bytes(head[4:8], "big"))

    def parts(self, data: bytes):
        dec = FrameDecoder()
        dec.feed(data)
        return dec.next_frame()

    def ask(self, msg_type, payload=None):
        msg_id = next(_SETUP_IDS)
        self.send(encode_request(msg_type, msg_id, payload or {}))
        while True:  # (a push may come first)
            f = self.parts(self.frame())
            if f.msg_id == msg_id:
                break
        assert f.status == Status.OK, (MsgType(msg_type).name, f.payload)
        return f.payload

    def close(self):
        self.sock.close()


@dataclass
class Ctx:
    """What an example's setup gets: the local ``broker`` of the server's namespace, the
    example's connection ``wire`` (after a HELLO with the token, unless the example is one),
    the ``server`` (the TcpServer), and ``later``: calls made when the example is done."""

    broker: object
    wire: Wire
    server: object
    patch: object
    later: list = field(default_factory=list)


@dataclass
class Spec:
    name: str
    msg_type: int
    payload: dict
    setup: Callable | None = None
    frames: int = 1  # frames in the answer
    vary: frozenset = frozenset()  # map keys whose values vary
    msg_id: int = MSG_ID
    hello: bool = True  # a HELLO with the token first (not shown)

    def request(self) -> bytes:
        return encode_request(self.msg_type, self.msg_id, self.payload)


@contextlib.contextmanager
def example_server(namespace, patch):
    """A TcpServer on ``namespace`` in a thread, with a transaction coordinator, its id
    counters (delivery and member tags, subscription ids) from 1, and the version and
    compressions the page shows."""
    from shmq.server import leases
    from shmq.server.handlers import session
    from shmq.server.subscriptions import Subscriptions
    from shmq.server.transactions import ProducerIds, Transactions
    from tests.conftest import ThreadedServer

    patch.setattr(leases, "_tags", itertools.count(1))
    patch.setattr(Subscriptions, "_ids", itertools.count(1))
    patch.setattr(session, "__version__", VERSION)
    patch.setattr(session, "CODECS", ["zstd"])
    srv = ThreadedServer(namespace, token=TOKEN)
    ids = ProducerIds()
    ids._next = PRODUCER_ID - 1  # (a server's come from its clock)
    txns = srv.server.txns = Transactions(srv.server.broker, srv.server.streams, ids)
    try:
        asyncio.run_coroutine_threadsafe(txns.start(None), srv.loop).result(10)
        yield srv
    finally:
        srv.loop.call_soon_threadsafe(txns.stop)
        srv.stop()


def run_example(spec: Spec, broker, patch, frames: int | None = None) -> bytes:
    """The bytes the server answers ``spec``'s request with, once its setup is done."""
    with example_server(broker.namespace, patch) as srv:
        wire = Wire(srv.port)
        ctx = Ctx(broker, wire, srv.server, patch)
        try:
            if spec.hello:
                wire.ask(MsgType.HELLO, {"token": TOKEN})
            if spec.setup is not None:
                spec.setup(ctx)
            wire.send(spec.request())
            got = b"".join(wire.frame() for _ in range(frames or spec.frames))
            # nothing else came before the answer to a PING sent after it
            wire.send(encode_request(MsgType.PING, 0xFFFF))
            assert wire.parts(wire.frame()).msg_id == 0xFFFF, "the server sent more than the example shows"
            return got
        finally:
            wire.close()
            for call in ctx.later:
                call()


# ------------------------------------------------------------------ the examples' setups

def _queue(*names, **settings):
    def setup(ctx):
        for name in names:
            ctx.broker.create_queue(name, **settings).close()
    return setup


def _then(*steps):
    def setup(ctx):
        for step in steps:
            step(ctx)
    return setup


def _put(name, *bodies):
    def setup(ctx):
        with ctx.broker.queue(name) as q:
            for body in bodies:
                q.put(body)
    return setup


def _ask(msg_type, payload, pushes=0):
    def setup(ctx):
        ctx.wire.ask(msg_type, payload)
        for _ in range(pushes):
            ctx.wire.frame()
    return setup


def _stream(name="events", partitions=2, records=()):
    def setup(ctx):
        with ctx.broker.create_stream(name, partitions=partitions) as s:
            for partition, value in records:
                s.append(value, partition=partition)
    return setup


def _store(name="cache", values=(), members=()):
    def setup(ctx):
        with ctx.broker.store(name) as st:
            for key, value in values:
                st.set(key, value)
            for key, member in members:
                st.add(key, member)
    return setup


def _backup_dir(ctx):
    """BACKUP's fixed destination, free, held by this run alone (a lock beside it)."""
    lock = open(BACKUP_DIR + ".lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    shutil.rmtree(BACKUP_DIR, ignore_errors=True)
    os.makedirs(BACKUP_DIR)

    def done():
        shutil.rmtree(BACKUP_DIR, ignore_errors=True)
        lock.close()
    ctx.later.append(done)


def _responder(ctx):
    """A worker that answers each request on queue ``rpc`` with b"pong" (a PRODUCE into its
    ``x-reply-to`` carrying its ``x-correlation-id``), in a thread."""
    ctx.broker.create_queue("rpc").close()

    def work():
        with shmq.connect(namespace=ctx.broker.namespace) as b, b.queue("rpc") as q:
            d = q.get(timeout=10)
            with b.queue(d.headers["x-reply-to"]) as out:
                out.put(b"pong", headers={"x-correlation-id": d.headers["x-correlation-id"]})
            d.ack()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    ctx.later.append(lambda: t.join(10))


TXN = bytes(range(16))  # a publisher's txn (PUBLISH)
_HOST = frozenset({"bytes_held"})  # the memory the kernel counts: the host's pages say
_JOINED = _ask(MsgType.JOIN, {"stream": "events", "group": "workers"})
_CONSUMED = _ask(MsgType.CONSUME, {"queue": "orders", "max": 1})
_TXN_INIT = _ask(MsgType.TXN_INIT, {"transactional_id": "tx-1"})

SPECS = [
    # ---- the session
    Spec("hello", MsgType.HELLO, {"client": "demo", "token": TOKEN}, hello=False, vary=frozenset({"version"})),
    Spec("heartbeat", MsgType.HELLO, {"token": TOKEN, "heartbeat_ms": 1000}, hello=False, frames=2,
         vary=frozenset({"version"})),
    Spec("ping", MsgType.PING, {}),
    Spec("backup", MsgType.BACKUP, {"dest": BACKUP_DIR + "/backup"}, _then(_backup_dir, _queue("orders"),
                                                                           _put("orders", b"hello"))),
    # ---- queues
    Spec("create", MsgType.CREATE, {"queue": "orders", "max_deliveries": 5, "dead_letter_queue": "orders.dlq"},
         _queue("orders.dlq")),
    Spec("delete", MsgType.DELETE, {"queue": "orders"}, _queue("orders")),
    Spec("list", MsgType.LIST, {}, _queue("orders", "orders.dlq")),
    Spec("stats", MsgType.STATS, {"queue": "orders"}, _queue("orders", max_bytes=1 << 20), vary=_HOST),
    Spec("purge", MsgType.PURGE, {"queue": "orders"}, _then(_queue("orders"), _put("orders", b"a", b"b"))),
    Spec("consumer-add", MsgType.CONSUMER_ADD, {"queue": "orders"}, _queue("orders")),
    Spec("consumer-remove", MsgType.CONSUMER_REMOVE, {"queue": "orders"},
         _then(_queue("orders"), _ask(MsgType.CONSUMER_ADD, {"queue": "orders"}))),
    Spec("produce", MsgType.PRODUCE, {"queue": "orders", "body": b"hello"}, _queue("orders")),
    Spec("produce-error", MsgType.PRODUCE, {"queue": "orders", "body": b"hello"}, msg_id=8),
    Spec("bad-request", MsgType.CONSUME, {"queue": "orders", "max": 0}, msg_id=9),
    Spec("produce-batch", MsgType.PRODUCE_BATCH,
         {"queue": "orders", "messages": [{"body": b"a"}, {"body": b"b", "headers": {"lang": "en"}}]},
         _queue("orders")),
    Spec("consume", MsgType.CONSUME, {"queue": "orders", "max": 10, "wait_ms": 1000},
         _then(_queue("orders"), _put("orders", b"hello"))),
    Spec("ack", MsgType.ACK, {"queue": "orders", "deliveries": [1]},
         _then(_queue("orders"), _put("orders", b"hello"), _CONSUMED)),
    Spec("nack", MsgType.NACK, {"queue": "orders", "deliveries": [1], "delay_ms": 5000},
         _then(_queue("orders"), _put("orders", b"hello"), _CONSUMED)),
    Spec("extend", MsgType.EXTEND, {"queue": "orders", "deliveries": [1], "visibility_ms": 60000},
         _then(_queue("orders"), _put("orders", b"hello"), _CONSUMED)),
    Spec("reject", MsgType.REJECT, {"queue": "orders", "deliveries": [1]},
         _then(_queue("orders"), _put("orders", b"hello"), _CONSUMED)),
    Spec("peek", MsgType.PEEK, {"queue": "orders"}, _then(_queue("orders"), _put("orders", b"hello"))),
    Spec("redrive", MsgType.REDRIVE, {"queue": "orders.dlq"},
         _then(_queue("orders.dlq"), _queue("orders", dead_letter_queue="orders.dlq"), _put("orders", b"hello"),
               _CONSUMED, _ask(MsgType.REJECT, {"queue": "orders", "deliveries": [1]}))),
    Spec("subscribe", MsgType.SUBSCRIBE, {"queue": "orders", "prefetch": 100}, frames=2,
         setup=_then(_queue("orders"), _put("orders", b"hello"))),
    Spec("cancel", MsgType.CANCEL, {"subscription": 1, "delivered": 0},
         _then(_queue("orders"), _put("orders", b"hello"), _ask(MsgType.SUBSCRIBE, {"queue": "orders", "prefetch": 1},
                                                                pushes=1))),
    # ---- streams
    Spec("stream-create", MsgType.STREAM_CREATE, {"stream": "events", "partitions": 2}),
    Spec("stream-delete", MsgType.STREAM_DELETE, {"stream": "events"}, _stream()),
    Spec("stream-list", MsgType.STREAM_LIST, {}, _stream()),
    Spec("stream-info", MsgType.STREAM_INFO, {"stream": "events"}, _stream()),
    Spec("stream-stats", MsgType.STREAM_STATS, {"stream": "events"}, _then(_stream(records=[(0, b"v1")]), _JOINED),
         vary=_HOST),
    Spec("append", MsgType.APPEND, {"stream": "events", "value": b"v1", "key": b"user-1"}, _stream()),
    Spec("append-batch", MsgType.APPEND_BATCH,
         {"stream": "events", "records": [{"value": b"v1"}, {"value": b"v2"}], "partition": 1}, _stream()),
    Spec("read", MsgType.READ, {"stream": "events", "partition": 0, "offset": 0, "max": 100},
         _stream(records=[(0, b"v1")])),
    Spec("offsets", MsgType.OFFSETS, {"stream": "events", "partition": 0}, _stream(records=[(0, b"v1")])),
    Spec("publish", MsgType.PUBLISH, {"stream": "events", "staging": "events.staging", "ranges": [[0, 0, 0, 1]],
                                      "txn": TXN, "batch": 0},
         _then(_stream(), _stream("events.staging", partitions=1, records=[(0, b"v1")]))),
    Spec("published", MsgType.PUBLISHED, {"stream": "events", "txn": TXN},
         _then(_stream(), _stream("events.staging", partitions=1, records=[(0, b"v1")]),
               _ask(MsgType.PUBLISH, {"stream": "events", "staging": "events.staging", "ranges": [[0, 0, 0, 1]],
                                      "txn": TXN, "batch": 0}))),
    Spec("delete-records", MsgType.DELETE_RECORDS, {"stream": "events", "offsets": [[0, 1]]},
         _stream(records=[(0, b"v1"), (0, b"v2")])),
    # ---- consumer groups
    Spec("join", MsgType.JOIN, {"stream": "events", "group": "workers"}, _stream()),
    Spec("poll", MsgType.POLL, {"stream": "events", "member": 1}, _then(_stream(records=[(0, b"v1")]), _JOINED)),
    Spec("poll-many", MsgType.POLL_MANY, {"members": [["events", 1]], "max": 100},
         _then(_stream(records=[(0, b"v1")]), _JOINED)),
    Spec("commit", MsgType.COMMIT, {"stream": "events", "member": 1, "offsets": [[0, 1]]},
         _then(_stream(records=[(0, b"v1")]), _JOINED)),
    Spec("leave", MsgType.LEAVE, {"stream": "events", "member": 1}, _then(_stream(), _JOINED)),
    Spec("assignment", MsgType.ASSIGNMENT, {"stream": "events", "member": 1}, _then(_stream(), _JOINED)),
    Spec("seek", MsgType.SEEK, {"stream": "events", "member": 1, "partitions": [0], "offset": 0},
         _then(_stream(), _JOINED)),
    Spec("pause", MsgType.PAUSE, {"stream": "events", "member": 1, "partitions": [1], "paused": True},
         _then(_stream(), _JOINED)),
    Spec("groups", MsgType.GROUPS, {"stream": "events"}, _then(_stream(), _JOINED)),
    Spec("committed", MsgType.COMMITTED, {"stream": "events", "group": "workers"},
         _then(_stream(records=[(0, b"v1")]), _JOINED,
               _ask(MsgType.COMMIT, {"stream": "events", "member": 1, "offsets": [[0, 1]]}))),
    Spec("lag", MsgType.LAG, {"stream": "events", "group": "workers"},
         _then(_stream(records=[(0, b"v1"), (1, b"v2")]), _JOINED,
               _ask(MsgType.COMMIT, {"stream": "events", "member": 1, "offsets": [[0, 1]]}))),
    Spec("reset", MsgType.RESET, {"stream": "events", "group": "workers", "to": "latest"},
         _stream(records=[(0, b"v1")])),
    # ---- transactions
    Spec("txn-init", MsgType.TXN_INIT, {"transactional_id": "tx-1"}, vary=frozenset({"producer_id"})),
    Spec("txn-offsets", MsgType.TXN_OFFSETS, {"transactional_id": "tx-1", "producer_id": PRODUCER_ID,
                                              "epoch": 0, "stream": "events", "member": 1, "offsets": [[0, 1]]},
         _then(_stream(records=[(0, b"v1")]), _JOINED, _TXN_INIT)),
    Spec("txn-end", MsgType.TXN_END, {"transactional_id": "tx-1", "producer_id": PRODUCER_ID, "epoch": 0,
                                          "commit": True},
         _then(_stream(), _TXN_INIT, _ask(MsgType.APPEND, {"stream": "events", "value": b"v1", "partition": 0,
                                                           "txn": ["tx-1", PRODUCER_ID, 0]}))),
    # ---- exchanges, and request / reply
    Spec("x-create", MsgType.X_CREATE, {"exchange": "news", "type": "topic"}),
    Spec("x-delete", MsgType.X_DELETE, {"exchange": "news"}, _ask(MsgType.X_CREATE, {"exchange": "news"})),
    Spec("x-list", MsgType.X_LIST, {"exchange": "news"},
         _then(_queue("orders"), _ask(MsgType.X_CREATE, {"exchange": "news", "type": "topic"}),
               _ask(MsgType.X_BIND, {"exchange": "news", "target": "orders", "pattern": "eu.*"}))),
    Spec("x-bind", MsgType.X_BIND, {"exchange": "news", "target": "orders", "pattern": "eu.*"},
         _then(_queue("orders"), _ask(MsgType.X_CREATE, {"exchange": "news", "type": "topic"}))),
    Spec("x-unbind", MsgType.X_UNBIND, {"exchange": "news", "target": "orders"},
         _then(_queue("orders"), _ask(MsgType.X_CREATE, {"exchange": "news", "type": "topic"}),
               _ask(MsgType.X_BIND, {"exchange": "news", "target": "orders", "pattern": "eu.*"}))),
    Spec("x-publish", MsgType.X_PUBLISH, {"exchange": "news", "body": b"hello", "routing_key": "eu.sales"},
         _then(_queue("orders"), _ask(MsgType.X_CREATE, {"exchange": "news", "type": "topic"}),
               _ask(MsgType.X_BIND, {"exchange": "news", "target": "orders", "pattern": "eu.*"}))),
    Spec("request", MsgType.REQUEST, {"queue": "rpc", "body": b"ping", "timeout_ms": 5000}, _responder,
         vary=frozenset({"x-correlation-id"})),
    # ---- keyed stores
    Spec("kv-open", MsgType.KV_OPEN, {"store": "cache"}),
    Spec("kv-list", MsgType.KV_LIST, {}, _store()),
    Spec("kv-drop", MsgType.KV_DROP, {"store": "cache"}, _store()),
    Spec("kv-set", MsgType.KV_SET, {"store": "cache", "key": "user:1", "value": b"ann", "ttl": 60}, _store()),
    Spec("kv-get", MsgType.KV_GET, {"store": "cache", "key": "user:1"}, _store(values=[("user:1", b"ann")])),
    Spec("kv-get-many", MsgType.KV_GET_MANY, {"store": "cache", "keys": ["user:1", "user:2"]},
         _store(values=[("user:1", b"ann")])),
    Spec("kv-delete", MsgType.KV_DELETE, {"store": "cache", "keys": ["user:1", "user:2"]},
         _store(values=[("user:1", b"ann")])),
    Spec("kv-incr", MsgType.KV_INCR, {"store": "cache", "key": "hits", "by": 5}, _store()),
    Spec("kv-add", MsgType.KV_ADD, {"store": "cache", "key": "tags", "member": "red"}, _store()),
    Spec("kv-members", MsgType.KV_MEMBERS, {"store": "cache", "key": "tags"},
         _store(members=[("tags", "red"), ("tags", "blue")])),
    Spec("kv-expire", MsgType.KV_EXPIRE, {"store": "cache", "key": "user:1", "ttl": 60},
         _store(values=[("user:1", b"ann")])),
    Spec("kv-ttl", MsgType.KV_TTL, {"store": "cache", "key": "user:1"},
         _then(_store(values=[("user:1", b"ann")]),
               _ask(MsgType.KV_EXPIRE, {"store": "cache", "key": "user:1", "ttl": 60})), vary=frozenset({"ttl"})),
    Spec("kv-keys", MsgType.KV_KEYS, {"store": "cache", "prefix": "user:"},
         _store(values=[("user:1", b"ann"), ("user:2", b"bob"), ("hits", b"3")])),
    Spec("kv-clear", MsgType.KV_CLEAR, {"store": "cache"}, _store(values=[("user:1", b"ann")])),
    Spec("kv-sweep", MsgType.KV_SWEEP, {"store": "cache"}, _store(values=[("user:1", b"ann")])),
]
BY_NAME = {s.name: s for s in SPECS}


# ------------------------------------------------------------------ the tests

def _page_blocks():
    return {b.name: b for b in blocks(DOC.read_text())}


def test_every_request_type_has_an_example_and_every_example_a_spec():
    found = blocks(DOC.read_text())
    names = [b.name for b in found]
    assert len(names) == len(set(names)), "two examples of one name"
    assert sorted(names) == sorted(BY_NAME), "examples of the page without a spec here, or specs without one there"
    shown = {b.sent[8] for b in found}
    missing = [MsgType(t).name for t in REQUEST_FIELDS if t not in shown]
    assert missing == [], f"request types the page has no example of: {missing}"


@pytest.mark.parametrize("name", [s.name for s in SPECS])
def test_an_example_of_the_page_is_what_the_server_answers(name, broker):
    spec, block = BY_NAME[name], _page_blocks()[name]
    where = f"docs/PROTOCOL.md:{block.line} ({name})"
    assert block.sent == spec.request(), f"{where}: its request is not {spec.payload!r} (msg id {spec.msg_id})"
    assert sum(frame_sizes(block.answer)[:spec.frames]) == len(block.answer), f"{where}: not {spec.frames} frames"
    with pytest.MonkeyPatch.context() as patch:
        got = run_example(spec, broker, patch)
    assert matches(block.answer, got), (
        f"{where}: the server answers\n" + "\n".join(annotate("<", got, spec.vary, (broker.namespace,))))


def test_the_examples_format_reads_what_it_should():
    text = ("```frames x\n"
            "> de ad be ef  00 00 00 00  07  01  00 00  00 00 00 07   header\n"
            "< de ad be ef  00 00 00 01  87  01  00 00  00 00 00 07   header\n"
            "< ..                                                     map of 0 (varies)\n"
            "```\n")
    (b,) = blocks(text)
    assert (b.name, b.sent, b.answer[-1], len(b.answer)) == ("x", encode_request(MsgType.PING, 7), None, 17)
    with pytest.raises(AssertionError, match="not a line of a frames block"):
        blocks(text.replace("< ..", "< .. ?"))
    with pytest.raises(AssertionError, match="never vary"):
        blocks(text.replace("> de", "> .."))
    assert matches([1, None, 3], b"\x01\x02\x03") and not matches([1, None, 3], b"\x01\x02\x04")
    assert not matches([1, None], b"\x01\x02\x03")


# ------------------------------------------------------------------ regenerating the page's blocks

def _block_text(spec: Spec, got: bytes, namespace: str) -> str:
    lines = annotate(">", spec.request()) + annotate("<", got, spec.vary, (namespace,))
    return f"```frames {spec.name}\n" + "\n".join(lines) + "\n```"


def main(argv):
    """Print each example's block as the server answers now; ``--write``: put them in the page."""
    from shmq.engine.shm.segment import destroy_namespace

    import uuid

    write = "--write" in argv
    wanted = [a for a in argv if not a.startswith("--")]
    out = {}
    for spec in SPECS:
        if wanted and spec.name not in wanted:
            continue
        ns = "t" + uuid.uuid4().hex[:12]
        b = shmq.connect(namespace=ns)
        b.create_namespace()
        try:
            with pytest.MonkeyPatch.context() as patch:
                out[spec.name] = _block_text(spec, run_example(spec, b, patch), ns)
        except Exception as e:  # the others still
            print(f"{spec.name}: {e!r}", file=sys.stderr)
        finally:
            b.close()
            destroy_namespace(ns)
    if not write:
        print("\n\n".join(out.values()))
        return
    text = DOC.read_text()
    seen = set()

    def put(m):
        seen.add(m[1])
        return out.get(m[1], m[0])

    text = _BLOCK.sub(put, text)
    DOC.write_text(text)
    for name in out.keys() - seen:
        print(f"not in the page yet:\n{out[name]}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
