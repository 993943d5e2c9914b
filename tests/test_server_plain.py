"""The server's plain requests in C (``server/_plain.c``, issue 44) against the Python path
they stand in for (``handlers``): the same reads — plain frames one by one and pipelined,
frames it must refuse, mutated and truncated ones, other requests between them — through a
``Connection`` whose server has ``plain`` and one whose server has not, on two namespaces in
the same state, get the same replies (byte for byte but for the lease tags, which come from
one counter, and the enqueue times) and leave the queues and the leases in the same state.

Strategy: a Hypothesis program of operations, each encoded once per side (an ACK names
deliveries by the order they were handed out, as each side numbered them), read by both
sides, the replies normalized and compared after every read; then a fuzz of random and
mutated bytes, which must never cost more than a connection. The connections are real ones
of real ``TcpServer``s (never listening), fed as the event loop feeds them.
"""

import asyncio
import re

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import shmq
from shmq import destroy_namespace
from shmq.errors import QueueNotFound
from shmq.protocol import FrameDecoder, MsgType, Status, encode_request
from shmq.protocol.shapes import ack_shape, consume_many_shape, consume_shape, produce_batch_shape, produce_shape
from shmq.server import plain as plain_seam
from shmq.server.connection import Connection
from shmq.server.tcp import TcpServer
from tests.test_server_connection import Transport

pytestmark = pytest.mark.skipif(not plain_seam.BUILT, reason="the C extension shmq.server._plain is not built")

QUEUES = ("q", "small", "prio")
UNKNOWN = 10**15  # a tag no connection was given (the counter starts at 1)


class Counted:
    """A ``Plain`` that counts the requests it serves."""

    def __init__(self, plain, side):
        assert plain is not None
        self.plain, self.side = plain, side

    def serve(self, data, leases, most, *wait):
        served = self.plain.serve(data, leases, most, *wait)
        if served is not None:
            self.side.served += served[2]
        return served

    def buffer(self, conn):
        return self.plain.buffer(conn)

    def read(self, conn, nbytes):
        before = conn.requests
        got = self.plain.read(conn, nbytes)
        if got is True:  # served whole: the connection counted them
            self.side.served += conn.requests - before
            self.side.whole += 1
        elif got:
            self.side.served += got[2]
        return got

    def deliver(self, *args):
        got = self.plain.deliver(*args)
        if got is not False:
            self.side.delivered += 1
        return got

    def forget(self):
        self.plain.forget()


def _unnamed(headers):
    """A REQUEST's message headers (a mutated frame's type byte can be REQUEST's) without the
    names each side makes its own: its reply queue's and its correlation id."""
    if type(headers) is not dict:
        return headers
    return {k: "..." if k in ("x-reply-to", "x-correlation-id") else v for k, v in headers.items()}


