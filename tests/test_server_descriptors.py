"""The server within its file descriptors (RLIMIT_NOFILE), and no shortage of them ever
losing data (docs/OPERATIONS.md, File descriptors).

A server started under a low limit says so in one line at start and lowers its
connection limit to what fits beside its queues, streams and a reserve (again as queues
are made); a connection beyond it gets LIMIT_EXCEEDED naming the descriptor limit, not
a hint at TLS; an accept that fails for EMFILE all the same says one line per episode
and answers LIMIT_EXCEEDED, without spinning. Nothing that fails for want of a
descriptor removes anything: an attach (the standard library unlinked the segment it
could not map), a snapshot round (it removed the files of a queue it could not attach),
a stream's delete, housekeeping.
"""

import collections
import errno
import logging
import os
import re
import subprocess
import sys
import textwrap

import psutil
import pytest

import shmq
from shmq.engine.shm.names import queue_segment
from shmq.engine.shm.segment import SEGMENT_FDS, SHM_DIR
from shmq.engine.store import STORE_FDS
from shmq.persistence import Snapshotter, recover
from shmq.formats.logfiles import LOG_FDS
from shmq.server.housekeeper import Housekeeper
from shmq.server.limits import CONNECTION_FDS, MAX_LINGERING, RESERVE_FDS
from shmq.server.periodic import Periodic
from tests._wait import drain, wait_for

