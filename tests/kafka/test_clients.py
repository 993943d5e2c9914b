"""Real Kafka clients against a real ``shmq server --kafka-port``: each produces and
consumes (explicit partitions), records map both ways with native appends, every
compression codec, SASL right and wrong, auto-creation on and off, admin topics,
offsets by time, the long poll woken by a native append."""

import asyncio
import shutil
import subprocess
import time

import pytest

from shmq.kafka.compression import CODECS
from shmq.kafka.records import decode_batches
from tests._wait import wait_for
from tests.kafka.groups_wire import Wire, fetch_records

pytestmark = pytest.mark.slow


def _kp_consume(bootstrap, topic, n, partition=0, **kw):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=15000, **kw)
    try:
        c.assign([TopicPartition(topic, partition)])
        c.seek(TopicPartition(topic, partition), 0)
        out = []
        for m in c:
            out.append(m)
            if len(out) == n:
                break
        return out
    finally:
        c.close()


def _ck_consume(bootstrap, topic, n, partition=0, **conf):
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False, **conf})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        out, deadline = [], time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None:
                assert m.error() is None, m.error()
                out.append(m)
        return out
    finally:
        c.close()


def test_kafka_python_produces_and_consumes_exactly(kafka_server, broker):
    from kafka import KafkaProducer

    srv = kafka_server()
    p = KafkaProducer(bootstrap_servers=srv.bootstrap)
    metas = [p.send("kp", value=b"v%d" % i, key=b"k%d" % i if i % 2 else None,
                    headers=[("h", b"%d" % i)], partition=0).get(timeout=30) for i in range(20)]
    p.close()
    assert [m.offset for m in metas] == list(range(20))
    got = _kp_consume(srv.bootstrap, "kp", 20)
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == \
        [(i, b"k%d" % i if i % 2 else None, b"v%d" % i, [("h", b"%d" % i)]) for i in range(20)]
    native = broker.stream("kp").read(0, 0, 100)  # the same records, natively
    assert [(r.offset, r.key, r.value, r.headers) for r in native] == \
        [(i, b"k%d" % i if i % 2 else None, b"v%d" % i, {"h": b"%d" % i}) for i in range(20)]
    assert [round(r.timestamp * 1000) for r in native] == [m.timestamp for m in got]


def test_confluent_kafka_produces_and_consumes(kafka_server, broker):
    from confluent_kafka import Producer

    srv = kafka_server()
    broker.create_stream("ck", partitions=3)
    p = Producer({"bootstrap.servers": srv.bootstrap, "linger.ms": 5})
    for i in range(300):
        p.produce("ck", value=b"v%d" % i, partition=i % 3, headers=[("n", b"%d" % i)])
    assert p.flush(30) == 0
    for part in range(3):
        got = _ck_consume(srv.bootstrap, "ck", 100, partition=part)
        assert [(m.offset(), m.value(), m.headers()) for m in got] == \
            [(j, b"v%d" % (3 * j + part), [("n", b"%d" % (3 * j + part))]) for j in range(100)]
    assert broker.stream("ck").offsets(1) == (0, 100)


def test_aiokafka_produces_and_consumes(kafka_server, broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    srv = kafka_server()

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=srv.bootstrap)
        await p.start()
        try:
            for i in range(10):
                await p.send_and_wait("aio", b"v%d" % i, key=b"k", partition=0)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=srv.bootstrap, enable_auto_commit=False)
        await c.start()
        try:
            c.assign([TopicPartition("aio", 0)])
            await c.seek_to_beginning()
            out = []
            while len(out) < 10:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=1000), 30)
                for msgs in batch.values():
                    out += msgs
            return out
        finally:
            await c.stop()

    got = asyncio.run(go())
    assert [(m.offset, m.key, m.value) for m in got] == [(i, b"k", b"v%d" % i) for i in range(10)]


