"""A consume-transform-produce loop in its own process, for the exactly-once tests:
``python -m tests.kafka.txn_worker PORT IN OUT GROUP TXN_ID N``.

A confluent-kafka consumer (read_committed, no auto commit) reads topic IN's partition 0
from its group's committed offset; for each batch of up to 7 records, a transactional
producer (``transactional.id`` TXN_ID) writes ``out-VALUE`` to OUT and commits the
group's offsets in the same transaction (``send_offsets_to_transaction``). It prints one
JSON object a line: {"ready": offset} once it knows where it starts, {"committed": offset}
after each commit; it exits 0 once the group's offset is N. A SIGKILL at any point leaves
the transaction it was in open: the next worker's ``init_transactions`` aborts it."""

import json
import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def say(**what):
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


def main(port, topic_in, topic_out, group, txn_id, n):
    bootstrap = f"127.0.0.1:{port}"
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1})
    p.init_transactions(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    tp = TopicPartition(topic_in, 0)
    (start,) = c.committed([tp], timeout=30)
    offset = start.offset if start.offset >= 0 else 0
    c.assign([TopicPartition(topic_in, 0, offset)])
    say(ready=offset)
    while offset < n:
        msgs = [m for m in c.consume(7, timeout=1.0) if m.error() is None]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(topic_out, value=b"out-" + m.value(), partition=0)
        offset = msgs[-1].offset() + 1
        p.send_offsets_to_transaction([TopicPartition(topic_in, 0, offset)], c.consumer_group_metadata(), 30)
        try:
            p.commit_transaction(30)
        except KafkaException as e:
            say(failed=str(e))
            raise
        say(committed=offset)
    c.close()


if __name__ == "__main__":
    port, tin, tout, group, tid, n = sys.argv[1:]
    main(int(port), tin, tout, group, tid, int(n))