class Side:
    """One server (its plain requests in C or not) on its own namespace, one connection."""

    def __init__(self, namespace, in_c):
        self.namespace = namespace
        self.broker = shmq.connect(namespace=namespace)
        self.broker.create_namespace()
        self.broker.create_queue("q", max_bytes=1 << 20)
        self.broker.create_queue("small", max_bytes=4096, max_message_bytes=256)
        self.broker.create_queue("prio", priorities=3)  # the general take: never served in C
        self.loop = asyncio.new_event_loop()
        self.server = TcpServer(self.broker, port=0)
        self.server.loop = self.loop
        self.served = 0  # requests served in C
        self.delivered = 0  # waiting CONSUMEs tried again in C (Plain.deliver)
        self.whole = 0  # reads served whole in C, replies written and all (Plain.read)
        if in_c:
            self.server.plain = Counted(plain_seam.plain_server(self.server), self)
        self.transport = Transport()
        self.conn = Connection(self.server)
        self.conn.connection_made(self.transport)
        self.tags = []  # the tags handed out, in order
        self.decoder = FrameDecoder(1 << 30)
        self.next_id = 0
        for name in ("q", "small"):  # warm: each ring's first chunk, the server's process slot (Python's)
            self.read(produce_shape(name).frame(1, b"w") + consume_shape(name).frame(2, 0))
            self.replies()
            self.read(ack_shape(name).frame(3, self.tags[0]))
            self.replies()
            self.tags.clear()
        self.served = 0

    def msg_id(self):
        self.next_id += 1
        return self.next_id

    def tag(self, i):
        return self.tags[i] if i < len(self.tags) else UNKNOWN + i

    def read(self, data: bytes):
        if self.conn.closing:
            return
        buf = self.conn.get_buffer(-1)
        n = min(len(data), len(buf))
        buf[:n] = data[:n]
        self.conn.buffer_updated(n)
        if n < len(data):
            self.read(data[n:])

    def replies(self, by_id=False) -> list:
        """The replies written since the last call, normalized: tags as their order, times out
        (``by_id``: the replies in the order of their msg ids, their tags in that order)."""
        for data in self.transport.written:
            self.decoder.feed(data)
        self.transport.written.clear()
        out = []
        frames = list(self.decoder.frames())
        for f in sorted(frames, key=lambda f: f.msg_id) if by_id else frames:
            payload = f.payload
            if f.type & 0x7F == MsgType.CONSUME and not f.status:
                payload = {"messages": [self._message(m) for m in payload["messages"]]}
            elif f.type & 0x7F == MsgType.PEEK and not f.status:  # (a mutated frame's type can be PEEK's)
                payload = {"messages": [{**m, "enqueued_at": None} for m in payload["messages"]]}
            elif f.status and type(payload.get("error")) is str:  # (it may name the namespace, and tags)
                error = payload["error"].replace(self.namespace, "NS")
                if error.startswith("unknown deliveries"):  # (the tags it names)
                    error = re.sub(r"\d+", lambda m: f"tag{self.tags.index(int(m[0]))}" if int(m[0]) in self.tags
                                   else m[0], error)
                payload = {**payload, "error": error}
            out.append((f.type, f.msg_id, f.status, payload))
        return out

    def _message(self, m):
        if type(m) is list:  # a row: [id, tag, body, attempt, enqueued_at, headers?, ...]
            self.tags.append(m[1])
            rest = [_unnamed(m[5]), *m[6:]] if len(m) > 5 else []
            return [m[0], len(self.tags) - 1, m[2], m[3], None, *rest]
        self.tags.append(m["delivery"])
        return {**m, "delivery": len(self.tags) - 1, "enqueued_at": None, "headers": _unnamed(m.get("headers"))}


    def state(self):
        out = {}
        for name in QUEUES:
            try:
                s = self.broker.queue(name).stats()
            except QueueNotFound:  # deleted by a request (a mutated frame's type can be DELETE_QUEUE's)
                out[name] = None
                continue
            out[name] = (s.ready, s.in_flight, s.enqueued_total, s.acked_total, s.redelivered_total)
        return out, len(self.conn.leases)

    def close(self):
        self.conn.connection_lost(None)
        self.server.queues.forget_all()
        self.loop.close()
        self.broker.close()
        destroy_namespace(self.namespace)


@pytest.fixture
def sides(namespace):
    """A pair of sides, C's and Python's; a Hypothesis example's pair is closed as the next
    example makes its own (its waiting gets' doorbell threads end with it)."""
    made, count = [], 0

    def close():
        while made:
            for side in made.pop():
                side.close()

    def make():
        nonlocal count
        close()
        count += 1
        made.append([Side(f"{namespace}{i}{count}", in_c) for i, in_c in enumerate((True, False))])
        return made[-1]

    yield make
    close()


# ---------------------------------------------------------------- the operations
_queue = st.sampled_from(QUEUES + ("nope", "é"))
_body = st.binary(max_size=300)
ops = st.one_of(
    st.tuples(st.just("put"), _queue, _body),
    st.tuples(st.just("batch"), _queue, st.lists(_body, min_size=1, max_size=70), st.booleans(), st.booleans()),
    st.tuples(st.just("get"), _queue, st.integers(1, 70), st.booleans()),
    st.tuples(st.just("wait"), _queue, st.integers(1, 70), st.booleans()),  # a get that waits for what comes
    st.tuples(st.just("ack"), _queue, st.lists(st.integers(0, 40), max_size=6)),
    st.tuples(st.just("fields"), st.sampled_from([MsgType.PRODUCE, MsgType.PRODUCE_BATCH, MsgType.CONSUME,
                                                  MsgType.ACK]),
              st.dictionaries(st.sampled_from(["queue", "body", "max", "wait_ms", "rows", "messages", "deliveries",
                                               "each", "headers", "priority", "other"]),
                              st.one_of(st.sampled_from(QUEUES), st.binary(max_size=4), st.integers(-2, 3),
                                        st.booleans(), st.none(), st.lists(st.binary(max_size=3), max_size=3),
                                        st.lists(st.integers(0, 3), max_size=3)), max_size=5)),
    st.tuples(st.just("ping")),
)


