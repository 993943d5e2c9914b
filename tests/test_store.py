"""The keyed store (shmq/engine/store.py): every method on both transports, expiry,
waiting gets woken from another process, atomic counters and sets under several
processes, a writer SIGKILLed mid-loop, the files' mode and their removal."""

import multiprocessing
import os
import re
import signal
import stat
import threading
import time

import pytest

import shmq
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from shmq.engine.store import Store, store_path
from tests._wait import wait_for

_FORK = multiprocessing.get_context("fork")


# ------------------------------------------------------------------ every method, both transports
def test_set_get_only_new_and_delete(any_broker):
    kv = any_broker.store("results")
    assert kv.get("a") is None
    assert kv.set("a", b"1") is True
    assert kv.get("a") == b"1"
    assert kv.set("a", b"2", only_new=True) is False
    assert kv.get("a") == b"1"
    assert kv.set("a", b"") is True
    assert kv.get("a") == b""
    assert kv.set("b", b"\x00" * 1000, only_new=True) is True
    assert kv.get_many(["a", "nope", "b"]) == [b"", None, b"\x00" * 1000]
    assert kv.get_many([]) == []
    assert kv.delete("a", "nope", "b", "a") == 2
    assert kv.delete() == 0
    assert kv.get_many(["a", "b"]) == [None, None]
    assert any_broker.list_stores() == ["results"]
    assert any_broker.delete_store("results") is True
    assert any_broker.delete_store("results") is False
    assert any_broker.list_stores() == []


def test_incr(any_broker):
    kv = any_broker.store()
    assert kv.incr("n") == 1
    assert kv.incr("n", 41) == 42
    assert kv.incr("n", -50) == -8
    assert kv.get("n") == b"-8"
    kv.set("n", b"7")
    assert kv.incr("n") == 8
    assert kv.ttl("n") is None
    assert kv.incr("n", 0, ttl=100) == 8
    assert 99 < kv.ttl("n") <= 100
    assert kv.incr("n") == 9 and kv.ttl("n") > 99  # the expiry stays
    kv.set("word", b"three")
    with pytest.raises(shmq.WrongType, match="key 'word' holds b'three', not an integer"):
        kv.incr("word")
    with pytest.raises(ValueError, match="would leave 64 bits"):
        kv.incr("n", 2**63 - 1)
    assert kv.get("n") == b"9"
    any_broker.delete_store("default")


def test_sets(any_broker):
    kv = any_broker.store("chords")
    assert kv.members("c") == set()
    assert kv.add("c", "t1") == 1
    assert kv.add("c", "t2") == 2
    assert kv.add("c", "t1") == 2  # a redelivered task counts once
    assert kv.members("c") == {"t1", "t2"}
    assert kv.add("c", "t3", ttl=50) == 3
    assert 49 < kv.ttl("c") <= 50
    kv.set("v", b"x")
    with pytest.raises(shmq.WrongType, match="key 'c' holds a set, not a value"):
        kv.get("c")
    with pytest.raises(shmq.WrongType, match="key 'c' holds a set, not a value"):
        kv.incr("c")
    with pytest.raises(shmq.WrongType, match="key 'v' holds a value, not a set"):
        kv.add("v", "m")
    with pytest.raises(shmq.WrongType, match="key 'v' holds a value, not a set"):
        kv.members("v")
    assert kv.get("v") == b"x" and kv.members("c") == {"t1", "t2", "t3"}  # nothing changed
    assert kv.set("c", b"now a value") is True  # a set replaces any kind, as Redis's SET
    assert kv.get("c") == b"now a value"
    assert kv.add("d", "x") == 1 and kv.delete("d") == 1 and kv.add("d", "y") == 1
    assert kv.members("d") == {"y"}
    any_broker.delete_store("chords")


def test_keys_clear_expire_ttl(any_broker):
    kv = any_broker.store()
    for k in ("celery-task-meta-1", "celery-task-meta-2", "chord-1", "é-key", "celery-taskX"):
        kv.set(k, b"v")
    kv.add("celery-task-set", "m")
    assert kv.keys() == sorted(["celery-task-meta-1", "celery-task-meta-2", "chord-1", "é-key", "celery-taskX",
                                "celery-task-set"])
    assert kv.keys("celery-task-") == ["celery-task-meta-1", "celery-task-meta-2", "celery-task-set"]
    assert kv.keys("é") == ["é-key"]
    assert kv.keys("zzz") == []
    assert kv.expire("chord-1", 30) is True
    assert kv.expire("nope", 30) is False
    assert 29 < kv.ttl("chord-1") <= 30
    assert kv.expire("chord-1", None) is True and kv.ttl("chord-1") is None
    assert kv.ttl("nope") is None
    assert kv.clear() == 6
    assert kv.keys() == [] and kv.clear() == 0
    assert kv.sweep() == 0
    any_broker.delete_store("default")


