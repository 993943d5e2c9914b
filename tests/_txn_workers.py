"""A native consume-transform-produce loop in its own process, for the exactly-once tests of
tests/test_transactions.py: ``python -m tests._txn_workers NAMESPACE IN OUT GROUP TXN_ID N``.

It takes the transactional id (an open transaction of the id, a killed worker's, is
aborted), joins group GROUP of stream IN's single partition locally, and for each poll of
up to 7 records appends ``out-VALUE`` to stream OUT and commits the group's offsets in one
transaction. It prints one JSON object a line: {"ready": offset} once it owns the
partition, {"committed": offset} after each commit; it exits 0 once the group's offset is
N. A SIGKILL at any point leaves its transaction open: the next worker's init aborts it."""

import json
import sys

import shmq


def say(**what):
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


def main(namespace, stream_in, stream_out, group, txn_id, n):
    with shmq.connect(namespace=namespace) as b:
        producer = b.transactional(txn_id, timeout=30)
        with b.stream(stream_in).consumer(group) as c:
            recs = []
            while not recs and not c.assignment():
                recs = c.poll(max_records=7, timeout=1.0)
            offset = recs[0].offset if recs else c.position(0)
            say(ready=offset)
            while offset < n:
                if not recs:
                    recs = c.poll(max_records=7, timeout=1.0)
                    continue
                with producer.transaction():
                    producer.append_many(stream_out, [b"out-" + r.value for r in recs], partition=0)
                    producer.commit_offsets(c)
                offset = recs[-1].offset + 1
                say(committed=offset)
                recs = []
        producer.close()


if __name__ == "__main__":
    ns, s_in, s_out, grp, tid, count = sys.argv[1:]
    main(ns, s_in, s_out, grp, tid, int(count))
