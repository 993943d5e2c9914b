"""What each kind of object owns (shmq/engine/shm/names.py, persistence/files.py), asked by
every tool: objects of every kind, made through every front door (the local API, TCP, the
Kafka listener, kombu, Dramatiq, ``shmq.mp``; the Spark sinks in tests/spark/test_owners.py),
leave ``shmq doctor`` nothing to call an orphan or to not know; ``doctor --clean`` leaves
every object and every message in place; ``shmq namespace destroy`` leaves nothing. A kind
added later whose entries no kind declares fails here (doctor's ``unknown``), and so does a
name made outside names.py (the scan below)."""

import json
import os
import re
import threading
import time

import pytest

import shmq
from shmq import doctor
from shmq.auth import default_data_dir
from shmq.engine.shm import names
from shmq.engine.shm.segment import destroy_namespace, namespace_entries
from shmq.persistence.files import is_data_file, owner_of
from tests.test_cli import shmq_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ the one place
def test_only_names_py_makes_a_name_in_dev_shm():
    """Every /dev/shm name is made by names.py's functions: no other module joins one."""
    made_elsewhere = []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "shmq")):
        for f in files:
            path = os.path.join(folder, f)
            if not f.endswith(".py") or path.endswith(os.path.join("shm", "names.py")):
                continue
            with open(path) as fh:
                text = fh.read()
            for pattern in (r"\bsegment_name\(", r"f[\"']shmq\.\{", r"[\"']shmq\.[\"']\s*\+"):
                made_elsewhere += [f"{os.path.relpath(path, ROOT)}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert made_elsewhere == [] or all("reaper.py" in m for m in made_elsewhere), made_elsewhere


def test_the_jvm_sinks_spool_is_named_as_names_py_declares():
    with open(os.path.join(ROOT, "shmq/spark/jvm/src/io/shmq/spark/sink/SinkWrite.java")) as f:
        java = f.read()
    prefix = names.spark_spool_prefix("NS")
    assert prefix == "shmq.NS.spark-spool."
    assert '"shmq." + opts.namespace() + ".spark-spool."' in java
    o = names.owner("NS", "shmq.NS.spark-spool.4242.abc-1.3.0.8")
    assert (o.kind.name, o.pid) == ("spark-spool", 4242)


@pytest.mark.parametrize("entry, kind, name", [
    ("shmq.NS.q.jobs.dlq", "queue", "jobs.dlq"),
    ("sem.shmq.NS.q.jobs.dlq.ne", "queue", "jobs.dlq"),
    ("shmq.NS.q.w#3", "queue", "w"),
    ("sem.shmq.NS.q.w#3.nf", "queue", "w"),
    ("shmq.NS.s.ev", "stream", "@ev"),
    ("shmq.NS.s.ev#11", "stream", "@ev"),
    ("sem.shmq.NS.s.ev.ne", "stream", "@ev"),
    ("shmq.NS.kv.results.db-wal", "store", "results"),
    ("shmq.NS.registry", "registry", None),
    ("shmq.NS.exchanges", "exchanges", None),
    ("shmq.NS.kafka-txns", "kafka-txns", None),
    ("shmq.NS.broker", "broker", None),
    ("sem.shmq.NS.logbell", "broker", None),
    ("sem.shmq.NS.slots", "mp-queue", None),
    ("shmq.NS.b.0123abcd", "mp-queue", None),
])
def test_each_entry_reads_back_to_its_kind_and_object(entry, kind, name):
    o = names.owner("NS", entry)
    assert (o.kind.name, o.name) == (kind, name)


@pytest.mark.parametrize("entry", ["shmq.NS.x.y", "sem.shmq.NS.q.w.zz", "shmq.NS.q.w#0", "shmq.NSX.q.w",
                                   "sem.shmq.NS.registry", "shmq.NS.q..bad"])
def test_a_name_no_kind_declares_is_no_ones(entry):
    assert names.owner("NS", entry) is None


# ------------------------------------------------------------------ every front door
def _holdings(ns) -> dict:
    """Every object of ``ns`` and what it holds: queues' counts, streams' offsets, stores' keys."""
    with shmq.connect(namespace=ns) as b:
        out = {}
        for q in b.list_queues():
            s = b.queue(q).stats()
            out["q:" + q] = (s.ready, s.in_flight, s.delayed, s.enqueued_total)
        for name in b.list_streams():
            s = b.stream(name)
            out["s:" + name] = tuple(s.offsets(p) for p in range(s.partitions))
        for name in b.list_stores():
            out["kv:" + name] = tuple(sorted(b.store(name).keys()))
        out["exchanges"] = tuple(b.list_exchanges())
    return out


def _assert_owned(ns, data_dir=None):
    """Doctor finds no orphan, no entry of no kind and nothing half removed in ``ns``;
    --clean changes nothing; every file of ``data_dir`` is shmq's and owned."""
    report = doctor.diagnose([ns])
    [found] = report["namespaces"]
    assert (report["orphans"], found["unknown"], found["half_removed"]) == ([], [], []), report
    r = shmq_cli("doctor", "--namespace", ns)
    assert r.returncode == 0 and "orphans: none" in r.stdout, r.stdout + r.stderr
    before, entries = _holdings(ns), namespace_entries(ns)
    cleaned = json.loads(shmq_cli("doctor", "--namespace", ns, "--clean", "--json").stdout)
    assert cleaned["orphans"] == [] and cleaned["problems"] == []
    assert (_holdings(ns), namespace_entries(ns)) == (before, entries)
    if data_dir is not None:
        with shmq.connect(namespace=ns) as b:
            live = set(b.list_queues()) | {"@" + s for s in b.list_streams()}
        for f in os.listdir(data_dir):
            assert is_data_file(f), f
            assert owner_of(f) in live | {None}, (f, owner_of(f))
    return before


def _wait(condition, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def served(namespace, servers):
    """A ``shmq server`` of the test's namespace with its default data dir and a Kafka
    listener; at the end it is stopped and ``shmq namespace destroy`` must leave nothing
    (no entry in /dev/shm, no data dir)."""
    shmq.connect(namespace=namespace).create_namespace()
    srv = servers(namespace, "--no-auth", "--kafka-port", "0", "--kafka-initial-rebalance-delay-ms", "0",
                  "--snapshot-interval", "0.05")
    srv.kafka = "127.0.0.1:" + re.search(r"kafka listener on \S+:(\d+)", "".join(srv.log)).group(1)
    yield srv
    assert srv.stop() == 0
    r = shmq_cli("namespace", "destroy", namespace, "--yes")
    assert r.returncode == 0, r.stderr
    assert namespace_entries(namespace) == [] and not os.path.exists(default_data_dir(namespace))


def _local(ns, srv):
    b = shmq.connect(namespace=ns)
    b.create_queue("jobs.dlq")
    jobs = b.create_queue("jobs", dead_letter_queue="jobs.dlq", max_deliveries=1)
    jobs.put_many([b"a", b"b", b"c"])
    jobs.get(timeout=5).reject()
    w = b.create_queue("w", lanes=4)
    for i in range(40):
        w.put(b"%d" % i)
    b.create_queue("mem", durability="memory").put(b"m")
    b.create_queue("wal", durability="wal").put(b"logged")
    ev = b.create_stream("ev", partitions=3)
    for i in range(6):
        ev.append(b"e%d" % i, key=b"k%d" % i)
    with ev.consumer("g") as c:
        c.poll(max_records=100, timeout=5)
        c.commit()
    b.create_stream("cmp", partitions=1, compact=True).append(b"v", key=b"k")
    kv = b.store("results")
    kv.set("task-1", b"ok")
    kv.incr("done")
    kv.add("chord", "task-1")
    b.create_exchange("events", "topic")
    b.bind("events", "jobs", "orders.#")
    b.publish("events", b"published", routing_key="orders.eu")
    rpc = b.create_queue("rpc")

    def answer():
        d = rpc.get(timeout=10)
        d.reply(b"pong")
        d.ack()

    t = threading.Thread(target=answer)
    t.start()
    assert b.request("rpc", b"ping", timeout=10) == b"pong"
    t.join(10)
    return b


def _tcp(ns, srv):
    b = shmq.connect(srv.url)
    b.create_queue("tq").put(b"over tcp")
    s = b.create_stream("ts", partitions=2)
    s.append(b"r", key=b"k")
    with s.consumer("tg") as c:
        c.poll(max_records=10, timeout=5)
        c.commit()
    p = b.transactional("etl-1")
    with p.transaction():
        p.append("ts", b"in a transaction", key=b"k")
    b.store("tkv").set("k", b"v")
    return b


def _kafka(ns, srv):
    confluent = pytest.importorskip("confluent_kafka")
    p = confluent.Producer({"bootstrap.servers": srv.kafka})
    for i in range(5):
        p.produce("ktopic", b"v%d" % i, key=b"k%d" % i)
    assert p.flush(30) == 0
    c = confluent.Consumer({"bootstrap.servers": srv.kafka, "group.id": "kg", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    c.subscribe(["ktopic"])
    got, deadline = 0, time.monotonic() + 60
    while got < 5 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got += 1
    assert got == 5
    c.commit(asynchronous=False)
    c.close()
    t = confluent.Producer({"bootstrap.servers": srv.kafka, "transactional.id": "ktx"})
    t.init_transactions(30)
    t.begin_transaction()
    t.produce("ktopic", b"in a transaction")
    t.commit_transaction(30)
    return None


def _kombu(ns, srv):
    from kombu import Connection

    import shmq.kombu  # noqa: F401  registers the transport

    with Connection(f"shmq:///{ns}") as conn:
        with conn.SimpleQueue("kq") as sq:
            sq.put({"n": 1})
            sq.put({"n": 2})
            sq.get(timeout=5).ack()
    return None


def _dramatiq(ns, srv):
    import dramatiq

    from shmq.dramatiq import ShmqBroker

    broker = ShmqBroker(srv.url, visibility_timeout=30.0)
    try:
        @dramatiq.actor(broker=broker, queue_name="dq")
        def task(n):  # pragma: no cover - no worker runs it: its message waits
            return n

        task.send(1)
        task.send_with_options(args=(2,), delay=60_000)
    finally:
        broker.close()
    return None


FRONT_DOORS = {"local": _local, "tcp": _tcp, "kafka": _kafka, "kombu": _kombu, "dramatiq": _dramatiq}


@pytest.mark.slow
def test_every_kind_through_every_front_door_is_owned(namespace, served):
    handles = [make(namespace, served) for make in FRONT_DOORS.values()]
    data_dir = default_data_dir(namespace)
    _wait(lambda: any(f.endswith(".dmsq") for f in os.listdir(data_dir)), "no snapshot written")
    held = _assert_owned(namespace, data_dir)
    assert {"q:jobs", "q:jobs.dlq", "q:w", "q:wal", "s:ev", "s:cmp", "kv:results", "q:tq", "s:ts", "kv:tkv",
            "s:ktopic", "q:kq", "q:dq"} <= set(held), sorted(held)
    assert held["q:w"][0] == 40 and held["q:jobs.dlq"][0] == 1
    kinds = {names.owner(namespace, e).kind.name for e in namespace_entries(namespace)}
    assert {"queue", "stream", "store", "registry", "exchanges", "broker"} <= kinds, kinds
    for h in handles:
        if h is not None:
            h.close()


def test_the_journal_of_a_server_without_a_data_dir_is_owned(namespace, servers):
    srv = servers(namespace, "--no-persist")
    with shmq.connect(srv.url) as b:
        b.create_stream("ts", partitions=1)
        p = b.transactional("etl-1")
        with p.transaction():
            p.append("ts", b"x")
    assert names.kafka_journal_entry(namespace) in namespace_entries(namespace)
    _assert_owned(namespace)
    assert srv.stop() == 0
    destroy_namespace(namespace)


def test_an_mp_queues_namespace_is_owned_and_destroyed_whole():
    from shmq import mp

    q = mp.JoinableQueue(maxsize=10)
    try:
        q.put(b"x" * (2 << 20))  # a body too big for the ring: a segment of its own
        q.put("small")
        ns = q._ns
        kinds = {names.owner(ns, e).kind.name for e in namespace_entries(ns)}
        assert kinds == {"registry", "queue", "mp-queue"}, namespace_entries(ns)
        report = doctor.diagnose([ns])
        assert report["orphans"] == [] and report["namespaces"][0]["unknown"] == []
        doctor.clean([ns])
        assert q.get(timeout=5) == b"x" * (2 << 20) and q.get(timeout=5) == "small"
    finally:
        from shmq.mp.lifetime import owner

        q.close()
        owner.cleanup()  # the namespaces this process made, and its reaper
    assert namespace_entries(q._ns) == []