def test_expiry_reads_as_absent_everywhere(any_broker):
    kv = any_broker.store()
    kv.set("v", b"1", ttl=0.05)
    kv.incr("n", ttl=0.05)
    kv.add("s", "m", ttl=0.05)
    kv.set("keep", b"k")
    assert sorted(kv.keys()) == ["keep", "n", "s", "v"]
    wait_for(lambda: kv.keys() == ["keep"], 5, "the three keys to expire")
    assert kv.get("v") is None and kv.get_many(["v", "n", "keep"]) == [None, None, b"k"]
    assert kv.members("s") == set() and kv.ttl("v") is None
    assert kv.expire("v", 10) is False
    assert kv.delete("v", "n", "s") == 0
    assert kv.set("v", b"2", only_new=True) is True  # an expired key is absent for only_new
    assert kv.incr("n") == 1  # counts from 0 again
    assert kv.add("s", "other") == 1 and kv.members("s") == {"other"}
    assert kv.ttl("n") is None
    kv.set("gone", b"x", ttl=0.05)
    wait_for(lambda: kv.get("gone") is None, 5, "the key to expire")
    assert kv.sweep() == 1 and kv.sweep() == 0
    any_broker.delete_store("default")


def test_waiting_get(any_broker):
    kv = any_broker.store()
    t0 = time.monotonic()
    assert kv.get("late", timeout=0.1) is None
    assert 0.09 < time.monotonic() - t0 < 5
    kv.set("here", b"1")
    assert kv.get("here", timeout=5) == b"1"
    other = any_broker.store()
    threading.Thread(target=lambda: other.set("late", b"2")).start()
    assert kv.get("late", timeout=10) == b"2"
    any_broker.delete_store("default")


@pytest.mark.parametrize("call, error, match", [
    (lambda kv: kv.set("", b"x"), ValueError, "a key must be 1-1024 characters, not 0"),
    (lambda kv: kv.set("k" * 1025, b"x"), ValueError, "a key must be 1-1024 characters, not 1025"),
    (lambda kv: kv.set(b"k", b"x"), TypeError, "a key must be a str, not bytes"),
    (lambda kv: kv.set("k", "text"), TypeError, "a value must be bytes, not str"),
    (lambda kv: kv.set("k", b"x", ttl=0), ValueError, "ttl must be > 0 seconds"),
    (lambda kv: kv.set("k", b"x", ttl=-1), ValueError, "ttl must be > 0 seconds"),
    (lambda kv: kv.set("k", b"x", ttl="1"), TypeError, "ttl must be a number of seconds"),
    (lambda kv: kv.get("k", timeout=-1), ValueError, "timeout must be seconds >= 0"),
    (lambda kv: kv.incr("k", 1.5), TypeError, "by must be an int"),
    (lambda kv: kv.add("k", ""), ValueError, "a member must be 1-1024 characters"),
    (lambda kv: kv.add("k", 3), TypeError, "a member must be a str"),
    (lambda kv: kv.get_many(["a", 3]), TypeError, "a key must be a str, not int"),
    (lambda kv: kv.delete("a", None), TypeError, "a key must be a str, not NoneType"),
    (lambda kv: kv.keys(3), TypeError, "prefix must be a str"),
    (lambda kv: kv.expire("k", 0), ValueError, "ttl must be > 0 seconds"),
])
def test_bad_arguments(any_broker, call, error, match):
    kv = any_broker.store()
    with pytest.raises(error, match=match):
        call(kv)
    assert kv.keys() == []
    any_broker.delete_store("default")


@pytest.mark.parametrize("name", ["", "a/b", ".x", "x" * 129, "a b"])
def test_bad_store_names(any_broker, name):
    with pytest.raises(ValueError, match="invalid queue name"):
        any_broker.store(name)
    assert any_broker.list_stores() == []


