"""The server's limits (docs/PROTOCOL.md, Limits) against clients that flood or stall it.

Strategy: a real ``shmq server`` process per test, with small limits set by its flags so
that every deadline is a fraction of a second, and real sockets that misbehave on
purpose. Memory is the server's RSS (psutil) before and after; "still serving" is a
legitimate client's round trip, timed. Nothing sleeps to synchronise: each wait is on a
socket (a reply, EOF, writability) or a process, with a bound.
"""

import asyncio
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmq
from shmq.client import aio
from shmq.protocol import HEADER_SIZE, FrameDecoder, MsgType, Status, encode_request, pack_header
from shmq.server.limits import Boundaries
from tests._processes import WORKERS
from tests._wait import wait_for

TOKEN = "limits-test-token"
MiB = 2**20


class Server:
    """``shmq server`` as a real process on a free port, requiring TOKEN; a thread
    drains its log into ``log``, so a chatty server never blocks on a full pipe."""

    def __init__(self, namespace, home, *args):
        env = {**os.environ, "PYTHONPATH": os.getcwd(), "SHMQ_TOKEN": TOKEN, "SHMQ_HOME": str(home)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0", *args],
            stderr=subprocess.PIPE, text=True, env=env,
        )
        self.log = []
        while True:  # the start-up lines end with the one naming the port
            line = self.proc.stderr.readline()
            self.log.append(line)
            assert line and len(self.log) < 100, self.log
            if "serving namespace" in line:
                break
        self.port = int(line.split(" on ")[1].split()[0].rsplit(":", 1)[1])
        self.url = f"tcp://127.0.0.1:{self.port}"
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def round_trip(self) -> float:
        """Seconds a new legitimate client takes to connect and PING."""
        t = time.monotonic()
        with shmq.connect(self.url, token=TOKEN) as b:
            b.ping()
        return time.monotonic() - t

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self._drain.join(10)
        self.proc.stderr.close()
        return self.proc.returncode


@pytest.fixture
def start_server(broker, tmp_path):
    """Start servers on the test's namespace with extra flags; all are stopped (exit 0) after."""
    servers = []

    def start(*args):
        srv = Server(broker.namespace, tmp_path, *args)
        servers.append(srv)
        return srv

    yield start
    codes = [srv.stop() for srv in servers]
    assert codes == [0] * len(servers), [srv.log[-5:] for srv in servers]
    for srv in servers:  # whatever the clients sent, the server logged no error
        assert [line for line in srv.log if "Traceback" in line or " ERROR " in line] == []


def _sock(port, hello=True, timeout=10):
    """A raw connection; with ``hello``, it has said HELLO with the token."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hello:
        s.sendall(encode_request(MsgType.HELLO, 0, {"token": TOKEN}))
        (f,) = _read_frames(s)
        assert (f.msg_id, f.status) == (0, Status.OK), f.payload
    return s


def _read_frames(s, n=1, timeout=10):
    """Up to ``n`` frames: fewer if the connection closes or ``timeout`` passes first."""
    dec = FrameDecoder(1 << 30)
    frames = []
    deadline = time.monotonic() + timeout
    while len(frames) < n:
        f = dec.next_frame()
        if f is not None:
            frames.append(f)
            continue
        s.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            data = s.recv(1 << 20)
        except (TimeoutError, ConnectionResetError):
            break
        if not data:
            break
        dec.feed(data)
    return frames


def _closed_after(s, timeout, since=None):
    """Seconds from ``since`` (default: now) until the server closes ``s`` (EOF or reset),
    or None if it is still open after ``timeout``; whatever else arrives meanwhile is read
    and dropped. A lower bound on a server timeout needs ``since`` taken before the server
    could have started its clock, i.e. before connecting."""
    t = time.monotonic() if since is None else since
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if not s.recv(1 << 16):
                return time.monotonic() - t
        except ConnectionResetError:
            return time.monotonic() - t
        except TimeoutError:
            return None
    return None


def _push(s, data, stall=0.3):
    """Send as much of ``data`` as the server takes: until the end, an error (it closed),
    or the socket staying unwritable for ``stall`` seconds (it stopped reading)."""
    s.setblocking(False)
    view = memoryview(data)
    sent = 0
    try:
        while sent < len(view):
            try:
                sent += s.send(view[sent : sent + MiB])
            except BlockingIOError:
                if not select.select([], [s], [], stall)[1]:
                    break
    except OSError:
        pass
    finally:
        s.settimeout(10)
    return sent


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12), cuts=st.lists(st.integers(0, 700), max_size=12))
def test_boundaries_follow_the_frames_in_any_chunking(lengths, cuts):
    """``Boundaries.advance`` (whole frames of a read counted in one pass, anything else
    byte-exact) knows, after every chunk, how many frames ended and the open frame's
    size and received bytes, as a walk of the stream's headers does."""
    data = b"".join(pack_header(n, MsgType.PRODUCE, 0, i) + b"p" * n for i, n in enumerate(lengths))
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + HEADER_SIZE + n)
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    bounds, ended = Boundaries(), 0
    for a, b in zip(edges, edges[1:]):
        ended += bounds.advance(memoryview(data)[a:b])
        done = sum(1 for end in starts[1:] if end <= b)  # frames whole within the first b bytes
        got = b - starts[done]
        need = HEADER_SIZE + lengths[done] if done < len(lengths) and got >= HEADER_SIZE else 0
        assert (ended, bounds.need, bounds.got) == (done, need, got)


