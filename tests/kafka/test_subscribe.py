"""Each Kafka client subscribes with a group and consumes what was produced: kafka-python,
aiokafka, confluent-kafka and kcat's balanced consumer (``-G``). Every record comes
once, and the client's commits are the shmq group's offsets (``stream.committed``).
One server for the module (``shared_kafka``); each test has its own topic and group."""

import asyncio
import shutil
import subprocess
import time

import pytest

from tests.kafka.clients import kafka_python_subscribed

pytestmark = pytest.mark.slow

PARTS, PER_PART = 3, 10


def produced(srv, topic):
    """A stream of PARTS partitions with PER_PART records appended natively to each: the
    {(partition, offset): value} a consumer of it must see."""
    s = srv.broker.create_stream(topic, partitions=PARTS)
    try:
        for p in range(PARTS):
            s.append_many([b"%s %d.%d" % (topic.encode(), p, i) for i in range(PER_PART)], partition=p)
    finally:
        s.close()
    return {(p, i): b"%s %d.%d" % (topic.encode(), p, i) for p in range(PARTS) for i in range(PER_PART)}


def committed(srv, topic, group):
    s = srv.broker.stream(topic)
    try:
        return s.committed(group)
    finally:
        s.close()


EVERY_END = {p: PER_PART for p in range(PARTS)}


def test_kafka_python_subscribes_consumes_and_commits(shared_kafka, names):
    topic, group = names("t"), names("g")
    want = produced(shared_kafka, topic)
    c = kafka_python_subscribed([topic], bootstrap_servers=shared_kafka.bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=30_000)
    try:
        got = {}
        for r in c:
            assert (r.partition, r.offset) not in got
            got[(r.partition, r.offset)] = r.value
            if len(got) == len(want):
                break
        assert got == want
        c.commit()
        assert committed(shared_kafka, topic, group) == EVERY_END
    finally:
        c.close()


def test_aiokafka_subscribes_consumes_and_commits(shared_kafka, names):
    from aiokafka import AIOKafkaConsumer

    topic, group = names("t"), names("g")
    want = produced(shared_kafka, topic)

    async def consume():
        c = AIOKafkaConsumer(topic, bootstrap_servers=shared_kafka.bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            got = {}
            deadline = time.monotonic() + 60
            while len(got) < len(want) and time.monotonic() < deadline:
                for records in (await c.getmany(timeout_ms=1000)).values():
                    for r in records:
                        assert (r.partition, r.offset) not in got
                        got[(r.partition, r.offset)] = r.value
            await c.commit()
            return got
        finally:
            await c.stop()

    assert asyncio.run(consume()) == want
    assert committed(shared_kafka, topic, group) == EVERY_END


def test_confluent_kafka_subscribes_consumes_and_commits(shared_kafka, names):
    from confluent_kafka import Consumer

    topic, group = names("t"), names("g")
    want = produced(shared_kafka, topic)
    c = Consumer({"bootstrap.servers": shared_kafka.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        got = {}
        deadline = time.monotonic() + 60
        while len(got) < len(want) and time.monotonic() < deadline:
            for m in c.consume(num_messages=100, timeout=1.0):
                assert m.error() is None, m.error()
                assert (m.partition(), m.offset()) not in got
                got[(m.partition(), m.offset())] = m.value()
        assert got == want
        c.commit(asynchronous=False)
        assert committed(shared_kafka, topic, group) == EVERY_END
    finally:
        c.close()


def test_kcat_balanced_consumer_consumes_and_commits(shared_kafka, names):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    topic, group = names("t"), names("g")
    want = produced(shared_kafka, topic)
    out = subprocess.run(["kcat", "-b", shared_kafka.bootstrap, "-G", group, topic, "-o", "beginning",
                          "-c", str(len(want)), "-f", "%p %o %s\n", "-X", "enable.auto.commit=true",
                          "-X", "auto.commit.interval.ms=100"],
                         capture_output=True, timeout=90)
    assert out.returncode == 0, out.stderr.decode()
    got = [line.split(b" ", 2) for line in out.stdout.splitlines()]
    assert len(got) == len(want)
    assert {(int(p), int(o)): v for p, o, v in got} == want
    assert committed(shared_kafka, topic, group) == EVERY_END  # committed as it closed
