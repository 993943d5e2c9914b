"""What the Kafka clients a user installs today send on their first connection: Metadata
with bytes after what its schema defines (librdkafka 2.16's full listing), SASL/PLAIN by
SaslHandshake v1 + SaslAuthenticate and by SaslHandshake v0 + raw tokens (older
librdkafka), with the system's kcat in both auth modes."""

import io
import shutil
import socket
import struct
import subprocess

import pytest
from kio.serial import entity_writer

from shmq.kafka import frame
from shmq.kafka.messages import request_class
from tests.kafka.conftest import KafkaServer
from tests.kafka.groups_wire import Wire

pytestmark = pytest.mark.slow

TOKEN = "s3cret-token"


@pytest.fixture
def sasl_server(broker, servers, tmp_path):
    """A server of the test's namespace whose Kafka port wants SASL/PLAIN with TOKEN."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    srv = KafkaServer(servers(broker.namespace, "--no-persist", "--kafka-port", "0", "--token-file", str(token_file)))
    yield srv
    assert srv.stop() == 0


def _plain(password: str) -> bytes:
    return b"\0user\0" + password.encode()


def _read_frame(sock) -> bytes | None:
    """The next frame's body, or None once the server closed the connection."""
    f = sock.makefile("rb")
    head = f.read(4)
    if len(head) < 4:
        return None
    return f.read(struct.unpack(">i", head)[0])


def test_metadata_with_bytes_after_its_fields_is_answered(kafka_server, broker):
    srv = kafka_server()
    broker.create_stream("listed", partitions=2)
    cls = request_class(3, 12)
    head = cls.__header_schema__(request_api_key=3, request_api_version=12, correlation_id=7, client_id="rdkafka")
    out = io.BytesIO()
    entity_writer(type(head))(out, head)
    entity_writer(cls)(out, cls(topics=None, allow_auto_topic_creation=False,
                                include_topic_authorized_operations=False))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(frame(out.getvalue() + b"\x00\x00\x00"))  # what librdkafka 2.16 writes after the array
        body = _read_frame(s)
    assert body is not None and body[:4] == struct.pack(">i", 7)
    assert b"listed" in body


def test_current_librdkafka_lists_topics_and_subscribes_by_regex(kafka_server, broker):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    srv = kafka_server()
    broker.create_stream("rx_a", partitions=1)
    broker.create_stream("rx_b", partitions=1)
    topics = AdminClient({"bootstrap.servers": srv.bootstrap}).list_topics(timeout=20).topics
    assert {"rx_a", "rx_b"} <= set(topics)
    p = Producer({"bootstrap.servers": srv.bootstrap})
    assert {"rx_a", "rx_b"} <= set(p.list_topics(timeout=20).topics)
    p.produce("rx_a", b"a", partition=0)
    p.produce("rx_b", b"b", partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": srv.bootstrap, "group.id": "rx", "auto.offset.reset": "earliest",
                  "topic.metadata.refresh.interval.ms": 1000})
    try:
        c.subscribe(["^rx_.*"])
        got, polls = set(), 0
        while got != {b"a", b"b"} and polls < 60:
            m = c.poll(1.0)
            polls += 1
            if m is not None and m.error() is None:
                got.add(m.value())
        assert got == {b"a", b"b"}
    finally:
        c.close()
    assert not any("bytes after the request" in x for x in srv.proc.log)


def test_sasl_handshake_v0_then_a_raw_token(sasl_server):
    srv = sasl_server
    with Wire(srv.port) as w:
        r = w.call(17, 0, mechanism="PLAIN")
        assert r.error_code == 0 and "PLAIN" in r.mechanisms
        w.sock.sendall(frame(_plain(TOKEN)))  # no request header: the token alone
        assert _read_frame(w.sock) == b""  # an empty frame: authenticated
        r = w.call(3, 1, topics=None)
        assert r.brokers[0].port == srv.port
    with Wire(srv.port) as w:
        assert w.call(17, 0, mechanism="PLAIN").error_code == 0
        w.sock.sendall(frame(_plain("wrong")))
        assert _read_frame(w.sock) is None  # closed: v0 has no error to send
    srv.proc.wait_for_line(lambda x: "a raw token after SaslHandshake v0" in x)
    with Wire(srv.port) as w:
        r = w.call(17, 1, mechanism="SCRAM-SHA-256")
        assert r.error_code == 33 and list(r.mechanisms) == ["PLAIN"]  # UNSUPPORTED_SASL_MECHANISM
    srv.proc.wait_for_line(lambda x: "SASL mechanism 'SCRAM-SHA-256' refused" in x)


