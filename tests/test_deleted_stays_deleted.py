"""Deleted means deleted: a queue or stream deleted while its server is stopped does not
come back at the server's next start (the registry in /dev/shm is the one the server last
ran on: what it no longer lists was deleted, and its files go), while after a reboot (a
registry made anew) every file is rebuilt, and a half-removed one (listed, its memory
gone) is rebuilt from its files."""

import os

import shmq
from shmq.engine.shm.names import queue_segment, stream_base
from shmq.engine.shm.segment import SHM_DIR
from tests.test_cli import shmq_cli


def _files(data_dir, name):
    return sorted(f for f in os.listdir(data_dir) if f.split(".")[0].split("#")[0] == name)


def test_a_queue_and_a_stream_deleted_while_the_server_is_stopped_stay_deleted(broker, servers, tmp_path):
    data = str(tmp_path)
    srv = servers(broker.namespace, "--data-dir", data)
    ns = ("--namespace", broker.namespace)
    assert shmq_cli("create", "zz", *ns).returncode == 0
    assert shmq_cli("produce", "zz", "-m", "one", *ns).returncode == 0
    broker.create_queue("kept").put(b"two")
    broker.create_stream("st", partitions=1, durability="wal").append(b"three")
    assert srv.stop() == 0
    assert _files(data, "zz") and _files(data, "@st")
    assert shmq_cli("delete", "zz", *ns).returncode == 0
    broker.delete_stream("st")
    srv = servers(broker.namespace, "--data-dir", data)
    assert any("queue zz was deleted while the server was stopped" in line for line in srv.log), srv.log
    assert broker.list_queues() == ["kept"] and broker.list_streams() == []
    assert _files(data, "zz") == [] and _files(data, "@st") == []
    r = shmq_cli("consume", "zz", *ns)
    assert r.returncode == 1 and "no queue 'zz'" in r.stderr
    assert broker.queue("kept").get(timeout=5).body == b"two"
    assert srv.stop() == 0


def test_after_a_reboot_every_file_is_rebuilt(namespace, servers, tmp_path):
    data = str(tmp_path)
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(namespace=namespace) as b:
        b.create_queue("zz").put(b"one")
    assert srv.stop() == 0
    shmq.destroy_namespace(namespace)  # the reboot: memory gone, registry with it
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(namespace=namespace) as b:
        assert b.list_queues() == ["zz"] and b.queue("zz").get(timeout=5).body == b"one"
    assert srv.stop() == 0


def test_a_half_removed_queue_and_stream_are_rebuilt_from_their_files(broker, servers, tmp_path):
    data = str(tmp_path)
    srv = servers(broker.namespace, "--data-dir", data)
    broker.create_queue("jobs").put_many([b"%d" % i for i in range(100)])
    broker.create_stream("ev", partitions=1).append_many([b"a", b"b"])
    assert srv.stop() == 0
    os.unlink(os.path.join(SHM_DIR, queue_segment(broker.namespace, "jobs").lstrip("/")))
    os.unlink(os.path.join(SHM_DIR, stream_base(broker.namespace, "ev").lstrip("/")))
    srv = servers(broker.namespace, "--data-dir", data)
    assert any("queue jobs was half removed" in line for line in srv.log), srv.log
    q = broker.queue("jobs")
    assert sorted(d.body for d in q.get_many(200, timeout=5)) == sorted(b"%d" % i for i in range(100))
    assert [r.value for r in broker.stream("ev").read(0, 0, 10)] == [b"a", b"b"]
    assert srv.stop() == 0
