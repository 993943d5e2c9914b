"""The Kafka port at the byte level, against a real server: garbage closes only its own
connection, unknown versions and APIs are answered, and an idempotent producer whose
connection is cut after a Produce (its response lost) appends each record once."""

import socket
import struct
import threading

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.serial import entity_reader

pytestmark = pytest.mark.slow


def _exchange(port, body: bytes) -> bytes:
    """Send one frame; the response frame's body, or b"" if the connection closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        f = s.makefile("rb")
        head = f.read(4)
        return f.read(struct.unpack(">i", head)[0]) if len(head) == 4 else b""


def _api_versions_ok(port) -> bool:
    body = struct.pack(">hhih", 18, 0, 1, -1)  # ApiVersions v0, correlation 1, no client id
    answer = _exchange(port, body)
    return answer[:4] == struct.pack(">i", 1) and answer[4:6] == b"\x00\x00"


def test_garbage_closes_only_its_connection_with_a_reason(kafka_server, broker):
    srv = kafka_server()
    garbage = [struct.pack(">i", 2**31 - 1) + b"x" * 100, struct.pack(">i", -7), struct.pack(">i", 8) + b"\xff" * 8,
               struct.pack(">i", 12) + struct.pack(">hhi", 3, 12, 5) + b"\xff\xff\xff\xff", b"\x00" * 3]
    for data in garbage:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            assert s.recv(100) == b""  # closed by the server (or answered nothing)
    srv.proc.wait_for_line(lambda x: "a frame of 2147483647 bytes; this port takes 0..16777216" in x)
    srv.proc.wait_for_line(lambda x: "Metadata v12: the request does not parse" in x)
    assert _api_versions_ok(srv.port)  # the listener serves on
    assert srv.proc.alive()


def test_an_unknown_api_versions_version_is_answered_in_v0(kafka_server):
    srv = kafka_server()
    answer = _exchange(srv.port, struct.pack(">hhih", 18, 99, 42, -1))
    assert answer[:4] == struct.pack(">i", 42)
    response, _n = entity_reader(ApiVersionsResponse)(answer, 4)
    assert response.error_code == 35  # UNSUPPORTED_VERSION, with the versions this side speaks
    keys = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert keys[0] == (0, 11) and keys[1] == (4, 12) and keys[18] == (0, 3)


def test_an_api_not_served_gets_unsupported_version(kafka_server):
    srv = kafka_server()
    # DescribeAcls v1 (not served): its response's error_code says UNSUPPORTED_VERSION
    body = struct.pack(">hhih", 29, 1, 9, -1) + b"\x01\xff\xff\xff\xff\xff\xff\x01\x03\x03"
    answer = _exchange(srv.port, body)
    assert answer[:4] == struct.pack(">i", 9)
    assert answer[8:10] == struct.pack(">h", 35)  # after correlation id and throttle_time_ms


class CuttingProxy:
    """A TCP proxy in front of the Kafka port that, once, forwards a Produce request and
    then cuts both sides before its response comes back."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.upstream = None
        self.cut = threading.Event()
        self.threads = []
        self.closed = False

    def start(self, upstream_port):
        self.upstream = upstream_port
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for args in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pump, args=(*args, (client, server)), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src, dst, requests, pair):
        buf = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if requests and not self.cut.is_set():
                    buf += data
                    while len(buf) >= 6:
                        size = struct.unpack_from(">i", buf)[0]
                        if len(buf) < 4 + size:
                            break
                        frame, buf = buf[:4 + size], buf[4 + size:]
                        dst.sendall(frame)
                        if struct.unpack_from(">h", frame, 4)[0] == 0:  # a Produce went through: cut
                            self.cut.set()
                            for s in pair:
                                s.shutdown(socket.SHUT_RDWR)
                            return
                    continue
                if buf:
                    dst.sendall(buf)
                    buf = b""
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in pair:
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def test_idempotent_producer_cut_mid_batch_appends_each_record_once(broker, servers):
    from confluent_kafka import Producer

    from tests.kafka.conftest import KafkaServer

    proxy = CuttingProxy()
    srv = KafkaServer(servers(broker.namespace, "--no-persist", "--no-auth", "--kafka-port", "0",
                              "--kafka-advertised-host", f"127.0.0.1:{proxy.port}"))
    try:
        proxy.start(srv.port)
        broker.create_stream("idem", partitions=1)
        delivered = []
        p = Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "enable.idempotence": True,
                      "linger.ms": 50, "retry.backoff.ms": 50})
        for i in range(200):
            p.produce("idem", b"r%d" % i, partition=0, on_delivery=lambda err, m: delivered.append((err, m.offset())))
        assert p.flush(60) == 0
        assert proxy.cut.is_set()
        assert [e for e, _o in delivered if e is not None] == []
        values = [r.value for r in broker.stream("idem").read(0, 0, 1000)]
        assert values == [b"r%d" % i for i in range(200)]  # each once, in order
        assert sorted(o for _e, o in delivered) == list(range(200))
        srv.proc.wait_for_line(lambda x: "(a retry): answered with offset 0" in x)
    finally:
        proxy.close()
        assert srv.stop() == 0
