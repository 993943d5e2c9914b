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

__all__ = ["kafka_python_subscribed"]


def kafka_python_subscribed(topics, listener=None, **config):
    """A kafka-python ``KafkaConsumer`` of ``config``, subscribed to ``topics`` (with the
    rebalance ``listener``), that has their metadata before its first poll joins."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(**config)
    c.subscribe(topics, listener=listener)
    c.topics()  # a blocking metadata fetch: the coordinator's snapshot of the subscription is whole
    return c
