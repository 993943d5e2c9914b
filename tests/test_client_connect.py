"""Both TCP clients against what may sit at an endpoint: a peer that is no shmq server
(an HTTP server, a socket that never answers) fails fast or within the connect limit,
naming the endpoint; a server that stops answering costs a request its timeout, and the
next call starts clean on a new connection; requests left unanswered by a lost connection
are said to be of unknown outcome; a token in the URL is used, and never shown."""

import asyncio
import http.server
import pickle
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

import shmq
from shmq.client import aio
from shmq.protocol import MsgType
from tests._wait import wait_for
from tests.test_client_parity import FakeServer
from tests.test_server_tcp import ServerProcess

TOKEN = "url-token-0123456789"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def connect_both(url, **options):
    """Connect with each client: [(the error class, its text, seconds it took)]."""
    async def connect_aio():
        await aio.connect(url, **options)

    out = []
    for attempt in (lambda: shmq.connect(url, **options), lambda: run(connect_aio())):
        start = time.monotonic()
        with pytest.raises(shmq.ShmqError) as caught:
            attempt()
        out.append((type(caught.value), str(caught.value), time.monotonic() - start))
    return out


@pytest.fixture
def http_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    thread.join(10)


def test_an_http_server_is_named_no_shmq_server_at_once(http_server):
    endpoint = http_server.removeprefix("tcp://")
    for cls, text, took in connect_both(http_server):  # the connect limit is 10 s
        assert cls is shmq.ProtocolError
        assert text.startswith(f"{endpoint} is not an shmq server: it answered b'")
        assert took < 5


def test_the_command_line_names_an_http_server_at_once(http_server):
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "shmq", "stats", "--url", http_server], capture_output=True,
                         text=True, timeout=60)
    assert time.monotonic() - start < 10  # the connect limit alone is 10 s
    assert out.returncode == 1
    assert out.stderr.startswith(f"shmq: error: {http_server.removeprefix('tcp://')} is not an shmq server: ")


def test_a_peer_that_never_answers_fails_within_the_connect_limit():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody ever answers
        url = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        endpoint = url.removeprefix("tcp://")
        for options in ({"timeout": 0.3}, {"connect_timeout": 0.3}):
            for cls, text, took in connect_both(url, **options):
                assert (cls, text) == (shmq.BrokerUnavailable,
                                       f"no reply to HELLO from {endpoint} within 0.3s: is it an shmq server?")
                assert took < 5


def test_an_unreachable_endpoint_is_named():
    with socket.create_server(("127.0.0.1", 0)) as s:
        url = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    for cls, text, _ in connect_both(url):
        assert cls is shmq.BrokerUnavailable
        assert text.startswith(f"cannot connect to {url.removeprefix('tcp://')}: ")


def stalling_first():
    """A FakeServer handler: on the first connection HELLO is answered, then a PING never
    is (the socket stays open until the client drops it); the next ones answer all."""
    connections = []

    def handler(conn):
        connections.append(conn)
        conn.answer(conn.read(), {"server": "fake"})  # HELLO
        ping = conn.read()
        assert ping.type == MsgType.PING
        if len(connections) == 1:
            while conn.sock.recv(65536):  # until the client closes it
                pass
            return
        conn.answer(ping)
        assert conn.sock.recv(65536) == b""

    return handler


@pytest.mark.parametrize("client", ["blocking", "asyncio"])
def test_a_request_past_its_timeout_drops_the_connection_and_the_next_call_starts_clean(client):
    fake = FakeServer(stalling_first(), connections=2)
    endpoint = fake.url.removeprefix("tcp://")
    message = (f"^no reply to PING from {endpoint} within 0.3s; the connection is dropped "
               r"\(the PING was sent: whether it was carried out is unknown\)$")

    async def main():
        async with await aio.connect(fake.url, timeout=0.3) as b:
            with pytest.raises(shmq.OutcomeUnknown, match=message):
                await b.ping()
            await b.ping()  # a new connection; its reply is its own

    try:
        if client == "blocking":
            with shmq.connect(fake.url, timeout=0.3) as b:
                with pytest.raises(shmq.OutcomeUnknown, match=message):
                    b.ping()
                b.ping()
        else:
            run(main())
    finally:
        fake.stop()


def closing_on_puts():
    """A FakeServer handler: on the first connection HELLO is answered, then two puts sent
    without waiting are read and the connection closed unanswered (they may have landed);
    the next one answers HELLO and a PING."""
    connections = []

    def handler(conn):
        connections.append(conn)
        conn.answer(conn.read(), {"server": "fake"})  # HELLO
        if len(connections) == 1:
            assert [conn.read().type for _ in range(2)] == [MsgType.PRODUCE, MsgType.PRODUCE_BATCH]
            conn.sock.shutdown(socket.SHUT_RDWR)
            return
        ping = conn.read()
        assert ping.type == MsgType.PING
        conn.answer(ping)
        assert conn.sock.recv(65536) == b""

    return handler


