"""Exchanges across a reboot: the snapshot loop writes the exchange table (exchanges.dmsx,
dmsq.write_exchanges) when it changes, recovery puts it back when shared memory has none,
a damaged file is moved aside and said in one line while the rest is restored, and a
data dir without the file (an older one) means no exchanges."""

import os
import stat

import pytest

import shmq
from shmq.formats import dmsq
from shmq.persistence import Snapshotter, recover
from tests._wait import drain as _drain


def _bindings(b, name):
    return sorted((x["target"], x["kind"], x["pattern"]) for x in b.exchange_info(name)["bindings"])


# ---------------------------------------------------------------- the file
TABLE = {"orders": {"type": "topic", "bindings": [["q", "eu", "orders.eu.*"], ["s", "history", "#"]]},
         "all": {"type": "fanout", "bindings": []}}


def test_the_file_round_trips_owner_only(tmp_path):
    path = tmp_path / dmsq.EXCHANGES_FILE
    dmsq.write_exchanges(path, TABLE)
    assert dmsq.read_exchanges(path) == TABLE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(tmp_path) == [dmsq.EXCHANGES_FILE]  # no .tmp left


@pytest.mark.parametrize("damage,error", [
    (lambda raw: raw[:-1], "does not fit"),
    (lambda raw: raw[:10], "too short"),
    (lambda raw: b"PNG!" + raw[4:], "bad magic"),
    (lambda raw: raw[:4] + b"\x09\x00" + raw[6:], "unsupported version 9"),
    (lambda raw: raw[:20] + bytes([raw[20] ^ 1]) + raw[21:], "checksum mismatch"),
])
def test_a_damaged_file_is_a_value_error_naming_it(tmp_path, damage, error):
    path = str(tmp_path / dmsq.EXCHANGES_FILE)
    dmsq.write_exchanges(path, TABLE)
    with open(path, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(damage(raw))
    with pytest.raises(ValueError, match=f"^{path}: damaged exchange table: .*{error}"):
        dmsq.read_exchanges(path)


def test_a_table_of_the_wrong_shape_is_refused(tmp_path):
    path = str(tmp_path / dmsq.EXCHANGES_FILE)
    dmsq.write_exchanges(path, {"x": {"type": "fanout", "bindings": [["z", "q", "#"]]}})  # kind "z"
    with pytest.raises(ValueError, match="exchange 'x': damaged bindings"):
        dmsq.read_exchanges(path)


# ---------------------------------------------------------------- the snapshot loop and recovery
def test_snapshots_write_the_table_when_it_changes_and_no_file_without_exchanges(broker, tmp_path):
    data = str(tmp_path)
    broker.create_queue("eu")
    snap = Snapshotter(broker, data)
    try:
        snap.run_once()
        assert sorted(os.listdir(data)) == ["disk-reserve", "eu.dmsq"]  # no exchanges: no file (as in older data dirs)
        broker.create_exchange("orders", type="topic")
        broker.bind("orders", "eu", "orders.eu.*")
        snap.run_once()
        path = os.path.join(data, dmsq.EXCHANGES_FILE)
        assert dmsq.read_exchanges(path) == {"orders": {"type": "topic", "bindings": [["q", "eu", "orders.eu.*"]]}}
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        written = os.stat(path).st_mtime_ns, os.stat(path).st_ino
        snap.run_once()  # unchanged: not written again (and not removed by the clean-up)
        assert (os.stat(path).st_mtime_ns, os.stat(path).st_ino) == written
        broker.delete_exchange("orders")
        snap.run_once()
        assert sorted(os.listdir(data)) == ["disk-reserve", "eu.dmsq"]  # the last exchange went: so did the file
    finally:
        snap.close()


def test_recovery_restores_only_when_memory_has_no_table(broker, tmp_path):
    data = str(tmp_path)
    assert recover(broker, data) == [] and broker.list_exchanges() == []  # no file: no exchanges
    assert not broker.exchange_table().exists()  # and no table made for nothing
    dmsq.write_exchanges(os.path.join(data, dmsq.EXCHANGES_FILE), TABLE)
    broker.create_exchange("newer")  # shared memory has a table: it is newer than the file
    recover(broker, data)
    assert broker.list_exchanges() == ["newer"]
    broker.delete_exchange("newer")


# ---------------------------------------------------------------- a server across a reboot
def test_exchanges_and_bindings_survive_a_server_reboot(namespace, servers, tmp_path):
    data = str(tmp_path / "data")
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(srv.url) as b:
        b.create_queue("eu")
        b.create_queue("scratch", durability="memory")  # not rebuilt: its binding is dropped
        b.create_stream("history", partitions=1)
        b.create_exchange("orders", type="topic")
        b.bind("orders", "eu", "orders.eu.*")
        b.bind("orders", "history", "#")
        b.bind("orders", "scratch", "orders.#")
        b.create_exchange("everyone", type="fanout")
        b.bind("everyone", "eu")
        assert b.publish("orders", b"before", routing_key="orders.eu.new") == 3
    assert srv.stop() == 0  # a clean stop writes a last snapshot
    path = os.path.join(data, dmsq.EXCHANGES_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert shmq.destroy_namespace(namespace) > 0  # the reboot: shared memory is gone

    srv = servers(namespace, "--data-dir", data)
    assert any("exchanges restored from" in line and "2 exchange(s), 3 binding(s) (1 to queues or streams "
               "not there dropped)" in line for line in srv.log), srv.log
    with shmq.connect(srv.url) as b:
        assert b.list_exchanges() == ["everyone", "orders"]
        assert b.exchange_info("orders")["type"] == "topic"
        assert _bindings(b, "orders") == [("eu", "queue", "orders.eu.*"), ("history", "stream", "#")]
        assert _bindings(b, "everyone") == [("eu", "queue", "#")]
        assert b.publish("orders", b"after", routing_key="orders.eu.paid") == 2
        assert b.publish("orders", b"us", routing_key="orders.us.paid") == 1  # the stream only
        assert b.publish("everyone", b"all") == 1
        assert _drain(b.queue("eu")) == [b"before", b"after", b"all"]
        assert [r.value for r in b.stream("history").read(0, 0, 100)] == [b"before", b"after", b"us"]
    assert srv.stop() == 0


def test_a_damaged_exchange_file_is_said_and_the_rest_restored(namespace, servers, tmp_path):
    data = str(tmp_path / "data")
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(srv.url) as b:
        b.create_queue("eu").put(b"kept")
        b.create_exchange("orders", type="topic")
        b.bind("orders", "eu", "#")
    assert srv.stop() == 0
    path = os.path.join(data, dmsq.EXCHANGES_FILE)
    with open(path, "r+b") as f:  # one byte of the table flipped
        f.seek(14)
        byte = f.read(1)
        f.seek(14)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert shmq.destroy_namespace(namespace) > 0

    srv = servers(namespace, "--data-dir", data)
    (line,) = [x for x in srv.log if "exchange table" in x]
    assert " ERROR " in line and line.count("\n") == 1
    assert f"{path}: damaged exchange table: checksum mismatch; no exchanges restored; file moved to " \
           f"{path}.corrupt" in line
    assert os.path.exists(path + ".corrupt")
    with shmq.connect(srv.url) as b:
        assert b.list_exchanges() == []
        assert _drain(b.queue("eu")) == [b"kept"]  # the queue was rebuilt all the same
    assert srv.stop() == 0
    assert os.path.exists(path + ".corrupt")  # the clean-up of the snapshot loop left it