def test_a_flood_of_waiting_consumes_is_capped_and_the_server_stays_small(start_server, broker):
    """20,000 pipelined CONSUMEs (wait 60 s) on one connection: the first 256 wait, the
    rest get LIMIT_EXCEEDED at once on a connection that stays open; memory stays flat
    and other clients are served at once, during the flood and after it."""
    broker.create_queue("q")
    srv = start_server()
    srv.round_trip()
    rss0 = srv.rss()
    n, cap = 20_000, 256
    s = _sock(srv.port)
    flood = b"".join(encode_request(MsgType.CONSUME, i, {"queue": "q", "wait_ms": 60_000}) for i in range(1, n + 1))
    sender = threading.Thread(target=s.sendall, args=(flood + encode_request(MsgType.PING, n + 1),))
    sender.start()
    replies = {f.msg_id: f for f in _read_frames(s, n - cap + 1, timeout=30)}
    sender.join(10)
    assert replies[n + 1].status == Status.OK
    refused = [replies[i] for i in range(cap + 1, n + 1) if i in replies]
    assert len(refused) == n - cap and all(f.status == Status.LIMIT_EXCEEDED for f in refused)
    assert refused[0].payload["error"].startswith(
        "too many waiting CONSUMEs, READs and POLLs on this connection (the limit is 256)")
    assert srv.rss() - rss0 < 20 * MiB
    assert srv.round_trip() < 1.0
    with shmq.connect(srv.url, token=TOKEN) as b:  # the first waiter gets the first message
        b.queue("q").put(b"first")
    (got,) = _read_frames(s)
    assert (got.msg_id, [m["body"] for m in got.payload["messages"]]) == (1, [b"first"])
    s.close()
    assert srv.round_trip() < 1.0
    assert srv.rss() - rss0 < 20 * MiB
    assert sum("limit of 256 waiting CONSUMEs" in line for line in srv.log) == 1  # one line, not 19,744


def test_dropping_many_waiting_consumes_is_cheap(start_server, broker):
    """With the cap raised, 40,000 waiting CONSUMEs on two connections cost little memory,
    and closing their connections does not stall the server."""
    broker.create_queue("q")
    srv = start_server("--max-waiting-per-connection", "100000")
    srv.round_trip()
    rss0 = srv.rss()
    socks = []
    for _ in range(2):
        s = _sock(srv.port)
        s.sendall(b"".join(encode_request(MsgType.CONSUME, i, {"queue": "q", "wait_ms": 60_000})
                           for i in range(1, 20_001)) + encode_request(MsgType.PING, 0xFFFF_FFFF))
        (pong,) = _read_frames(s, timeout=30)  # requests run in order: all 20,000 now wait
        assert (pong.msg_id, pong.status) == (0xFFFF_FFFF, Status.OK)
        socks.append(s)
    # about 1 KiB a waiter (39.6-40.6 MiB for these 40,000, by venv): 1.2 KiB at most
    assert srv.rss() - rss0 < 48 * MiB
    for s in socks:
        s.close()
    assert srv.round_trip() < 1.0
    with shmq.connect(srv.url, token=TOKEN) as b:  # the dropped waiters take nothing
        q = b.queue("q")
        q.put(b"x")
        assert q.get(timeout=5).body == b"x"


