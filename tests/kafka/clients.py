"""Kafka clients made the way the group tests need them.

Strategy: kafka-python 3.0.12 can lose a rebalance of its own. Its ``join_group_async``
loops while ``need_rejoin()`` is true, and a ``poll(timeout_ms=...)`` whose timer runs
out mid-join leaves the JoinGroup/SyncGroup task in flight for the next poll to finish.
But when the rejoin was asked for by a metadata change (a leader that assigned before
it had its topics' partitions: ``assignment_snapshot != metadata_snapshot``), the
leader's own assignment clears that condition while the task is in flight; the next
poll then finds nothing to rejoin and never awaits the task, so heartbeats stay off
(they are turned back on only when the join completes), the coordinator expels the
member after its session timeout, and the consumer keeps no partitions for good. (The
Java client loops on ``rejoinNeededOrPending()``: a join in flight is always finished.)
A consumer that joins before it has its topics' metadata always rejoins that way once
the metadata comes, and on a loaded machine a 100 ms poll often runs out meanwhile. So
ours fetch the metadata first: the first assignment is then complete and no rejoin is
asked for by metadata; the others come from the coordinator (REBALANCE_IN_PROGRESS),
which keeps ``need_rejoin()`` true until the join is done.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["kafka_python_subscribed", "Talker"]


class Talker:
    """``python -m MODULE ARGS`` in a process of its own, and what it said: one JSON object
    a line on its stdout, gathered by a thread (``said``)."""

    def __init__(self, module, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        self.said = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.said.append(json.loads(line))

    def stop(self) -> int:
        """SIGTERM, and its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        self._reader.join(10)
        return rc

    def kill(self):
        self.proc.kill()
        self.proc.wait(30)
        self._reader.join(10)


def kafka_python_subscribed(topics, listener=None, **config):
    """A kafka-python ``KafkaConsumer`` of ``config``, subscribed to ``topics`` (with the
    rebalance ``listener``), that has their metadata before its first poll joins."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(**config)
    c.subscribe(topics, listener=listener)
    c.topics()  # a blocking metadata fetch: the coordinator's snapshot of the subscription is whole
    return c


def read_all(bootstrap, topic, isolation, partition=0, keys=False):
    """[(offset, value)] (with ``keys``: [(offset, key, value)]) of a partition from its
    earliest offset to its end (the last stable offset for read_committed), read by a
    confluent-kafka consumer."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": isolation,
                  "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        got = []
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, f"no end of {topic} within 30 s: {got}"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                return got
            got.append((m.offset(), m.key(), m.value()) if keys else (m.offset(), m.value()))
    finally:
        c.close()


def through_sigkills(make, stop_ats, between=None):
    """Exactly-once workers (``make()``: a ``Talker`` with ``committed()``, the offset it
    last committed), one per point of ``stop_ats``, each SIGKILLed (with ``between()``
    first, if given) once it committed past that point, which it does not choose; then one
    to the end, which must exit 0."""
    from tests._wait import wait_for

    workers = []
    try:
        for stop_at in stop_ats:
            w = make()
            workers.append(w)
            wait_for(lambda: w.committed() >= stop_at or w.proc.poll() is not None, 120,
                     f"the worker committing past {stop_at}")
            assert w.proc.poll() is None, w.said
            if between is not None:
                between()
            w.kill()
        last = make()
        workers.append(last)
        assert last.proc.wait(180) == 0, last.said
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.kill()
