"""A Kafka consumer in its own process, for the group tests: ``python -m
tests.kafka.groups_member LIB PORT TOPIC GROUP`` (LIB: kafka-python or confluent).

It polls, "processes" each batch by printing it, then commits the batch synchronously
(the next offset of each partition in it), and prints what it did, one JSON object a
line: {"assigned": [partition, ...]} at each assignment, {"got": [[p, offset, value],
...]}, {"committed": {p: offset}} or {"commit_failed": why}. SIGUSR1: from then on it
commits nothing (a consumer stuck before its commit). SIGTERM: it closes (leaves the
group) and exits 0. A SIGKILL leaves whatever it printed and did not commit."""

import json
import signal
import sys

SESSION_MS, HEARTBEAT_MS, MAX_POLL_MS = 6000, 1000, 10000
stop = hold = False


def say(**what):
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


def on_term(*_):
    global stop
    stop = True


def on_usr1(*_):
    global hold
    hold = True


def kafka_python(port, topic, group):
    from kafka import ConsumerRebalanceListener
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            say(assigned=sorted(tp.partition for tp in assigned))

    from tests.kafka.clients import kafka_python_subscribed

    c = kafka_python_subscribed([topic], Listener(), bootstrap_servers=f"127.0.0.1:{port}", group_id=group,
                                client_id="kp", auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                max_poll_interval_ms=MAX_POLL_MS)
    while not stop:
        batch = [r for rs in c.poll(timeout_ms=200).values() for r in rs]
        if not batch:
            continue
        say(got=[[r.partition, r.offset, r.value.decode()] for r in batch])
        ends = {}
        for r in batch:
            ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
        if hold:
            continue
        try:
            c.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in ends.items()})
            say(committed=ends)
        except KafkaError as e:
            say(commit_failed=repr(e))
    c.close()


def confluent(port, topic, group):
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": group, "client.id": "ck",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "session.timeout.ms": SESSION_MS,
                  "heartbeat.interval.ms": HEARTBEAT_MS, "max.poll.interval.ms": MAX_POLL_MS})
    c.subscribe([topic], on_assign=lambda _c, parts: say(assigned=sorted(tp.partition for tp in parts)))
    while not stop:
        batch = [m for m in c.consume(num_messages=100, timeout=0.2) if m.error() is None]
        if not batch:
            continue
        say(got=[[m.partition(), m.offset(), m.value().decode()] for m in batch])
        ends = {}
        for m in batch:
            ends[m.partition()] = max(ends.get(m.partition(), 0), m.offset() + 1)
        if hold:
            continue
        try:
            c.commit(offsets=[TopicPartition(topic, p, o) for p, o in ends.items()], asynchronous=False)
            say(committed=ends)
        except KafkaException as e:
            say(commit_failed=repr(e))
    c.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    lib, port, topic, group = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    {"kafka-python": kafka_python, "confluent": confluent}[lib](port, topic, group)
    say(closed=True)