# ------------------------------------------------------------------ the local handle
def test_files_mode_and_namespace_destroy(namespace):
    with shmq.connect(namespace=namespace) as b:
        kv = b.store("s1")
        kv.set("k", b"v")
        path = store_path(namespace, "s1")
        entries = namespace_entries(namespace)
        for suffix in ("", "-wal", "-shm"):
            assert os.path.basename(path + suffix) in entries
            assert stat.S_IMODE(os.stat(path + suffix).st_mode) == 0o600
        b.store("s2").set("k", b"v")
        assert b.list_stores() == ["s1", "s2"]
    destroy_namespace(namespace)
    assert namespace_entries(namespace) == []
    with shmq.connect(namespace=namespace) as b:
        assert b.list_stores() == []
    destroy_namespace(namespace)


def test_handle_sees_a_deleted_store_as_new(broker):
    kv, other = broker.store(), broker.store()
    kv.set("k", b"v")
    assert other.get("k") == b"v"
    assert broker.delete_store("default") is True
    assert other.get("k") is None  # a new, empty store
    other.set("k", b"w")
    assert kv.get("k") == b"w"
    assert broker.list_stores() == ["default"]


def test_closed_handle(broker):
    with broker.store() as kv:
        kv.set("k", b"v")
    with pytest.raises(shmq.ShmqError, match="store 'default' of namespace .* is closed"):
        kv.get("k")
    with shmq.connect(namespace=broker.namespace) as b:
        kv2 = b.store()
    with pytest.raises(shmq.ShmqError, match="is closed"):
        kv2.get("k")


def test_threads_share_a_handle(broker):
    kv = broker.store()

    def work():
        for _ in range(200):
            kv.incr("n")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert kv.get("n") == b"800"


def test_pickle_and_fork(broker):
    import pickle

    kv = broker.store("p")
    kv.set("k", b"v")
    again = pickle.loads(pickle.dumps(kv))
    assert again.get("k") == b"v"
    again.close()
    child = _FORK.Process(target=_incr_times, args=(kv, "n", 10))  # the handle itself, inherited
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert kv.incr("n") == 11  # the parent's connection still works


def test_housekeeping_sweeps_and_never_makes_a_store(broker):
    from shmq.server.housekeeper import Housekeeper

    kv = broker.store("hk")
    kv.set("short", b"x", ttl=0.05)
    kv.set("long", b"y", ttl=100)
    hk = Housekeeper(broker)
    try:
        hk.run_once()
        assert kv.keys() == ["long", "short"] or kv.keys() == ["long"]
        wait_for(lambda: kv.get("short") is None, 5, "the key to expire")
        hk.run_once()
        path = store_path(broker.namespace, "hk")
        with Store(broker.namespace, "hk") as raw:  # the row itself is gone, not only unseen
            assert raw._connection().execute("SELECT key FROM kv").fetchall() == [("long",)]
        broker.delete_store("hk")
        hk.run_once()
        assert not os.path.exists(path) and broker.list_stores() == []
    finally:
        hk.close()


def test_sweep_gives_memory_back(broker):
    kv = broker.store("mem")

    def held():  # what the store's files take in /dev/shm
        return sum(os.stat(p).st_blocks * 512 for p in (kv.path, kv.path + "-wal", kv.path + "-shm")
                   if os.path.exists(p))

    for i in range(2000):
        kv.set(f"k{i}", bytes(1000), ttl=0.05 if i % 2 else None)
    full = held()
    assert full > 2_000_000
    wait_for(lambda: len(kv.keys()) == 1000, 5, "half the keys to expire")
    assert kv.sweep() == 1000
    assert held() < full * 0.8
    assert kv.clear() == 1000
    assert held() < 200_000


def test_store_create_false(broker):
    with pytest.raises(FileNotFoundError, match="no store 'x'"):
        Store(broker.namespace, "x", create=False)
    assert broker.list_stores() == []


# ------------------------------------------------------------------ other processes
def _incr_times(kv, key, n):
    for _ in range(n):
        kv.incr(key)


def _hammer(namespace, tag, n, go):
    go.wait(30)
    with shmq.connect(namespace=namespace) as b:
        kv = b.store("hammer")
        for i in range(n):
            kv.incr("total")
            kv.add("members", f"{tag}-{i}")
            kv.add("dups", f"{i % 50}")


def test_incr_and_add_from_four_processes(broker):
    go = _FORK.Event()
    procs = [_FORK.Process(target=_hammer, args=(broker.namespace, p, 500, go)) for p in range(4)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    kv = broker.store("hammer")
    assert kv.get("total") == b"2000"
    assert len(kv.members("members")) == 2000
    assert kv.add("members", "0-0") == 2000
    assert kv.members("dups") == {str(i) for i in range(50)}


def _writer_in_rollback_mode(path):
    """A connection holding a new store file's write lock before the file is WAL (what
    another process's first open does while it makes the file: a concurrent first open
    met it as an instant LockTimeout)."""
    import sqlite3

    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE early (x)")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO early VALUES (1)")
    return conn


