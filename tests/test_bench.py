"""The bench: `python -m bench --quick` and `python -m bench.streams --quick` run end to end
and write well-formed output (not their speed), every adapter carries a case through the
harness, the consumers' stop logic and the streams' target verdicts. Each test looks only
at the shmq namespaces it or its bench created, and at the peer servers its bench started."""

import argparse
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bench import adapters, harness, report
from bench.harness import CaseResult
from bench.plan import Job, StreamJob
from bench.roles import consume_polled, consume_shared

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


@pytest.mark.slow
def test_quick_bench_output_is_well_formed(tmp_path):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pid, code, stdout, stderr = _run(["--quick", "--json", str(out_json), "--plot", str(out_png)], env, 180)
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("shmq") and lines[1].startswith("machine :")
    assert lines[2].startswith("python  :") and lines[3].startswith("packages:")
    assert "Throughput, P producers -> P consumers" in stdout
    assert "msgs/s" in stdout and "vs mpq" in stdout and "vs best" in stdout
    assert "RTT p50" in stdout and "RTT p99.9" in stdout
    assert "Durability modes" in stdout and "wal always" in stdout

    doc = json.loads(out_json.read_text())
    assert {"machine", "settings", "cases", "durability"} <= set(doc)
    for system in ("shmq", "mpqueue"):
        cases = [c for c in doc["cases"] if c["system"] == system]
        assert cases and all(c["status"] == "ok" for c in cases), cases
        for c in cases:
            value = c["summary"]["p50_us" if c["kind"] == "rtt" else "msgs_per_s"]
            assert value > 0
    assert all(c["status"] in ("ok", "skipped") for c in doc["cases"])
    assert all(d.get("msgs_per_s", 0) > 0 for d in doc["durability"]), doc["durability"]
    reported = {c["system"] for c in doc["cases"]} | set(doc["skipped"])
    assert set(adapters.SYSTEMS) <= reported  # every system ran or says why not (iceoryx2, rabbitmq, nats-core...)
    assert "Streams, P producers -> 1 consumer" in stdout and "Targets of the streams issue" in stdout
    streams = doc["streams"]
    assert set(adapters.STREAM_SYSTEMS) <= {c["system"] for c in streams["cases"]} | set(streams["skipped"])
    assert all(c["status"] in ("ok", "skipped") for c in streams["cases"]) and streams["notes"] == []

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


class _RacyTotal:
    """A shared counter where another consumer adds `bump` just after every locked update."""

    def __init__(self, value, bump):
        self.value, self._bump = value, bump

    def get_lock(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.value += self._bump


@pytest.mark.parametrize("mode", ["msg", "batch"])
def test_only_the_consumer_that_crosses_n_sends_the_stops(mode):
    job = Job("mpqueue", "tput", 8, mode, n=100, runs=1, pairs=4)
    # this consumer takes the 99th message; another takes the 100th between the lock and the check
    tx = _ListEnd()
    rx_tx = _ListEnd([b"x" * 8, b""], peer=tx), tx
    result = consume_shared(job, rx_tx, _RacyTotal(98, bump=1))
    assert result["got"] == 1
    assert rx_tx[1].sent == []  # it left through its own stop, sending none back
    assert rx_tx[0].released == [0]  # and gave back what was prefetched for it (RabbitMQ)

    tx = _ListEnd()
    rx_tx = _ListEnd([b"x" * 8], peer=tx), tx
    result = consume_shared(job, rx_tx, _RacyTotal(99, bump=0))
    assert result["got"] == 1 and rx_tx[1].sent == [b""] * 3  # the crosser stops the other three
    assert rx_tx[0].released == [0]  # having first given back its prefetch, so the stops reach them


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
def test_every_adapter_carries_cases_through_the_harness(system):
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
        results = harness.run_jobs(jobs, {system: adapter}, mp.get_context("spawn"), 30.0, progress)
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


# ---------------------------------------------------------------- streams


@pytest.mark.slow
def test_quick_stream_bench_output_is_well_formed(tmp_path):
    out_json = tmp_path / "streams.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    servers_before = _orphaned_bench_servers()
    pid, code, stdout, stderr = _run(["--quick", "--json", str(out_json)], env, 120, module="bench.streams")
    assert code == 0, stdout + stderr
    lines = stdout.splitlines()
    assert lines[0] == "shmq stream benchmark" and lines[1].startswith("machine :")
    assert lines[3].startswith("load    : 1-minute load average")
    assert lines[4].startswith("packages:") and "nats-server" in lines[4] and "redis-server" in lines[4]
    assert "Streams, P producers -> 1 consumer" in stdout and "rec/s" in stdout and "vs best peer" in stdout
    assert "reference, published, not measured here: 821.56k records/s: Kafka" in stdout and "Kreps" in stdout
    assert "Targets of the streams issue" in stdout and "local, batched: >= 3.00M records/s" in stdout

    doc = json.loads(out_json.read_text())
    part = doc["streams"]
    assert part["reference"]["records_per_s"] == 821_557 and part["notes"] == []
    cases = part["cases"]
    assert all(c["status"] in ("ok", "skipped") for c in cases), [c["detail"] for c in cases]
    # every stream system ran or says why not; shmq's local stream always runs, in every case
    assert set(adapters.STREAM_SYSTEMS) <= {c["system"] for c in cases} | set(part["skipped"])
    for system in set(adapters.STREAM_SYSTEMS) - set(part["skipped"]):
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
def test_every_stream_adapter_carries_cases_through_the_harness(system):
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
        results = harness.run_jobs(jobs, {system: adapter}, mp.get_context("spawn"), 30.0, progress)
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