def test_unfinished_frames_before_hello_are_refused_at_the_header(start_server):
    """16 connections that declare a 16 MiB HELLO and send 15 MiB of it, never having
    authenticated: each gets TOO_LARGE at the header and is closed; memory stays flat."""
    srv = start_server()
    srv.round_trip()
    rss0 = srv.rss()
    socks = [_sock(srv.port, hello=False) for _ in range(16)]
    junk = pack_header(16 * MiB - 64, MsgType.HELLO, 0, 7) + bytes(15 * MiB)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda s: _push(s, junk), socks))
    for s in socks:
        (f,) = _read_frames(s, timeout=5)
        assert (f.msg_id, f.status) == (7, Status.TOO_LARGE)
        assert f.payload["error"] == "before a HELLO with the token, frames may be at most 4096 bytes"
        assert _closed_after(s, 5) is not None
        s.close()
    assert srv.rss() - rss0 < 10 * MiB
    assert srv.round_trip() < 1.0


def test_an_oversize_hello_is_refused_and_closed_and_the_limit_lifts_after_hello(start_server, broker):
    broker.create_queue("q", max_message_bytes=2 * MiB)
    srv = start_server()
    s = _sock(srv.port, hello=False)
    s.sendall(encode_request(MsgType.HELLO, 5, {"token": TOKEN, "client": "x" * 5000}))
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status) == (5, Status.TOO_LARGE) and "at most 4096 bytes" in f.payload["error"]
    assert _closed_after(s, 5) is not None
    s = _sock(srv.port, hello=False)  # any other request before HELLO: UNAUTHORIZED, closed
    s.sendall(encode_request(MsgType.PING, 6))
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status) == (6, Status.UNAUTHORIZED)
    assert _closed_after(s, 5) is not None
    s = _sock(srv.port)  # after HELLO, frames up to --max-frame-bytes
    s.sendall(encode_request(MsgType.PRODUCE, 8, {"queue": "q", "body": bytes(MiB)}))
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status) == (8, Status.OK)
    s.close()


@pytest.mark.parametrize("frame,status,error", [
    (pack_header(2, MsgType.PING, 0, 11) + b"\x81\xa1", Status.UNAUTHORIZED,  # a map cut short
     "a malformed frame before HELLO: malformed msgpack payload: the payload ends inside a value: its msgpack needs "
     "more than the frame's 2 bytes"),
    (pack_header(1, MsgType.HELLO, 0, 11) + b"\x07", Status.UNAUTHORIZED,
     "a malformed frame before HELLO: the payload must be a msgpack map, not int"),
    (encode_request(MsgType.HELLO, 11, {"token": 5}), Status.UNAUTHORIZED,
     "a malformed HELLO: HELLO: field 'token' must be a string, not 5"),
    (pack_header(0, MsgType.HELLO | 0x80, 0, 11), Status.UNAUTHORIZED, "say HELLO with the token first"),
    (encode_request(0x7E, 11), Status.UNAUTHORIZED, "say HELLO with the token first"),
    (encode_request(MsgType.LIST, 11), Status.UNAUTHORIZED, "say HELLO with the token first"),
], ids=["bad-msgpack", "not-a-map", "bad-hello-field", "a-reply", "unknown-type", "a-request"])
def test_before_hello_a_malformed_or_unexpected_frame_gets_unauthorized_and_closes(start_server, frame, status,
                                                                                   error):
    """docs/PROTOCOL.md, rule 6: before HELLO, anything but a well-formed HELLO gets one
    UNAUTHORIZED reply and the connection closes (before: BAD_REQUEST, and it stayed open)."""
    srv = start_server()
    s = _sock(srv.port, hello=False)
    s.sendall(frame + encode_request(MsgType.HELLO, 12, {"token": TOKEN}))  # a HELLO after it is never read
    (f,) = _read_frames(s, 2, timeout=5)
    assert (f.msg_id, f.status, f.payload) == (11, status, {"error": error})
    assert _closed_after(s, 5) is not None
    s.close()
    assert srv.round_trip() < 1.0