def _kcat(srv, *args, password=None, data=None):
    sasl = [] if password is None else ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN",
                                         "-X", "sasl.username=u", "-X", f"sasl.password={password}"]
    return subprocess.run(["kcat", "-b", srv.bootstrap, *sasl, *args], input=data, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (apt-get install kcat)")
def test_the_systems_kcat_with_sasl_both_flows(sasl_server):
    srv = sasl_server
    lines = "".join(f"s{i}\n" for i in range(10)).encode()
    assert _kcat(srv, "-P", "-t", "kc", "-p", "0", password=TOKEN, data=lines).returncode == 0
    listing = _kcat(srv, "-L", password=TOKEN)
    assert listing.returncode == 0 and b'topic "kc" with 1 partitions' in listing.stdout
    out = _kcat(srv, "-C", "-t", "kc", "-p", "0", "-o", "beginning", "-e", "-f", "%o:%s\n", password=TOKEN)
    assert out.stdout.decode().splitlines() == [f"{i}:s{i}" for i in range(10)]
    bad = _kcat(srv, "-L", "-m", "5", password="wrong")
    assert bad.returncode != 0 and b"Authentication failed" in bad.stderr
    # older librdkafka's own flow: SaslHandshake v0, then the raw token
    old = _kcat(srv, "-L", "-X", "api.version.request=false", "-X", "broker.version.fallback=0.10.0",
                password=TOKEN)
    assert old.returncode == 0 and b'topic "kc"' in old.stdout
    # (without SASL, against a server that wants none: test_clients.py's kcat test)


def test_aiokafka_and_confluent_kafka_log_in_with_the_token(sasl_server, broker):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from confluent_kafka.admin import AdminClient

    srv = sasl_server
    sasl = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_plain_username="me",
                sasl_plain_password=TOKEN)

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=srv.bootstrap, **sasl)
        await p.start()
        try:
            await p.send_and_wait("ai", b"v", partition=0)
        finally:
            await p.stop()
        c = AIOKafkaConsumer("ai", bootstrap_servers=srv.bootstrap, auto_offset_reset="earliest",
                             group_id="ai", **sasl)
        await c.start()
        try:
            return await asyncio.wait_for(c.getone(), 30)
        finally:
            await c.stop()

    assert asyncio.run(go()).value == b"v"
    admin = AdminClient({"bootstrap.servers": srv.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "PLAIN", "sasl.username": "me", "sasl.password": TOKEN})
    assert "ai" in admin.list_topics(timeout=20).topics  # librdkafka 2.16's full listing, logged in
    assert [r.value for r in broker.stream("ai").read(0, 0, 10)] == [b"v"]


def test_the_topics_the_listener_makes_take_its_ring_size(kafka_server, broker):
    from confluent_kafka.admin import AdminClient, NewTopic

    srv = kafka_server("--kafka-topic-max-bytes", "1MiB", "--kafka-auto-create-partitions", "2")
    admin = AdminClient({"bootstrap.servers": srv.bootstrap})
    admin.create_topics([NewTopic("made", 3)])["made"].result(30)
    assert "auto" in admin.list_topics("auto", timeout=20).topics  # auto-created by the Metadata
    with broker.stream("made") as made, broker.stream("auto") as auto:
        assert (made.partitions, made.max_bytes, auto.partitions, auto.max_bytes) == (3, 2**20, 2, 2**20)
