"""The transaction coordinator at the wire against a model (a Hypothesis state machine):
producers of two transactional ids (each re-initialized at random, fencing the one before)
and a plain producer write to two partitions; transactions commit and abort; after every
step a read_committed Fetch, filtered as a client filters it (Kafka's aborted list and
markers), a read_uncommitted one, the last stable offset and a native reader agree with
what the model says each sees."""

import datetime
import uuid

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode as E

import shmq
from shmq.kafka.records import CONTROL, TRANSACTIONAL, Record, decode_batches, encode_batch
from tests.kafka.groups_wire import Wire, fetch_records

MINUTE = datetime.timedelta(seconds=60)
PARTS = 2
IDS = ("a", "b")


def _client_view(part) -> list:
    """What a read_committed client keeps of a Fetch: the records of its batches, less the
    aborted transactions' (from the producer's first offset to its ABORT marker) and the
    control batches."""
    aborted = {}  # producer id -> first offsets of its aborted transactions not yet ended
    for a in part.aborted_transactions or ():
        aborted.setdefault(a.producer_id, []).append(a.first_offset)
    out = []
    for b in decode_batches(part.records or b"", 2**24):
        if b.attributes & CONTROL:
            if b.keys[0] == b"\0\0\0\0" and aborted.get(b.producer_id):
                aborted[b.producer_id].pop(0)
            continue
        firsts = aborted.get(b.producer_id) if b.attributes & TRANSACTIONAL else None
        if firsts and b.base_offset >= firsts[0]:
            continue
        out += [(r.offset, r.value) for r in b.records]
    return out


class Coordinator(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        srv = Coordinator.server
        self.w = Wire(srv.port)
        self.topic = "m" + uuid.uuid4().hex[:10]
        self.stream = Coordinator.broker.create_stream(self.topic, partitions=PARTS)
        self.txn_ids = {t: f"{self.topic}-{t}" for t in IDS}
        self.producers = {}  # id -> (pid, epoch, {partition: next sequence}, {partitions added}, open)
        self.parts = [[] for _ in range(PARTS)]  # per partition: [offset] -> [value, state]
        self.pending = {t: [] for t in IDS}  # (partition, offset) of the open transaction's records and markers
        self.n = 0

    def teardown(self):
        self.w.close()
        self.stream.close()
        Coordinator.broker.delete_stream(self.topic)

    def _append(self, p, value, state):
        self.parts[p].append([value, state])
        return len(self.parts[p]) - 1

    @rule(t=st.sampled_from(IDS))
    def init(self, t):
        r = self.w.call(22, 4, transactional_id=self.txn_ids[t], transaction_timeout=MINUTE, producer_id=-1,
                        producer_epoch=-1)
        assert r.error_code == E.none
        old = self.producers.get(t)
        if old is not None and old[4]:  # its open transaction: aborted, a marker in each partition it took
            self._end(t, False)
        self.producers[t] = (r.producer_id, r.producer_epoch, {}, set(), False)

    @precondition(lambda self: self.producers)
    @rule(data=st.data(), p=st.integers(0, PARTS - 1))
    def add(self, data, p):
        t = data.draw(st.sampled_from(sorted(self.producers)))
        pid, epoch, seqs, added, _open = self.producers[t]
        r = self.w.call(24, 3, v3_and_below_transactional_id=self.txn_ids[t], v3_and_below_producer_id=pid,
                        v3_and_below_producer_epoch=epoch,
                        v3_and_below_topics=[{"name": self.topic, "partitions": [p]}])
        assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == E.none
        added.add(p)
        self.producers[t] = (pid, epoch, seqs, added, True)

    @precondition(lambda self: self.producers)
    @rule(data=st.data(), p=st.integers(0, PARTS - 1), k=st.integers(1, 3))
    def produce(self, data, p, k):
        t = data.draw(st.sampled_from(sorted(self.producers)))
        pid, epoch, seqs, added, is_open = self.producers[t]
        seq = seqs.get(p, 0)
        values = []
        for _ in range(k):
            self.n += 1
            values.append(b"%s%d" % (t.encode(), self.n))
        batch = encode_batch([Record(i, 1_600_000_000_000, None, v, ()) for i, v in enumerate(values)],
                             producer_id=pid, producer_epoch=epoch, base_sequence=seq, attributes=TRANSACTIONAL)
        r = self.w.call(0, 9, transactional_id=self.txn_ids[t], acks=-1, timeout=MINUTE, topic_data=[
            {"name": self.topic, "partition_data": [{"index": p, "records": batch}]}])
        code = r.responses[0].partition_responses[0].error_code
        if p not in added:
            assert code == E.invalid_txn_state
            return
        assert code == E.none
        seqs[p] = seq + k
        for v in values:
            self.pending[t].append((p, self._append(p, v, "open")))

    @rule(p=st.integers(0, PARTS - 1))
    def plain(self, p):
        self.n += 1
        self._append(p, b"plain%d" % self.n, "visible")
        assert self.stream.append(b"plain%d" % self.n, partition=p).offset == len(self.parts[p]) - 1

    @precondition(lambda self: any(v[4] for v in self.producers.values()))
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data, commit):
        t = data.draw(st.sampled_from(sorted(t for t, v in self.producers.items() if v[4])))
        pid, epoch, seqs, added, _open = self.producers[t]
        r = self.w.call(26, 3, transactional_id=self.txn_ids[t], producer_id=pid, producer_epoch=epoch,
                        committed=commit)
        assert r.error_code == E.none
        self._end(t, commit)
        self.producers[t] = (pid, epoch, seqs, set(), False)

    def _end(self, t, commit):
        for p, o in self.pending[t]:
            self.parts[p][o][1] = "visible" if commit else "aborted"
        self.pending[t] = []
        for p in sorted(self.producers[t][3], key=lambda q: q):  # (the partitions in the order it added them)
            self._append(p, None, "marker")

    @invariant()
    def readers_agree(self):
        for p in range(PARTS):
            recs = self.parts[p]
            first_open = min((o for o, (_v, s) in enumerate(recs) if s == "open"), default=len(recs))
            committed = [(o, v) for o, (v, s) in enumerate(recs[:first_open]) if s == "visible"]
            stored = [v for v, s in recs if s != "marker"]
            part = fetch_records(self.w, self.topic, 0, 2**24, 1, p)
            assert (part.high_watermark, part.last_stable_offset) == (len(recs), first_open)
            assert _client_view(part) == committed
            raw = fetch_records(self.w, self.topic, 0, 2**24, 0, p)
            assert [r.value for b in decode_batches(raw.records or b"", 2**24) if not b.attributes & CONTROL
                    for r in b.records] == stored
            assert [(r.offset, r.value) for r in self.stream.read(p, 0, 10_000)] == committed
            assert self.stream.stable(p) == first_open


def test_the_coordinator_against_a_model(shared_kafka):
    Coordinator.server = shared_kafka
    Coordinator.broker = shared_kafka.broker
    machine = Coordinator.TestCase
    machine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
    machine().runTest()
