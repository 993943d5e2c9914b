"""The TCP server against hostile and unlucky clients: it answers, closes what it must,
keeps serving everyone else, and gives back the deliveries of clients that vanish."""

import os
import resource
import signal
import socket
import subprocess
import threading

import psutil
import pytest

import shmq
from shmq.auth import client_token
from shmq.protocol import FrameDecoder, MsgType, Status, encode_request, pack_header
from tests import _workers as w
from tests._processes import WORKERS, start_module


class ServerProcess:
    """``shmq server`` as a process of its own on a free port (``python -m shmq.cli server``,
    forked from the suite's process server where its environment allows: tests._processes).
    ``log``: its lines up to the one naming the port; then a thread drains the rest into
    ``later`` (a server that logs every connection never blocks on a full pipe), and
    ``wait_for_line`` waits for one."""

    def __init__(self, namespace, *args, env=None):
        self.proc = start_module("shmq.cli", ["server", "--namespace", namespace, "--port", "0", *args],
                                 stderr=subprocess.PIPE, env=env or {**os.environ, "PYTHONPATH": os.getcwd()})
        self.log = []
        while True:  # the start-up lines end with the one naming the port
            line = self.proc.stderr.readline()
            self.log.append(line)
            assert line and len(self.log) < 100, self.log
            if "serving namespace" in line:
                break
        self.port = int(line.split(" on ")[1].split()[0].rsplit(":", 1)[1])
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.later = []
        self._new_line = threading.Condition()
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()

    def _read_log(self):
        try:
            for line in self.proc.stderr:
                with self._new_line:
                    self.later.append(line)
                    self._new_line.notify_all()
        except (ValueError, OSError):  # closed under us (a test that killed it)
            pass

    def wait_for_line(self, predicate, timeout=10):
        """The first line after start-up for which ``predicate`` is true (AssertionError
        after ``timeout`` seconds)."""
        with self._new_line:
            found = self._new_line.wait_for(lambda: next((x for x in self.later if predicate(x)), None), timeout)
        assert found is not None, f"no such line within {timeout}s: {self.later[-10:]}"
        return found

    def alive(self):
        with shmq.connect(self.url) as b:
            b.ping()
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(30)
        else:
            rc = self.proc.returncode
        self._drain.join(10)
        self.proc.stderr.close()
        return rc


def rebooted(broker, data_dir):
    """After a server on ``data_dir`` stopped: a reboot (``broker`` lets go and its
    namespace's shared memory is gone), then ``shmq server`` started again on ``data_dir``."""
    broker.close()
    shmq.destroy_namespace(broker.namespace)
    return ServerProcess(broker.namespace, "--data-dir", data_dir)


@pytest.fixture
def server(broker):
    srv = ServerProcess(broker.namespace)
    yield srv
    assert srv.stop() == 0