@pytest.mark.parametrize("client", ["blocking", "asyncio"])
@pytest.mark.parametrize("reconnect", [True, False], ids=["reconnect", "no reconnect"])
def test_puts_sent_without_waiting_left_unanswered_make_the_next_call_raise_outcome_unknown(client, reconnect):
    fake = FakeServer(closing_on_puts(), connections=2 if reconnect else 1)
    endpoint = fake.url.removeprefix("tcp://")
    unknown = (f"^lost the connection to {endpoint}: connection closed by the server \\(2 puts sent without "
               r"waiting were not answered: whether they landed is unknown\)$")
    lost = f"^lost the connection to {endpoint}: connection closed by the server$"

    async def main():
        async with await aio.connect(fake.url, reconnect=reconnect) as b:
            q = aio.AsyncQueue(b, "q")
            await q.put(b"a", wait=False)
            await q.put_many([b"b"], wait=False)
            while not b._link.core.failed:  # its reader task saw the close
                await asyncio.sleep(0.005)
            with pytest.raises(shmq.OutcomeUnknown, match=unknown):
                await q.flush()
            if reconnect:
                await b.ping()  # said once
            else:
                with pytest.raises(shmq.BrokerUnavailable, match=lost):
                    await b.ping()

    try:
        if client == "blocking":
            with shmq.connect(fake.url, reconnect=reconnect) as b:
                q = shmq.client.RemoteQueue(b, "q")
                q.put(b"a", wait=False)
                q.put_many([b"b"], wait=False)
                wait_for(lambda: select.select([b._link.sock], [], [], 0)[0], what="the server's close")
                with pytest.raises(shmq.OutcomeUnknown, match=unknown):
                    q.flush()
                if reconnect:
                    b.ping()  # said once
                else:
                    with pytest.raises(shmq.BrokerUnavailable, match=lost):
                        b.ping()
        else:
            run(main())
    finally:
        fake.stop()


def test_a_timeout_bounds_the_wait_past_what_a_get_asks_for(tcp_server, broker):
    broker.create_queue("q")
    with shmq.connect(tcp_server.url, timeout=0.2) as b:
        q = b.queue("q")
        with pytest.raises(shmq.QueueEmpty):  # waits 1 s at the server: longer than the timeout, as asked
            q.get(timeout=1)
        q.put(b"x")
        d = q.get(timeout=1)
        assert d.body == b"x"
        d.ack()
        with pickle.loads(pickle.dumps(b)) as copy:  # a copy connects alike
            assert (copy.options, copy.url) == (b.options, b.url)

    async def main():
        async with await aio.connect(tcp_server.url, timeout=0.2) as b:
            q = await b.queue("q")
            with pytest.raises(shmq.QueueEmpty):
                await q.get(timeout=1)

    run(main())


# ---------------------------------------------------------------- tokens in the URL
@pytest.fixture
def token_server(broker, monkeypatch, tmp_path):
    """A server wanting TOKEN; $SHMQ_TOKEN holds a wrong one, so only a token passed or
    in the URL gets in (the URL's comes before $SHMQ_TOKEN and the runtime file)."""
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o600)
    srv = ServerProcess(broker.namespace, "--no-persist", "--token-file", str(path))
    monkeypatch.setenv("SHMQ_TOKEN", "wrong")
    yield srv
    assert srv.stop() == 0


def test_a_token_in_the_url_is_used_and_never_shown(token_server):
    port = token_server.port
    with pytest.raises(shmq.Unauthorized, match="refused the token in \\$SHMQ_TOKEN"):
        shmq.connect(token_server.url)
    for url in (f"tcp://:{TOKEN}@127.0.0.1:{port}", f"tcp://me:{TOKEN}@127.0.0.1:{port}",
                f"tcp://127.0.0.1:{port}?token={TOKEN}"):
        with shmq.connect(url) as b:
            b.ping()
            assert (repr(b), b.url) == (f"<shmq.RemoteBroker tcp://127.0.0.1:{port}>", f"tcp://127.0.0.1:{port}")
    with shmq.connect(f"tcp://:wrong-one@127.0.0.1:{port}", token=TOKEN) as b:  # the argument wins
        b.ping()
    with pytest.raises(shmq.Unauthorized, match=f"^127.0.0.1:{port} refused the token given: ") as caught:
        shmq.connect(f"tcp://:{TOKEN}@127.0.0.1:{port}", token="wrong-two")
    with pytest.raises(shmq.Unauthorized) as caught2:
        shmq.connect(f"tcp://:not-{TOKEN}@127.0.0.1:{port}")
    assert TOKEN not in str(caught.value) + str(caught2.value)

    async def main():
        async with await aio.connect(f"tcp://:{TOKEN}@127.0.0.1:{port}") as b:
            await b.ping()
            assert repr(b) == f"<shmq.AsyncBroker tcp://127.0.0.1:{port}>"

    run(main())


def test_import_shmq_is_enough_for_the_asyncio_client(tcp_server):
    code = ("import sys, shmq\n"
            "assert 'asyncio' not in sys.modules  # not loaded until it is used\n"
            "import asyncio\n"
            "async def main():\n"
            f"    async with await shmq.aio.connect({tcp_server.url!r}) as b:\n"
            "        await b.ping()\n"
            "asyncio.run(main())\n")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
