"""``shmq store list|keys|get|set|delete`` end to end, on both transports; ``shmq
namespace destroy`` removes stores."""

import json
import os
import subprocess
import sys

from shmq.engine.shm.segment import namespace_entries
from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and tcp)


def ok(*args):
    r = shmq_cli(*args)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    return r.stdout


def fails(*args):
    r = shmq_cli(*args)
    assert (r.returncode, r.stdout) == (1, "") and r.stderr.count("\n") == 1, r
    return r.stderr


def test_store_commands(target, broker):  # noqa: F811
    assert shmq_cli("store", "list", *target).stdout == ""
    assert ok("store", "set", "results", "task-1", "done", *target) == "set task-1 in store results\n"
    assert ok("store", "set", "results", "task-2", "ok", "--ttl", "100", *target) == \
        "set task-2 in store results, expiring in 100s\n"
    assert ok("store", "set", "results", "task-1", "again", "--only-new", *target) == \
        "kept task-1 in store results: it is there already (--only-new)\n"
    assert json.loads(ok("store", "set", "results", "x", "1", "--json", *target)) == \
        {"store": "results", "key": "x", "set": True}
    assert ok("store", "list", *target) == "results\n"
    assert json.loads(ok("store", "list", "--json", *target)) == ["results"]
    assert ok("store", "keys", "results", *target) == "task-1\ntask-2\nx\n"
    assert json.loads(ok("store", "keys", "results", "--prefix", "task-", "--json", *target)) == ["task-1", "task-2"]
    assert ok("store", "get", "results", "task-1", *target) == "done\n"
    kv = broker.store("results")
    kv.add("chord", "b")
    kv.add("chord", "a")
    assert ok("store", "get", "results", "chord", *target) == "a\nb\n"
    assert 50 < kv.ttl("task-2") <= 100  # (the commands before took some of it)
    assert ok("store", "delete", "results", "task-1", "nope", *target) == "deleted 1 of 2 key(s) from store results\n"
    assert json.loads(ok("store", "delete", "results", "x", "--json", *target)) == {"store": "results", "deleted": 1}
    assert kv.keys() == ["chord", "task-2"]


def test_store_errors_are_one_line(target, broker):  # noqa: F811
    broker.store("s").set("k", b"v")
    assert fails("store", "get", "s", "nope", *target) == "shmq: error: store 's' has no key 'nope'\n"
    assert "no store 'other' in" in fails("store", "get", "other", "k", *target)
    assert "no store 'other' in" in fails("store", "keys", "other", *target)
    assert "no store 'other' in" in fails("store", "delete", "other", "k", *target)
    assert fails("store", "set", "s", "", "v", *target) == "shmq: error: a key must be 1-1024 characters, not 0\n"
    assert "ttl must be > 0 seconds" in fails("store", "set", "s", "k", "v", "--ttl", "0", *target)
    assert "invalid queue name 'a/b'" in fails("store", "set", "a/b", "k", "v", *target)
    assert broker.list_stores() == ["s"]  # a read never makes a store


def test_get_waits(broker):
    args = [sys.executable, "-m", "shmq.cli", "store", "get", "s", "late", "--wait", "20", "--namespace",
            broker.namespace]
    kv = broker.store("s")
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ,
                                                                                     "PYTHONPATH": os.getcwd()})
    try:
        kv.set("late", b"here")
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert (p.returncode, out, err) == (0, b"here\n", b"")


def test_namespace_destroy_removes_stores(namespace):
    assert ok("store", "set", "s", "k", "v", "--namespace", namespace) == "set k in store s\n"
    assert any(".kv.s.db" in e for e in namespace_entries(namespace))
    assert "destroyed namespace" in ok("namespace", "destroy", namespace, "--yes")
    assert namespace_entries(namespace) == []