def _sock(port, hello=True):
    """A raw connection; with ``hello``, it has said HELLO with the token a client finds."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hello:
        token, _ = client_token(None, s.getsockname(), s.getpeername())
        s.sendall(encode_request(MsgType.HELLO, 0, {"token": token} if token else {}))
        (f,) = _read_frames(s)
        assert (f.msg_id, f.status) == (0, Status.OK), f.payload
    return s


def _read_frames(s, n=1, timeout=10):
    dec = FrameDecoder(1 << 30)
    frames = []
    s.settimeout(timeout)
    while len(frames) < n:
        f = dec.next_frame()
        if f is not None:
            frames.append(f)
            continue
        data = s.recv(65536)
        if not data:
            break
        dec.feed(data)
    return frames


def _closed(s, timeout=10):
    s.settimeout(timeout)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True


def test_garbage_bytes_get_bad_frame_then_close(server):
    s = _sock(server.port)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    (f,) = _read_frames(s)
    assert f.status == Status.BAD_FRAME and "magic" in f.payload["error"].lower()
    assert _closed(s)
    assert server.alive()


def test_huge_declared_length_gets_too_large_without_reading_it(server):
    s = _sock(server.port)
    s.sendall(pack_header(2**32 - 1, MsgType.PRODUCE, 0, 77))
    (f,) = _read_frames(s)
    assert (f.status, f.msg_id) == (Status.TOO_LARGE, 77)
    assert _closed(s)
    assert server.alive()
    rss = psutil.Process(server.proc.pid).memory_info().rss
    assert rss < 500 * 2**20  # it never allocated the 4 GiB it was promised


def test_bad_requests_keep_the_connection_usable(server, broker):
    broker.create_queue("q")
    s = _sock(server.port)
    s.sendall(encode_request(0x55, 1, {}))                      # unknown type
    s.sendall(encode_request(MsgType.PRODUCE, 2, {"queue": "q"}))  # missing body
    s.sendall(pack_header(3, MsgType.PING, 0, 3) + b"\xc1\xc1\xc1")  # malformed msgpack
    s.sendall(encode_request(MsgType.PRODUCE, 4, {"queue": "nope", "body": b"x"}))
    s.sendall(encode_request(MsgType.PING, 5))
    frames = {f.msg_id: f for f in _read_frames(s, 5)}
    assert [frames[i].status for i in (1, 2, 3, 4, 5)] == [
        Status.BAD_REQUEST, Status.BAD_REQUEST, Status.BAD_REQUEST, Status.NO_SUCH_QUEUE, Status.OK]
    assert "body" in frames[2].payload["error"]
    s.close()
    assert broker.queue("q").stats().ready == 0


def test_other_version_is_refused_and_the_connection_stays(server):
    s = _sock(server.port)
    s.sendall(pack_header(0, MsgType.PING, 0, 9, version=2) + encode_request(MsgType.PING, 10))
    f9, f10 = sorted(_read_frames(s, 2), key=lambda f: f.msg_id)
    assert (f9.status, f10.status) == (Status.UNSUPPORTED_VERSION, Status.OK)
    s.close()


def test_truncated_frames_and_a_stalled_half_header_hurt_no_one(server, broker):
    broker.create_queue("q")
    stalled = _sock(server.port)
    stalled.sendall(encode_request(MsgType.PING, 1)[:7])  # half a header, then nothing
    truncated = _sock(server.port)
    truncated.sendall(encode_request(MsgType.PRODUCE, 2, {"queue": "q", "body": b"x" * 1000})[:500])
    truncated.close()  # gone mid-frame: nothing half-produced
    with shmq.connect(server.url) as b:
        q = b.queue("q")
        q.put(b"fine")
        assert q.get(timeout=5).body == b"fine"
    stalled.close()
    assert broker.queue("q").stats().enqueued_total == 1


def test_pipelined_requests_are_not_held_back_by_a_waiting_consume(server, broker):
    broker.create_queue("q")
    s = _sock(server.port)
    s.sendall(encode_request(MsgType.CONSUME, 1, {"queue": "q", "wait_ms": 3000})
              + encode_request(MsgType.PING, 2)
              + encode_request(MsgType.PRODUCE, 3, {"queue": "q", "body": b"late"}))
    frames = _read_frames(s, 3)
    # the PING is not held back by the waiting CONSUME, which is answered as the PRODUCE feeds it,
    # before that PRODUCE's own reply (the waiter is the one in a hurry)
    assert [f.msg_id for f in frames] == [2, 1, 3]
    consume = frames[1]
    assert consume.msg_id == 1 and [m["body"] for m in consume.payload["messages"]] == [b"late"]
    s.close()


def test_produce_to_a_full_queue_answers_queue_full_at_once(server, broker):
    broker.create_queue("q", max_bytes=4096, max_message_bytes=976)
    with shmq.connect(server.url) as b:
        q = b.queue("q")
        for _ in range(4):
            q.put_nowait(b"x" * 976)
        s = _sock(server.port)
        s.sendall(encode_request(MsgType.PRODUCE, 1, {"queue": "q", "body": b"y"}))
        (f,) = _read_frames(s, timeout=5)
        assert f.status == Status.QUEUE_FULL
        s.close()


def test_a_closed_connection_gives_its_deliveries_back_at_once(server, broker):
    q = broker.create_queue("q", visibility_timeout=300)
    q.put_many([b"a", b"b", b"c"])
    b = shmq.connect(server.url)
    held = b.queue("q").get_many(3, timeout=5)
    assert len(held) == 3 and q.stats().in_flight == 3
    b.close()
    got = q.get_many(3, timeout=5)
    assert sorted(d.body for d in got) == [b"a", b"b", b"c"] and all(d.attempt == 2 for d in got)
    q.ack_many(got)


def test_a_client_killed_mid_consume_gives_its_deliveries_back(server, broker):
    q = broker.create_queue("q", visibility_timeout=300)
    q.put_many([b"%d" % i for i in range(5)])
    ready = WORKERS.Event()
    p = WORKERS.Process(target=w.hold_leases, args=(None, "q", 5, ready, server.url))
    p.start()
    assert ready.wait(30)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    got = []
    while len(got) < 5:
        got += q.get_many(5, timeout=5)  # far less than the 300 s visibility timeout
    assert sorted(d.body for d in got) == [b"%d" % i for i in range(5)]
    q.ack_many(got)
    assert server.alive()


def test_token_guards_remote_access(broker):
    srv = ServerProcess(broker.namespace, "--token", "s3cret")
    try:
        with pytest.raises(shmq.Unauthorized):
            shmq.connect(srv.url, token="wrong")
        s = _sock(srv.port, hello=False)
        s.sendall(encode_request(MsgType.LIST, 1))
        (f,) = _read_frames(s)
        assert f.status == Status.UNAUTHORIZED
        assert _closed(s)
        with shmq.connect(srv.url, token="s3cret") as b:
            assert b.list_queues() == []
    finally:
        assert srv.stop() == 0


def test_a_thousand_concurrent_connections(server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2200:
        pytest.skip(f"needs 2200 file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2200), hard))
    socks = []
    try:
        for i in range(1000):
            socks.append(_sock(server.port))
        for i, s in enumerate(socks):
            s.sendall(encode_request(MsgType.PING, i + 1))
        for i, s in enumerate(socks):
            (f,) = _read_frames(s)
            assert (f.msg_id, f.status) == (i + 1, Status.OK)
        assert server.alive()
        rss = psutil.Process(server.proc.pid).memory_info().rss
        assert rss < 300 * 2**20
    finally:
        for s in socks:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connection_refused_names_the_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(shmq.BrokerUnavailable, match=f"127.0.0.1:{port}"):
        shmq.connect(f"tcp://127.0.0.1:{port}")


def test_sigterm_answers_a_waiting_consume_and_exits_0(broker):
    broker.create_queue("q")
    srv = ServerProcess(broker.namespace)
    s = _sock(srv.port)
    s.sendall(encode_request(MsgType.CONSUME, 1, {"queue": "q", "wait_ms": 20000}) + encode_request(MsgType.PING, 2))
    dec = FrameDecoder()
    s.settimeout(10)
    while (pong := dec.next_frame()) is None:  # requests run in order: the CONSUME now waits
        dec.feed(s.recv(65536))
    assert pong.msg_id == 2
    srv.proc.send_signal(signal.SIGTERM)
    while (f := dec.next_frame()) is None:
        dec.feed(s.recv(65536))
    assert (f.msg_id, f.status, f.payload["messages"]) == (1, Status.OK, [])
    assert srv.stop() == 0
    s.close()
