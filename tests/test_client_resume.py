"""Clients that come back whole (issue 31, item 2): across a SIGKILL and restart of a real
``shmq server`` on one port, ``consume(prefetch=N)`` iterations and group members of both
TCP clients go on by themselves, every message and record delivered; reconnects back off
with full jitter; heartbeats keep a quiet client from the idle timeout and notice a
server that stops answering."""

import asyncio
import signal
import socket
import threading
import time

import pytest

import shmq
from shmq.auth import client_token
from shmq.client import aio
from shmq.client.options import ConnectOptions
from shmq.protocol import REPLY_BIT, FrameDecoder, MsgType, PushType, encode_request
from tests._wait import in_thread, wait_for

N = 300  # messages put to each queue, records appended to the stream
AGAIN = {"retries": 40, "backoff": (0.05, 0.5)}  # a restart on a loaded machine takes seconds


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


class _Bounds:
    """A stand-in for ``random``: records each ``uniform``'s bounds, draws the top one."""

    def __init__(self):
        self.asked = []

    def uniform(self, low, high):
        self.asked.append((low, high))
        return high


def test_reconnect_pauses_have_full_jitter():
    options = ConnectOptions(retries=7, backoff=(0.1, 2.0))
    drawn = _Bounds()
    assert list(options.pauses(drawn)) == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert drawn.asked == [(0, 0.1), (0, 0.2), (0, 0.4), (0, 0.8), (0, 1.6), (0, 2.0), (0, 2.0)]
    samples = [list(options.pauses()) for _ in range(200)]
    for pauses in samples:
        assert pauses[0] == 0.0 and len(pauses) == 8
        assert all(0 <= p <= min(2.0, 0.1 * 2**n) for n, p in enumerate(pauses[1:]))
    assert len({pauses[5] for pauses in samples}) > 100  # drawn, not fixed: clients do not knock together
    with pytest.raises(ValueError, match=r"^heartbeat must be a positive number of seconds, not 0$"):
        ConnectOptions(heartbeat=0)


@pytest.fixture
def restartable(broker, servers, tmp_path):
    """``start()``: a ``shmq server`` of the test's namespace with a data dir, always on one port."""
    port = free_port()

    def start():
        return servers(broker.namespace, "--port", str(port), "--data-dir", str(tmp_path / "data"))

    return start


def kill(srv) -> None:
    srv.proc.send_signal(signal.SIGKILL)
    assert srv.stop() == -signal.SIGKILL


def _keep_trying(call, until):
    """A producer's retry of a call safe to repeat (a put with a dedup id, an append whose
    duplicate the accounting by id forgives) while the server is away."""
    while True:
        try:
            return call()
        except shmq.BrokerUnavailable:
            assert time.monotonic() < until, "the server did not come back"


@pytest.mark.slow
def test_subscribers_and_group_members_come_back_after_a_kill(broker, restartable):
    broker.create_queue("q", max_bytes=1 << 20)
    broker.create_queue("aq", max_bytes=1 << 20)
    broker.create_stream("s", partitions=2, max_bytes=1 << 20)
    srv = restartable()
    url = srv.url
    want = {str(i).encode() for i in range(N)}
    got = {name: set() for name in ("q", "aq", "g", "gm", "ga")}
    failures = []
    seen_kill = threading.Event()  # the server was killed: the producer makes the rest
    revoked, assigned = [], []

    def blocking_consumers():
        try:
            with shmq.connect(url, **AGAIN) as b:
                it = b.queue("q").consume(prefetch=10)
                member = b.stream("s").consumer("g", auto_commit=True, auto_commit_interval=0.05,
                                                on_revoke=revoked.append, on_assign=assigned.append)
                multi = b.consumer("gm", streams=["s"], auto_commit=True, auto_commit_interval=0.05)
                records, multi_records = iter(member), iter(multi)
                while got["q"] != want or got["g"] != want or got["gm"] != want:
                    if got["q"] != want:
                        d = next(it)
                        got["q"].add(d.body)
                        d.ack(wait=False)
                    if got["g"] != want:
                        got["g"].add(next(records).value)
                    if got["gm"] != want:
                        got["gm"].add(next(multi_records).value)
                it.close()
                member.close()
                multi.close()
        except BaseException as e:
            failures.append(e)

    async def asyncio_consumers():
        async with await aio.connect(url, **AGAIN) as b:
            it = (await b.queue("aq")).consume(prefetch=10)
            member = await (await b.stream("s")).consumer("ga", auto_commit=True, auto_commit_interval=0.05)
            while got["aq"] != want or got["ga"] != want:
                if got["aq"] != want:
                    d = await it.__anext__()
                    got["aq"].add(d.body)
                    await d.ack(wait=False)
                if got["ga"] != want:
                    got["ga"].add((await member.__anext__()).value)
            await it.aclose()
            await member.close()

    def in_asyncio():
        try:
            asyncio.run(asyncio_consumers())
        except BaseException as e:
            failures.append(e)

    def producer():
        try:
            with shmq.connect(url, **AGAIN) as b:
                q, aq, s = b.queue("q"), b.queue("aq"), b.stream("s")
                for i in range(N):
                    if i == N // 2:
                        assert seen_kill.wait(120)
                    until = time.monotonic() + 60
                    body = str(i).encode()
                    _keep_trying(lambda: q.put(body, dedup_id=body.decode()), until)
                    _keep_trying(lambda: aq.put(body, dedup_id=body.decode()), until)
                    _keep_trying(lambda: s.append(body, key=body), until)
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=f) for f in (blocking_consumers, in_asyncio, producer)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: all(len(g) >= N // 4 for g in got.values()) or failures, timeout=60,
                 what="every consumer to get a quarter")
        assert not failures, failures
        kill(srv)  # under live subscribers and group members, the producer between two puts or in one
        srv = restartable()
        seen_kill.set()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), {k: len(v) for k, v in got.items()}
    finally:
        seen_kill.set()
    assert not failures, failures
    assert got == {name: want for name in got}  # every id, none lost (some twice: redelivered)
    assert revoked and assigned[-1]  # the member was told of the rejoin as of a rebalance
    with shmq.connect(url) as b:  # nothing left behind: acked, committed
        assert (b.queue("q").stats().ready, b.queue("aq").stats().ready) == (0, 0)
        assert sum(b.stream("s").lag("g").values()) == 0
    srv.stop()
    broker.delete_stream("s")


