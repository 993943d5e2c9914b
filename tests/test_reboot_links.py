"""Links between objects across a reboot, whatever the order of their names: a queue's
dead-letter queue (``jobs`` -> ``jobs.dlq``, which sorts after it) and an exchange's
bindings come back through the server's rebuild and through ``shmq restore``; a link
whose target is nowhere after everything is rebuilt is a warning naming both."""

import logging
import os

import pytest

import shmq
from shmq.formats import dmsq
from shmq.persistence import recover, restore_file, snapshot_queue
from tests._wait import drain
from tests.test_cli import shmq_cli

LINKS = {"jobs": "jobs.dlq", "b.main": "a.dlq"}  # the first DLQ sorts after its queue, the second before


def _build(b):
    """Queues linked to their dead-letter queues, an exchange bound to a queue that sorts
    after it, and a message waiting in ``jobs``."""
    for queue, dlq in LINKS.items():
        b.create_queue(dlq)
        b.create_queue(queue, max_deliveries=3, dead_letter_queue=dlq)
    b.create_queue("zz.audit")
    b.create_exchange("alerts", type="fanout")
    b.bind("alerts", "zz.audit")
    b.queue("jobs").put(b"job 1")


def _check(b, exchanges=True):
    """Every link is back: a reject() in ``jobs`` lands in ``jobs.dlq``; a publish to
    ``alerts`` lands in ``zz.audit``."""
    assert {q: b.queue(q).settings()["dead_letter_queue"] for q in LINKS} == LINKS
    d = b.queue("jobs").get(timeout=5)
    assert d.body == b"job 1"
    d.reject()
    (dead,) = b.queue("jobs.dlq").get_many(10, timeout=5)
    assert (dead.body, dead.headers["x-death-reason"], dead.headers["x-death-queue"]) == (b"job 1", "rejected", "jobs")
    dead.ack()
    assert b.queue("jobs").stats().dead_lettered_total == 1
    if exchanges:
        assert b.publish("alerts", b"alert 1") == 1
        assert drain(b.queue("zz.audit")) == [b"alert 1"]


def _reboot(namespace):
    assert shmq.destroy_namespace(namespace) > 0  # what a reboot does: shared memory is gone


def _snapshot_says(data, queue):
    with dmsq.SnapshotReader(os.path.join(data, queue + dmsq.SUFFIX)) as r:
        return r.header.settings["dead_letter_queue"]


# ---------------------------------------------------------------- the server's rebuild
def test_a_server_reboot_keeps_dead_letter_links_and_bindings_whatever_the_names(namespace, servers, tmp_path):
    data = str(tmp_path / "data")
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(srv.url) as b:
        _build(b)
    assert srv.stop() == 0  # a clean stop writes a last snapshot
    assert _snapshot_says(data, "jobs") == "jobs.dlq"
    _reboot(namespace)

    srv = servers(namespace, "--data-dir", data)
    assert not [line for line in srv.log if " WARNING " in line or " ERROR " in line], srv.log
    with shmq.connect(srv.url) as b:
        _check(b)
    assert srv.stop() == 0
    assert _snapshot_says(data, "jobs") == "jobs.dlq"  # and the files still say it: the next reboot keeps it


