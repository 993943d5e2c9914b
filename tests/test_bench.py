"""`python -m bench --quick` runs end to end and writes well-formed output (not its speed)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _shmq_entries():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("shmq.")}
    except FileNotFoundError:
        return set()


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
def test_quick_bench_output_is_well_formed(tmp_path):
    before = _shmq_entries()
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(out_json), "--plot", str(out_png)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("shmq") and lines[1].startswith("machine :")
    assert lines[2].startswith("python  :") and lines[3].startswith("packages:")
    assert "Throughput, P producers -> P consumers" in proc.stdout
    assert "msgs/s" in proc.stdout and "vs mpq" in proc.stdout and "vs best" in proc.stdout
    assert "RTT p50" in proc.stdout and "RTT p99.9" in proc.stdout
    assert "Durability modes" in proc.stdout and "wal always" in proc.stdout

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
        assert "plot skipped: matplotlib not installed" in proc.stdout
    assert _shmq_entries() - before == set()

    # --report reprints the same tables from the JSON alone, and redraws the plot
    again_png = tmp_path / "again.png"
    again = subprocess.run(
        [sys.executable, "-m", "bench", "--report", str(out_json), "--plot", str(again_png)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert again.returncode == 0, again.stdout + again.stderr

    def tables(text):
        return [line for line in text.splitlines() if not line.startswith(("wrote ", "plot skipped"))]

    assert tables(again.stdout) == tables(proc.stdout)
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
    from bench.local import Job, _consume_shared

    job = Job("mpqueue", "tput", 8, mode, n=100, runs=1, pairs=4)
    # this consumer takes the 99th message; another takes the 100th between the lock and the check
    rx_tx = _ListEnd([b"x" * 8, b""]), _ListEnd()
    result = _consume_shared(job, rx_tx, _RacyTotal(98, bump=1))
    assert result["got"] == 1
    assert rx_tx[1].sent == []  # it left through its own stop, sending none back

    rx_tx = _ListEnd([b"x" * 8]), _ListEnd()
    result = _consume_shared(job, rx_tx, _RacyTotal(99, bump=0))
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
    from bench.local import Job, _consume_polled

    job = Job("zmq", "tput", 4, "msg", n=10, runs=1, pairs=4)
    total = _RacyTotal(5, bump=0)
    idle = []

    def another_consumer_finishes():  # during the second idle poll the others take the last 3
        idle.append(total.value)
        if len(idle) == 2:
            total.value = job.n

    rx = _PolledEnd([[b"abcd"], [b"abcd"], [], [], []], another_consumer_finishes)
    result = _consume_polled(job, [rx], total)
    assert result["got"] == 2
    assert idle == [7, 7]  # it polled on at 7 of 10 and stopped once all 10 were taken