LIMIT = 256  # the servers' RLIMIT_NOFILE, soft and hard, in these tests
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def low_limit(tmp_path):
    """``env(n)``: the environment of a ``servers`` process that starts with RLIMIT_NOFILE
    n, soft and hard (so it cannot raise it): a sitecustomize on its PYTHONPATH sets it."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, resource\n"
        "n = int(os.environ['SHMQ_TEST_NOFILE'])\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))\n")
    return lambda n: {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "SHMQ_TEST_NOFILE": str(n)}


def _descriptor_lines(lines):
    return [x for x in lines if " file descriptors: " in x]


def _max_connections(line) -> int:
    return int(re.search(r"\bmax_connections=(\d+)", line).group(1))


def _connect_all(url, n):
    """``n`` connections, each pinged: (those open, Counter of the errors of the others)."""
    held, refused = [], collections.Counter()
    for _ in range(n):
        try:
            b = shmq.connect(url, connect_timeout=10, reconnect=False)
            b.ping()
            held.append(b)
        except Exception as e:  # noqa: BLE001 (each kind counted, and checked below)
            refused[f"{type(e).__name__}: {e}"] += 1
    return held, refused


def _bodies(name, i, n, tag="m"):
    return [f"{name}/{tag}{i + j}".encode() for j in range(n)]


# ---------------------------------------------------------------------- start-up, the limit, refusals
def test_the_start_says_what_its_descriptors_allow_and_a_connection_beyond_gets_limit_exceeded(
        broker, servers, low_limit):
    srv = servers(broker.namespace, "--no-persist", env=low_limit(LIMIT))
    (line,) = _descriptor_lines(srv.log)
    assert " WARNING " in line and f"more than its limit of {LIMIT}" in line, line
    assert "--max-connections lowered to" in line and "--max-connections 1024" in line, line
    assert "LimitNOFILE=" in line and "ulimit -n" in line and "give a lower --max-connections" in line, line
    cap = _max_connections(line)
    assert 1 <= cap < LIMIT
    held, refused = _connect_all(srv.url, cap + 5)
    try:
        assert len(held) == cap and sum(refused.values()) == 5, refused
        (error,) = refused
        assert error.startswith(f"LimitExceeded: too many connections (the server's limit is {cap}, lowered from "
                                f"--max-connections 1024 to fit its open-file limit of {LIMIT}"), error
        assert "tcps" not in error and "TLS" not in error
    finally:
        for b in held:
            b.close()
    with shmq.connect(srv.url) as b:  # the refused ones cost nothing: it serves on
        b.ping()
    assert srv.stop() == 0
    assert not any("Too many open files" in x or "Traceback" in x for x in srv.later), srv.later[-10:]


def test_a_server_whose_limit_fits_says_so_and_keeps_its_connection_limit(broker, servers, low_limit):
    srv = servers(broker.namespace, "--no-persist", "--max-connections", "16", env=low_limit(4096))
    (line,) = _descriptor_lines(srv.log)
    assert " INFO " in line and "of its limit of 4096" in line and "16 for its clients" in line, line
    assert "lowered" not in line and "connection" not in line  # (a terminal says no word of them at start)
    assert srv.stop() == 0


# ---------------------------------------------------------------------- many queues, many clients, one restart
def test_under_a_low_limit_every_message_survives_many_clients_and_comes_back_after_a_reboot(
        namespace, servers, low_limit, tmp_path):
    data = str(tmp_path / "data")
    env = low_limit(LIMIT)
    expected = {}
    with shmq.connect(namespace=namespace) as local:
        local.create_namespace()
        for i in range(12):  # made before the start, one with 2 lanes
            name = f"q{i}"
            q = local.create_queue(name, lanes=2 if i == 0 else 1)
            expected[name] = collections.Counter(_bodies(name, 0, 100))
            q.put_many(list(expected[name]))
            q.close()
    srv = servers(namespace, "--data-dir", data, "--snapshot-interval", "0.2", env=env)
    (first,) = _descriptor_lines(srv.log)
    with shmq.connect(srv.url) as admin:  # more over TCP, one with a log: the server fits its connections again
        for i in range(12, 20):
            name = f"q{i}"
            q = admin.create_queue(name, durability="wal" if i == 12 else "snapshot")
            expected[name] = collections.Counter(_bodies(name, 0, 100))
            q.put_many(list(expected[name]))
    again = srv.wait_for_line(lambda x: " file descriptors: " in x and "20 queue(s)" in x)
    cap = _max_connections(again)
    assert cap < _max_connections(first)

    held, refused = _connect_all(srv.url, cap + 20)
    try:
        assert len(held) == cap and sum(refused.values()) == 20, refused
        assert all(e.startswith("LimitExceeded: too many connections") and "open-file limit" in e
                   for e in refused), refused
        for k, b in enumerate(held):  # every client puts, and takes and acks what it got
            name = f"q{k % 20}"
            q = b.queue(name)
            new = _bodies(name, 1000 + 10 * k, 10, "c")
            q.put_many(new)
            expected[name].update(new)
            for d in q.get_many(5, timeout=5):
                d.ack()
                expected[name][d.body] -= 1
    finally:
        for b in held:
            b.close()
    assert srv.stop() == 0
    assert not any("Too many open files" in x or "Traceback" in x or "out of file descriptors" in x
                   for x in srv.later), [x for x in srv.later if "WARNING" in x or "ERROR" in x][:10]

    shmq.destroy_namespace(namespace)  # a reboot: the memory gone, every queue rebuilt from the data dir
    srv = servers(namespace, "--data-dir", data, env=env)
    with shmq.connect(namespace=namespace) as local:
        assert sorted(local.list_queues()) == sorted(expected)
        for name, want in expected.items():
            q = local.queue(name)
            assert collections.Counter(drain(q)) == +want, name  # every body, as often as put and not acked
            q.close()
    assert srv.stop() == 0


# ---------------------------------------------------------------------- an accept out of descriptors
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_an_accept_out_of_descriptors_is_one_line_an_answer_and_no_spin(broker, loop):
    proc = subprocess.Popen([sys.executable, "-m", "tests._starved_server", broker.namespace, "48", loop],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        url = f"tcp://127.0.0.1:{int(proc.stdout.readline())}"
        serving = psutil.Process(proc.pid)
        connections = getattr(serving, "net_connections", None) or serving.connections  # (psutil < 6)
        held, refused = _connect_all(url, 80)
        for b in held:
            b.close()
        assert held and refused, (len(held), refused)
        (error,) = refused  # each answered, none closed without a word (which the client took for TLS)
        assert error.startswith("LimitExceeded: the server is out of file descriptors"), error
        # the server closes its ends of those connections as it reads their ends
        wait_for(lambda: all(c.status == psutil.CONN_LISTEN for c in connections("tcp")), 10,
                 "the server to close the connections its clients closed")
        with shmq.connect(url, connect_timeout=10, reconnect=False) as b:  # it still listens
            b.ping()
    finally:
        proc.stdin.close()
        proc.wait(30)
    log = proc.stderr.read().splitlines()
    assert len([x for x in log if "out of file descriptors" in x]) == 1, log[:20]
    assert not any("Traceback" in x for x in log) and len(log) < 10, log[:20]


# ---------------------------------------------------------------------- nothing removed for want of a descriptor
_ATTACH_STARVED = textwrap.dedent("""
    import errno, os, resource, sys
    import shmq
    broker = shmq.connect(namespace=sys.argv[1])
    broker.list_queues()  # (the registry attached first)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    outcomes = []
    for free in range(16):  # 0, 1, 2, ... descriptors free: each attach fails (EMFILE) or works
        try:
            broker.queue("jobs").close()
            outcomes.append("attached")
        except OSError as e:
            assert e.errno == errno.EMFILE or "maximum number of files" in str(e), e
            outcomes.append("EMFILE")
        if held:
            os.close(held.pop())
    print(" ".join(outcomes))