def test_links_to_what_is_nowhere_after_the_rebuild_are_warnings_naming_both(namespace, servers, tmp_path):
    data = str(tmp_path / "data")
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(srv.url) as b:
        b.create_queue("jobs.dlq", durability="memory")  # never saved: nowhere after a reboot
        b.create_queue("jobs", dead_letter_queue="jobs.dlq")
        b.create_exchange("alerts", type="fanout")
        b.bind("alerts", "jobs.dlq")
        b.bind("alerts", "jobs")
    assert srv.stop() == 0
    _reboot(namespace)

    srv = servers(namespace, "--data-dir", data)
    warnings = [line.split(" WARNING ", 1)[1] for line in srv.log if " WARNING " in line]  # message, then fields
    expected = [
        f"queue 'jobs' has lost its dead-letter queue 'jobs.dlq': there is no queue 'jobs.dlq' (none in shared "
        f"memory, none rebuilt from {data}); messages 'jobs' rejects or delivers max_deliveries times are dropped",
        f"exchange 'alerts' has lost its binding to queue 'jobs.dlq' (pattern '#'): there is no queue 'jobs.dlq' "
        f"(none in shared memory, none rebuilt from {data}); what it routes there is not delivered",
    ]
    assert len(warnings) == 2 and all(w.startswith(e + " ") for w, e in zip(warnings, expected)), srv.log
    with shmq.connect(srv.url) as b:
        assert b.list_queues() == ["jobs"] and b.queue("jobs").settings()["dead_letter_queue"] is None
        assert b.publish("alerts", b"x") == 1
    assert srv.stop() == 0


def test_a_cycle_and_a_chain_of_dead_letter_queues_are_linked_again(broker, tmp_path):
    """a -> b -> a (made by deleting and making a again) and x -> x.dlq -> x.dlq.last."""
    links = {"a": "b", "b": "a", "x": "x.dlq", "x.dlq": "x.dlq.last", "x.dlq.last": None}
    broker.create_queue("a")
    broker.create_queue("b", dead_letter_queue="a")
    broker.delete_queue("a")
    broker.create_queue("a", dead_letter_queue="b")
    for q in ("x.dlq.last", "x.dlq", "x"):
        broker.create_queue(q, dead_letter_queue=links[q])
    for q in links:
        h = broker.queue(q)
        h.put(b"in " + q.encode())
        snapshot_queue(h, str(tmp_path))
        h.close()
        broker.delete_queue(q)  # the reboot
    assert recover(broker, str(tmp_path)) == sorted(links)
    assert {q: broker.queue(q).dead_letter_queue for q in links} == links
    assert {q: drain(broker.queue(q)) for q in links} == {q: [b"in " + q.encode()] for q in links}


# ---------------------------------------------------------------- shmq restore
def test_shmq_restore_after_a_reboot_links_the_files_it_is_given_together(namespace, servers, tmp_path):
    data = str(tmp_path / "data")
    srv = servers(namespace, "--data-dir", data)
    with shmq.connect(srv.url) as b:
        _build(b)
    assert srv.stop() == 0
    _reboot(namespace)

    names = ["exchanges.dmsx", "jobs.dmsq", "jobs.dlq.dmsq", "b.main.dmsq", "a.dlq.dmsq", "zz.audit.dmsq"]
    assert sorted(os.listdir(data)) == sorted(names + ["registry.id", "disk-reserve"])
    files = [os.path.join(data, name) for name in names]  # the exchanges, then each queue before its DLQ
    r = shmq_cli("restore", *files, "--namespace", namespace)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout.splitlines() == [
        "restored 1 message(s) into jobs", "restored 0 message(s) into jobs.dlq", "restored 0 message(s) into b.main",
        "restored 0 message(s) into a.dlq", "restored 0 message(s) into zz.audit",
        f"restored 1 exchange(s) with 1 binding(s) from {files[0]}"]
    with shmq.connect(namespace=namespace) as b:
        _check(b)
        for q in b.list_queues():
            b.delete_queue(q)


def test_shmq_restore_says_which_dead_letter_queue_is_missing(broker, tmp_path):
    broker.create_queue("jobs.dlq")
    jobs = broker.create_queue("jobs", dead_letter_queue="jobs.dlq")
    jobs.put(b"job 1")
    path, _n = snapshot_queue(jobs, str(tmp_path))
    jobs.close()
    broker.delete_queue("jobs")
    broker.delete_queue("jobs.dlq")  # restored alone: its dead-letter queue is nowhere
    r = shmq_cli("restore", path, "--namespace", broker.namespace)
    assert (r.returncode, r.stdout) == (0, "restored 1 message(s) into jobs\n")
    assert r.stderr == ("shmq: warning: queue 'jobs' has lost its dead-letter queue 'jobs.dlq': there is no queue "
                        "'jobs.dlq' (restore its file in the same command, or create it first); messages 'jobs' "
                        "rejects or delivers max_deliveries times are dropped\n")
    assert broker.queue("jobs").dead_letter_queue is None


