"""The JVM's DEADBEEF client (issue 32, item 3): ``io.shmq.spark.source.TcpStream`` reads a
stream from a real ``shmq server`` as an executor on another host would, over TCP, and finds
the token of this user's server by itself as the Python client does (``io.shmq.spark.tcp.Auth``,
held to ``shmq.auth.discover``'s answers).

The Java codec is checked against bytes the Python codec makes (requests byte for byte,
replies decoded fed a byte at a time); then a Java main (``TcpStreamDump``) reads records
appended with the Python client and prints them, and the test compares every field with
what the engine stored. Skipped, saying why, where there is no JDK.
"""

import json
import math
import os
import shutil
import socket
import subprocess

import msgpack
import psutil
import pytest

import shmq
from shmq import auth
from shmq.protocol import MsgType, Status, encode_error, encode_reply, encode_request
from tests._wait import in_thread, wait_for
from tests.spark.jvm_harness import run_java, skip_without_jdk
from tests.test_tls import certs  # noqa: F401  (a fixture: a throwaway CA and the server's certificate)

TOKEN = "s3cret-token_1"


@pytest.fixture
def java(classes, monkeypatch):
    """``java(cls, *args, env=None)``: runs a class of io.shmq.spark.tcp's tests, with no token or
    CA of this process's but those of ``env``, and returns the finished process; ``java.popen``:
    the same, started, its stdin and stdout piped."""
    for name in ("SHMQ_TOKEN", "SHMQ_TLS_CA"):
        monkeypatch.delenv(name, raising=False)

    def run(cls, *args, env=None):
        with monkeypatch.context() as m:
            for name, value in (env or {}).items():
                m.setenv(name, value)
            return run_java(classes, f"io.shmq.spark.tcp.{cls}", *args, check=False)

    def popen(cls, *args):
        java_bin = os.path.join(os.path.dirname(skip_without_jdk()), "java")
        return subprocess.Popen([java_bin, "-cp", classes, f"io.shmq.spark.tcp.{cls}", *map(str, args)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    run.popen = popen
    return run


def _ok(proc) -> list[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def _wire_ns(ns: int) -> int:
    """The timestamp the JVM client gives for one the engine stored as ``ns``: the wire has it
    as float seconds (``ns / 1e9``), taken back to whole seconds and a rounded fraction, as
    ``StreamMessages.nanos`` does it (Java's Math.round: floor(x + 0.5))."""
    ts = ns / 1e9
    whole = math.floor(ts)
    back = whole * 10**9 + math.floor((ts - whole) * 1e9 + 0.5)
    assert abs(back - ns) <= 250  # a float of epoch seconds keeps a quarter microsecond
    return back


def _line(p, row) -> str:
    """``TcpStreamDump``'s line for a row of ``read_raw`` (offset, ns, key, headers, value)."""
    offset, ns, key, hraw, value = row
    return (f"record {p} {offset} {_wire_ns(ns)} {'-' if key is None else key.hex()} "
            f"{'-' if value is None else value.hex()} {hraw.hex()}")


def test_wire_codec_unit(java):
    assert _ok(java("WireCodecTest")) == ["WireCodecTest: ok"]


def test_codec_matches_the_python_codec(java, tmp_path):
    requests = [
        ("hello shmq-jvm " + TOKEN, MsgType.HELLO, 0x0D0A, {"client": "shmq-jvm", "token": TOKEN}),
        ("hello shmq-jvm -", MsgType.HELLO, 0x0D0A, {"client": "shmq-jvm"}),
        ("info événements", MsgType.STREAM_INFO, 7, {"stream": "événements"}),
        ("offsets s 255", MsgType.OFFSETS, 7, {"stream": "s", "partition": 255}),
        ("read " + "n" * 40 + " 3 0 1", MsgType.READ, 7,
         {"stream": "n" * 40, "partition": 3, "offset": 0, "max": 1, "wait_ms": 0}),
        ("read s 0 4294967296 100000", MsgType.READ, 7,
         {"stream": "s", "partition": 0, "offset": 2**32, "max": 100_000, "wait_ms": 0}),
    ]
    (tmp_path / "requests.txt").write_text(
        "".join(f"{line} {encode_request(t, i, p).hex()}\n" for line, t, i, p in requests), encoding="utf-8")
    headers = {"trace": "é-1", "n": -3, "big": 2**63, "f": 0.1, "ok": True, "raw": b"\x00\xff"}
    records = [
        {"partition": 1, "offset": 2**40, "value": b"", "timestamp": 1_763_950_000.123456},
        {"partition": 1, "offset": 2**40 + 1, "value": b"\x00" * 70_000, "key": b"k" * 300,
         "headers": headers, "timestamp": 0.5},
        {"partition": 1, "offset": 2**40 + 2, "value": b"v", "key": b"", "timestamp": 1e9, "future": [1, {}]},
    ]
    replies = [
        encode_reply(MsgType.HELLO, 0x0D0A, {"server": "shmq", "version": "9", "max_frame_bytes": 1 << 20,
                                             "compression": []}),
        encode_reply(MsgType.STREAM_INFO, 2, {"stream": "s", "partitions": 4, "retention": "drop", "x": None}),
        encode_reply(MsgType.OFFSETS, 3, {"earliest": 5, "end": 2**40}),
        encode_reply(MsgType.READ, 4, {"records": records}),
        encode_reply(MsgType.READ, 5, {"records": []}),
        encode_error(MsgType.READ, 6, Status.OFFSET_OUT_OF_RANGE, "offset 1 is below the earliest, 5",
                     {"earliest": 5, "end": 9}),
        encode_error(MsgType.HELLO, 0x0D0A, Status.UNAUTHORIZED, "bad token"),
    ]
    (tmp_path / "replies.bin").write_bytes(b"".join(replies))
    packed = msgpack.packb(headers, use_bin_type=True).hex()
    assert _ok(java("WireFixtures", tmp_path)) == [
        "frame 81 3338 0", "max_frame_bytes 1048576",
        "frame a3 2 0", "partitions 4",
        "frame ab 3 0", f"offsets 5 {2**40}",
        "frame aa 4 0",
        f"record {2**40} {_wire_ns(1_763_950_000_123_456_000)} - {''} ",
        f"record {2**40 + 1} 500000000 {'6b' * 300} {'00' * 70_000} {packed}",
        f"record {2**40 + 2} 1000000000000000000 {''} {b'v'.hex()} ",
        "frame aa 5 0",
        "frame aa 6 16", "error OFFSET_OUT_OF_RANGE 5 9 offset 1 is below the earliest, 5",
        "frame 81 3338 3", "error UNAUTHORIZED -1 -1 bad token",
    ]


@pytest.fixture
def start(broker, servers):
    """``start(*args)``: a real ``shmq server`` with a token on the test's namespace (``.url``),
    stopped at the end, before the namespace is checked for leaks."""
    started = []

    def run(*args):
        started.append(servers(broker.namespace, "--no-persist", "--token", TOKEN, *args))
        return started[-1]

    yield run
    for srv in started:
        assert srv.stop() == 0


@pytest.fixture
def server(start):
    return start()


def _appended(broker, url) -> list[str]:
    """A stream "events" of 3 partitions with known records, appended over TCP with the
    Python client; ``TcpStreamDump``'s whole expected output (from what the engine stored)."""
    keys = [None, b"k1", b"", b"\xff" * 3]
    with shmq.connect(url, token=TOKEN) as remote:
        s = remote.create_stream("events", partitions=3)
        for i in range(7):
            s.append(b"value-%d" % i + b"\x00" * i, key=keys[i % 4],
                     headers=None if i % 3 else {"i": i, "s": "é" * i, "b": b"\x01", "f": i / 3, "t": i == 3},
                     partition=i % 2)
        s.append_many([b"x" * 100] * 5, partition=0)
        s.append(None, key=b"k", headers=[("a", b"1"), ("a", None)], partition=1)  # a tombstone: a nil value
    return _stored(broker)


def _stored(broker) -> list[str]:
    """``TcpStreamDump``'s whole output for the stream "events" as the engine stores it now."""
    local = broker.stream("events")
    out = [f"partitions {local.partitions}"]
    for p in range(local.partitions):
        earliest, end = local.offsets(p)
        out.append(f"offsets {p} {earliest} {end}")
        out += [_line(p, row) for row in local.read_raw(p, earliest, end - earliest or 1)]
    return out


def test_reads_what_the_python_client_appended(java, broker, server):
    expected = _appended(broker, server.url)
    assert sum(x.startswith("record ") for x in expected) == 13 and "offsets 2 0 0" in expected
    assert any(x.startswith("record 1 3 ") and " 6b - " in x for x in expected)  # the tombstone
    assert _ok(java("TcpStreamDump", server.url, TOKEN, "events")) == expected
    # the token in the url, and in $SHMQ_TOKEN
    url_token = server.url.replace("tcp://", f"tcp://:{TOKEN}@")
    assert _ok(java("TcpStreamDump", url_token, "-", "events")) == expected
    assert _ok(java("TcpStreamDump", server.url, "-", "events", env={"SHMQ_TOKEN": TOKEN})) == expected


def test_a_read_stops_at_until_and_max(java, broker, server):
    expected = [x for x in _appended(broker, server.url) if x.startswith("record 0 ")]
    assert _ok(java("TcpStreamDump", server.url, TOKEN, "events", "read", 0, 2, 5, 100)) == ["read 3", *expected[2:5]]
    assert _ok(java("TcpStreamDump", server.url, TOKEN, "events", "read", 0, 2, 9, 4)) == ["read 4", *expected[2:6]]
    assert _ok(java("TcpStreamDump", server.url, TOKEN, "events", "read", 0, 9, 20, 4)) == ["read 0"]  # at the end


def test_a_wrong_or_missing_token_is_refused_clearly(java, broker, server, tmp_path):
    where = server.url.removeprefix("tcp://")
    proc = java("TcpStreamDump", server.url, "wrong", "events")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout == (f"error ServerException: {where} refused the token given: UNAUTHORIZED: wrong or missing "
                           "token\n")
    elsewhere = tmp_path / "elsewhere"  # another per-user directory: no runtime file of this server
    proc = java("TcpStreamDump", server.url, "-", "events", env={"SHMQ_HOME": str(elsewhere)})
    assert proc.returncode == 3
    assert proc.stdout.startswith(f"error ServerException: {where} requires a token and none was found: pass one "
                                  "(the token option, tcp://:TOKEN@host:port) or set $SHMQ_TOKEN, or run the query as "
                                  f"the server's user on its host (it reads {elsewhere}/run): UNAUTHORIZED: ")


def test_the_token_of_this_users_server_is_found_by_itself(java, broker, server):
    """No token given, none in $SHMQ_TOKEN: the one in the runtime file of this user's server
    that listens where the client connected (shmq.auth), as the Python client finds it."""
    expected = _appended(broker, server.url)
    assert _ok(java("TcpStreamDump", server.url, "-", "events")) == expected
    (path,) = [os.path.join(auth.run_dir(), f) for f in os.listdir(auth.run_dir())
               if f.startswith(f"server-{server.port}-")]
    with open(path) as f:
        info = json.load(f)
    with open(path, "w") as f:  # a token found there that the server refuses says where it came from
        json.dump({**info, "token": "not-the-one"}, f)
    proc = java("TcpStreamDump", server.url, "-", "events")
    assert proc.stdout == (f"error ServerException: 127.0.0.1:{server.port} refused the token in {path}: "
                           "UNAUTHORIZED: wrong or missing token\n")


def test_finding_the_token_is_shmq_auth_discover_rule_for_rule(java, tmp_path, monkeypatch):
    """Runtime files of live and dead servers, bound to one address, to all, to a name, IPv4 and
    IPv6; every (local, peer) pair finds in Java what shmq.auth.discover finds."""
    monkeypatch.setenv("SHMQ_HOME", str(tmp_path))
    os.makedirs(auth.run_dir(), mode=0o700)
    me, ticks = os.getpid(), auth._start_ticks(os.getpid())
    files = {  # port: [(pid, start, addresses, token)], in the order of their files' names
        7001: [(me, ticks, ["127.0.0.1"], "t-loopback")],
        7002: [(me, ticks, ["0.0.0.0"], "t-any")],
        7003: [(me, ticks, ["10.1.2.3", "127.0.0.1"], "t-two")],
        7004: [(me, ticks + 1, ["0.0.0.0"], "t-restarted-pid"), (2**22 + 7, ticks, ["0.0.0.0"], "t-gone")],
        7005: [(me, ticks, ["localhost"], "t-a-name")],
        7006: [(me, ticks, ["::ffff:127.0.0.1"], "t-mapped")],
        7007: [(me, ticks, ["::"], "t-any6")],
        7008: [(me, None, ["0.0.0.0"], "t-no-start"), (me, ticks, ["0.0.0.0"], "t-second")],
        7009: [(me, ticks, ["fe80::1%eth0", "10.1.2.3"], "t-scoped")],
    }
    for port, servers in files.items():
        for i, (pid, start, addresses, token) in enumerate(servers):
            with open(os.path.join(auth.run_dir(), f"server-{port}-{i}.json"), "w") as f:
                json.dump({"pid": pid, "start": start, "host": "h", "addresses": addresses,
                           "port": port, "namespace": "n", "token": token}, f)
    with open(os.path.join(auth.run_dir(), "server-7010-0.json"), "w") as f:  # its port is not the one in its name
        json.dump({"pid": me, "start": ticks, "addresses": ["0.0.0.0"], "port": 9999, "token": "t-port"}, f)
    pairs = [("127.0.0.1", "127.0.0.1"), ("127.0.0.1", "127.0.0.2"), ("10.1.2.3", "10.1.2.3"),
             ("10.9.9.9", "10.1.2.3"), ("10.9.9.9", "10.8.8.8"), ("::1", "::1")]
    cases = [(port, local, peer) for port in [*files, 7010, 7011] for local, peer in pairs]
    expected = [f"run {auth.run_dir()}"]
    for port, local, peer in cases:
        token, path = auth.discover((local, 0), (peer, port))
        expected.append("-" if token is None else f"{token} the token in {path}")
    assert sum(x != "-" for x in expected) > 15 and sum(x == "-" for x in expected) > 15
    assert _ok(java("AuthCheck", *(f"{port}/{local}/{peer}" for port, local, peer in cases),
                    env={"SHMQ_HOME": str(tmp_path)})) == expected


def test_unknown_stream_bad_url_and_no_server(java, broker, server):
    proc = java("TcpStreamDump", server.url, TOKEN, "nope")
    assert (proc.returncode, proc.stdout) == (
        3, f"error ServerException: {server.url.removeprefix('tcp://')}: STREAM_NOT_FOUND: no stream 'nope' in "
           f"namespace '{broker.namespace}'\n")
    proc = java("TcpStreamDump", "http://:tok@127.0.0.1:1", TOKEN, "s")
    assert proc.stdout == ("error IllegalArgumentException: unsupported broker url 'http://***@127.0.0.1:1': use "
                           "tcp://host:port (tcps://host:port: TLS)\n")
    server.stop()
    proc = java("TcpStreamDump", server.url, TOKEN, "events")
    where = server.url.removeprefix("tcp://")
    assert proc.stdout == f"error IOException: cannot connect to {where}: Connection refused\n"


def test_offsets_dropped_by_retention_are_data_loss(java, broker, server):
    _appended(broker, server.url)
    with shmq.connect(server.url, token=TOKEN) as remote:
        assert remote.stream("events").delete_records({0: 6}) == 6
    proc = java("TcpStreamDump", server.url, TOKEN, "events", "read", 0, 2, 9, 100)
    assert (proc.returncode, proc.stdout) == (
        3, "error DataLossException 6: stream 'events' partition 0: offsets 2..5 were dropped by retention (or lost) "
           "before they were read (the oldest retained is 6)\n")
    expected = [x for x in _stored(broker) if x.startswith("record 0 ")]
    assert _ok(java("TcpStreamDump", server.url, TOKEN, "events", "read", 0, 6, 9, 100)) == ["read 3", *expected]
    proc = java("TcpStreamDump", server.url, TOKEN, "events", "read", 0, 12, 13, 100)
    assert (proc.returncode, proc.stdout) == (
        3, "error IOException: stream 'events' partition 0 ends at 9, before offset 12: was it deleted and created "
           "again?\n")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command (test certificates)")
def test_tcps_trusts_the_ca_of_shmq_tls_ca(java, broker, start, certs, monkeypatch):  # noqa: F811
    srv = start("--tls-cert", certs.cert, "--tls-key", certs.key)
    url = f"tcps://127.0.0.1:{srv.port}"
    monkeypatch.setenv("SHMQ_TLS_CA", certs.ca)
    expected = _appended(broker, url)
    assert _ok(java("TcpStreamDump", url, TOKEN, "events", env={"SHMQ_TLS_CA": certs.ca})) == expected
    proc = java("TcpStreamDump", url, TOKEN, "events", env={"SHMQ_TLS_CA": certs.other_ca})
    assert proc.returncode == 3
    assert proc.stdout == (f"error IOException: cannot connect to 127.0.0.1:{srv.port}: TLS certificate verify "
                           f"failed: no CA trusted here signed the server's certificate (only those of $SHMQ_TLS_CA "
                           f"{certs.other_ca} are)\n")
    proc = java("TcpStreamDump", srv.url, TOKEN, "events")
    assert proc.stdout == (f"error IOException: 127.0.0.1:{srv.port}: connection closed by the server (a server with "
                           "--tls-cert closes plain connections at the HELLO: use tcps://)\n")


def test_a_connection_the_server_closed_idle_is_opened_again(java, broker, start):
    srv = start("--idle-timeout", "0.5")
    _appended(broker, srv.url)
    proc = java.popen("TcpStreamDump", srv.url, TOKEN, "events", "pause", 0)
    try:
        assert proc.stdout.readline() == "latest 0 9\n"
        server = psutil.Process(srv.proc.pid)
        wait_for(lambda: not [c for c in server.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED],
                 timeout=30, what="the server closing the idle connection")
        proc.stdin.write("go on\n")
        proc.stdin.close()
        assert proc.stdout.read() == "latest 0 9\n"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command (test certificates)")
def test_tcps_to_a_server_that_wants_a_client_certificate(java, broker, start, certs):  # noqa: F811
    srv = start("--tls-cert", certs.cert, "--tls-key", certs.key, "--tls-client-ca", certs.ca)
    proc = java("TcpStreamDump", f"tcps://127.0.0.1:{srv.port}", TOKEN, "events", env={"SHMQ_TLS_CA": certs.ca})
    assert proc.returncode == 3
    assert proc.stdout.startswith(f"error IOException: 127.0.0.1:{srv.port}: ")  # a closed or broken connection
    assert proc.stdout.endswith(" (at the HELLO, over TLS: a server with --tls-client-ca closes connections that show "
                                "no client certificate its CA signed, and this client shows none)\n")


def test_a_peer_that_is_no_shmq_server(java):
    """An HTTP server's answer to the HELLO is refused at its first bytes, in one line."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)  # the HELLO
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    with listener:
        thread, served = in_thread(answer)
        proc = java("TcpStreamDump", f"tcp://127.0.0.1:{port}", TOKEN, "events")
        thread.join(30)
    assert "error" not in served
    assert (proc.returncode, proc.stdout) == (
        3, f"error ProtocolException: 127.0.0.1:{port} sent what is no shmq reply: bad magic 0x48545450 (expected "
           "0xDEADBEEF)\n")


def test_a_read_larger_than_a_reply_takes_several(java, broker, start):
    """Replies of a server with small frames carry few records: one read sends READs until it has them all."""
    srv = start("--max-frame-bytes", "2048")
    with shmq.connect(srv.url, token=TOKEN) as remote:
        s = remote.create_stream("events", partitions=1, max_message_bytes=1024)
        for i in range(40):
            s.append(b"%04d" % i + b"." * 300)
        assert 0 < len(s.read(0, 3, max_records=1000)) < 10  # a reply holds a few
    expected = [x for x in _stored(broker) if x.startswith("record ")]
    assert len(expected) == 40
    assert _ok(java("TcpStreamDump", srv.url, TOKEN, "events", "read", 0, 3, 38, 1000)) == ["read 35", *expected[3:38]]