""")


def test_an_attach_out_of_descriptors_removes_nothing(broker):
    q = broker.create_queue("jobs", lanes=2)
    q.put_many([b"%d" % i for i in range(1000)])
    r = subprocess.run([sys.executable, "-c", _ATTACH_STARVED, broker.namespace], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
    assert r.returncode == 0 and "Exception ignored" not in r.stderr, r.stderr  # (a half-made handle let go)
    assert "EMFILE" in r.stdout and r.stdout.split()[-1] == "attached", r.stdout
    assert os.path.exists(os.path.join(SHM_DIR, queue_segment(broker.namespace, "jobs").lstrip("/")))
    assert sorted(drain(broker.queue("jobs"))) == sorted(b"%d" % i for i in range(1000))


def _emfile(*_args, **_kw):
    raise OSError(errno.EMFILE, "Too many open files")


def test_a_snapshot_round_that_cannot_attach_or_finds_no_memory_keeps_the_files(broker, tmp_path, monkeypatch,
                                                                                caplog):
    data = str(tmp_path)
    for name in ("jobs", "other"):
        broker.create_queue(name).put_many([b"%s-%d" % (name.encode(), i) for i in range(1000)])
    snap = Snapshotter(shmq.connect(namespace=broker.namespace), data)
    snap.run_once()
    jobs = os.path.join(data, "jobs.dmsq")
    before = open(jobs, "rb").read()
    real = snap.broker.queue
    monkeypatch.setattr(snap.broker, "queue", lambda name, **kw: _emfile() if name == "jobs" else real(name, **kw))
    with caplog.at_level(logging.INFO, "shmq.persistence"):
        for _ in range(3):
            snap.run_once()
    said = [r.getMessage() for r in caplog.records if "jobs" in r.getMessage()]
    assert len(said) == 1 and "cannot attach queue jobs" in said[0] and "Too many open files" in said[0], said
    assert open(jobs, "rb").read() == before  # kept as it was
    assert snap.last_round["queues"] == 1 and snap.last_round["failed"] == 1  # the other one snapshotted
    monkeypatch.setattr(snap.broker, "queue", real)

    # its segment gone while its registry entry stays (half removed): its files stay, a restart rebuilds it
    os.unlink(os.path.join(SHM_DIR, queue_segment(broker.namespace, "jobs").lstrip("/")))
    caplog.clear()
    with caplog.at_level(logging.INFO, "shmq.persistence"):
        for _ in range(3):
            snap.run_once()
    assert open(jobs, "rb").read() == before
    said = [r.getMessage() for r in caplog.records if "jobs" in r.getMessage()]
    assert len(said) == 1 and "memory was not found" in said[0], said
    snap.close()
    snap.broker.close()
    assert "jobs" in recover(broker, data)  # the start's recovery: rebuilt from the kept file
    assert sorted(drain(broker.queue("jobs"))) == sorted(b"jobs-%d" % i for i in range(1000))


def test_a_stream_delete_out_of_descriptors_changes_nothing(broker, monkeypatch):
    s = broker.create_stream("ev", partitions=2)
    s.append_many([b"a", b"b", b"c"])
    import shmq.engine.broker as engine_broker

    monkeypatch.setattr(engine_broker, "Stream", _emfile)
    with pytest.raises(OSError, match="Too many open files"):
        broker.delete_stream("ev")
    monkeypatch.undo()
    broker.list_queues()  # (what finishes a delete left half done, under the registry's lock)
    assert broker.list_streams() == ["ev"]
    assert sorted(r.value for p in range(2) for r in broker.stream("ev").read(p, 0, 10)) == [b"a", b"b", b"c"]
    s.close()


def test_housekeeping_that_cannot_attach_says_it_once_and_lets_nothing_go(broker, monkeypatch, caplog):
    for name in ("jobs", "other"):
        broker.create_queue(name).put(b"x")
    keeper = Housekeeper(shmq.connect(namespace=broker.namespace))
    real = keeper.broker.queue
    monkeypatch.setattr(keeper.broker, "queue", lambda name, **kw: _emfile() if name == "jobs" else real(name, **kw))
    try:
        with caplog.at_level(logging.INFO, "shmq.server"):
            for _ in range(3):
                keeper.run_once()
            said = [r.getMessage() for r in caplog.records if "jobs" in r.getMessage()]
            assert len(said) == 1 and "Too many open files" in said[0], said
            assert set(keeper._queues) == {"other"} and keeper.census.queues == 2
            monkeypatch.setattr(keeper.broker, "queue", real)
            keeper.run_once()
        assert set(keeper._queues) == {"jobs", "other"}
        assert any("housekeeping of queue jobs works again" in r.getMessage() for r in caplog.records)
    finally:
        keeper.close()
        keeper.broker.close()
    assert broker.queue("jobs").get(timeout=5).body == b"x"


def test_a_periodic_failure_is_said_once_while_it_repeats(caplog):
    runs = []

    def work():
        runs.append(1)
        if len(runs) <= 5:
            raise OSError(errno.EMFILE, "Too many open files")

    with caplog.at_level(logging.INFO, "shmq.server"):
        p = Periodic(0.001, work, "housekeeping").start()
        try:
            wait_for(lambda: len(runs) >= 8, 10, "eight runs")
        finally:
            p.stop()
            p.join()
    lines = [r for r in caplog.records if "housekeeping" in r.getMessage()]
    assert [r.levelname for r in lines] == ["ERROR", "INFO"], [r.getMessage() for r in lines]
    assert "Too many open files" in lines[0].getMessage() and lines[0].exc_info is None
    assert "works again (after 4 more failed run(s))" in lines[1].getMessage()


# ---------------------------------------------------------------------- the page
def test_operations_gives_the_descriptors_each_object_costs():
    """docs/OPERATIONS.md's table says what the constants say (one owner per fact)."""
    page = open(os.path.join(ROOT, "docs", "OPERATIONS.md")).read()
    section = page.split("## File descriptors", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| ([^|]+?) \| (\d+) \|", section, re.M))
    assert rows == {
        "a queue lane, or a stream's groups' table, or a stream partition (its segment)": str(SEGMENT_FDS),
        "a `wal` queue lane, or a partition of a durable stream (its log or high-water file)": str(LOG_FDS),
        "a keyed store (SQLite's file, -wal and -shm)": str(STORE_FDS),
        "a connection (either port, TLS or not)": str(CONNECTION_FDS),
        "the reserve: snapshots, logs, housekeeping, creates": str(RESERVE_FDS),
    }, rows
    assert f"{MAX_LINGERING}" in section and "LimitNOFILE=" in section and "ulimit -n" in section
