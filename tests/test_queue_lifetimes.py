"""Queue lifetimes (shmq/engine/queues/lifetime.py): consumer counts per queue, kept by real
processes and TCP connections and given back when they die; auto-delete queues, deleted with
their bindings when the last consumer goes; queues that expire when unused (x-expires)."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import shmq
from shmq.client.core import Send
from shmq.engine import maintenance
from shmq.engine.shm import layout as L
from shmq.persistence import queues as snapshots
from shmq.protocol import MsgType
from shmq.server.housekeeper import Housekeeper
from tests._wait import wait_for

# a consumer in a process of its own: registers on QUEUE (over URL when given), says "ready", then
# removes one consumer per "remove" line it reads (printing the count left); EOF ends it
CONSUMER = textwrap.dedent("""
    import sys, shmq
    target, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    b = shmq.connect(target) if "://" in target else shmq.connect(namespace=target)
    q = b.queue(name)
    for _ in range(n):
        q.add_consumer()
    print("ready", flush=True)
    for line in sys.stdin:
        print(q.remove_consumer(), flush=True)
""")


class Consumer:
    """A process holding ``n`` consumers of queue ``name`` (of a namespace, or a server's url)."""

    def __init__(self, target, name, n=1):
        self.proc = subprocess.Popen([sys.executable, "-c", CONSUMER, target, name, str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert self.proc.stdout.readline() == "ready\n"

    def remove(self) -> int:
        self.proc.stdin.write("remove\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)
        assert self.proc.returncode == -signal.SIGKILL

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(10)
        self.proc.stdout.close()


@pytest.fixture
def consumers():
    started = []

    def start(target, name, n=1):
        c = Consumer(target, name, n)
        started.append(c)
        return c

    yield start
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
        c.proc.wait(10)
        c.proc.stdout.close()
        c.proc.stdin.close()


def _bound(broker, name):
    return [b["target"] for x in broker.list_exchanges() for b in broker.exchange_info(x)["bindings"]
            if b["target"] == name]


# ---------------------------------------------------------------- counts
def test_counts_are_every_process_and_each_removes_its_own(broker, consumers):
    q = broker.create_queue("q")
    assert q.stats().consumers == 0
    assert q.add_consumer() == 1
    a = consumers(broker.namespace, "q", 2)
    b = consumers(broker.namespace, "q")
    assert q.stats().consumers == 4
    assert a.remove() == 3
    assert q.remove_consumer() == 2
    with pytest.raises(ValueError, match="this process has no consumer registered"):
        q.remove_consumer()
    assert b.remove() == 1
    assert a.remove() == 0
    assert q.stats().consumers == 0
    assert broker.list_queues() == ["q"]  # not auto-delete: it stays


def test_a_killed_consumer_is_uncounted_by_housekeeping(broker, consumers):
    q = broker.create_queue("q")
    q.add_consumer()
    c = consumers(broker.namespace, "q", 3)
    assert q.stats().consumers == 4
    c.kill()
    assert q.stats().consumers == 4  # until its row is reaped
    maintenance.housekeep(q)
    assert q.stats().consumers == 1


def test_laned_queue_counts_in_lane_zero(broker, consumers):
    q = broker.create_queue("q", lanes=3, auto_delete=True)
    c = consumers(broker.namespace, "q")
    assert q.add_consumer() == 2
    assert q.stats().consumers == 2
    assert q._lanes[0]._mq[L.proc_word(q._lanes[0]._slot, L.P_CONSUMERS)] == 1
    assert q.remove_consumer() == 1
    assert c.remove() == 0
    assert broker.list_queues() == []
    assert [e for e in os.listdir("/dev/shm") if f"shmq.{broker.namespace}.q." in e] == []


# ---------------------------------------------------------------- auto-delete
def test_auto_delete_goes_with_its_last_consumer_and_its_bindings(broker, consumers):
    broker.create_queue("q", auto_delete=True)
    broker.create_queue("other")
    broker.create_exchange("fan")
    broker.create_exchange("topic", "topic")
    broker.bind("fan", "q")
    broker.bind("topic", "q", "a.*")
    broker.bind("topic", "other", "#")
    one = consumers(broker.namespace, "q")
    two = consumers(broker.namespace, "q")
    assert one.remove() == 1
    assert "q" in broker.list_queues()
    assert two.remove() == 0
    assert broker.list_queues() == ["other"]
    assert _bound(broker, "q") == []
    assert _bound(broker, "other") == ["other"]
    broker.create_queue("q")  # made again: bound to nothing
    assert broker.publish("fan", b"m") == 0


def test_auto_delete_never_consumed_stays(broker):
    q = broker.create_queue("q", auto_delete=True)
    q.put(b"m")
    with shmq.connect(namespace=broker.namespace) as other:
        other.create_queue("x")  # a local sweep
    Housekeeper(broker).run_once()
    assert "q" in broker.list_queues()
    assert q.settings()["auto_delete"] is True


def test_auto_delete_after_its_last_consumer_is_killed(broker, consumers):
    q = broker.create_queue("q", auto_delete=True)
    keep = broker.create_queue("keep")  # not auto-delete: its count drops, it stays
    broker.create_exchange("fan")
    broker.bind("fan", "q")
    c = consumers(broker.namespace, "q")
    k = consumers(broker.namespace, "keep")
    c.kill()
    k.kill()
    assert "q" in broker.list_queues()
    maintenance.housekeep(q)  # reaps the dead row: the count falls to zero, the queue goes
    assert broker.list_queues() == ["keep"]
    assert _bound(broker, "q") == []
    maintenance.housekeep(keep)
    assert keep.stats().consumers == 0


@pytest.mark.parametrize("by", ["server", "local"])
def test_a_killed_consumer_s_queue_goes_at_the_next_sweep(broker, consumers, by):
    broker.create_queue("q", auto_delete=True)
    consumers(broker.namespace, "q").kill()
    if by == "server":
        Housekeeper(broker).run_once()
    else:
        with shmq.connect(namespace=broker.namespace) as other:
            other.declare_queue("x")  # a declare sweeps the namespace
    assert broker.list_queues() == (["x"] if by == "local" else [])


def test_a_consumer_that_comes_first_keeps_it(broker):
    q = broker.create_queue("q", auto_delete=True)
    q.add_consumer()
    q.add_consumer()
    assert q.remove_consumer() == 1
    assert broker._delete("q", unused=True) is None  # the deleter looks under the lock
    assert q.remove_consumer() == 0
    assert broker.list_queues() == []
    with pytest.raises(shmq.QueueNotFound):
        q.add_consumer()


def test_settings_compare_change_and_persist(broker, tmp_path):
    q = broker.create_queue("q", auto_delete=True, expires=2.5)
    assert (q.settings()["auto_delete"], q.settings()["expires"]) == (True, 2.5)
    broker.create_queue("q", exist_ok=True, auto_delete=True, expires=2.5).close()
    with pytest.raises(shmq.QueueExists, match=r"expires 2.5 \(asked 3.0\)"):
        broker.create_queue("q", exist_ok=True, expires=3.0)
    with pytest.raises(shmq.SettingsMismatch, match="auto_delete True"):
        broker.declare_queue("q", auto_delete=False)
    broker.declare_queue("q", auto_delete=True, expires=60).close()  # expires changes live
    assert q.settings()["expires"] == 60.0
    assert broker.update_queue("q", expires=None)["expires"] is None
    for bad, error in ((0, ValueError), (-1, ValueError), ("1", TypeError)):
        with pytest.raises(error, match="expires"):
            broker.create_queue("bad", expires=bad)
    with pytest.raises(TypeError, match="auto_delete must be a bool"):
        broker.create_queue("bad", auto_delete=1)
    broker.update_queue("q", expires=7.5)
    path, _n = snapshots.snapshot_queue(q, str(tmp_path))
    q.close()
    broker.delete_queue("q")
    assert snapshots.restore_file(broker, path) == ("q", 0, None)
    restored = broker.queue("q")
    assert (restored.settings()["auto_delete"], restored.settings()["expires"]) == (True, 7.5)


# ---------------------------------------------------------------- expires
def _sweep_locally(namespace):
    with shmq.connect(namespace=namespace) as other:
        other.create_queue("sweeper", exist_ok=True)  # a create sweeps the namespace (once a second per broker)
    return True


def test_unused_queues_expire_locally_and_used_ones_stay(broker):
    idle = broker.create_queue("idle", expires=0.2)
    taken = broker.create_queue("taken", expires=0.2)
    consumed = broker.create_queue("consumed", expires=0.2)
    broker.create_queue("declared", expires=0.2)
    consumed.add_consumer()
    broker.create_exchange("fan")
    broker.bind("fan", "idle")
    _sweep_locally(broker.namespace)
    assert "idle" in broker.list_queues()  # not yet

    def poll():
        with pytest.raises(shmq.QueueEmpty):
            taken.get_nowait()  # a get (on an empty queue too) is a use
        broker.declare_queue("declared", expires=0.2).close()  # a re-declare renews it
        _sweep_locally(broker.namespace)
        return "idle" not in broker.list_queues()

    wait_for(poll, what="the idle queue's expiry")
    assert sorted(broker.list_queues()) == ["consumed", "declared", "sweeper", "taken"]
    assert _bound(broker, "idle") == []
    assert idle.deleted
    consumed.remove_consumer()  # no consumer: its expiry counts from now
    wait_for(lambda: _sweep_locally(broker.namespace) and "consumed" not in broker.list_queues(),
             what="the expiry of the queue its consumer left")


def test_takes_on_the_c_and_python_paths_renew(broker):
    """A take stores the queue's last use once it is a quarter of ``expires`` old (a
    second at most): not on every take."""
    assert L.life_renew_ns(400) == 100_000_000 and L.life_renew_ns(3_600_000) == L.LIFE_RENEW_NS
    for kind in ("c", "python"):
        q = broker.create_queue(kind, expires=60.0)
        if kind == "python":
            q._fast_take = None
        mq = q._mq
        q.put(b"m")
        mq[L.I_LAST_USED] -= 10**8  # used 0.1 s ago: no store
        before = mq[L.I_LAST_USED]
        q.get().ack()
        assert mq[L.I_LAST_USED] == before
        mq[L.I_LAST_USED] -= 2 * 10**9  # 2.1 s ago: stored again
        with pytest.raises(shmq.QueueEmpty):
            q.get_nowait()
        assert mq[L.I_LAST_USED] > before


def test_a_server_expires_unused_queues(broker, servers):
    srv = servers(broker.namespace)
    try:
        with shmq.connect(srv.url) as remote:
            remote.create_queue("idle", expires=0.3)
            kept = remote.create_queue("kept", expires=0.3)
            kept.add_consumer()
            wait_for(lambda: "idle" not in remote.list_queues(), what="the server's expiry of the idle queue")
            srv.wait_for_line(lambda line: "queue idle deleted: unused for its expires" in line)
            assert remote.list_queues() == ["kept"]
    finally:
        srv.proc.terminate()
        srv.proc.wait(10)


# ---------------------------------------------------------------- over TCP
def test_tcp_counts_settings_and_errors(broker, tcp_server):
    with shmq.connect(tcp_server.url) as remote:
        q = remote.create_queue("q", auto_delete=True, expires=30)
        assert (q.settings()["auto_delete"], q.settings()["expires"]) == (True, 30.0)
        assert q.add_consumer() == 1
        assert broker.queue("q").add_consumer() == 2
        assert q.stats().consumers == 2
        assert q.remove_consumer() == 1
        with pytest.raises(ValueError, match="this connection has no consumer of it registered"):
            q.remove_consumer()  # BAD_REQUEST: the other consumer is not this connection's
        with pytest.raises(shmq.QueueNotFound):
            _raw(remote, MsgType.CONSUMER_ADD, {"queue": "nowhere"})
        with pytest.raises(ValueError, match="queue"):
            _raw(remote, MsgType.CONSUMER_REMOVE, {})
        with pytest.raises(ValueError, match="auto_delete"):
            remote.create_queue("bad", auto_delete="yes")
        with pytest.raises(ValueError, match="expires must be > 0"):
            remote.create_queue("bad", expires=-1)
        with pytest.raises(ValueError, match="expires"):
            _raw(remote, MsgType.CREATE, {"queue": "bad", "expires": "soon"})
        with pytest.raises(TypeError, match="expires must be a number of seconds"):
            remote.create_queue("bad", expires="soon")  # (the client checks it first, as the engine does)
        assert remote.declare_queue("q", auto_delete=True, expires=None).settings()["expires"] is None
        assert "bad" not in remote.list_queues()


def _raw(remote, msg_type, fields):
    """One request as given, over ``remote``'s connection; its reply's payload."""
    def call():
        return (yield Send(msg_type, fields))

    return remote._drive(call())


@pytest.mark.parametrize("end", ["close", "kill"])
def test_tcp_consumers_are_given_back_when_the_connection_ends(broker, tcp_server, consumers, end):
    broker.create_queue("q", auto_delete=True)
    broker.create_queue("keep")
    broker.create_exchange("fan")
    broker.bind("fan", "q")
    c = consumers(tcp_server.url, "q", 2)
    k = consumers(tcp_server.url, "keep")
    assert broker.queue("q").stats().consumers == 2
    assert broker.queue("keep").stats().consumers == 1
    for p in (c, k):
        p.kill() if end == "kill" else p.close()
    wait_for(lambda: broker.list_queues() == ["keep"], what="the auto-delete queue's deletion")
    wait_for(lambda: broker.queue("keep").stats().consumers == 0, what="the connection's consumers given back")
    assert _bound(broker, "q") == []


def test_tcp_two_connections_one_removes_then_the_other(broker, tcp_server, consumers):
    broker.create_queue("q", auto_delete=True)
    one = consumers(tcp_server.url, "q")
    two = consumers(tcp_server.url, "q")
    assert one.remove() == 1
    one.close()
    assert broker.queue("q").stats().consumers == 1
    assert two.remove() == 0
    assert broker.list_queues() == []


@pytest.mark.parametrize("where", ["local", "tcp"])
def test_asyncio_clients_count_and_auto_delete(broker, tcp_server, where):
    import asyncio

    from shmq import aio

    async def main():
        b = await (aio.connect(tcp_server.url) if where == "tcp" else aio.connect(namespace=broker.namespace))
        async with b:
            q = await b.create_queue("q", auto_delete=True, expires=30)
            assert (await q.settings())["expires"] == 30.0
            assert await q.add_consumer() == 1
            assert (await q.stats()).consumers == 1
            assert await q.remove_consumer() == 0
            assert await b.list_queues() == []

    asyncio.run(asyncio.wait_for(main(), 30))


def test_cli_creates_sets_and_shows_them(broker):
    from tests.test_cli import shmq_cli

    ns = ("--namespace", broker.namespace)
    assert shmq_cli("create", "q", "--auto-delete", "--expires", "90", *ns).returncode == 0
    assert (broker.queue("q").settings()["auto_delete"], broker.queue("q").settings()["expires"]) == (True, 90.0)
    assert shmq_cli("queue", "set", "q", "--expires", "0", *ns).returncode == 0  # 0: never
    assert broker.queue("q").settings()["expires"] is None
    broker.queue("q").add_consumer()
    out = shmq_cli("stats", "q", "--json", *ns)
    assert json.loads(out.stdout)["queues"]["q"]["consumers"] == 1
    assert "consumers" in shmq_cli("stats", *ns).stdout
    bad = shmq_cli("create", "r", "--expires", "0", *ns)
    assert bad.returncode == 2 and "--expires" in bad.stderr
