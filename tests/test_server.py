"""``shmq server``: housekeeping without clients, clean stop on SIGTERM/SIGINT."""

import os
import signal
import subprocess
import sys
import time

import pytest


def _start_server(namespace):
    return subprocess.Popen(
        [sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0", "--log-level", "info"],
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _wait_for_line(proc, needle, timeout=30):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"server never logged {needle!r}; got {lines}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_server_expires_leases_with_no_client_and_stops_cleanly(broker, sig):
    q = broker.create_queue("q", visibility_timeout=0.2)
    q.put(b"x")
    d = q.get_nowait()  # leased; nobody else calls get: only the server can expire it
    proc = _start_server(broker.namespace)
    try:
        _wait_for_line(proc, "serving namespace")
        _wait_for_line(proc, "ready again")
        assert q.stats().ready == 1
        proc.send_signal(sig)
        assert proc.wait(30) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert broker.list_queues() == ["q"]  # queues outlive the server
    assert q.get_nowait().attempt == 2
    assert d.id == 1


def test_cli_list_and_clean_error(broker):
    broker.create_queue("b")
    broker.create_queue("a")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "shmq.cli", "list", "--namespace", broker.namespace],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["a", "b"]
    bad = subprocess.run([sys.executable, "-m", "shmq.cli", "list", "--namespace", "bad.ns"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("shmq: error: invalid namespace")
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