def encode(side, op) -> bytes:
    kind = op[0]
    if kind == "put":
        return produce_shape(op[1]).frame(side.msg_id(), op[2])
    if kind == "batch":
        _, queue, bodies, as_maps, each = op
        messages = [{"body": b} for b in bodies] if as_maps else bodies
        payload = {"queue": queue, "messages": messages, **({"each": True} if each else {})}
        return encode_request(MsgType.PRODUCE_BATCH, side.msg_id(), payload)
    if kind in ("get", "wait"):
        _, queue, most, rows = op
        shape = consume_shape(queue) if most == 1 and not rows else consume_many_shape(queue, most, rows)
        return shape.frame(side.msg_id(), 0 if kind == "get" else 600_000)
    if kind == "ack":
        tags = [side.tag(i) for i in op[2]]
        if len(tags) == 1:
            return ack_shape(op[1]).frame(side.msg_id(), tags[0])
        return encode_request(MsgType.ACK, side.msg_id(), {"queue": op[1], "deliveries": tags})
    if kind == "fields":
        return encode_request(op[1], side.msg_id(), op[2])
    return encode_request(MsgType.PING, side.msg_id())


def run(pair, reads, cuts=()):
    """Each read's requests on both sides; ``cuts``: where a read's bytes are split into
    reads of their own (a fraction of its length each), frames arriving in pieces. Once a
    get waits, the replies of a read are compared by msg id: a waiting get answered in a
    read comes first in C, in its place among the read's replies in Python (replies may
    come in any order, docs/PROTOCOL.md)."""
    waited = False
    for i, read in enumerate(reads):
        waited = waited or any(op[0] in ("wait", "fields") for op in read)
        for side in pair:
            data = b"".join(encode(side, op) for op in read)
            at = sorted({int(f * len(data)) for f in cuts[i % len(cuts)]} - {0}) if cuts else []
            for a, b in zip([0, *at], [*at, len(data)]):
                side.read(data[a:b])
        c, py = (side.replies(by_id=waited) for side in pair)
        assert c == py, read
        assert pair[0].state() == pair[1].state(), read


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(ops, min_size=1, max_size=5), min_size=1, max_size=12))
def test_the_c_path_answers_as_the_python_path(sides, reads):
    """Reads of one or more requests (pipelined), plain or not, good or bad."""
    pair = sides()
    run(pair, reads)
    event(f"served in C: {'some' if pair[0].served else 'none'}")
    event(f"waiting gets answered in C: {'some' if pair[0].delivered else 'none'}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(ops, min_size=1, max_size=5), min_size=1, max_size=8),
       st.lists(st.lists(st.floats(0, 1, exclude_max=True), max_size=3), min_size=1, max_size=4))
def test_frames_in_pieces_get_the_python_paths_answers(sides, reads, cuts):
    """The same, each read's bytes cut into several reads: the frames a later read completes
    are offered to C from the decoder's bytes (``FrameDecoder.offer``)."""
    pair = sides()
    run(pair, reads, cuts)
    event(f"served in C: {'some' if pair[0].served else 'none'}")


def test_a_read_goes_in_once_its_rest_from_the_first_frame_c_left(sides):
    """A read has one way in (``Connection.take``, ``Plain.read`` its fast path): a whole read of
    plain frames ends in C; a read with a PING among them is served in C up to the PING, and
    ``take`` goes on from there, the PING and the frames after it through Python's dispatch; C's
    ``serve`` is called for neither read from anywhere else (only ``FrameDecoder.offer`` calls it,
    for frames over several reads), and the replies and counts are those of the Python path."""
    pair = sides()
    c = pair[0]
    dispatched, offered = [], []
    hook, serve = c.conn.handle, c.server.plain.serve
    c.conn.handle = lambda frame: dispatched.append(frame[0]) or hook(frame)
    c.server.plain.serve = lambda *args: offered.append(1) or serve(*args)
    whole = [("put", "q", b"a"), ("put", "q", b"b")]
    split = [("get", "q", 2, True), ("ping",), ("put", "q", b"c"), ("get", "q", 5, False)]
    for looked in (False, True):  # (a warm-up round first: a ring's next chunk is Python's to map)
        dispatched.clear()
        c.whole = c.served = 0
        requests = c.conn.requests
        run(pair, [whole])
        assert not looked or (c.whole, c.served, dispatched, c.conn.requests - requests) == (1, 2, [], 2)
        run(pair, [split])
    assert (c.whole, c.served, c.conn.requests - requests) == (1, 3, 6)
    assert dispatched == [MsgType.PING, MsgType.PRODUCE, MsgType.CONSUME] and offered == []


