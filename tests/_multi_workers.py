"""Worker processes of tests/test_stream_multi_consumer.py (spawned: importable top-level functions)."""

import shmq


def reading_member(where, streams, group, want, out, go):
    """Join ``group`` on ``streams``, read ``want`` records (committing after each poll),
    tell ``out`` what it read and owns, then wait for ``go`` (the test kills it first)."""
    broker = shmq.connect(where) if where.startswith("tcp://") else shmq.connect(namespace=where)
    c = broker.consumer(group, streams=streams)
    read = []
    while len(read) < want:
        got = c.poll(max_records=want - len(read), timeout=1.0)
        read += [[r.stream, r.partition, r.offset] for r in got]
        if got:
            c.commit()
    out.put([read, [list(tp) for tp in c.assignment()]])
    go.wait(60)
    c.close()
    broker.close()
