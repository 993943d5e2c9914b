"""A server that persists (``--data-dir``) keeps the Kafka listener's memory over a clean
restart: the idempotent producers' sequence numbers (a retry after the restart is still
answered once, the next batch taken) and the commit metadata; a server that dies keeps
nothing stale."""

import datetime
import json
import os
import stat

import pytest
from kio.schema.errors import ErrorCode as E

from shmq.kafka.records import Record, encode_batch
from tests.kafka.conftest import KafkaServer
from tests.kafka.groups_wire import Wire, produce
from tests.kafka.test_groups import commit, fetch

pytestmark = pytest.mark.slow

INIT_PRODUCER_ID = 22


def _batch(pid, epoch, first, n):
    return encode_batch([Record(i, 1_600_000_000_000, None, b"r%d" % (first + i), ()) for i in range(n)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=first)


def _produce(w, batch):
    part = produce(w, "ev", batch, acks=-1)
    return part.error_code, part.base_offset


def _values(broker):
    return [r.value for r in broker.stream("ev").read(0, 0, 100)]


def test_sequences_and_commit_metadata_survive_a_clean_restart(broker, servers, tmp_path):
    data = str(tmp_path / "data")
    start = lambda: KafkaServer(servers(broker.namespace, "--data-dir", data, "--no-auth",  # noqa: E731
                                        "--kafka-port", "0", "--kafka-initial-rebalance-delay-ms", "0"))
    srv = start()
    with Wire(srv.port) as w:
        r = w.call(INIT_PRODUCER_ID, 4, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                   producer_id=-1, producer_epoch=-1)
        pid, epoch = r.producer_id, r.producer_epoch
        first = _batch(pid, epoch, 0, 5)
        assert _produce(w, first) == (E.none, 0)
        assert commit(w, -1, "", {0: 3}, topic="ev", metadata="kept over restarts") == {0: E.none}
        assert commit(w, -1, "", {0: -2}, group="h", topic="ev") == {0: E.none}  # a negative one: kept here alone
    assert srv.stop() == 0
    path = os.path.join(data, "kafka-state.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        kept = json.load(f)
    assert (len(kept["sequences"]), kept["metadata"]) == (1, [["g", "ev", 0, 3, "kept over restarts", -1],
                                                              ["h", "ev", 0, -2, "", -1]])

    srv = start()
    assert "1 producer partition(s), 2 commit metadata" in "".join(x for x in srv.proc.log if "taken back" in x)
    assert not os.path.exists(path)  # taken: a crash from now on leaves nothing stale
    with Wire(srv.port) as w:
        assert _produce(w, first) == (E.none, 0)  # a retry of the batch before the restart: appended once
        assert _produce(w, _batch(pid, epoch, 5, 3)) == (E.none, 5)  # the next sequence: taken
        assert fetch(w, topic="ev", partitions=(0,)) == {0: (3, "kept over restarts")}
        assert fetch(w, group="h", topic="ev", partitions=(0,)) == {0: (-2, "")}
    assert _values(broker) == [b"r%d" % i for i in range(8)]

    srv.proc.proc.kill()  # dies: keeps nothing
    srv.proc.proc.wait(30)
    assert not os.path.exists(path)
    srv = start()
    with Wire(srv.port) as w:
        assert _produce(w, _batch(pid, epoch, 8, 1))[0] == E.unknown_producer_id  # the client starts a new epoch
        assert fetch(w, topic="ev", partitions=(0,)) == {0: (3, "")}  # the offset is the stream's: it stays
    assert srv.stop() == 0


def test_a_backup_keeps_the_commit_metadata_and_no_sequences(broker, servers, tmp_path):
    """``shmq backup`` asks the server, which adds its listener's commit metadata; a server
    started from the backup serves the topic, the group's offset and its metadata, and
    takes no producer sequences (they could be older than the records: a new epoch)."""
    import uuid

    from shmq.engine.shm.segment import destroy_namespace
    from tests.test_cli import shmq_cli

    srv = KafkaServer(servers(broker.namespace, "--data-dir", str(tmp_path / "data"), "--no-auth", "--kafka-port",
                              "0", "--kafka-initial-rebalance-delay-ms", "0"))
    with Wire(srv.port) as w:
        r = w.call(INIT_PRODUCER_ID, 4, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                   producer_id=-1, producer_epoch=-1)
        pid, epoch = r.producer_id, r.producer_epoch
        assert _produce(w, _batch(pid, epoch, 0, 5)) == (E.none, 0)
        assert commit(w, -1, "", {0: 3}, topic="ev", metadata="kept in the backup") == {0: E.none}
    dest = tmp_path / "backup"
    r = shmq_cli("backup", str(dest), "--namespace", broker.namespace, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["kafka_state"] is True, r.stderr
    with open(dest / "kafka-state.json") as f:
        kept = json.load(f)
    assert (kept["sequences"], kept["metadata"]) == ([], [["g", "ev", 0, 3, "kept in the backup", -1]])
    assert srv.stop() == 0
    other = "t" + uuid.uuid4().hex[:12]
    try:
        srv = KafkaServer(servers(other, "--data-dir", str(dest), "--no-auth", "--kafka-port", "0",
                                  "--kafka-initial-rebalance-delay-ms", "0"))
        with Wire(srv.port) as w:
            assert fetch(w, topic="ev", partitions=(0,)) == {0: (3, "kept in the backup")}
            assert _produce(w, _batch(pid, epoch, 5, 1))[0] == E.unknown_producer_id  # a new epoch, as after a crash
        assert srv.stop() == 0
    finally:
        destroy_namespace(other)


def test_a_damaged_state_file_is_set_aside(broker, servers, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "kafka-state.json").write_text('{"version": 1, "sequences": [["not", "a", "row"]], "metadata": []}')
    srv = KafkaServer(servers(broker.namespace, "--data-dir", str(data), "--no-auth", "--kafka-port", "0"))
    said = [x for x in srv.proc.log if "is not a Kafka state this server wrote" in x]
    assert len(said) == 1 and "moved to " + str(data / "kafka-state.json.damaged") in said[0], srv.proc.log
    assert sorted(p.name for p in data.iterdir() if p.name.startswith("kafka")) == ["kafka-state.json.damaged"]
    assert srv.stop() == 0


def test_the_state_files_are_shmqs_for_namespace_destroy(tmp_path):
    from shmq.persistence.files import remove_data_dir

    for name in ("kafka-state.json", "kafka-state.json.damaged", "kafka-state.json.4242.tmp", "notes.json",
                 "kafka-txns.log", "kafka-txns.log.damaged", "kafka-txns.log.77.tmp", "kafka-txns.logs"):
        (tmp_path / name).write_text("{}")
    assert remove_data_dir(str(tmp_path)) == (6, ["kafka-txns.logs", "notes.json"])
