"""``shmq status`` against real ``shmq server`` processes: where it listens, TLS, the
one-line error when none runs."""

import json
import os
import re
import subprocess
import sys
import time

from tests.test_tls import certs  # noqa: F401  (the session's test CA and server certificate)


def shmq_cli(*args):
    return subprocess.run([sys.executable, "-m", "shmq.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def kafka_port(srv):
    return int(re.search(r"kafka listener on \S+:(\d+)", "".join(srv.log)).group(1))


def test_status_of_a_server_with_a_kafka_listener(broker, servers):
    before = time.time()
    srv = servers(broker.namespace, "--no-persist", "--no-auth", "--kafka-port", "0")
    kport = kafka_port(srv)
    r = shmq_cli("status", "--namespace", broker.namespace, "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["started_at"] <= time.time() and st["started_at"] >= before - 2
    assert 0 <= st["uptime_s"] < 120
    assert {k: v for k, v in st.items() if k not in ("started_at", "uptime_s")} == {
        "namespace": broker.namespace, "running": True, "pid": srv.proc.pid, "address": f"127.0.0.1:{srv.port}",
        "kafka_address": f"127.0.0.1:{kport}", "tls": False, "token": False, "data_dir": None}

    r = shmq_cli("status", "--namespace", broker.namespace)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) if not line.startswith("data dir") else ("data dir", line[11:])
                 for line in r.stdout.splitlines())
    assert lines["namespace"] == broker.namespace
    assert re.fullmatch(rf"running, pid {srv.proc.pid}, up (\d+m )?\d+s \(since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)",
                        lines["server"]), lines["server"]
    assert (lines["deadbeef"], lines["kafka"], lines["tls"], lines["token"], lines["data dir"]) == (
        f"127.0.0.1:{srv.port}", f"127.0.0.1:{kport}", "no", "no", "none (--no-persist)")
    assert srv.stop() == 0

    r = shmq_cli("status", "--namespace", broker.namespace)  # stopped: none runs
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"shmq: error: no server runs for namespace {broker.namespace!r} (start one: shmq server "
                        f"--namespace {broker.namespace})\n")


def test_status_of_a_tls_server_with_a_token(broker, servers, certs, tmp_path):  # noqa: F811
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-status\n")
    os.chmod(token, 0o600)
    srv = servers(broker.namespace, "--no-persist", "--token-file", str(token), "--tls-cert", certs.cert,
                  "--tls-key", certs.key)
    st = json.loads(shmq_cli("status", "--namespace", broker.namespace, "--json").stdout)
    assert (st["pid"], st["address"], st["kafka_address"], st["tls"], st["token"]) == (
        srv.proc.pid, f"127.0.0.1:{srv.port}", None, True, True)
    text = shmq_cli("status", "--namespace", broker.namespace).stdout
    assert "kafka      off\n" in text and "tls        yes\n" in text and "token      yes\n" in text
    assert srv.stop() == 0


def test_status_without_a_server(namespace):
    r = shmq_cli("status", "--namespace", namespace, "--json")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"shmq: error: no server runs for namespace {namespace!r} (start one: shmq server "
                        f"--namespace {namespace})\n")


def test_status_with_a_bad_namespace_is_one_line():
    r = shmq_cli("status", "--namespace", "no/such")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("shmq: error: ")