@pytest.mark.slow
def test_a_quiet_client_with_heartbeats_outlives_the_idle_timeout(broker, servers):
    srv = servers(broker.namespace, "--no-persist", "--idle-timeout", "1")
    with shmq.connect(srv.url, heartbeat=0.3, reconnect=False) as beating, \
            shmq.connect(srv.url, heartbeat=None, reconnect=False) as silent:
        start = time.monotonic()
        wait_for(lambda: (silent._read_idle(silent._link), silent._link.core.failed)[1], timeout=10,
                 what="the server to close the silent client as idle")
        wait_for(lambda: time.monotonic() - start >= 3, timeout=10, what="3 quiet seconds")
        assert not beating._link.core.failed
        beating.ping()  # the same connection: it does not reconnect
        with pytest.raises(shmq.BrokerUnavailable, match="connection closed by the server"):
            silent.ping()
    assert srv.stop() == 0


@pytest.mark.parametrize("client", ["blocking", "asyncio"])
def test_a_server_that_stops_answering_is_noticed_within_three_heartbeats(broker, servers, client):
    broker.create_queue("q")
    srv = servers(broker.namespace, "--no-persist")
    every = 0.5
    try:
        if client == "blocking":
            with shmq.connect(srv.url, heartbeat=every, reconnect=False) as b:
                q = b.queue("q")
                t, outcome = in_thread(lambda: q.get(timeout=60))
                wait_for(lambda: b._link.reading, what="the get to wait at the server")
                srv.proc.send_signal(signal.SIGSTOP)
                stopped = time.monotonic()
                t.join(30)
                assert not t.is_alive() and "got" not in outcome
                error, when = outcome["error"], outcome["at"]
        else:
            async def main():
                async with await aio.connect(srv.url, heartbeat=every, reconnect=False) as b:
                    q = await b.queue("q")
                    waiting = asyncio.ensure_future(q.get(timeout=60))
                    while not b._link.pending:  # (its CONSUME written: the server waits)
                        await asyncio.sleep(0.01)
                    srv.proc.send_signal(signal.SIGSTOP)
                    stopped = time.monotonic()
                    with pytest.raises(shmq.BrokerUnavailable) as raised:
                        await asyncio.wait_for(waiting, 30)
                    return raised.value, stopped, time.monotonic()

            error, stopped, when = asyncio.run(main())
        assert isinstance(error, shmq.OutcomeUnknown)
        assert "did not answer a heartbeat PING within 0.5s; the connection is dropped" in str(error)
        assert when - stopped <= 3 * every + 2.0  # the bound, and a loaded machine's slack
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    assert srv.stop() == 0


def test_a_server_pushes_heartbeats_a_hello_asked_for(broker, servers):
    srv = servers(broker.namespace, "--no-persist")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        token, _ = client_token(None, sock.getsockname(), sock.getpeername())  # this user's server's
        sock.sendall(encode_request(MsgType.HELLO, 1, {"client": "test", "token": token, "heartbeat_ms": 100}))
        decoder, frames = FrameDecoder(1 << 20), []
        while len(frames) < 3:
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            decoder.feed(data)
            frames += list(decoder.frames())
        hello, beats = frames[0], frames[1:3]
        assert hello.msg_id == 1 and hello.payload["heartbeat_ms"] >= 100
        assert [(f.type, f.msg_id, f.status, f.payload) for f in beats] == [(PushType.HEARTBEAT | REPLY_BIT, 0, 0, {})] * 2
    assert srv.stop() == 0
