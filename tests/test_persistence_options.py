"""The work-queue options across snapshots and reboots (issue 13): a queue's settings
(priorities, TTL, dedup window, retry policy, priority aging) are saved in its snapshot
(format version 2) and a rebuilt queue has them; each message keeps its priority, expiry,
group and due time (the engine's extension block in its header bytes); version-1 files
are still read."""

import dataclasses
import time

import shmq
from shmq.formats import dmsq
from shmq.persistence import restore_file, snapshot_queue
from tests.test_server_tcp import ServerProcess, rebooted

OPTIONS = {"priorities": 3, "message_ttl": 3600.0, "dedup_window": 30.0, "retry_delay": 0.5, "retry_backoff": 2.0,
           "retry_delay_max": 10.0, "priority_aging": None}


def _options(settings):
    return {k: settings[k] for k in OPTIONS}


def test_a_snapshot_keeps_the_settings_and_a_restore_creates_the_queue_with_them(broker, tmp_path):
    q = broker.create_queue("q", **OPTIONS)
    q.put(b"low")
    q.put(b"high", priority=2, group="g", ttl=600)
    path, n = snapshot_queue(q, str(tmp_path))
    r = dmsq.read_snapshot(path)
    assert (r.header.version, n, r.complete) == (2, 2, True)
    assert _options(r.header.settings) == OPTIONS
    assert r.records[1].headers[0] == 0xC1  # the extension block, kept as the engine wrote it
    assert restore_file(broker, path, into="copy") == ("copy", 2, None)
    c = broker.queue("copy")
    assert _options(c.settings()) == OPTIONS
    d = c.get_nowait()
    assert (d.body, d.priority, d.group) == (b"high", 2, "g")  # first: its priority came back


def test_a_version_1_snapshot_restores_with_the_default_options(broker, tmp_path, monkeypatch):
    path = str(tmp_path / "old.dmsq")
    header = dmsq.SnapshotHeader("old", {"max_bytes": 1 << 20, "max_message_bytes": 1000, "visibility_timeout": 5.0,
                                         "max_deliveries": None, "dead_letter_queue": None, "durability": "snapshot"},
                                 1, 2, version=1)
    with monkeypatch.context() as m:  # a file of the shmq before the work-queue options
        m.setattr(dmsq, "FORMAT_VERSION", 1)
        dmsq.write_snapshot(path, header, [dmsq.SnapshotRecord(7, 1, 3, b"", b"kept")], fsync=False)
    assert restore_file(broker, path) == ("old", 1, None)
    q = broker.queue("old")
    defaults = broker.create_queue("fresh").settings()
    assert _options(q.settings()) == _options(defaults)
    assert (q.visibility_timeout, q.max_message_bytes) == (5.0, 1000)
    d = q.get_nowait()
    assert (d.id, d.body, d.attempt, d.priority, d.group) == (7, b"kept", 2, 0, None)


def test_a_reboot_keeps_settings_and_each_message_s_options(broker, tmp_path):
    data_dir = str(tmp_path / "data")
    srv = ServerProcess(broker.namespace, "--data-dir", data_dir, "--snapshot-interval", "0.05")
    with shmq.connect(srv.url) as remote:
        q = remote.create_queue("q", **OPTIONS)
        q.put(b"low")
        q.put(b"high", priority=2, group="g")
        q.put(b"high, same group", priority=2, group="g")
        q.put(b"mid", priority=1, ttl=3600)
        q.put(b"later", delay=3600)
        put_at = time.time()
        q.put(b"short-lived", ttl=0.5)
        remote.create_queue("tick")
    assert srv.stop() == 0  # a clean stop writes a last snapshot
    srv = rebooted(broker, data_dir)
    try:
        with shmq.connect(srv.url) as remote:
            q = remote.queue("q")
            assert _options(q.settings()) == OPTIONS
            s = q.stats()
            # "later" is still delayed (level 0 also has "short-lived", until it expires)
            assert (s.delayed, s.ready_by_priority[1:]) == (1, (1, 2))
            # wait (on a queue that stays empty) until "short-lived" has expired: its expiry came back too
            wait = put_at + 0.5 - time.time()
            if wait > 0:
                try:
                    remote.queue("tick").get(timeout=wait + 0.05)
                except shmq.QueueEmpty:
                    pass
            got = q.get_many(10, timeout=5)
            assert [(d.body, d.priority, d.group) for d in got] == [
                (b"high", 2, "g"), (b"mid", 1, None), (b"low", 0, None)]  # one of group g at a time
            assert q.stats().expired_total == 1
            q.ack_many(got)
            d = q.get(timeout=5)
            assert (d.body, d.group) == (b"high, same group", "g")
            d.ack()
            assert q.stats().delayed == 1
    finally:
        assert srv.stop() == 0
        broker.__init__(broker.namespace)  # the fixture's teardown uses it


def test_snapshot_header_settings_are_the_queue_s_own(broker, tmp_path):
    """Every setting ``settings()`` reports is in the file and goes back to create_queue."""
    q = broker.create_queue("q", **OPTIONS)
    path, _n = snapshot_queue(q, str(tmp_path))
    saved = dmsq.read_snapshot(path).header.settings
    assert {k: saved[k] for k in q.settings()} == q.settings()
    assert dataclasses.is_dataclass(q.stats())