def test_a_first_open_waits_out_another_process_making_the_file(broker, monkeypatch):
    """(engine/store.py) SQLite refuses a switch to WAL at once while another connection
    holds the file's write lock in rollback mode; the open tries again (its pauses) until
    the other one is done, instead of raising LockTimeout without waiting."""
    from shmq.engine import store as store_module

    other = _writer_in_rollback_mode(store_module.store_path(broker.namespace, "fresh"))
    pauses = []

    def pause(seconds):
        pauses.append(seconds)
        if len(pauses) == 3:
            other.execute("COMMIT")

    monkeypatch.setattr(store_module, "_pause", pause)
    try:
        kv = broker.store("fresh")
        assert kv.incr("n") == 1
    finally:
        other.close()
    assert len(pauses) == 3 and pauses == sorted(pauses)


def test_a_first_open_that_never_gets_the_file_says_so_after_its_lock_timeout(broker, monkeypatch):
    from shmq.engine import store as store_module

    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.2)
    other = _writer_in_rollback_mode(store_module.store_path(broker.namespace, "fresh"))
    try:
        started = time.monotonic()
        with pytest.raises(shmq.LockTimeout, match="store 'fresh' .* held its write lock"):
            broker.store("fresh")
        assert time.monotonic() - started >= 0.2
    finally:
        other.close()


def _set_later(namespace, go):
    go.wait(30)
    with shmq.connect(namespace=namespace) as b:
        b.store().set("k", repr(time.monotonic()).encode())


@pytest.fixture(params=["watch", "poll"])
def wake(request, monkeypatch):
    """How a waiting get hears of writes: a watch of the store's -wal, or (where inotify
    cannot be had) its pauses alone."""
    if request.param == "poll":
        from shmq.engine import walwatch

        monkeypatch.setattr(walwatch, "watch", lambda path: None)
    return request.param


def test_waiting_get_woken_by_another_process(broker, wake):
    kv = broker.store()
    go = _FORK.Event()
    child = _FORK.Process(target=_set_later, args=(broker.namespace, go))
    child.start()
    try:
        threading.Thread(target=go.set).start()
        value = kv.get("k", timeout=20)
        woke = time.monotonic()
    finally:
        child.join(30)
    assert value is not None
    assert woke - float(value) < 1.0  # a wake within the pauses' bound (20 ms) and a loaded machine's slack


def _until_killed(namespace, tag):
    with shmq.connect(namespace=namespace) as b:
        kv = b.store("k")
        i = 0
        while True:
            kv.incr("total")
            kv.add("members", f"{tag}-{i}")
            i += 1


def test_sigkill_mid_loop_leaves_the_store_intact(broker):
    kv = broker.store("k")
    victim = _FORK.Process(target=_until_killed, args=(broker.namespace, "victim"))
    victim.start()
    wait_for(lambda: kv.get("total") is not None and int(kv.get("total")) > 200, 30, "the victim's first incrs")
    go = _FORK.Event()
    survivors = [_FORK.Process(target=_hammer_k, args=(broker.namespace, p, 300, go)) for p in range(3)]
    for p in survivors:
        p.start()
    go.set()
    wait_for(lambda: len(kv.members("members")) > 300, 30, "the survivors to be under way")
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    for p in survivors:
        p.join(120)
    assert [p.exitcode for p in survivors] == [0, 0, 0]
    members = kv.members("members")
    done = sorted(int(m.split("-")[1]) for m in members if m.startswith("victim-"))
    assert done == list(range(len(done)))  # its adds: a prefix of its loop, none torn
    total = int(kv.get("total"))
    assert total - 900 in (len(done), len(done) + 1)  # each incr of the victim's before its add
    assert len(members) == 900 + len(done)
    assert kv.incr("total") == total + 1 and kv.sweep() == 0  # still usable


def _hammer_k(namespace, tag, n, go):
    go.wait(30)
    with shmq.connect(namespace=namespace) as b:
        kv = b.store("k")
        for i in range(n):
            kv.incr("total")
            kv.add("members", f"{tag}-{i}")


