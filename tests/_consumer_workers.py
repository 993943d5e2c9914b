"""Worker processes of tests/test_stream_consumer_api.py (spawned: importable top-level functions)."""

import shmq


def _broker(where):
    return shmq.connect(where) if where.startswith("tcp://") else shmq.connect(namespace=where)


def stalling_member(where, stream, group, out, go):
    """Join ``group`` with max_poll_interval=1, poll until it owns partitions, tell ``out``
    what it owns, stop polling until ``go``, then poll once more and tell the callbacks
    it heard and what it owns then."""
    broker = _broker(where)
    heard = []
    c = broker.stream(stream).consumer(group, max_poll_interval=1.0, on_assign=lambda ps: heard.append(["assign", ps]),
                                       on_revoke=lambda ps: heard.append(["revoke", ps]))
    while not heard:
        c.poll(max_records=1, timeout=1.0)  # commits nothing: what it read is read again by its successor
    out.put(["owned", c.assignment()])
    go.wait(60)  # stalled: no poll for longer than max_poll_interval
    c.poll(timeout=0.5)
    out.put(["after", heard, c.assignment()])
    c.close()
    broker.close()
