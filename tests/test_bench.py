"""The bench: `python -m bench --quick`, `python -m bench.streams --quick`, `python -m
bench.scale`, `python -m bench.contention` and `python -m bench.tcp --quick` run end to end
and write well-formed output (not their speed), every adapter carries a case through the
harness, the consumers' stop logic, the contention workers' clock and refills, producers
alone (pipelined, and one timed put), and the streams' and TCP's target verdicts. Each
test looks only at the shmq namespaces it or its bench created, and at the peer servers
its bench started."""

import argparse
import inspect
import io
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

import shmq
from bench import (adapters, contention, contention_roles, harness, load, machine, produce_roles, report, scale,
                   scaling, tcp, tcp_cpu, tcp_report)
from bench.adapters.shmq_local import ShmqLanes
from bench.harness import CaseFailed, CaseResult
from bench.plan import ContentionJob, Job, ProduceJob, StreamJob, plan_tcp
from bench.plan import queue_bytes as plan_queue_bytes
from bench.roles import consume_polled, consume_shared
from tests import _processes
from tests._wait import wait_for

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _entries_of_run(pid):
    """/dev/shm entries of the namespaces a bench process created (``bench-<pid>-*``)."""
    prefix = f"bench-{pid}-"
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return []
    return sorted(n for n in names if any(part.startswith(prefix) for part in n.split(".")))


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _orphaned_bench_servers():
    """Pids of peer servers a bench started (their temporary directories say so) whose
    bench is gone: left running. Another bench running meanwhile still owns its own."""
    found = set()
    for proc in psutil.process_iter(["cmdline", "ppid"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if any(f"bench-{peer}-" in cmdline for peer in ("redis", "nats", "rabbit")):
            if proc.info["ppid"] in (0, 1) or not psutil.pid_exists(proc.info["ppid"]):
                found.add(proc.pid)
    return found


@pytest.fixture
def role_context():
    """The context a bench starts its roles in: forked from a server that has imported shmq
    and the bench once (the suite's, tests._processes, which preloads what the harness's does)."""
    return _processes.WORKERS


def _run(argv, env, timeout, module="bench"):
    """Run ``python -m bench ...``; returns (pid, returncode, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.pid, proc.returncode, out, err


def _run_saved(module, argv, out_json, timeout):
    """Run ``python -m <module> <argv>`` (which writes its run to ``out_json``) to a zero
    exit; returns (its pid, its stdout, the run it wrote, which names its command)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pid, code, stdout, stderr = _run(argv, env, timeout, module=module)
    assert code == 0, stdout + stderr
    doc = json.loads(out_json.read_text())
    assert doc["command"] == f"python -m {module} " + " ".join(argv)
    return pid, stdout, doc


@pytest.mark.slow
def test_quick_bench_output_is_well_formed(tmp_path):
    """The matrix's run, its tables, JSON, plot and --report, on shmq and one peer; every
    other system's pass through the harness is test_every_adapter_carries_cases_through_the_harness's,
    the streams' part test_quick_stream_bench_output_is_well_formed's (the whole --quick
    matrix, every system and the streams, took 4-5 minutes of the suite: it checked both again)."""
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = ["--quick", "--systems", "shmq,mpqueue", "--sizes", "64", "--no-streams", "--json", str(out_json),
            "--plot", str(out_png)]
    pid, code, stdout, stderr = _run(args, env, 600)  # (a bound, not a speed)
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("shmq") and lines[1].startswith("machine :")
    assert lines[2].startswith("python  :") and lines[3].startswith("packages:")
    assert "Throughput, P producers -> P consumers" in stdout
    assert "msgs/s" in stdout and "vs mpq" in stdout and "vs best" in stdout
    assert "RTT p50" in stdout and "RTT p99.9" in stdout
    assert "Durability modes" in stdout and "wal always" in stdout

    doc = json.loads(out_json.read_text())
    assert {"date", "command", "machine", "settings", "cases", "durability"} <= set(doc)
    assert doc["command"] == f"python -m bench {' '.join(args)}"
    for system in ("shmq", "mpqueue"):
        cases = [c for c in doc["cases"] if c["system"] == system]
        assert cases and all(c["status"] == "ok" for c in cases), cases
        for c in cases:
            value = c["summary"]["p50_us" if c["kind"] == "rtt" else "msgs_per_s"]
            assert value > 0
    assert all(c["status"] in ("ok", "skipped") for c in doc["cases"])
    assert {c["system"] for c in doc["cases"]} == {"shmq", "mpqueue"}
    assert all(d.get("msgs_per_s", 0) > 0 for d in doc["durability"]), doc["durability"]

    if _has_matplotlib():
        assert out_png.read_bytes()[:8] == PNG_SIGNATURE
    else:
        assert "plot skipped: matplotlib not installed" in stdout
    # the bench's own leak check (its notes) and ours look at its namespaces only
    assert doc["notes"] == []
    assert _entries_of_run(pid) == []

    # --report reprints the same tables from the JSON alone, and redraws the plot
    again_png = tmp_path / "again.png"
    _pid, again_code, again_out, again_err = _run(["--report", str(out_json), "--plot", str(again_png)], env, 60)
    assert again_code == 0, again_out + again_err

    def tables(text):
        return [line for line in text.splitlines() if not line.startswith(("wrote ", "plot skipped"))]

    assert tables(again_out) == tables(stdout)
    if _has_matplotlib():
        assert again_png.read_bytes()[:8] == PNG_SIGNATURE


class _ListEnd:
    """A receive end over a list of bodies, and a send end that records what it sent; a
    receive end notes, at each release, how much its peer send end had sent by then."""

    takes_ahead = False

    def __init__(self, bodies=(), peer=None):
        self.bodies, self.sent, self.peer, self.released = list(bodies), [], peer, []

    def release(self):
        self.released.append(len(self.peer.sent))

    def recv(self):
        return self.bodies.pop(0)

    def recv_batch(self, limit):
        taken, self.bodies = self.bodies[:limit], self.bodies[limit:]
        return taken

    def send(self, body):
        self.sent.append(body)

    def send_batch(self, bodies):
        self.sent.extend(bodies)

    def flush(self):
        pass


class _RacyTotal:
    """A shared counter (a mesh's) where another consumer adds `bump` just after every locked update."""

    def __init__(self, value, bump):
        self.value, self._bump = value, bump

    def get_lock(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.value += self._bump


def test_consumers_of_a_shared_queue_stop_at_a_stop_and_put_the_extras_back():
    job = Job("mpqueue", "tput", 8, "batch", n=100, runs=1, pairs=4)
    tx = _ListEnd()
    rx_tx = _ListEnd([b"x" * 8, b"x" * 8, b"", b""], peer=tx), tx  # one batch: two messages, two stops
    result = consume_shared(job, rx_tx, None)  # (no shared count: nothing locked per message)
    assert result["got"] == 2
    assert rx_tx[1].sent == [b""]  # the extra stop went back, for another consumer
    assert rx_tx[0].released == [0]  # after giving back what was prefetched for it (RabbitMQ)
    job = Job("mpqueue", "tput", 8, "msg", n=100, runs=1, pairs=4)
    tx = _ListEnd()
    rx_tx = _ListEnd([b"x" * 8, b"x" * 8, b"x" * 8, b"", b"x" * 8], peer=tx), tx
    assert consume_shared(job, rx_tx, None)["got"] == 3 and tx.sent == []  # its own stop: it leaves


class _AheadEnd(_ListEnd):
    takes_ahead = True  # a broker's prefetch (RabbitMQ)


@pytest.mark.parametrize("mode", ["msg", "batch"])
def test_consumers_that_take_ahead_stop_at_a_shared_count_the_crosser_stops_the_others(mode):
    job = Job("rabbitmq", "tput", 8, mode, n=100, runs=1, pairs=4)
    # this consumer takes the 99th message; another takes the 100th between the lock and the check
    tx = _AheadEnd()
    rx_tx = _AheadEnd([b"x" * 8, b""], peer=tx), tx
    assert consume_shared(job, rx_tx, _RacyTotal(98, bump=1))["got"] == 1
    assert rx_tx[1].sent == [] and rx_tx[0].released == [0]  # it left through its own stop
    tx = _AheadEnd()
    rx_tx = _AheadEnd([b"x" * 8], peer=tx), tx
    assert consume_shared(job, rx_tx, _RacyTotal(99, bump=0))["got"] == 1
    assert rx_tx[1].sent == [b""] * 3  # the crosser stops the other three
    assert rx_tx[0].released == [0]  # having first given back its prefetch, so the stops reach them
    from bench.roles import produce

    sender = _AheadEnd()
    produce(job, [sender], 0)
    assert b"" not in sender.sent  # its producers send no stops


def test_producers_send_one_stop_per_consumer_after_their_messages():
    from bench.roles import produce, stops_of

    pp = Job("mpqueue", "tput", 8, "msg", n=100, runs=1, pairs=4)
    assert [stops_of(pp, i) for i in range(4)] == [1, 1, 1, 1]
    fan_out = Job("mpqueue", "tput", 8, "msg", n=100, runs=1, pairs=3, shape="1->P")
    assert stops_of(fan_out, 0) == 3
    assert stops_of(Job("mpqueue", "tput", 8, "msg", n=100, runs=1, pairs=1), 0) == 0  # a lone consumer counts
    tx = _ListEnd()
    produce(pp, [tx], 2)
    assert tx.sent == [b"x" * 8] * pp.share + [b""]  # the stop after every message it put


class _PolledEnd:
    """A mesh receive end: a script of poll results ([] = an idle poll)."""

    def __init__(self, script, on_idle):
        self._script, self._on_idle = list(script), on_idle

    def poll_batch(self, batch, seconds):
        bodies = self._script.pop(0) if self._script else []
        if not bodies:
            self._on_idle()
        return bodies


def test_a_mesh_consumer_polls_until_the_shared_total_reaches_n():
    job = Job("zmq", "tput", 4, "msg", n=10, runs=1, pairs=4)
    total = _RacyTotal(5, bump=0)
    idle = []

    def another_consumer_finishes():  # during the second idle poll the others take the last 3
        idle.append(total.value)
        if len(idle) == 2:
            total.value = job.n

    rx = _PolledEnd([[b"abcd"], [b"abcd"], [], [], []], another_consumer_finishes)
    result = consume_polled(job, [rx], total)
    assert result["got"] == 2
    assert idle == [7, 7]  # it polled on at 7 of 10 and stopped once all 10 were taken


def test_the_leak_check_counts_only_its_own_namespace(broker, namespace):
    broker.create_queue("q")
    assert adapters.leftover_notes("shmq", adapters.run_namespace("local")) == []
    notes = adapters.leftover_notes("shmq", namespace)
    assert len(notes) == 1 and notes[0].startswith("shmq left ") and f"shmq.{namespace}.registry" in notes[0]


@pytest.mark.slow
@pytest.mark.parametrize("system", adapters.SYSTEMS)
def test_every_adapter_carries_cases_through_the_harness(system, role_context):
    """Every system (iceoryx2, RabbitMQ and core NATS among them) runs a tiny case of each
    kind, or is skipped saying why; a case it cannot run comes back skipped with its reason."""
    reason = adapters.probe(system)
    if reason:
        pytest.skip(reason)
    servers_before = _orphaned_bench_servers()
    jobs = [Job(system, "tput", 64, "msg", n=128, runs=1, warmup=8),
            Job(system, "tput", 1024, "batch", n=192, runs=2, warmup=8),
            Job(system, "tput", 64, "batch", n=256, runs=2, warmup=8, pairs=2),
            Job(system, "rtt", 64, "msg", n=20, runs=1, warmup=4)]
    adapter = adapters.adapter_class(system)()
    try:
        unsupported = [adapter.unsupported(j) for j in jobs]
        progress = harness.Progress(len(jobs), stream=io.StringIO())
        results = harness.run_jobs(jobs, {system: adapter}, role_context, 30.0, progress)
    finally:
        notes = adapter.close()
    assert unsupported[:2] == [None, None] and unsupported[3] is None  # 1 -> 1 and ping-pong run everywhere
    expected = [("skipped", 0, why) if why else ("ok", j.runs, "") for j, why in zip(jobs, unsupported)]
    assert [(r.status, len(r.runs), r.detail if r.status == "skipped" else "") for r, _ in results] == expected, \
        [r.detail for r, _ in results]
    assert all(s["msgs_per_s"] > 0 for (r, s) in results[:3] if r.status == "ok") and results[3][1]["p50_us"] > 0
    assert notes == []
    assert _orphaned_bench_servers() <= servers_before


def test_a_missing_peer_is_skipped_saying_why(monkeypatch):
    """No iceoryx2 bindings, no rabbitmq-server, no nats-server: each is skipped with its reason."""
    import bench.servers

    monkeypatch.setitem(sys.modules, "iceoryx2", None)  # import iceoryx2 raises ImportError
    monkeypatch.delitem(sys.modules, "bench.adapters.iceoryx2_pubsub", raising=False)
    monkeypatch.setattr(bench.servers, "RABBITMQ_BIN", "/nonexistent/rabbitmq/bin")
    monkeypatch.setenv("PATH", "/nonexistent")
    skipped = {}
    assert harness.open_adapters(["iceoryx2", "iceoryx2-poll", "rabbitmq", "nats-core"], skipped) == {}
    assert skipped == {"iceoryx2": "iceoryx2 not installed", "iceoryx2-poll": "iceoryx2 not installed",
                       "rabbitmq": "rabbitmq-server not installed (apt-get install rabbitmq-server)",
                       "nats-core": "nats-server not on PATH"}


def test_the_report_says_which_peers_acknowledge_nothing():
    def case(system, rate):
        return CaseResult(system, "tput", 64, "msg", 1000), {"msgs_per_s": rate, "msgs_per_s_min": rate,
                                                             "msgs_per_s_max": rate, "mb_per_s": 0.0}

    results = [case("shmq", 200_000), case("iceoryx2-poll", 300_000), case("rabbitmq", 5_000)]
    settings = argparse.Namespace(runs=1, quick=True, cpus=())
    info = {"cpu": "x", "logical_cpus": 2, "physical_cores": None, "usable_cpus": None, "os": "y", "python": "z"}
    out = io.StringIO()
    report.report(info, settings, {}, results, [], out=out)
    rows = {cells[4]: cells[5] for cells in map(str.split, out.getvalue().splitlines()) if cells[:4] == [
        "64", "B", "msg", "1->1"]}  # size, mode, P, system, acks, ...
    assert rows == {"shmq": "each", "iceoryx2-poll": "none", "rabbitmq": "each"}
    assert "  no acks (a received message is gone): iceoryx2-poll; shmq acks every message" in out.getvalue()
    assert {adapters.acks(s) for s in adapters.SYSTEMS} == {"each", "none"}  # every system says


def test_the_machines_python_speed_is_measured_and_reported():
    best, median = machine.python_speed(tries=50)
    assert 0 < best <= median
    info = {"cpu": "x", "logical_cpus": 2, "physical_cores": None, "usable_cpus": None, "os": "y", "python": "z",
            "python_speed_us": [60.2, 117.0]}
    out = io.StringIO()
    report.print_header(info, argparse.Namespace(runs=1, quick=True, cpus=()), {}, out)
    lines = out.getvalue().splitlines()
    assert lines[3].startswith("packages:")
    assert lines[4] == "speed   : a Python loop of 2,000 additions 60 µs at best, 117 at the median"
    assert "python_speed_us" in machine.machine_info()


# ---------------------------------------------------------------- streams


@pytest.mark.slow
def test_quick_stream_bench_output_is_well_formed(tmp_path):
    out_json = tmp_path / "streams.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    servers_before = _orphaned_bench_servers()
    # shmq's local stream and one peer; each other system's pass through the harness is
    # test_every_stream_adapter_carries_cases_through_the_harness's
    systems = ["shmq-stream", "redis-streams"]
    args = ["--quick", "--systems", ",".join(systems), "--json", str(out_json)]
    pid, code, stdout, stderr = _run(args, env, 300, module="bench.streams")
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    assert lines[0] == "shmq stream benchmark" and lines[1].startswith("machine :")
    assert lines[3].startswith("load    : 1-minute load average")
    assert lines[4].startswith("packages:") and "nats-server" in lines[4] and "redis-server" in lines[4]
    assert "Streams, P producers -> 1 consumer" in stdout and "rec/s" in stdout and "vs best peer" in stdout
    assert "reference, published, not measured here: 821.56k records/s: Kafka" in stdout and "Kreps" in stdout
    assert "Targets of the streams issue" in stdout and "local, batched: >= 3.00M records/s" in stdout

    doc = json.loads(out_json.read_text())
    assert doc["command"] == f"python -m bench.streams {' '.join(args)}"
    part = doc["streams"]
    assert part["reference"]["records_per_s"] == 821_557 and part["notes"] == []
    cases = part["cases"]
    assert all(c["status"] in ("ok", "skipped") for c in cases), [c["detail"] for c in cases]
    # each system asked for ran or says why not; shmq's local stream always runs, in every case
    assert set(systems) <= {c["system"] for c in cases} | set(part["skipped"])
    for system in set(systems) - set(part["skipped"]):
        mine = [c for c in cases if c["system"] == system]
        assert {(c["kind"], c["mode"], c["pairs"]) for c in mine} == {
            (read, mode, p) for read in ("group", "offset") for mode in ("msg", "batch") for p in (1, 4)}
        for c in mine:
            assert c["status"] == "ok" and c["summary"]["msgs_per_s"] > 0 and c["summary"]["append_per_s"] > 0
    assert "shmq-stream" not in part["skipped"]
    if {"redis-streams", "nats-js"} - set(part["skipped"]):  # a peer ran: shmq's rows are compared with it
        assert "Ratios shmq-stream / peer" in stdout
    for system, reason in part["skipped"].items():
        assert reason and f"skipped: {reason}" in stdout

    # nothing of the run's namespaces in /dev/shm, no server of its own left running
    assert _entries_of_run(pid) == []
    assert _orphaned_bench_servers() <= servers_before

    _pid, again_code, again_out, again_err = _run(["--report", str(out_json)], env, 60, module="bench.streams")
    assert again_code == 0, again_out + again_err
    assert again_out.splitlines() == [line for line in stdout.splitlines() if not line.startswith("wrote ")]


@pytest.mark.slow
@pytest.mark.parametrize("system", adapters.STREAM_SYSTEMS)
def test_every_stream_adapter_carries_cases_through_the_harness(system, role_context):
    reason = adapters.probe(system)
    if reason:
        pytest.skip(reason)
    jobs = [StreamJob(system, read, 64, mode, n=256, runs=runs, warmup=8, pairs=p, partitions=p)
            for read, mode, p, runs in (("group", "msg", 1, 1), ("offset", "batch", 4, 2), ("group", "batch", 4, 1),
                                        ("offset", "msg", 1, 1))]
    try:
        adapter = adapters.adapter_class(system)()
    except Exception as exc:  # a client that has streams before its server does
        pytest.skip(f"{system} setup failed: {exc!r}")
    try:
        progress = harness.Progress(len(jobs), stream=io.StringIO())
        results = harness.run_jobs(jobs, {system: adapter}, role_context, 30.0, progress)
    finally:
        notes = adapter.close()
    assert [(r.status, len(r.runs)) for r, _ in results] == [("ok", 1), ("ok", 2), ("ok", 1), ("ok", 1)], \
        [r.detail for r, _ in results]
    assert all(s["msgs_per_s"] > 0 and s["append_per_s"] > 0 for _, s in results)
    assert notes == []


def _stream_case(system, mode, rate, read="group", pairs=1, size=64):
    result = CaseResult(system, read, size, mode, 1000, pairs)
    return result, {"msgs_per_s": rate, "msgs_per_s_min": rate, "msgs_per_s_max": rate, "mb_per_s": 0.0}


def test_stream_targets_name_what_was_met_and_missed():
    results = [_stream_case("shmq-stream", "msg", 100_000), _stream_case("redis-streams", "msg", 5_000),
               _stream_case("nats-js", "msg", 9_000),
               _stream_case("shmq-stream", "msg", 50_000, read="offset"),
               _stream_case("redis-streams", "msg", 10_000, read="offset"),
               _stream_case("shmq-stream", "batch", 3.2e6), _stream_case("redis-streams", "batch", 50_000)]
    per_record, batched, tcp = report.stream_targets({"shmq-stream-tcp": "no remote streams"}, results)
    assert per_record[1:] == ("5.0x .. 11.1x (1 of 2 cases)", "missed")  # the best peer per case: 10 k, 9 k
    assert batched[1:] == ("3.20M .. 3.20M records/s (1 of 1 cases)", "met")
    assert tcp[1:] == ("not measured: no remote streams", "not measured")

    results += [_stream_case("shmq-stream-tcp", "batch", 60_000)]
    tcp = report.stream_targets({}, results)[-1]
    assert tcp[1:] == ("1.20x .. 1.20x of Redis (1 of 1 cases)", "met")


def test_the_prefetch_bench_runs_end_to_end_and_names_what_it_skips():
    """``python -m bench.prefetch`` on a tiny run: shmq's row, and each peer either measured
    or skipped with its reason (not its speed); it leaves nothing in /dev/shm."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "bench.prefetch", "--runs", "1", "--count", "300", "--sizes", "64",
                             "--systems", "shmq-tcp,redis-streams,nats-js"], cwd=str(ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout + stderr
    assert "TCP consume with prefetch" in stdout
    rows = {line.split()[0]: line.split() for line in stdout.splitlines() if line.split()[:1] in (["shmq-tcp"],
                                                                                               ["redis-streams"],
                                                                                               ["nats-js"])}
    assert rows["shmq-tcp"][1] == "64B" and float(rows["shmq-tcp"][2].replace(",", "")) > 0
    assert "redis-streams" in rows or "redis-streams" in stdout + stderr  # measured, or skipped saying why
    if "nats-js" in rows:  # a NATS JetStream durable pull consumer, each message acked
        assert rows["nats-js"][1] == "64B" and float(rows["nats-js"][2].replace(",", "")) > 0
    else:
        assert "nats-js: skipped (" in stdout, stdout  # nats-server or nats-py missing, or it did not start
    assert _entries_of_run(proc.pid) == []


# ---------------------------------------------------------------- scale and contention


def _hide_faster_fifo(monkeypatch):
    """As if faster-fifo were not installed: importing it raises ImportError."""
    monkeypatch.setitem(sys.modules, "faster_fifo", None)
    monkeypatch.delitem(sys.modules, "bench.adapters.fasterfifo", raising=False)


def test_a_scale_plan_runs_1_to_1_once_and_each_shape_above_it():
    jobs = scale.plan_scale(["shmq", "zmq"], [64], [1, 2, 4], ["P->P", "1->P", "P->1"], ["msg"], 3, 1000, 60.0,
                            (0, 1))
    assert [(j.pairs, j.shape, j.system) for j in jobs[:2]] == [(1, "P->P", "shmq"), (1, "P->P", "zmq")]
    assert {(j.pairs, j.shape) for j in jobs} == {(1, "P->P")} | {(p, x) for p in (2, 4) for x in
                                                                   ("P->P", "1->P", "P->1")}
    assert all(j.cpus == ((0, 1) if j.pairs == 1 else ()) for j in jobs)  # only 1 -> 1 is pinned
    fan_out = next(j for j in jobs if (j.pairs, j.shape) == (4, "1->P"))
    fan_in = next(j for j in jobs if (j.pairs, j.shape) == (4, "P->1"))
    assert fan_out.roles == ("producer0", "consumer0", "consumer1", "consumer2", "consumer3")
    assert fan_in.roles == ("producer0", "producer1", "producer2", "producer3", "consumer0")
    assert (fan_out.share, fan_in.share) == (4000, 1000) and fan_out.label == "shmq tput 64B msg 1->4"  # P x count
    batched = scale.plan_scale(["shmq"], [64], [4], ["P->1"], ["batch"], 1, 1001, 60.0, ())[0]
    assert batched.n == 16016 and batched.n % batched.producers == 0  # batched: 4 x, whole shares


def test_a_tcp_plan_runs_each_case_on_both_systems_with_whole_batches_per_producer():
    jobs = plan_tcp(["shmq-tcp", "redis"], sizes=[64], pairs=[1, 4], count=128, trips=50, runs=2, cpus=(0, 1))
    assert [(tcp_report.case_of(j), j.size, j.producers, j.consumers, j.n) for j in jobs[::2]] == [
        ("pingpong", 64, 1, 1, 50), ("put", 64, 1, 0, 50),
        ("msg", 64, 1, 1, 128), ("msg", 64, 4, 4, 256),  # 128 messages cannot give 4 producers a batch each
        ("batch", 64, 1, 1, 640), ("batch", 64, 4, 4, 512),
        ("pipe", 64, 1, 0, 640), ("pipe", 64, 4, 0, 512)]
    assert [j.system for j in jobs] == ["shmq-tcp", "redis"] * 8  # interleaved, case by case
    pingpong, put, pipe4 = jobs[0], jobs[2], jobs[-1]
    assert (pingpong.roles, pingpong.channels, put.roles, put.channels) == (("pinger", "ponger"), 2, ("worker0",), 1)
    assert pipe4.roles == ("worker0", "worker1", "worker2", "worker3") and pipe4.share == 128
    assert all(j.cpus == ((0, 1) if j.producers == 1 else ()) for j in jobs)  # a 1 -> 1 case and a lone producer
    assert pipe4.queue_bytes == plan_queue_bytes(64)  # 64 MiB holds a run and its warm-up, and at 1 KiB:
    big = plan_tcp(["shmq-tcp"], ["pipe"], [1024], [4], count=40_000)[0]
    assert big.n == 199_936 and big.queue_bytes == (199_936 + 4 * 201) * (1024 + 64)
    assert [tcp_report.case_of(j) for j in plan_tcp(["shmq-tcp"], ["put", "batch"], [64], [1])] == ["put", "batch"]


def _tcp_case(system, case, size=64, pairs=1, status="ok", **summary):
    """A bench.tcp result: ``case`` one of plan.TCP_CASES, its summary's figures as given."""
    kind, mode = ("rtt", "msg") if case in ("pingpong", "put") else ("tput", case)
    shape = "P->0" if case in ("put", "pipe") else "P->P"
    return CaseResult(system, kind, size, mode, 1000, pairs, status=status, shape=shape, runs=[{}, {}]), summary


def test_tcp_rows_put_shmq_over_redis_and_judge_the_issues_targets():
    """shmq / Redis both ways (a latency below 1x and a rate above 1x are shmq ahead), the
    target only where issue 44 sets one (64 B), and a failed side named, never a ratio."""
    lat = dict(p50_min_us=90.0, p50_max_us=110.0, p99_us=300.0, p999_us=900.0)
    results = [_tcp_case("shmq-tcp", "pingpong", p50_us=100.0, **lat), _tcp_case("redis", "pingpong", p50_us=250.0,
                                                                                   **lat),
               _tcp_case("shmq-tcp", "put", p50_us=31.0, **lat), _tcp_case("redis", "put", p50_us=40.0, **lat),
               _tcp_case("shmq-tcp", "msg", msgs_per_s=15_000.0, msgs_per_s_min=14_000.0, msgs_per_s_max=17_000.0),
               _tcp_case("redis", "msg", msgs_per_s=10_000.0, msgs_per_s_min=9_000.0, msgs_per_s_max=11_000.0),
               _tcp_case("shmq-tcp", "batch", pairs=4, msgs_per_s=300_000.0, msgs_per_s_min=1.0, msgs_per_s_max=1.0),
               _tcp_case("redis", "batch", pairs=4, msgs_per_s=100_000.0, msgs_per_s_min=1.0, msgs_per_s_max=1.0),
               _tcp_case("shmq-tcp", "pipe", size=1024, msgs_per_s=50_000.0, msgs_per_s_min=1.0, msgs_per_s_max=1.0),
               _tcp_case("redis", "pipe", size=1024, status="timeout"),
               _tcp_case("shmq-tcp", "pipe", msgs_per_s=50_000.0, msgs_per_s_min=1.0, msgs_per_s_max=1.0),
               _tcp_case("redis", "pipe", status="error")]
    table = tcp_report.rows(results)
    assert [row.cells() for row in table] == [
        ["ping-pong", "64 B", "1->1", "p50 µs", "100.0 ±10%", "250.0 ±4%", "0.40x", "<= 0.8x met"],
        ["ping-pong", "64 B", "1->1", "p99 µs", "300.0", "300.0", "1.00x", ""],
        ["ping-pong", "64 B", "1->1", "p99.9 µs", "900.0", "900.0", "1.00x", ""],
        ["one put", "64 B", "1->0", "p50 µs", "31.0 ±32%", "40.0 ±25%", "0.78x", "<= 0.3x missed"],
        ["one put", "64 B", "1->0", "p99 µs", "300.0", "300.0", "1.00x", ""],
        ["one put", "64 B", "1->0", "p99.9 µs", "900.0", "900.0", "1.00x", ""],
        ["per message", "64 B", "1->1", "msgs/s", "15.0 k ±10%", "10.0 k ±10%", "1.50x", ">= 1.5x met"],
        ["batched (64)", "64 B", "4->4", "msgs/s", "300 k ±0%", "100 k ±0%", "3.00x", ""],  # a target at 1 -> 1 only
        ["pipelined put", "1 KiB", "1->0", "msgs/s", "50.0 k ±0%", "timeout", "n/a", ""],  # no target at 1 KiB
        ["pipelined put", "64 B", "1->0", "msgs/s", "50.0 k ±0%", "error", "n/a", ">= 3.0x not measured"]]
    assert tcp_report.target_summary(table) == ("targets of issue 44 (64 B): 2 of 4 met; not met: one put 1->0 p50, "
                                                "pipelined put 1->0 msgs/s")


def test_producers_alone_take_out_the_warm_up_then_each_runs_messages():
    log = []

    def end(spec, role):
        return _CountingEnd(log, role)

    job = ProduceJob("shmq-tcp", "tput", 64, "pipe", 640, 3, pairs=4, warmup=10)
    job.before_run(end, ["spec"], [])
    job.before_run(end, ["spec"], [{"seconds": 0.5, "got": 640}])
    assert log == [("recv", 40), ("recv", 640)]  # 4 workers' warm-up, then a run's n
    tx = _CountingEnd([])
    assert produce_roles.work(job, [tx])["got"] == 160 and tx.count == 160  # its share, pipelined
    one = produce_roles.work(ProduceJob("redis", "rtt", 64, "msg", 50, 1), [tx])
    assert tx.count == 210 and 0 < one["p50_us"] <= one["p99_us"] <= one["p999_us"] <= one["max_us"]


class _Setup:
    """A job whose before_run waits for ``release`` (or raises ``error``)."""

    def __init__(self, error=None):
        self.release, self.error = threading.Event(), error

    def before_run(self, end, specs, runs):
        if self.error:
            raise self.error
        self.release.wait(30)


def test_a_run_whose_queue_cannot_be_set_up_ends_its_case_not_the_bench():
    stuck = _Setup()
    try:
        with pytest.raises(CaseFailed, match=r"setting up run 2 \(filling or emptying the queue\) took over 0s") as e:
            harness._prepare(stuck, None, [], [{}], 0.05)
        assert e.value.status == "timeout"
    finally:
        stuck.release.set()
    with pytest.raises(CaseFailed, match="(?s)setting up run 1 failed:.*OSError: the server went away") as e:
        harness._prepare(_Setup(OSError("the server went away")), None, [], [], 5.0)
    assert e.value.status == "error"


@pytest.mark.parametrize("system", ["shmq", "shmq-tcp", "redis"])
def test_producers_alone_carry_their_cases_through_the_harness(system, role_context):
    """Pipelined producers (2) and one timed put, two runs each: the queue emptied before
    each run holds exactly what the last one put (a flush that left some unsent would stop
    the next run's set-up, and the case)."""
    reason = adapters.probe(system)
    if reason:
        pytest.skip(reason)
    jobs = [ProduceJob(system, "tput", 64, "pipe", n=256, runs=2, warmup=9, pairs=2),
            ProduceJob(system, "rtt", 64, "msg", n=40, runs=2, warmup=9)]
    adapter = adapters.adapter_class(system)()
    try:
        results = harness.run_jobs(jobs, {system: adapter}, role_context, 30.0,
                                   harness.Progress(len(jobs), stream=io.StringIO()))
    finally:
        notes = adapter.close()
    assert [(r.status, len(r.runs)) for r, _ in results] == [("ok", 2), ("ok", 2)], [r.detail for r, _ in results]
    assert results[0][1]["msgs_per_s"] > 0 and results[1][1]["p50_us"] > 0 and notes == []


@pytest.mark.slow
def test_the_tcp_bench_runs_every_case_against_redis_in_one_run(tmp_path, capsys):
    """``python -m bench.tcp --quick`` on a small run: every case on shmq over TCP and on
    Redis (or Redis skipped, saying why), the table with shmq / Redis and the issue's
    targets, a JSON of every run, the plot beside it, a --report that prints the same
    table; nothing left in /dev/shm, no server left running."""
    out_json = tmp_path / "tcp.json"
    servers_before = _orphaned_bench_servers()
    argv = ["--quick", "--sizes", "64", "--pairs", "2", "--count", "200", "--trips", "30", "--json", str(out_json)]
    pid, stdout, doc = _run_saved("bench.tcp", argv, out_json, 120)
    assert doc["notes"] == []
    assert {k: doc["tcp"][k] for k in ("cases", "sizes", "pairs", "count", "trips")} == {
        "cases": ["pingpong", "put", "msg", "batch", "pipe"], "sizes": [64], "pairs": [2], "count": 200, "trips": 30}
    systems = [s for s in tcp_report.SYSTEMS if s not in doc["skipped"]]
    assert systems[0] == "shmq-tcp" and (systems == ["shmq-tcp", "redis"] or "redis" in doc["skipped"])
    cases = sorted((c["system"], tcp_report.case_of(CaseResult(**{k: v for k, v in c.items() if k != "summary"})),
                    c["size"], c["pairs"], c["n"]) for c in doc["cases"])
    assert cases == sorted((s, case, 64, p, n) for s in systems for case, p, n in (
        ("pingpong", 1, 30), ("put", 1, 30), ("msg", 2, 128), ("batch", 2, 896), ("pipe", 2, 896)))
    for c in doc["cases"]:
        assert c["status"] == "ok" and len(c["runs"]) == 1, c["detail"]
        assert c["summary"]["p50_us" if c["kind"] == "rtt" else "msgs_per_s"] > 0
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("case "))
    assert lines[head].split() == ["case", "size", "P->C", "figure", "shmq-tcp", "redis", "shmq", "/", "redis",
                                   "target", "(issue", "44)"]
    rows = [line for line in lines[head + 2:] if line.strip()][:10]
    assert [line[:13].strip() for line in rows] == ["ping-pong"] * 3 + ["one put"] * 3 + [
        "per message", "batched (64)", "pipelined put", "shmq / redis:"]
    if "redis" in systems:
        assert [row["verdict"] in ("met", "missed") for row in doc["tcp"]["targets"]] == [True, True]
        assert rows[0].split()[-3] == "<=" and rows[0].split()[-4].endswith("x")  # ping-pong p50: ratio, target
    if _has_matplotlib():
        assert (tmp_path / "tcp.png").read_bytes()[:8] == PNG_SIGNATURE
    assert _entries_of_run(pid) == []
    assert _orphaned_bench_servers() <= servers_before

    assert tcp.main(["--report", str(out_json), "--plot", ""]) == 0
    assert capsys.readouterr().out.splitlines() == [ln for ln in lines if not ln.startswith("wrote ")]


@pytest.mark.slow
def test_the_tcp_cpu_bench_says_what_each_process_spent_a_message(tmp_path):
    """``python -m bench.tcp_cpu --quick``: every case on shmq over TCP and on Redis (or
    Redis skipped, saying why), each process's user and system CPU a message in the JSON
    and the table, shmq over Redis where both ran; nothing left in /dev/shm, no server
    left running."""
    out_json = tmp_path / "cpu.json"
    servers_before = _orphaned_bench_servers()
    pid, stdout, doc = _run_saved("bench.tcp_cpu", ["--quick", "--runs", "1", "--json", str(out_json)], out_json, 120)
    systems = [s for s in tcp_cpu.SYSTEMS if s not in doc["skipped"]]
    assert systems[0] == "shmq-tcp" and (systems == ["shmq-tcp", "redis"] or "redis" in doc["skipped"])
    assert [(r["system"], r["case"], r["n"]) for r in doc["rows"]] == [
        (s, case, n) for s in systems for case, n in (("pingpong", 448), ("msg", 960), ("batch", 16000),
                                                      ("fill", 64000), ("drain", 64000))]
    for row in doc["rows"]:
        who = ("server", *tcp_cpu.ROLES[row["case"]])
        assert row["rate"] > 0 and row["runs"] == 1
        assert all(row[w][k] >= 0 for w in who for k in ("user_us", "system_us"))
        assert row["total_us"] == pytest.approx(sum(row[w]["user_us"] + row[w]["system_us"] for w in who))
        assert row["total_us"] > 0 and 0 <= row["system_total_us"] <= row["total_us"]
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("case "))
    assert lines[head].split()[:6] == ["case", "system", "rate/s", "server", "client", "1"]
    ratios = [line for line in lines if "shmq / Redis:" in line]
    assert len(ratios) == (5 if "redis" in systems else 0)
    assert _entries_of_run(pid) == []
    assert _orphaned_bench_servers() <= servers_before


def test_the_tcp_cpu_rows_take_each_figures_median_and_put_shmq_over_redis():
    def run(rate, server, pinger, ponger):
        return {"rate": rate, "server": dict(zip(("user_us", "system_us"), server)),
                "pinger": dict(zip(("user_us", "system_us"), pinger)),
                "ponger": dict(zip(("user_us", "system_us"), ponger))}
    shmq_runs = [run(10, (4, 2), (1, 1), (1, 1)), run(30, (8, 2), (3, 1), (1, 1)), run(20, (6, 4), (2, 3), (1, 1))]
    row = tcp_cpu.median_row("shmq-tcp", "pingpong", shmq_runs)
    assert row["rate"] == 20 and row["server"] == {"user_us": 6, "system_us": 2}
    assert row["pinger"] == {"user_us": 2, "system_us": 1} and row["total_us"] == 6 + 2 + 2 + 1 + 1 + 1
    assert row["system_total_us"] == 2 + 1 + 1
    redis = tcp_cpu.median_row("redis", "pingpong", [run(10, (2, 2), (4, 2), (4, 2))])
    args = tcp_cpu.parse_args(["--cases", "pingpong"])
    text = tcp_cpu.format_report({"cpu": "X", "logical_cpus": 2}, [row, redis], {"nats": "why"}, args)
    assert "shmq / Redis: rate 2.00x; CPU a round trip 0.81x (server 2.00x, clients 0.42x)" in text
    assert text.splitlines()[-1] == "skipped nats: why"
    idle = tcp_cpu.median_row("redis", "pingpong", [run(10, (0, 0), (4, 2), (4, 2))])  # a server's CPU under a tick
    text = tcp_cpu.format_report({"cpu": "X", "logical_cpus": 2}, [row, idle], {}, args)
    assert "shmq / Redis: rate 2.00x; CPU a round trip 1.08x (server -, clients 0.42x)" in text


def test_a_tcp_cpu_case_of_one_client_shows_its_one_and_a_dash_for_the_other():
    """``drain`` (and ``fill``) run one client: its row has the server, that client, and a dash."""
    def run(rate, server, consumer):
        return {"rate": rate, "server": dict(zip(("user_us", "system_us"), server)),
                "consumer": dict(zip(("user_us", "system_us"), consumer))}
    row = tcp_cpu.median_row("shmq-tcp", "drain", [run(30, (0.5, 0.3), (0.3, 0.4))])
    redis = tcp_cpu.median_row("redis", "drain", [run(10, (0.2, 0.3), (1.7, 0.4))])
    assert row["total_us"] == pytest.approx(1.5) and row["system_total_us"] == pytest.approx(0.7)
    text = tcp_cpu.format_report({"cpu": "X", "logical_cpus": 2}, [row, redis], {},
                                 tcp_cpu.parse_args(["--cases", "drain"]))
    line = next(ln for ln in text.splitlines() if ln.startswith("drain     shmq-tcp"))
    assert line.split() == ["drain", "shmq-tcp", "30", "0.5/0.3", "0.3/0.4", "-", "1.5", "0.7"]
    assert "shmq / Redis: rate 3.00x; CPU a message 0.58x (server 1.60x, clients 0.33x)" in text


def test_a_tcp_cpu_run_whose_clients_cannot_connect_ends_in_one_error_with_their_exit_codes():
    class Nowhere:  # an adapter whose channel no client can open: a port nobody listens on
        def make(self, ctx, size):
            return ("tcp://127.0.0.1:1", "q")

        def drop(self, spec):
            pass

    before = set(psutil.Process().children())
    with pytest.raises(RuntimeError, match=r"^shmq-tcp msg: a client did not report within 3 s \(exit codes \[1, 1\]\)$"):
        tcp_cpu.run_case(mp.get_context("spawn"), "shmq-tcp", Nowhere(), psutil.Process(), "msg", 64, (), 3)
    assert [p for p in psutil.Process().children() if p not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())] == []


