"""Where a transactional append the coordinator journaled but never noted went
(``server/transactions/intents.locate``), found in a real stream partition among other
appenders' records: its batch at the first unclaimed run that matches, or nothing."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmq.kafka.records import marker
from shmq.server.transactions.intents import DATA, MARK, digest, locate

values = st.lists(st.binary(max_size=6).map(lambda b: b"x" + b), max_size=6)  # another appender's
ours_ = st.lists(st.binary(max_size=6).map(lambda b: b"o" + b), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=values, others=values, decoy=st.booleans(), ours=st.none() | ours_, later=values,
       copies=st.booleans())
def test_a_batch_is_found_where_it_went_or_not_at_all(broker, before, others, decoy, ours, later, copies):
    """``before``: appended before the intent; ``others``: after it, before the batch
    (another producer's, with ``decoy``, a copy of the batch that a span claims: another
    transaction's); ``ours``: the batch, or None if its append never happened; ``later``:
    appended after it (with ``copies``, a copy of the batch, which comes after it)."""
    s = broker.create_stream("p", partitions=1)
    try:
        spans = []
        if before:
            s.append_many(before, partition=0)
        after = s.offsets(0)[1]
        body = ours or [b"o"]
        event = [DATA, 7, 0, "p", s.created_at, 0, after, len(body), digest(body)]
        if others:
            s.append_many(others, partition=0)
        if decoy:
            first = s.append_many(body, partition=0)[0].offset
            spans.append((first, first + len(body), 8, 0, 0))
        at = s.append_many(ours, partition=0)[0].offset if ours else None
        if later or copies:
            s.append_many(later + (body if copies and ours else []), partition=0)
        assert locate(s, 0, spans, event) == at
    finally:
        s.close()
        broker.delete_stream("p")


def test_a_marker_is_the_first_unclaimed_record_of_its_bytes(broker):
    s = broker.create_stream("m", partitions=1)
    try:
        k, v = marker(True)
        s.append_many([b"a"], partition=0)
        claimed = s.append_marker(0, k, v)  # another transaction's, noted
        s.append_many([b"b"], partition=0, keys=[k])  # a record with the key's bytes only
        mine = s.append_marker(0, k, v)
        event = [MARK, 7, 0, "m", s.created_at, 0, 0, True]
        assert locate(s, 0, [(claimed, claimed + 1, 8, 0, 2)], event) == mine
        assert locate(s, 0, [(claimed, claimed + 1, 8, 0, 2)], [MARK, 7, 0, "m", s.created_at, 0, 0, False]) is None
        assert locate(s, 0, [], [MARK, 7, 0, "m", s.created_at, 0, mine + 1, True]) is None  # (nothing after)
    finally:
        s.close()
        broker.delete_stream("m")