def test_kcat_produces_and_consumes(kafka_server, broker):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    srv = kafka_server()
    lines = "".join(f"line {i}\n" for i in range(25))
    subprocess.run(["kcat", "-b", srv.bootstrap, "-P", "-t", "kc", "-p", "0"], input=lines.encode(), check=True,
                   timeout=60)
    assert [r.value for r in broker.stream("kc").read(0, 0, 100)] == [f"line {i}".encode() for i in range(25)]
    out = subprocess.run(["kcat", "-b", srv.bootstrap, "-C", "-t", "kc", "-p", "0", "-o", "beginning", "-e",
                          "-f", "%o:%s\n"], capture_output=True, check=True, timeout=60).stdout.decode()
    assert out.splitlines() == [f"{i}:line {i}" for i in range(25)]


def test_native_records_read_by_kafka_consumers_exactly(kafka_server, broker):
    srv = kafka_server()
    s = broker.create_stream("nat", partitions=2)
    headers = {"s": "text", "b": b"\x00\xff", "i": 42, "f": 1.5, "t": True, "n": False}
    metas = [s.append(b"value %d" % i, key=b"key" if i % 2 else None, headers=headers, partition=1)
             for i in range(5)]
    got = _kp_consume(srv.bootstrap, "nat", 5, partition=1)
    assert [(m.offset, m.key, m.value, m.timestamp) for m in got] == \
        [(i, b"key" if i % 2 else None, b"value %d" % i, int(metas[i].timestamp * 1000)) for i in range(5)]
    assert got[0].headers == [("s", b"text"), ("b", b"\x00\xff"), ("i", b"42"), ("f", b"1.5"), ("t", b"true"),
                              ("n", b"false")]


def test_tombstones_and_every_header_keep_their_shape(shared_kafka, names):
    """librdkafka's tests 0070 and 0073 (a null value is not an empty one) and 0085 (a
    repeated header key, a null header value): what confluent-kafka produces comes back to
    it and to kafka-python as it went, and natively as value None and the list of header
    pairs; a native tombstone and header list go out to them as Kafka's nulls (the fetch
    encodes those; a producer's batch is served as it came)."""
    from confluent_kafka import Producer

    topic, b = names("tomb"), shared_kafka.broker
    b.create_stream(topic, partitions=1)
    pairs = [("a", b"1"), ("a", b"2"), ("n", None)]
    p = Producer({"bootstrap.servers": shared_kafka.bootstrap, "linger.ms": 20})
    p.produce(topic, key=b"k", value=None, partition=0)
    p.produce(topic, key=b"k", value=b"", partition=0)
    p.produce(topic, value=b"v", headers=pairs, partition=0)
    assert p.flush(30) == 0
    s = b.stream(topic)
    s.append(None, key=b"n", headers=pairs, partition=0)
    s.append(b"", headers={"d": b""}, partition=0)
    want = [(0, b"k", None, []), (1, b"k", b"", []), (2, None, b"v", pairs), (3, b"n", None, pairs),
            (4, None, b"", [("d", b"")])]
    got = _ck_consume(shared_kafka.bootstrap, topic, 5)
    assert [(m.offset(), m.key(), m.value(), m.headers() or []) for m in got] == want
    got = _kp_consume(shared_kafka.bootstrap, topic, 5)
    assert [(m.offset, m.key, m.value, m.headers) for m in got] == want
    native = s.read(0, 0, 10)
    assert [(r.offset, r.key, r.value, r.headers) for r in native] == \
        [(0, b"k", None, {}), (1, b"k", b"", {}), (2, None, b"v", pairs), (3, b"n", None, pairs),
         (4, None, b"", {"d": b""})]
    s.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_every_compression_codec(kafka_server, broker, codec):
    from confluent_kafka import Producer
    from kafka import KafkaProducer

    srv = kafka_server()
    kp = KafkaProducer(bootstrap_servers=srv.bootstrap, compression_type=codec, linger_ms=20)
    futures = [kp.send("z", value=b"kp %d " % i * 20, partition=0) for i in range(50)]
    kp.flush(30)
    assert sorted(f.get(timeout=1).offset for f in futures) == list(range(50))
    kp.close()
    cp = Producer({"bootstrap.servers": srv.bootstrap, "compression.codec": codec, "linger.ms": 20})
    for i in range(50):
        cp.produce("z", value=b"ck %d " % i * 20, partition=0)
    assert cp.flush(30) == 0
    values = [r.value for r in broker.stream("z").read(0, 0, 200)]
    assert values == [b"kp %d " % i * 20 for i in range(50)] + [b"ck %d " % i * 20 for i in range(50)]
    # fetched as the producers sent them (compressed batches, kept): each client reads them all back
    with Wire(srv.port) as w:
        fetched = fetch_records(w, "z", 0).records
    assert {b.attributes & 7 for b in decode_batches(fetched, 2**24)} == {CODECS[codec]}
    assert [m.value for m in _kp_consume(srv.bootstrap, "z", 100)] == values
    assert [m.value() for m in _ck_consume(srv.bootstrap, "z", 100)] == values