def test_the_tcp_cpu_bench_refuses_an_unknown_case_saying_the_choices(capsys):
    with pytest.raises(SystemExit) as e:
        tcp_cpu.parse_args(["--cases", "pingpong,bogus"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m bench.tcp_cpu: error: argument --cases: unknown bogus; choose from pingpong, msg, batch, fill, drain")


def test_the_tcp_report_refuses_another_benchs_run_in_one_line(capsys):
    assert tcp.main(["--report", str(ROOT / "docs" / "bench.json")]) == 2
    assert capsys.readouterr().err == (f"python -m bench.tcp: error: {ROOT / 'docs' / 'bench.json'} is not a run "
                                       "of python -m bench.tcp\n")


def _tput(system, pairs, shape, rate, mode="msg", status="ok"):
    result = CaseResult(system, "tput", 64, mode, 1000, pairs, status=status, shape=shape,
                        detail="why" if status == "skipped" else "")
    return result, ({"msgs_per_s": rate} if status == "ok" else {})


def test_a_scale_grid_puts_1_to_1_first_in_every_shape_with_ratios_to_it():
    results = [_tput("shmq", 1, "P->P", 100_000), _tput("zmq", 1, "P->P", 400_000),
               _tput("shmq", 2, "P->P", 150_000), _tput("zmq", 2, "P->P", 0, status="error"),
               _tput("shmq", 2, "1->P", 50_000), _tput("zmq", 2, "1->P", 800_000)]
    pp, fan_out = scaling.scale_grids(results)
    assert (pp.title, pp.columns) == ("64 B, P producers -> P consumers, per message", ["1->1", "2->2"])
    assert [(name, ack, [c.text() for c in cells]) for name, ack, cells in pp.rows] == [
        ("shmq", "each", ["100 k", "150 k (1.50x)"]), ("zmq", "none", ["400 k", "error"]),
        ("shmq / best peer", "", ["0.25x", ""])]  # no peer measured at 2 -> 2
    assert fan_out.columns == ["1->1", "1->2"]
    assert [[c.text() for c in cells] for _, _, cells in fan_out.rows] == [["100 k", "50.0 k (0.50x)"],
                                                                          ["400 k", "800 k (2.00x)"],
                                                                          ["0.25x", "0.06x"]]


def test_lanes_are_asked_for_where_shmq_has_them_and_skipped_saying_why_where_not(monkeypatch):
    if "lanes" in inspect.signature(shmq.Broker.create_queue).parameters:
        assert ShmqLanes.probe() is None
    else:
        assert ShmqLanes.probe() == ("shmq-lanes: this shmq's create_queue has no lanes= "
                                     "(laned queues are not built yet)")

    def create_queue(self, name, max_bytes=0, max_message_bytes=None, exist_ok=False, lanes=1):
        calls.append((name, lanes))

    calls = []
    monkeypatch.setattr(shmq.Broker, "create_queue", create_queue)
    assert ShmqLanes.probe() is None
    adapter = ShmqLanes.__new__(ShmqLanes)  # no namespace of its own: create_queue above is a fake
    adapter.namespace, adapter._count, adapter._broker = "n", 0, shmq.Broker.__new__(shmq.Broker)
    assert adapter.make_case(None, Job("shmq-lanes", "tput", 64, "msg", 64, 1, pairs=4, shape="P->1")) == ("n", "q1")
    adapter.lanes = 2  # python -m bench.scale --lanes 2
    adapter.make_case(None, Job("shmq-lanes", "tput", 64, "msg", 64, 1, pairs=4))
    assert calls == [("q1", 4), ("q2", 2)]


@pytest.mark.slow
def test_the_scale_bench_runs_end_to_end_and_names_what_it_skips(tmp_path, monkeypatch, capsys):
    """``python -m bench.scale`` on a tiny run: shmq measured in every shape and mode,
    faster-fifo (hidden) and shmq-lanes (without lanes) skipped saying why, a JSON of
    every run, the plot, a --report that prints the same tables, nothing left in /dev/shm."""
    _hide_faster_fifo(monkeypatch)
    out_json, out_png = tmp_path / "scale.json", tmp_path / "scale.png"
    argv = ["--quick", "--pairs", "1,2", "--count", "640", "--systems", "shmq,mpqueue,faster-fifo,shmq-lanes",
            "--json", str(out_json), "--plot", str(out_png)]
    assert scale.main(argv) == 0
    stdout = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert doc["command"] == "python -m bench.scale " + " ".join(argv) and doc["date"][:2] == "20"
    assert {"machine", "settings", "skipped", "notes", "cases"} <= set(doc) and doc["notes"] == []
    assert doc["skipped"]["faster-fifo"] == "faster-fifo not installed"
    assert "skipped: faster-fifo not installed" in stdout
    lanes = [c for c in doc["cases"] if c["system"] == "shmq-lanes"]
    assert ("shmq-lanes" in doc["skipped"]) != bool(lanes)  # skipped saying why, or measured
    for system in ("shmq", "mpqueue"):
        cases = [c for c in doc["cases"] if c["system"] == system]
        assert sorted((c["pairs"], c["shape"], c["mode"]) for c in cases) == sorted(
            [(1, "P->P", m) for m in ("msg", "batch")]
            + [(2, x, m) for x in ("P->P", "1->P", "P->1") for m in ("msg", "batch")])
        for c in cases:
            assert c["status"] == "ok" and len(c["runs"]) == 1 and c["summary"]["msgs_per_s"] > 0, c["detail"]
            producers = 1 if c["shape"] == "1->P" else c["pairs"]
            assert c["n"] == scale.messages(64, c["mode"], producers, c["pairs"])  # --quick: count / 20 (>= 64), x P
    for title in ("64 B, P producers -> P consumers, per message", "64 B, 1 producer -> P consumers, batched",
                  "64 B, P producers -> 1 consumer, per message"):
        assert title in stdout
    assert "1->1" in stdout and "2->2" in stdout and "1->2" in stdout and "2->1" in stdout
    if _has_matplotlib():
        assert out_png.read_bytes()[:8] == PNG_SIGNATURE
    assert _entries_of_run(os.getpid()) == []

    assert scale.main(["--report", str(out_json), "--plot", ""]) == 0
    again = capsys.readouterr().out
    assert [ln for ln in again.splitlines()] == [ln for ln in stdout.splitlines() if not ln.startswith("wrote ")]


def _timed(seconds, got, until):
    return {"seconds": seconds, "got": got, "until": until}


def test_a_contention_run_adds_its_workers_counts_and_says_when_one_ran_short():
    job = ContentionJob("shmq", "take", 64, "msg", 1000, 3, pairs=2)
    merged = harness._merge_consumers(job, {"worker0": _timed(0.5, 300, "time"), "worker1": _timed(0.4, 500, "cap")})
    assert merged == {"seconds": 0.5, "n": 800, "short": 1}
    with pytest.raises(CaseFailed, match="received 1001 messages, expected 1000"):
        harness._merge_consumers(job, {"worker0": _timed(0.5, 501, "time"), "worker1": _timed(0.5, 500, "cap")})
    result = CaseResult("shmq", "take", 64, "msg", 1000, 2, runs=[merged, {"seconds": 0.25, "n": 800, "short": 0}])
    assert harness.summarize(result)["msgs_per_s"] == 2400.0  # each run's own count over its time: 1600, 3200


class _CountingEnd:
    """A send or receive end that counts what passes; ``log`` records (role, count) at close."""

    def __init__(self, log, role="send"):
        self.log, self.role, self.count = log, role, 0

    def send(self, body):
        self.count += 1

    def send_batch(self, bodies):
        self.count += len(bodies)

    def send_pipelined(self, body):
        self.count += 1

    def recv(self):
        self.count += 1
        return b"x"

    def recv_batch(self, limit):
        self.count += limit
        return [b"x"] * limit

    def flush(self):
        pass

    def close(self):
        self.log.append((self.role, self.count))


@pytest.mark.parametrize("kind", ["put", "take"])
@pytest.mark.parametrize("mode", ["msg", "batch"])
def test_a_contention_worker_stops_at_its_time_or_its_share(kind, mode):
    ends = [_CountingEnd([]), _CountingEnd([], "recv")]
    out = contention_roles.work(ContentionJob("shmq", kind, 64, mode, 1000, 1, pairs=4, seconds=3600.0), ends)
    assert (out["got"], out["until"]) == (250, "cap")  # its share of 1000, long before an hour
    assert ends[kind == "take"].count == 250 and ends[kind == "put"].count == 0
    out = contention_roles.work(ContentionJob("shmq", kind, 64, mode, 10**9, 1, pairs=1, seconds=0.0), ends)
    step = 64 if mode == "batch" else contention_roles.CHECK_EVERY
    assert (out["got"], out["until"]) == (step, "time")  # one call's worth, then the clock says stop


def test_a_contention_queue_is_filled_or_drained_between_runs():
    log = []

    def end(spec, role):
        return _CountingEnd(log, role)

    take = ContentionJob("shmq", "take", 64, "msg", 1000, 3, pairs=2)
    put = ContentionJob("shmq", "put", 64, "batch", 1000, 3, pairs=2)
    take.before_run(end, ["spec"], [])
    take.before_run(end, ["spec"], [{"seconds": 0.5, "n": 700}])
    assert log == [("send", 1000), ("send", 700)]  # full before each run: what the last one took, put back
    log.clear()
    put.before_run(end, ["spec"], [])
    put.before_run(end, ["spec"], [{"seconds": 0.5, "n": 900}])
    assert log == [("send", 1000), ("recv", 1000), ("recv", 900)]  # written through once, then emptied


def test_the_contention_report_refuses_another_benchs_run_in_one_line(capsys):
    assert contention.main(["--report", str(ROOT / "docs" / "bench.json")]) == 2
    assert capsys.readouterr().err == (f"python -m bench.contention: error: {ROOT / 'docs' / 'bench.json'} is not a "
                                       "run of python -m bench.contention\n")


@pytest.mark.slow
def test_the_contention_bench_runs_end_to_end_and_names_what_it_skips(tmp_path, monkeypatch, capsys):
    _hide_faster_fifo(monkeypatch)
    out_json = tmp_path / "contention.json"
    argv = ["--quick", "--workers", "1,2", "--seconds", "0.05", "--fill", "20000", "--json", str(out_json)]
    assert contention.main(argv) == 0
    stdout = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert doc["command"] == "python -m bench.contention " + " ".join(argv)
    assert doc["contention"] == {"seconds": 0.05, "fill": 20000} and doc["notes"] == []
    assert doc["skipped"] == {"faster-fifo": "faster-fifo not installed"}
    assert "skipped: faster-fifo not installed" in stdout
    cases = doc["cases"]
    assert sorted((c["system"], c["kind"], c["mode"], c["pairs"]) for c in cases) == sorted(
        ("shmq", k, m, n) for k in ("put", "take") for m in ("msg", "batch") for n in (1, 2))
    for c in cases:
        assert c["status"] == "ok" and c["shape"] == "N" and len(c["runs"]) == 1, c["detail"]
        run = c["runs"][0]
        assert 0 < run["n"] <= 20000 and run["short"] in range(c["pairs"] + 1) and c["summary"]["msgs_per_s"] > 0
    lines = stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("64 B, N processes on one queue"))
    assert lines[head + 1].split() == ["N", "=", "1", "N", "=", "2"]
    rows = [ln[:30].strip() for ln in lines[head + 3:head + 7]]
    assert rows == ["shmq put, per message", "shmq get + ack, per message", "shmq get_many(64) + ack_many",
                    "shmq put_many(64)"]  # the issue's order
    assert "(" in lines[head + 3] and "x)" in lines[head + 3]  # N = 2's ratio to N = 1
    assert _entries_of_run(os.getpid()) == []

    assert contention.main(["--report", str(out_json)]) == 0
    assert capsys.readouterr().out.splitlines() == [ln for ln in lines if not ln.startswith("wrote ")]


def test_the_spark_pages_figures_are_the_saved_runs():
    """docs/SPARK.md's performance table is generated from docs/spark-bench.json (python
    -m bench.spark --markdown): one owner of each figure, and the page says the run's."""
    from bench import spark as spark_bench

    doc = json.loads((ROOT / "docs" / "spark-bench.json").read_text())
    page = (ROOT / "docs" / "SPARK.md").read_text()
    begin, end = page.index(spark_bench.MD_BEGIN), page.index(spark_bench.MD_END) + len(spark_bench.MD_END)
    assert page[begin:end] == spark_bench.markdown(doc), "stale: python -m bench.spark --markdown docs/spark-bench.json"
    assert doc["settings"]["runs"] >= 3 and doc["settings"]["records"] == 1_000_000 and not doc["settings"]["quick"]


@pytest.mark.slow
def test_the_kafka_bench_quick_runs_every_system_and_says_the_targets(tmp_path):
    """``python -m bench.kafka --quick``: confluent-kafka through the Kafka listener (plain,
    and transactional with a read_committed consumer), shmq's own TCP client and Redis
    Streams (or Redis skipped, saying why), each a rate and a latency, the issue's two
    targets with a verdict, the transactions' ratio, the JSON; nothing left in /dev/shm,
    no server left running."""
    out_json = tmp_path / "kafka.json"
    servers_before = _orphaned_bench_servers()
    pid, stdout, doc = _run_saved("bench.kafka", ["--quick", "--records", "500", "--json", str(out_json)], out_json, 180)
    assert (doc["records"], doc["size"], doc["runs"], doc["txn_size"]) == (500, 100, 1, 100)
    systems = [r["system"] for r in doc["rows"]]
    assert systems == ["kafka", "kafka-txn", "shmq-tcp", "redis-streams"] or (
        systems == ["kafka", "kafka-txn", "shmq-tcp"] and "redis-streams" in doc["skipped"])
    for r in doc["rows"]:
        assert r["error"] is None and len(r["runs"]) == 1 and r["records_per_s"] > 0 and r["p50_us"] > 0, r
    assert [(t["system"], t["peer"], t["at_least"]) for t in doc["targets"]] == [
        ("kafka", "shmq-tcp", 0.8), ("kafka", "redis-streams", 2.0)]
    assert doc["targets"][0]["verdict"] in ("met", "missed")
    lines = stdout.splitlines()
    assert "| system | records/s | p50 produce-to-consume | kafka / system (records/s) |" in lines
    assert sum(line.startswith("target (issue 44): kafka >= ") for line in lines) == 2
    assert sum(line.startswith("transactions of 100: kafka-txn / kafka = ") for line in lines) == 1
    assert _entries_of_run(pid) == []
    assert _orphaned_bench_servers() <= servers_before


@pytest.mark.slow
@pytest.mark.parametrize("role", ["put", "get", "pingpong"])
def test_the_one_connection_bench_costs_one_plain_request_on_each_side(role):
    """``python -m bench.tcp_one --role put|get|pingpong``: plain requests one at a time (a
    ping-pong's gets waiting), every message accounted for (the bench checks the queues after
    each run), the server's and the clients' CPU per message, busy polling off on both ends;
    nothing left behind."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    servers_before = _orphaned_bench_servers()
    pid, code, stdout, stderr = _run(["--role", role, "--size", "64", "--count", "300", "--runs", "1",
                                      "--busy-poll-us", "0", "--server-arg=--busy-poll-us=0"], env, 120,
                                     module="bench.tcp_one")
    assert code == 0, stdout + stderr
    head, figures = stdout.splitlines()[-2:]
    what = {"put": "put of 64 B", "get": "get + ack(wait=False) of 64 B",
            "pingpong": "round trips of 64 B (msgs/s: round trips/s; CPU a round trip, the clients' both)"}[role]
    assert head.startswith(f"one connection, client client, {what}, client busy_poll_us=0; 300 messages")
    assert re.fullmatch(r"\s+[\d,]+ msgs/s  \([\d,]+ \.\. [\d,]+\); server CPU [\d.]+ us/msg, "
                        r"client CPU [\d.]+ us/msg", figures), figures
    assert _orphaned_bench_servers() <= servers_before


@pytest.mark.slow
def test_the_loopback_bench_measures_a_round_trip_asleep_and_spinning():
    """``python -m bench.loopback``: each way of waiting, and the zero-cost ping-pong against
    redis-server (or skipped, saying why); no process left behind."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    servers_before = _orphaned_bench_servers()
    pid, code, stdout, stderr = _run(["--count", "200", "--runs", "1"], env, 120, module="bench.loopback")
    if code == 2 and "needs two CPUs" in stderr:
        pytest.skip(stderr.strip())
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("loopback TCP, 64 B, plain Python sockets; p50 µs, median of 1 runs of 200")
    assert [line.rsplit(None, 1)[0].strip() for line in lines[2:7]] == [
        "both asleep", "echo spinning", "client spinning", "both spinning", "both asleep, on one CPU"]
    assert all(float(line.rsplit(None, 1)[1]) > 0 for line in lines[2:7])
    assert lines[7].startswith("ping-pong") and (
        lines[7].endswith("skipped (redis-server not on PATH)") or float(lines[7].rsplit(None, 1)[1]) > 0)
    assert _orphaned_bench_servers() <= servers_before


def test_the_memory_bench_measures_a_queue_and_a_partition_empty_full_and_drained(tmp_path):
    """``python -m bench.memory``: shmq's queue and partition (and Redis's, where it is here),
    each empty, holding the messages and drained, the JSON with its code stamp; nothing
    left in /dev/shm."""
    out_json = tmp_path / "memory.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = ["--systems", "shmq,redis", "--count", "3000", "--empty", "10", "--json", str(out_json)]
    pid, code, stdout, stderr = _run(argv, env, 180, module="bench.memory")
    assert code == 0, stdout + stderr
    doc = json.loads(out_json.read_text())
    assert doc["command"] == "python -m bench.memory " + " ".join(argv)
    assert doc["code"]["measures"] == "memory" and "shmq/engine/_fast.c" in doc["code"]["files"]
    rows = {(r["what"], r["system"]): r for r in doc["rows"]}
    queue, part = rows["queue", "shmq"], rows["partition", "shmq"]
    payload = 3000 * 1024
    assert queue["empty"] <= 256 * 1024 and part["empty"] <= 256 * 1024  # kilobytes, not its max_bytes
    assert payload <= queue["held"] <= 2 * payload and payload <= part["held"] <= 2 * payload
    assert queue["drained"] <= 256 * 1024  # given back
    assert ("queue", "redis") in rows or "redis" in doc["skipped"]
    assert _entries_of_run(pid) == []


def test_a_run_under_load_keeps_its_hogs_busy_while_it_lasts_and_leaves_none():
    with load.hogs(2) as pids:
        procs = [psutil.Process(pid) for pid in pids]
        assert len(procs) == 2
        wait_for(lambda: all(p.cpu_times().user > 0.05 for p in procs), what="both hogs burning CPU")
    assert not any(p.is_running() for p in procs)


def test_the_tcp_bench_refuses_a_load_out_of_range_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        tcp.parse_args(["--load", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "python -m bench.tcp: error: --load must be 0 to 64 processes"


def test_the_arrays_bench_runs_a_loader_and_a_trainer_and_takes_sizes_as_the_other_benches_do(tmp_path):
    """``python -m bench.arrays``: sizes written as the other benches take them (``64k``), a
    run of shmq's arrays API and of ``multiprocessing.Queue`` in the JSON, each array counted;
    nothing left in /dev/shm. A size or a loader count it cannot use is one line of error."""
    pytest.importorskip("numpy")
    out_json = tmp_path / "arrays.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = ["--systems", "shmq-arrays,mpqueue", "--sizes", "64k", "--pairs", "1", "--count", "40", "--runs", "1",
            "--json", str(out_json)]
    pid, code, stdout, stderr = _run(argv, env, 180, module="bench.arrays")
    assert code == 0, stdout + stderr
    doc = json.loads(out_json.read_text())
    assert {(r["size"], r["pairs"], r["system"]) for r in doc["rows"]} == {
        (65536, 1, "shmq-arrays"), (65536, 1, "mpqueue")}
    assert all(r["arrays_per_s"] > 0 for r in doc["rows"])
    assert _entries_of_run(pid) == []
    for bad, line in ((["--sizes", "4x"], "--sizes takes byte counts such as 1048576, 1m or 4MiB"),
                      (["--sizes", "0"], "--sizes wants arrays of 4 bytes or more"),
                      (["--pairs", "none"], "--pairs whole numbers")):
        _pid, code, stdout, stderr = _run(bad, env, 60, module="bench.arrays")
        assert code == 2 and stdout == "" and "Traceback" not in stderr
        assert line in stderr.splitlines()[-1] and stderr.splitlines()[-1].startswith("python -m bench.arrays: error:")