def test_before_hello_a_frame_of_another_version_leaves_room_to_fall_back(start_server):
    """Rule 3 before HELLO too: UNSUPPORTED_VERSION, and a HELLO in version 1 on the same
    connection is answered."""
    srv = start_server()
    s = _sock(srv.port, hello=False)
    s.sendall(pack_header(0, MsgType.HELLO, 0, 11, version=2) + encode_request(MsgType.HELLO, 12, {"token": TOKEN}))
    got = _read_frames(s, 2, timeout=5)
    assert [(f.msg_id, f.status) for f in got] == [(11, Status.UNSUPPORTED_VERSION), (12, Status.OK)]
    assert got[0].payload == {"error": "unsupported protocol version 2 (this side speaks 1)"}
    s.close()


def test_unfinished_big_frames_after_hello_share_a_bounded_budget(start_server, broker):
    """12 authenticated connections each stall 15 MiB into a 16 MiB frame: only what the
    32 MiB budget admits is read (the others wait, paused); a small request is served at
    once, a big one waits for budget and goes through as soon as the hoarders leave."""
    broker.create_queue("q", max_message_bytes=2 * MiB)
    srv = start_server("--max-buffered-bytes", str(32 * MiB), "--frame-timeout", "20")
    srv.round_trip()
    rss0 = srv.rss()
    hoarders = [_sock(srv.port) for _ in range(12)]
    junk = pack_header(16 * MiB - 64, MsgType.PRODUCE, 0, 9) + bytes(15 * MiB)
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda s: _push(s, junk), hoarders))
    assert srv.rss() - rss0 < (32 + 16) * MiB  # the budget, 64 KiB a connection, and slack
    assert srv.round_trip() < 1.0
    results = []
    with shmq.connect(srv.url, token=TOKEN) as b:
        q = b.queue("q")
        big = threading.Thread(target=lambda: results.append(q.put(bytes(MiB + 1))))
        big.start()
        big.join(0.5)
        assert big.is_alive()  # paused for budget, not refused
        for s in hoarders:
            s.close()
        big.join(5)
        assert not big.is_alive() and len(results) == 1
        assert len(q.get(timeout=5).body) == MiB + 1


def test_big_frames_from_many_clients_at_once_all_go_through(start_server, broker):
    """Whole-frame reservations: concurrent big frames beyond the budget never deadlock."""
    broker.create_queue("q", max_bytes=64 * MiB, max_message_bytes=12 * MiB)
    srv = start_server("--max-buffered-bytes", str(20 * MiB))

    def put_big(i):
        with shmq.connect(srv.url, token=TOKEN) as b:
            return b.queue("q").put(bytes([i]) * (12 * MiB))

    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(put_big, range(4), timeout=30))
    assert len(set(ids)) == 4
    q = broker.queue("q")
    assert sorted(q.get(timeout=5).body[0] for _ in range(4)) == [0, 1, 2, 3]