def test_a_big_batch_in_pieces_is_served_in_c(sides):
    """A PRODUCE_BATCH of 64 bodies, a CONSUME of them and their ACK, each in pieces: no
    Python dispatch, the queue holds exactly them and then nothing. (A ring's next chunk of
    memory is Python's to map: the batch fits the chunk the warm-up round maps.)"""
    c, _py = sides()
    dispatched = []
    hook = c.conn.handle
    c.conn.handle = lambda frame: dispatched.append(frame[0]) or hook(frame)
    bodies = [bytes([i]) * 100 for i in range(64)]
    for _ in range(2):  # (the warm-up round, then the one looked at)
        dispatched.clear()
        c.served = 0
        for data in (encode_request(MsgType.PRODUCE_BATCH, 1, {"queue": "q", "messages": bodies}),
                     consume_many_shape("q", 64, True).frame(2, 0)):
            third = len(data) // 3
            for a, b in ((0, third), (third, 2 * third), (2 * third, len(data))):
                c.read(data[a:b])
        got = c.replies()
        assert [r[2] for r in got] == [Status.OK, Status.OK] and [m[2] for m in got[1][3]["messages"]] == bodies
        data, c.tags = encode_request(MsgType.ACK, 3, {"queue": "q", "deliveries": c.tags}), []
        c.read(data[:7])
        c.read(data[7:])
        assert c.replies()[0][3] == {"acked": 64}
        assert c.broker.queue("q").stats().ready == 0 and len(c.conn.leases) == 0
    assert dispatched == [] and c.served == 3


def test_the_c_path_serves_what_the_clients_send(sides):
    """The plain shapes the clients send are served in C: of 100 rounds of each, only the
    few the engine leaves to Python (a ring's next chunk of memory, a new lap) reach the
    connection's Python dispatch (its hook records what does); a get that waits is lined up
    from C, and answered in C when data comes."""
    c, _py = sides()
    # the first put and take of a handle are Python's: memory for the ring's first chunk, and
    # the server's process slot in the queue (registered by its first take)
    c.read(produce_shape("q").frame(100, b"0") + consume_shape("q").frame(101, 0))
    c.replies()
    c.read(ack_shape("q").frame(102, c.tags[0]))
    assert c.replies()[0][3] == {"acked": 1}
    dispatched = []
    hook = c.conn.handle
    c.conn.handle = lambda frame: dispatched.append(frame[0]) or hook(frame)
    c.whole = 0
    for i in range(100):
        c.read(produce_shape("q").frame(1, b"a" * 100))
        c.read(encode_request(MsgType.PRODUCE_BATCH, 2, {"queue": "q", "messages": [b"b" * 100] * 3}))
        c.read(encode_request(MsgType.PRODUCE_BATCH, 3, {"queue": "q", "messages": [{"body": b"e"}], "each": True}))
        c.read(consume_shape("q").frame(4, 0) + consume_many_shape("q", 2, True).frame(5, 0)
               + consume_many_shape("q", 2, False).frame(6, 0))
        got = c.replies()
        assert [r[2] for r in got] == [Status.OK] * 6
        tags, c.tags = c.tags[-5:], []
        c.read(ack_shape("q").frame(7, tags[0]) + encode_request(MsgType.ACK, 8, {"queue": "q", "deliveries": tags[1:]}))
        assert [r[3] for r in c.replies()] == [{"acked": 1}, {"acked": 4}]
    assert len(dispatched) <= 10, dispatched
    assert c.whole >= 500 - len(dispatched)  # a read with no frame left to Python: whole in C, its reply written there
    dispatched.clear()
    # nothing ready and a wait: lined up from C; the data a PRODUCE brings, answered in C first
    for shape, most in ((consume_shape("q"), 1), (consume_many_shape("q", 2, True), 2)):
        c.read(shape.frame(9, 50))
        assert c.replies() == [] and len(c.conn.waiters) == 1
        c.read(encode_request(MsgType.PRODUCE_BATCH, 10, {"queue": "q", "messages": [b"w"] * most}))
        got = c.replies()
        assert [r[:3] for r in got] == [(MsgType.CONSUME | 0x80, 9, Status.OK), (MsgType.PRODUCE_BATCH | 0x80, 10, 0)]
        assert len(got[0][3]["messages"]) == most and not c.conn.waiters
    assert dispatched == [] and c.delivered == 2


def test_a_delivery_with_headers_and_the_general_take_go_through_python(sides):
    c, py = sides()
    for side in (c, py):
        side.broker.queue("q").put(b"with headers", headers={"k": "v"})
        side.broker.queue("q").put(b"plain")
        side.broker.queue("prio").put(b"p", priority=2)
    run((c, py), [[("get", "q", 5, False)], [("get", "q", 5, True)], [("get", "prio", 1, False)],
                  [("ack", "q", [0, 1]), ("ack", "prio", [2])]])
    assert c.state()[0]["q"][:2] == (0, 0) and c.state()[0]["prio"][:2] == (0, 0)


