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
