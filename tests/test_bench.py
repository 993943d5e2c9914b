"""The bench: `python -m bench --quick` runs end to end and writes well-formed output (not
its speed), every adapter carries a case through the harness, and the consumers' stop
logic. Each test looks only at the shmq namespaces it or its bench created."""

import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import adapters, harness
from bench.plan import Job
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


def _run(argv, env, timeout):
    """Run ``python -m bench ...``; returns (pid, returncode, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench", *argv], cwd=ROOT, env=env,
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
    assert {"shmq", "shmq-tcp", "mpqueue", "simplequeue", "faster-fifo", "zmq", "posix-mq", "redis"} <= reported

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
    """A receive end over a list of bodies, and a send end that records what it sent."""

    def __init__(self, bodies=()):
        self.bodies, self.sent = list(bodies), []

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
    rx_tx = _ListEnd([b"x" * 8, b""]), _ListEnd()
    result = consume_shared(job, rx_tx, _RacyTotal(98, bump=1))
    assert result["got"] == 1
    assert rx_tx[1].sent == []  # it left through its own stop, sending none back

    rx_tx = _ListEnd([b"x" * 8]), _ListEnd()
    result = consume_shared(job, rx_tx, _RacyTotal(99, bump=0))
    assert result["got"] == 1 and rx_tx[1].sent == [b""] * 3  # the crosser stops the other three


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
    reason = adapters.probe(system)
    if reason:
        pytest.skip(reason)
    jobs = [Job(system, "tput", 64, "msg", n=128, runs=1, warmup=8),
            Job(system, "tput", 64, "batch", n=256, runs=2, warmup=8, pairs=2),
            Job(system, "rtt", 64, "msg", n=20, runs=1, warmup=4)]
    adapter = adapters.adapter_class(system)()
    try:
        progress = harness.Progress(len(jobs), stream=io.StringIO())
        results = harness.run_jobs(jobs, {system: adapter}, mp.get_context("spawn"), 30.0, progress)
    finally:
        notes = adapter.close()
    assert [(r.status, len(r.runs)) for r, _ in results] == [("ok", 1), ("ok", 2), ("ok", 1)], \
        [r.detail for r, _ in results]
    assert all(s["msgs_per_s"] > 0 for _, s in results[:2]) and results[2][1]["p50_us"] > 0
    assert notes == []