@pytest.mark.parametrize("reads", [
    [[("wait", "small", 2, False), ("put", "small", b"x"), ("put", "small", b"y")]],
    [[("wait", "small", 2, False)], [("put", "small", b"x"), ("put", "small", b"y")]],
], ids=["one read", "two reads"])
def test_a_put_answers_the_gets_waiting_on_its_queue_before_the_next_frame(sides, reads):
    """A PRODUCE in Python answers the gets waiting on its queue before the read's next
    frame: a get waiting for two is answered with the first put's message alone. The C path
    answered it with both (it notified once the read was served: Hypothesis found it); now
    a put to a queue with waiting gets ends its serve when more frames follow."""
    c, py = sides()
    run((c, py), reads)


def test_an_ack_of_a_lapsed_lease_is_refused_as_python_refuses_it(sides):
    c, py = sides()
    for side in (c, py):
        side.broker.queue("q").put_many([b"a", b"b"])
    run((c, py), [[("get", "q", 2, True)]])
    for side in (c, py):  # both leases lapse, as if the consumer took too long
        for _tag, (q, d) in list(side.conn.leases.held.items()):
            d.extend(0.0)
    run((c, py), [[("ack", "q", [0, 1])], [("ack", "q", [0])]])


def test_a_full_queue_and_a_body_too_large_are_refused_as_python_refuses_them(sides):
    c, py = sides()
    run((c, py), [[("put", "small", b"x" * 257)], [("put", "small", b"x" * 200)] * 30,
                  [("batch", "small", [b"y" * 200] * 30, False, True)],
                  [("batch", "small", [b"y" * 200] * 30, True, False)]])


# ---------------------------------------------------------------- fuzz
def _frames(side):
    return [produce_shape("q").frame(1, b"body"), consume_many_shape("q", 3, True).frame(2, 0),
            encode_request(MsgType.PRODUCE_BATCH, 3, {"queue": "q", "messages": [b"a", b"b"]}),
            ack_shape("q").frame(4, UNKNOWN), consume_shape("q").frame(5, 0),
            encode_request(MsgType.ACK, 6, {"queue": "q", "deliveries": [UNKNOWN, UNKNOWN + 1]})]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 400), st.integers(0, 255)), max_size=4),
       st.integers(0, 5), st.integers(1, 400))
@example(flips=[(1, 53, 3)], which=0, cut=1)  # CONSUME's type byte made DELETE_QUEUE's: both sides delete q
def test_mutated_plain_frames_get_the_python_paths_answer(sides, flips, which, cut):
    """A plain frame with bytes changed or cut short: the C path serves it only if it is still
    a good plain request, and the replies (or the connection's end) are the Python path's."""
    pair = sides()
    for side in pair:
        frames = [bytearray(f) for f in _frames(side)]
        for i, at, value in flips:
            f = frames[i]
            f[at % len(f)] = value
        data = b"".join(frames[which:]) + b"".join(frames[:which])
        side.read(bytes(data[:cut]) + bytes(data[cut:]))
    c, py = (side.replies() for side in pair)
    assert c == py
    assert pair[0].state() == pair[1].state()
    assert pair[0].conn.closing == pair[1].conn.closing


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=200))
def test_random_bytes_after_a_good_request_never_crash_the_server(sides, noise):
    pair = sides()
    for side in pair:
        side.read(produce_shape("q").frame(1, b"ok") + noise)
    c, py = (side.replies() for side in pair)
    assert c == py
    assert c[0][:3] == (MsgType.PRODUCE | 0x80, 1, Status.OK)


def test_the_reply_bytes_are_pythons(sides):
    """Without tags or times in them (PRODUCE, PRODUCE_BATCH, ACK, an empty CONSUME), the C
    replies are the very bytes of the Python path's."""
    c, py = sides()
    data = lambda side: (produce_shape("q").frame(7, b"x" * 300) +  # noqa: E731
                         encode_request(MsgType.PRODUCE_BATCH, 8, {"queue": "q", "messages": [b"a"] * 20}) +
                         encode_request(MsgType.PRODUCE_BATCH, 9, {"queue": "q", "messages": [{"body": b"a"}] * 3,
                                                                   "each": True}) +
                         consume_shape("small").frame(10, 0) + consume_many_shape("small", 5, True).frame(11, 0))
    for side in (c, py):
        side.read(data(side))
    assert c.transport.written == py.transport.written
    assert len(c.transport.written) == 1  # (one read, one write)