def test_slowloris_connections_are_closed_at_the_frame_deadline(start_server):
    """100 connections trickling a frame a byte at a time are closed once their frame
    is 0.5 s old, with LIMIT_EXCEEDED first; other clients are served meanwhile."""
    srv = start_server("--frame-timeout", "0.5")
    socks = [_sock(srv.port) for _ in range(100)]
    frame = encode_request(MsgType.PRODUCE, 3, {"queue": "q", "body": bytes(1000)})
    started = time.monotonic()
    closed_at = {}
    sent = 0
    while len(closed_at) < len(socks) and time.monotonic() - started < 5:
        for s in socks:
            if s not in closed_at:
                try:
                    s.send(frame[sent : sent + 1])
                except OSError:
                    closed_at[s] = time.monotonic() - started
        sent += 1
        readable, _, _ = select.select([s for s in socks if s not in closed_at], [], [], 0.1)
        for s in readable:
            closed_at[s] = time.monotonic() - started
    assert len(closed_at) == 100
    assert 0.5 <= min(closed_at.values()) and max(closed_at.values()) < 3.0
    (f,) = _read_frames(socks[0])
    assert (f.msg_id, f.status, f.payload["error"]) == (0, Status.LIMIT_EXCEEDED,
                                                         "a frame must arrive whole within 0.5s")
    for s in socks:
        s.close()
    assert srv.round_trip() < 1.0


def test_idle_connections_are_closed_but_a_waiting_consume_is_not_idle(start_server, broker):
    broker.create_queue("q")
    srv = start_server("--idle-timeout", "0.5")
    connecting = time.monotonic()
    idle = _sock(srv.port)
    waiting = _sock(srv.port)
    t = time.monotonic()
    waiting.sendall(encode_request(MsgType.CONSUME, 2, {"queue": "q", "wait_ms": 1500}))
    took = _closed_after(idle, 5, since=connecting)
    assert took is not None and 0.5 <= took < 2.0
    (f,) = _read_frames(waiting, timeout=5)  # answered at its deadline, not closed before
    assert (f.msg_id, f.status, f.payload["messages"]) == (2, Status.OK, [])
    assert time.monotonic() - t >= 1.45  # (an event loop timer may fire a fraction of a millisecond early)
    took = _closed_after(waiting, 5)  # then idle like any other
    assert took is not None and took < 2.0
    with shmq.connect(srv.url, token=TOKEN) as b:  # a blocking get waits past the idle timeout
        with pytest.raises(shmq.QueueEmpty, match="'q' is empty"):
            b.queue("q").get(timeout=1.5)
    assert sum("idle for 0.5s; closing" in line for line in srv.log) >= 2


def test_a_connection_that_never_says_hello_is_closed_at_the_frame_timeout(start_server):
    srv = start_server("--frame-timeout", "0.5")  # the idle timeout stays at 300 s
    connecting = time.monotonic()
    s = _sock(srv.port, hello=False)
    took = _closed_after(s, 5, since=connecting)
    assert took is not None and 0.5 <= took < 2.0
    s = _sock(srv.port)  # after HELLO, the idle timeout applies
    assert _closed_after(s, 1.5) is None
    s.close()


def test_connections_over_the_cap_get_limit_exceeded_then_close(start_server):
    srv = start_server("--max-connections", "8")
    socks = [_sock(srv.port) for _ in range(8)]
    extra = _sock(srv.port, hello=False)
    (f,) = _read_frames(extra)
    assert (f.type, f.msg_id, f.status, f.payload["error"]) == (
        0x80, 0, Status.LIMIT_EXCEEDED, "too many connections (the server's limit is 8)")
    assert _closed_after(extra, 5) is not None
    with pytest.raises(shmq.LimitExceeded, match=r"too many connections \(the server's limit is 8\)"):
        shmq.connect(srv.url, token=TOKEN)
    for i, s in enumerate(socks):  # the 8 are served as before
        s.sendall(encode_request(MsgType.PING, i + 1))
        (f,) = _read_frames(s)
        assert (f.msg_id, f.status) == (i + 1, Status.OK)
    socks.pop().close()
    deadline = time.monotonic() + 3
    while True:  # the freed slot is taken by the next client once the server saw the close
        try:
            assert srv.round_trip() < 1.0
            break
        except shmq.LimitExceeded:
            assert time.monotonic() < deadline
    for s in socks:
        s.close()
    # (the log comes through a thread that reads the server's stderr: wait for the line, then count)
    wait_for(lambda: any("refusing new ones" in line for line in srv.log), what="the refusal's log line")
    assert sum("refusing new ones" in line for line in srv.log) == 1