def test_restore_file_logs_the_missing_dead_letter_queue(broker, tmp_path, caplog):
    broker.create_queue("jobs.dlq")
    jobs = broker.create_queue("jobs", dead_letter_queue="jobs.dlq")
    path, _n = snapshot_queue(jobs, str(tmp_path))
    jobs.close()
    with caplog.at_level(logging.WARNING, logger="shmq.persistence"):
        assert restore_file(broker, path, into="copy") == ("copy", 0, None)  # its DLQ is there: linked
        assert broker.queue("copy").dead_letter_queue == "jobs.dlq"
        broker.delete_queue("jobs.dlq")
        assert restore_file(broker, path, into="copy2") == ("copy2", 0, None)
    assert [r.getMessage() for r in caplog.records] == [
        "queue 'copy2' has lost its dead-letter queue 'jobs.dlq': there is no queue 'jobs.dlq' (restore both with "
        "restore_files, or create it first); messages 'copy2' rejects or delivers max_deliveries times are dropped"]


def test_shmq_restore_of_several_files_refuses_into_and_restores_around_a_bad_file(broker, tmp_path):
    q = broker.create_queue("orders")
    q.put(b"order 1")
    path, _n = snapshot_queue(q, str(tmp_path))
    q.close()
    broker.delete_queue("orders")
    junk = tmp_path / "junk.dmsq"
    junk.write_bytes(b"\x89PNG not a snapshot")
    ns = ["--namespace", broker.namespace]
    r = shmq_cli("restore", path, str(junk), "--into", "copy", *ns)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"shmq: error: --into names one queue: give it one .dmsq FILE, not {path} {junk}; "
                               "try '")
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert broker.list_queues() == []
    r = shmq_cli("restore", str(junk), path, *ns)
    assert (r.returncode, r.stdout) == (1, "restored 1 message(s) into orders\n")
    assert r.stderr.startswith(f"shmq: error: {junk}: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert drain(broker.queue("orders")) == [b"order 1"]


@pytest.mark.parametrize("into", [None, "copy"])
def test_a_junk_file_restores_nothing_even_with_into(broker, tmp_path, into):
    junk = tmp_path / "junk.dmsq"
    junk.write_bytes(b"\x89PNG not a snapshot")
    r = shmq_cli("restore", str(junk), "--namespace", broker.namespace, *(["--into", into] if into else []))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.startswith(f"shmq: error: {junk}: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert broker.list_queues() == []


def test_shmq_restore_of_the_exchange_file_binds_what_is_there_and_says_what_is_not(broker, tmp_path):
    path = str(tmp_path / dmsq.EXCHANGES_FILE)
    dmsq.write_exchanges(path, {"alerts": {"type": "fanout", "bindings": [["q", "audit", "#"], ["q", "gone", "#"]]},
                                "orders": {"type": "topic", "bindings": []}})
    broker.create_queue("audit")
    broker.create_exchange("orders", type="fanout")  # already here: kept as it is
    r = shmq_cli("restore", path, "--namespace", broker.namespace)
    assert (r.returncode, r.stdout) == (0, f"restored 1 exchange(s) with 1 binding(s) from {path} (1 already in the "
                                           "namespace kept as they are)\n")
    assert r.stderr == ("shmq: warning: exchange 'alerts' has lost its binding to queue 'gone' (pattern '#'): there "
                        "is no queue 'gone' (restore its file in the same command, or create it first); what it "
                        "routes there is not delivered\n")
    assert broker.exchange_info("orders")["type"] == "fanout"
    assert broker.publish("alerts", b"alert") == 1
    assert drain(broker.queue("audit")) == [b"alert"]