def test_a_write_between_a_waiting_gets_first_try_and_its_line_is_not_missed(broker, wake):
    """(server/stores.py) A server's GET found nothing, another process's write landed,
    then the GET joined its store's line (whose watch, made then, rings for nothing
    after): the line's first look tries it all the same. Before, the line took the
    store's stamp as it joined, which held that write, and the GET waited out its whole
    timeout (a full suite's TCP get waited its server's 5 s once)."""
    import asyncio

    from shmq.engine.store import Store
    from shmq.server.stores import StoreWaiters
    from shmq.server.waiters import Waiter

    handle = broker.store("line")
    writer = Store(broker.namespace, "line", create=False)  # (another connection: another process's writes)
    answers = []

    class Conn:
        def answer(self, w, result):
            answers.append((time.monotonic(), result))

    loop = asyncio.new_event_loop()
    try:
        line = StoreWaiters(loop, handle)
        w = Waiter(Conn(), line, 1, 0, lambda _args: handle.get("k"), None, None)
        assert w.take(None) is None  # the GET's first try
        writer.set("k", b"v")  # then the write, before the GET waits

        async def waiting():
            started = time.monotonic()
            line.add(w, loop.time() + 5)
            while not answers and time.monotonic() - started < 5:
                await asyncio.sleep(0.005)
            return started

        started = loop.run_until_complete(waiting())
    finally:
        loop.close()
        writer.close()
    assert [r for _t, r in answers] == [b"v"]
    assert answers[0][0] - started < 1.0  # its first look, not its deadline
    assert not line.waiters and line.bell is None and line.timer is None  # retired: nothing left watching


# ------------------------------------------------------------------ over TCP, and asyncio
def test_tcp_waiting_get_woken_by_a_local_process(broker, tcp_server, wake):
    go = _FORK.Event()
    child = _FORK.Process(target=_set_later, args=(broker.namespace, go))
    child.start()
    try:
        with shmq.connect(tcp_server.url) as remote:
            kv = remote.store()
            threading.Thread(target=go.set).start()
            value = kv.get("k", timeout=20)
            woke = time.monotonic()
    finally:
        child.join(30)
    assert value is not None and woke - float(value) < 1.0


def test_tcp_waiting_get_holds_back_neither_the_server_nor_its_connection(broker, tcp_server):
    with shmq.connect(tcp_server.url) as waiter, shmq.connect(tcp_server.url) as other:
        got = {}
        t = threading.Thread(target=lambda: got.update(v=waiter.store().get("k", timeout=20)))
        t.start()
        wait_for(lambda: tcp_server.server.stores.lines.get("default") is not None
                 and tcp_server.server.stores.lines["default"].live, 10, "the GET to wait at the server")
        t0 = time.monotonic()
        for _ in range(20):
            other.ping()
        assert other.store().incr("n") == 1 and waiter.store().get("n") == b"1"  # (another GET, same connection)
        assert time.monotonic() - t0 < 5
        other.store().set("k", b"v")
        t.join(20)
        assert got == {"v": b"v"}
        assert waiter.store().get("nope", timeout=0.05) is None


def test_the_server_holds_a_bounded_number_of_stores_open(broker, tcp_server, monkeypatch):
    from shmq.server import stores

    monkeypatch.setattr(stores, "MAX_OPEN", 4)
    with shmq.connect(tcp_server.url) as remote:
        for i in range(10):
            remote.store(f"s{i}").set("k", str(i).encode())
        assert len(tcp_server.server.stores.handles) <= 4
        assert [remote.store(f"s{i}").get("k") for i in range(10)] == [str(i).encode() for i in range(10)]
        assert remote.list_stores() == sorted(f"s{i}" for i in range(10))


def test_tcp_stop_answers_a_waiting_get(broker):
    from tests.conftest import ThreadedServer

    srv = ThreadedServer(broker.namespace)
    remote = shmq.connect(srv.url, reconnect=False)
    try:
        got = {}
        kv = remote.store()

        def get():
            try:
                got["v"] = kv.get("k", timeout=20)
            except shmq.BrokerUnavailable as e:  # answered (nothing), then its next slice found the server gone
                got["e"] = e

        t = threading.Thread(target=get)
        t.start()
        wait_for(lambda: srv.server.stores.lines.get("default") is not None
                 and srv.server.stores.lines["default"].live, 10, "the GET to wait at the server")
        t0 = time.monotonic()
        srv.stop()
        t.join(20)
        assert not t.is_alive() and time.monotonic() - t0 < 10
        assert got.get("v") is None and ("e" in got or "v" in got)
    finally:
        remote.close()