def test_waiting_consumes_past_the_cap_get_limit_exceeded_on_an_open_connection(start_server, broker):
    broker.create_queue("q")
    srv = start_server("--max-waiting-per-connection", "4")
    s = _sock(srv.port)
    s.sendall(b"".join(encode_request(MsgType.CONSUME, i, {"queue": "q", "wait_ms": 30_000}) for i in range(1, 7))
              + encode_request(MsgType.PING, 7))
    frames = {f.msg_id: f for f in _read_frames(s, 3)}
    assert {i: f.status for i, f in frames.items()} == {5: Status.LIMIT_EXCEEDED, 6: Status.LIMIT_EXCEEDED,
                                                        7: Status.OK}
    with shmq.connect(srv.url, token=TOKEN) as b:
        b.queue("q").put(b"m")
    (f,) = _read_frames(s)  # first come, first served
    (m,) = f.payload["messages"]
    assert (f.msg_id, m["body"]) == (1, b"m")
    s.sendall(encode_request(MsgType.CONSUME, 8, {"queue": "q", "wait_ms": 30_000})   # 4 wait again
              + encode_request(MsgType.CONSUME, 9, {"queue": "q", "wait_ms": 30_000}))  # one too many
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status) == (9, Status.LIMIT_EXCEEDED)
    s.sendall(encode_request(MsgType.ACK, 10, {"queue": "q", "deliveries": [m["delivery"]]}))
    (f,) = _read_frames(s)
    assert (f.msg_id, f.status, f.payload) == (10, Status.OK, {"acked": 1})
    s.close()

    async def five_gets():  # the asyncio client, 5 concurrent gets on one connection
        async with await aio.connect(srv.url, token=TOKEN) as b:
            q = await b.queue("q")
            await asyncio.gather(*(q.get(timeout=10) for _ in range(5)))

    with pytest.raises(shmq.LimitExceeded,
                       match=r"too many waiting CONSUMEs, READs and POLLs on this connection \(the limit is 4\)"):
        asyncio.run(five_gets())


# ---------------------------------------------------------------------------- soak

def _soak_producer(url, tag, count, ready, go):
    with shmq.connect(url, token=TOKEN) as b:
        q = b.queue("soak")
        ready.set()
        assert go.wait(30)
        i = 0
        while i < count:
            bodies = [f"{tag}:{j}".encode() for j in range(i, min(i + 1 + i % 7, count))]
            if len(bodies) == 1:
                q.put(bodies[0], timeout=30)
            else:
                q.put_many(bodies, timeout=30)
            i += len(bodies)


def _soak_consumer(url, out_path, total, acked, ready):
    """Get and ack until all consumers acked ``total``; write each acked body on a line."""
    with shmq.connect(url, token=TOKEN) as b, open(out_path, "w") as out:
        q = b.queue("soak")
        ready.set()
        deadline = time.monotonic() + 60
        while acked.value < total and time.monotonic() < deadline:
            try:
                ds = q.get_many(16, timeout=0.2)
            except shmq.QueueEmpty:
                continue
            assert q.ack_many(ds) == len(ds)
            out.write("".join(d.body.decode() + "\n" for d in ds))
            out.flush()
            with acked.get_lock():
                acked.value += len(ds)


def _soak_hostile(port, url, seed, seconds):
    """Misbehave in turns until ``seconds`` pass: floods, leases dropped unsettled,
    garbage, oversize and half frames, requests before HELLO, too many connections."""
    rnd = random.Random(seed)
    deadline = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < deadline:
        turn += 1
        try:
            _misbehave(turn % 7, port, url, rnd)
        except (OSError, shmq.ShmqError, AssertionError):  # refused, closed, over the cap: expected
            pass