def test_sasl_plain_with_the_token_and_a_wrong_one(broker, servers, tmp_path, caplog):
    from confluent_kafka import KafkaException, Producer
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from tests.kafka.conftest import KafkaServer

    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)
    srv = KafkaServer(servers(broker.namespace, "--no-persist", "--kafka-port", "0", "--token-file", str(token_file)))
    try:
        sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": "anyone"}
        p = KafkaProducer(bootstrap_servers=srv.bootstrap, sasl_plain_password="s3cret-token", **sasl)
        assert p.send("sec", b"in", partition=0).get(timeout=30).offset == 0
        p.close()
        with pytest.raises(KafkaError, match="Unable to bootstrap"):
            KafkaProducer(bootstrap_servers=srv.bootstrap, sasl_plain_password="wrong",
                          bootstrap_timeout_ms=3000, **sasl)
        assert "SaslAuthenticationFailedError: Authentication failed: invalid credentials" in caplog.text
        srv.proc.wait_for_line(lambda x: "SASL/PLAIN refused" in x)
        cp = Producer({"bootstrap.servers": srv.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                       "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "s3cret-token"})
        cp.produce("sec", b"ck", partition=0)
        assert cp.flush(30) == 0
        errors = []
        bad = Producer({"bootstrap.servers": srv.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                        "sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": "nope",
                        "error_cb": errors.append})
        bad.poll(0)
        wait_for(lambda: bad.poll(0.2) is not None or errors, 30, "an authentication error")
        assert "Authentication failed" in str(errors[0])
        with pytest.raises(KafkaException):  # no SASL at all: the connection is closed
            from confluent_kafka.admin import AdminClient
            AdminClient({"bootstrap.servers": srv.bootstrap}).list_topics(timeout=5)
        srv.proc.wait_for_line(lambda x: "before SASL authentication" in x)
        assert [r.value for r in broker.stream("sec").read(0, 0, 10)] == [b"in", b"ck"]
    finally:
        assert srv.stop() == 0


def test_auto_created_topic_and_one_refused(kafka_server, broker):
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    srv = kafka_server("--kafka-auto-create-partitions", "3")
    p = KafkaProducer(bootstrap_servers=srv.bootstrap)
    p.send("made", b"x").get(timeout=30)
    p.close()
    assert broker.stream("made").partitions == 3
    srv.stop()
    srv = kafka_server("--no-kafka-auto-create")
    p = KafkaProducer(bootstrap_servers=srv.bootstrap, max_block_ms=3000)
    with pytest.raises(KafkaTimeoutError, match="Failed to update metadata"):
        p.send("never", b"x").get(timeout=10)
    p.close()
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": srv.bootstrap}).list_topics(topic="never", timeout=10)
    assert md.topics["never"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert "never" not in broker.list_streams()


def test_admin_creates_and_deletes_topics(kafka_server, broker):
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    srv = kafka_server()
    admin = KafkaAdminClient(bootstrap_servers=srv.bootstrap)
    try:
        admin.create_topics([NewTopic("adm", num_partitions=4, replication_factor=1)])
        assert broker.stream("adm").partitions == 4
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("adm", num_partitions=4, replication_factor=1)])
        assert "adm" in admin.list_topics()
        admin.delete_topics(["adm"])
        assert "adm" not in broker.list_streams()
    finally:
        admin.close()


def test_a_12_partition_topic_costs_what_it_holds(kafka_server, broker):
    """A topic an admin client makes with 12 partitions holds 64 KiB of /dev/shm a
    partition (776 MiB before), and grows with the records produced into it."""
    import os

    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from shmq.engine.shm.segment import namespace_entries

    def held():
        return sum(os.stat(f"/dev/shm/{e}").st_blocks * 512 for e in namespace_entries(broker.namespace)
                   if ".s.wide" in e)

    srv = kafka_server()
    admin = KafkaAdminClient(bootstrap_servers=srv.bootstrap)
    try:
        admin.create_topics([NewTopic("wide", num_partitions=12, replication_factor=1)])
    finally:
        admin.close()
    empty = held()
    assert empty < 2 * 2**20  # the groups' table (396 KiB) and 12 x 64 KiB
    producer = KafkaProducer(bootstrap_servers=srv.bootstrap, linger_ms=5)
    for i in range(12_000):
        producer.send("wide", b"v" * 1000, key=b"%d" % i)
    producer.flush()
    producer.close()
    assert empty + 12 * 2**20 < held() < empty + 16 * 2**20  # 12,000 records of 1 KB


def test_list_offsets_earliest_latest_and_by_time(kafka_server, broker):
    from kafka import KafkaConsumer, TopicPartition

    srv = kafka_server()
    s = broker.create_stream("lo", partitions=1)
    first = [s.append(b"a%d" % i) for i in range(3)]
    cut = wait_for(lambda: (t := time.time()) > first[-1].timestamp + 0.002 and t, 5, "the clock to move")
    later = [s.append(b"b%d" % i) for i in range(2)]
    c = KafkaConsumer(bootstrap_servers=srv.bootstrap)
    try:
        tp = TopicPartition("lo", 0)
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 5}
        found = c.offsets_for_times({tp: int(cut * 1000)})[tp]
        assert (found.offset, found.timestamp) == (3, int(later[0].timestamp * 1000))
        assert c.offsets_for_times({tp: int(time.time() * 1000) + 60_000}) == {tp: None}
    finally:
        c.close()


