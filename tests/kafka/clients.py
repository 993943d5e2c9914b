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