def _misbehave(kind, port, url, rnd):
    if kind == 0:  # a flood of waiting CONSUMEs, then gone
        s = _sock(port)
        s.sendall(b"".join(encode_request(MsgType.CONSUME, i, {"queue": "soak", "wait_ms": 5000})
                           for i in range(1, 65)) + encode_request(MsgType.PING, 99))
        _read_frames(s, 49, timeout=5)
        s.close()
    elif kind == 1:  # lease some, leave without settling: they are ready again at once
        with shmq.connect(url, token=TOKEN) as b:
            b.queue("leases").get_many(rnd.randint(1, 8), timeout=0.2)  # always some to lease
            b.queue("soak").get_many(rnd.randint(1, 8), timeout=0.2)
    elif kind == 2:  # garbage
        s = _sock(port, hello=rnd.random() < 0.5)
        s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randint(16, 400))))
        _closed_after(s, 5)
        s.close()
    elif kind == 3:  # an oversize frame, before or after HELLO
        s = _sock(port, hello=rnd.random() < 0.5)
        s.sendall(pack_header(2**31, MsgType.PRODUCE, 0, 1))
        _closed_after(s, 5)
        s.close()
    elif kind == 4:  # half a frame, then gone
        s = _sock(port)
        s.sendall(encode_request(MsgType.PRODUCE, 1, {"queue": "soak", "body": b"never"})[: rnd.randint(1, 30)])
        s.close()
    elif kind == 5:  # a request before HELLO
        s = _sock(port, hello=False)
        s.sendall(encode_request(MsgType.CONSUME, 1, {"queue": "soak"}))
        _closed_after(s, 5)
        s.close()
    else:  # more connections than allowed (the server's 64) by itself, briefly
        socks = []
        try:
            for _ in range(70):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            _read_frames(socks[-1], 1, timeout=5)  # the last one is refused (LIMIT_EXCEEDED) before any closes
        finally:
            for s in socks:
                s.close()


@pytest.mark.slow
def test_soak_mixed_valid_and_hostile_traffic(start_server, broker, tmp_path):
    """Producers, consumers and hostile clients in separate processes against one small
    -limit server: every message is acked exactly once, and the server stays small."""
    broker.create_queue("soak", visibility_timeout=60)
    broker.create_queue("leases", visibility_timeout=60).put_many([b"lease me"] * 100)
    srv = start_server("--max-connections", "64", "--max-waiting-per-connection", "16", "--frame-timeout", "1",
                       "--idle-timeout", "2", "--max-buffered-bytes", str(32 * MiB))
    srv.round_trip()
    rss0 = srv.rss()
    ctx = WORKERS
    per_producer, producers, consumers = 2000, 3, 3
    total = per_producer * producers
    acked = ctx.Value("q", 0)
    readies = [ctx.Event() for _ in range(consumers)]
    procs = [ctx.Process(target=_soak_consumer, args=(srv.url, str(tmp_path / f"c{i}"), total, acked, readies[i]))
             for i in range(consumers)]
    for p in procs:
        p.start()
    go = ctx.Event()
    readies += [ctx.Event() for _ in range(producers)]
    procs += [ctx.Process(target=_soak_producer, args=(srv.url, f"p{i}", per_producer, readies[consumers + i], go))
              for i in range(producers)]
    for p in procs[consumers:]:
        p.start()
    # every valid client is connected before the hostile ones crowd the server
    assert all(r.wait(30) for r in readies)
    hostile = [ctx.Process(target=_soak_hostile, args=(srv.port, srv.url, seed, 6)) for seed in range(3)]
    for p in hostile:
        p.start()
    procs += hostile
    go.set()
    try:
        for p in procs:
            p.join(90)
        assert [p.exitcode for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    got = []
    for i in range(consumers):
        got += (tmp_path / f"c{i}").read_text().split()
    expected = [f"p{i}:{j}" for i in range(producers) for j in range(per_producer)]
    assert len(got) == total and sorted(got) == sorted(expected)
    stats = broker.queue("soak").stats()
    assert (stats.ready, stats.in_flight, stats.enqueued_total, stats.acked_total) == (0, 0, total, total)
    assert srv.rss() - rss0 < 64 * MiB
    assert srv.round_trip() < 1.0
    for what in ("refusing new ones", "waiting CONSUMEs, READs and POLLs; refusing more", "deliveries: ready again",
                 "a request before HELLO; closing", "exceeds max_frame_bytes", "frames may be at most 4096 bytes"):
        assert any(what in line for line in srv.log), what  # the hostile clients did hit each limit