@pytest.mark.parametrize("where", ["tcp", "local"])
def test_asyncio_clients(broker, where, wake):
    import asyncio

    srv = None
    if where == "tcp":
        from tests.conftest import ThreadedServer

        srv = ThreadedServer(broker.namespace)

    async def main():
        b = await (shmq.aio.connect(srv.url) if srv else shmq.aio.connect(namespace=broker.namespace))
        try:
            kv = await b.store("a")
            assert await kv.set("k", b"v", ttl=60) is True
            assert await kv.get("k") == b"v" and 59 < await kv.ttl("k") <= 60
            assert await kv.get_many(["k", "x"]) == [b"v", None]
            assert await kv.incr("n", 2) == 2 and await kv.add("s", "m") == 1
            assert await kv.members("s") == {"m"} and await kv.keys() == ["k", "n", "s"]
            assert await kv.expire("k", None) is True and await kv.ttl("k") is None
            with pytest.raises(shmq.WrongType, match="key 's' holds a set, not a value"):
                await kv.get("s")
            waiting = asyncio.ensure_future(kv.get("late", timeout=20))
            await asyncio.sleep(0)  # the GET goes out (or starts its looks) first
            other = await b.store("a")
            await other.set("late", b"here")
            assert await waiting == b"here"
            assert await kv.get("never", timeout=0.05) is None
            assert await kv.delete("k", "n", "s", "late") == 4 and await kv.clear() == 0
            assert await kv.sweep() == 0
            assert await b.list_stores() == ["a"] and await b.delete_store("a") is True
        finally:
            await b.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        if srv is not None:
            srv.stop()


def test_remote_handle_pickles(broker, tcp_server):
    import pickle

    with shmq.connect(tcp_server.url) as remote:
        kv = remote.store("p")
        kv.set("k", b"v")
        again = pickle.loads(pickle.dumps(kv))
        try:
            assert again.get("k") == b"v"
        finally:
            again._broker.close()


# ------------------------------------------------------------------ against a model
def test_state_machine_against_a_dict(broker):
    from hypothesis import settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

    keys = st.sampled_from(["a", "b", "c", "ä"])
    kv = broker.store("model")

    class Model(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            kv.clear()
            self.values, self.sets = {}, {}

        def _kind(self, key):
            return "v" if key in self.values else "s" if key in self.sets else None

        @rule(key=keys, value=st.one_of(st.binary(max_size=20), st.integers(-99, 99).map(lambda n: str(n).encode())),
              only_new=st.booleans())
        def set(self, key, value, only_new):
            fresh = self._kind(key) is None
            assert kv.set(key, value, only_new=only_new) is (fresh or not only_new)
            if fresh or not only_new:
                self.sets.pop(key, None)
                self.values[key] = value

        @rule(key=keys, by=st.integers(-1000, 1000))
        def incr(self, key, by):
            kind = self._kind(key)
            if kind == "s" or (kind == "v" and not re.fullmatch(rb"-?[0-9]{1,19}", self.values[key])):
                with pytest.raises(shmq.WrongType):
                    kv.incr(key, by)
                return
            n = int(self.values.get(key, b"0")) + by
            if not -2**63 <= n < 2**63:
                with pytest.raises(ValueError, match="64 bits"):
                    kv.incr(key, by)
                return
            assert kv.incr(key, by) == n
            self.values[key] = str(n).encode()

        @rule(key=keys, member=st.sampled_from(["x", "y", "z"]))
        def add(self, key, member):
            if self._kind(key) == "v":
                with pytest.raises(shmq.WrongType):
                    kv.add(key, member)
                return
            self.sets.setdefault(key, set()).add(member)
            assert kv.add(key, member) == len(self.sets[key])

        @rule(ks=st.lists(keys, max_size=3))
        def delete(self, ks):
            there = sum(1 for k in set(ks) if self._kind(k) is not None)
            assert kv.delete(*ks) == there
            for k in ks:
                self.values.pop(k, None)
                self.sets.pop(k, None)

        @invariant()
        def reads_agree(self):
            assert kv.keys() == sorted({*self.values, *self.sets})
            for k in ("a", "b", "c", "ä"):
                if self._kind(k) == "s":
                    assert kv.members(k) == self.sets[k]
                else:
                    assert kv.get(k) == self.values.get(k)

    Model.TestCase.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
    Model.TestCase().runTest()