def test_a_waiting_fetch_is_woken_by_a_native_append(kafka_server, broker):
    from kafka import KafkaConsumer, TopicPartition

    srv = kafka_server()
    s = broker.create_stream("lp", partitions=1)
    c = KafkaConsumer(bootstrap_servers=srv.bootstrap, fetch_max_wait_ms=60_000, request_timeout_ms=90_000,
                      enable_auto_commit=False)
    try:
        tp = TopicPartition("lp", 0)
        c.assign([tp])
        c.seek(tp, 0)
        assert c.poll(timeout_ms=500) == {}  # a fetch now waits in the listener (up to a minute)
        started = time.monotonic()
        s.append(b"wake")
        got = wait_for(lambda: c.poll(timeout_ms=500).get(tp), 30, "the record")
        assert [m.value for m in got] == [b"wake"]
        assert time.monotonic() - started < 30  # woken, not answered at the one-minute deadline
    finally:
        c.close()


def test_server_status_names_the_kafka_port(kafka_server, broker):
    from click.testing import CliRunner

    from shmq.cli import main

    srv = kafka_server()
    out = CliRunner().invoke(main, ["namespace", "list"]).output
    assert f"kafka 127.0.0.1:{srv.port}" in out, out
    listed = CliRunner().invoke(main, ["namespace", "list", "--json"]).output
    assert f"\"kafka_port\": {srv.port}" in listed
