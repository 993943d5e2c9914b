"""The transaction coordinator's parts without a server: the journal file
(``persistence/kafka_txns.py``: written whole or not at all, a torn last line dropped, a
damaged one refused) and a partition's transaction index (``server/transactions/index.py``:
the last stable offset, the aborted transactions a range overlaps, the spans a fetch
encodes), against a model in a Hypothesis state machine; and a server that finds a
damaged journal."""

import os
import stat

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shmq.persistence.kafka_txns import Journal, read_journal
from shmq.server.transactions.index import ABORT_MARKER, COMMIT_MARKER, DATA, PartitionTxns
from tests.kafka.conftest import KafkaServer


def test_the_journal_appends_whole_lines_and_drops_a_torn_one(tmp_path):
    path = str(tmp_path / "kafka-txns.log")
    j = Journal(path, [["txn", "t", 1, 0, 60000, "Empty", 0]])
    j.write(["add", "t", "ev", 1.5, 0, 7])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_journal(path) == [["txn", "t", 1, 0, 60000, "Empty", 0], ["add", "t", "ev", 1.5, 0, 7]]
    with open(path, "ab") as f:  # a process killed in the middle of a write
        f.write(b'["batch", 1, 0, "ev"')
    assert read_journal(path)[-1] == ["add", "t", "ev", 1.5, 0, 7]
    j.rewrite([["txn", "t", 1, 1, 60000, "CompleteAbort", 5]])
    j.write(["group", "t", "g"])
    j.close()
    assert read_journal(path) == [["txn", "t", 1, 1, 60000, "CompleteAbort", 5], ["group", "t", "g"]]
    assert sorted(os.listdir(tmp_path)) == ["kafka-txns.log"]  # no temp file left


@pytest.mark.parametrize("text", ['["version", 2]\n', '{"a": 1}\n', '["version", 1]\n[]\n', 'no json\n'])
def test_a_journal_not_of_this_version_or_shape_is_refused(tmp_path, text):
    (tmp_path / "kafka-txns.log").write_text(text)
    with pytest.raises(ValueError):
        read_journal(str(tmp_path / "kafka-txns.log"))


def test_no_journal_reads_as_none(tmp_path):
    assert read_journal(str(tmp_path / "kafka-txns.log")) is None


def test_a_server_sets_a_damaged_journal_aside(broker, servers, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "kafka-txns.log").write_text('["version", 99]\n')
    srv = KafkaServer(servers(broker.namespace, "--data-dir", str(data), "--no-auth", "--kafka-port", "0"))
    said = [x for x in srv.proc.log if "is not a transaction journal this server wrote" in x]
    assert len(said) == 1 and "moved to " + str(data / "kafka-txns.log.damaged") in said[0], srv.proc.log
    assert srv.stop() == 0
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("kafka-txns")) == ["kafka-txns.log.damaged"]


def test_the_index_of_one_partition():
    t = PartitionTxns()
    assert not t and t.stable(10) == 10
    t.begin(7, 10)
    t.appended(7, 0, 10, 3)
    t.begin(8, 12)  # (another producer's transaction takes the partition in meanwhile)
    t.appended(8, 0, 13, 2)
    assert t.stable(15) == 10
    t.ended(7, 0, 15, commit=False)
    assert t.stable(16) == 12
    t.ended(8, 0, 16, commit=True)
    assert t.stable(17) == 17
    assert t.aborted_between(0, 17) == [(7, 10)]
    assert t.aborted_between(16, 17) == [] and t.aborted_between(0, 10) == []
    assert t.spans_in(11, 16) == [(10, 13, 7, 0, DATA), (13, 15, 8, 0, DATA), (15, 16, 7, 0, ABORT_MARKER)]
    assert PartitionTxns.restore(t.export(), 16).spans_in(0, 20)[-1] == (15, 16, 7, 0, ABORT_MARKER)
    t.trim(15)
    assert t.spans_in(0, 20) == [(15, 16, 7, 0, ABORT_MARKER), (16, 17, 8, 0, COMMIT_MARKER)]
    assert t.aborted_between(0, 20) == [(7, 10)]  # its marker is still there
    t.trim(16)
    assert t.aborted_between(0, 20) == []


class IndexMachine(RuleBasedStateMachine):
    """Producers open, write and end transactions on one partition whose offsets only
    grow; the index's facts against those of the records themselves."""

    def __init__(self):
        super().__init__()
        self.t = PartitionTxns()
        self.end = 0
        self.records = []  # (offset, pid or None, kind)
        self.open = {}  # pid -> first offset (the end when it was added)
        self.ended = {}  # pid -> [(first, marker, commit)]

    @rule(pid=st.integers(1, 4))
    def add(self, pid):
        if pid not in self.open:
            self.open[pid] = self.end
        self.t.begin(pid, self.end)

    @rule(pid=st.integers(1, 4), n=st.integers(1, 4))
    def write(self, pid, n):
        if pid in self.open:
            self.t.appended(pid, 0, self.end, n)
        for _ in range(n):
            self.records.append((self.end, pid if pid in self.open else None, DATA))
            self.end += 1

    @precondition(lambda self: self.open)
    @rule(data=st.data(), commit=st.booleans())
    def end_txn(self, data, commit):
        pid = data.draw(st.sampled_from(sorted(self.open)))
        self.t.ended(pid, 0, self.end, commit)
        self.ended.setdefault(pid, []).append((self.open.pop(pid), self.end, commit))
        self.records.append((self.end, pid, COMMIT_MARKER if commit else ABORT_MARKER))
        self.end += 1

    @invariant()
    def stable_offset(self):
        assert self.t.stable(self.end) == min(self.open.values(), default=self.end)

    @invariant()
    def aborted_and_spans(self):
        for lo in range(0, self.end + 1, 3):
            want = [(pid, first) for pid, runs in self.ended.items() for first, marker, commit in runs
                    if not commit and marker >= lo and first < self.end]
            assert sorted(self.t.aborted_between(lo, self.end)) == sorted(want)
        owner = {}
        for first, stop, pid, _epoch, kind in self.t.spans_in(0, self.end):
            for o in range(first, stop):
                owner[o] = (pid, kind)
        assert owner == {o: (pid, kind) for o, pid, kind in self.records if pid is not None}


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
