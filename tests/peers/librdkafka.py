"""librdkafka's own test suite against ``shmq server --kafka-port`` (issue 40): not a
pytest module (CI cannot fetch librdkafka), a script a person runs and whose counts
go to docs/KAFKA.md.

    python -m tests.peers.librdkafka --src ~/librdkafka [--sasl] [--tests 0001,0002] [--out results.json]

``--src``: a librdkafka checkout (the tag nearest the installed confluent-kafka's
librdkafka) after ``./configure && make -j libs && make -C tests build``. Each test
program runs alone (``TESTS=NNNN ./test-runner -p1 -L``: the broker tests, full mode)
against a server of its own, on a namespace of its own that is destroyed after it, with
a test.conf naming the listener (and SASL/PLAIN with the server's token as the password
with ``--sasl``), ``TEST_SCENARIO`` the test's own ("noautocreate": a server with
``--no-kafka-auto-create``), and ``kafka_topics`` as Kafka's ``bin/kafka-topics.sh``. Prints one line per program and the counts; ``--out`` writes
them as JSON.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid

VERSION = os.environ.get("TEST_KAFKA_VERSION", "4.0.0")  # Kafka 4.0: record batches v2 only (KIP-724), as here
_ENTRY = re.compile(r"^\s*(\d{4})_(\w+)\s*,\s*([^,)]*)")
_SCENARIO = re.compile(r'\.scenario\s*=\s*"([^"]+)"')
_ROW = re.compile(r"\|\s*(\d{4}_\w+)\s*\|\s*(PASSED|FAILED|SKIPPED|RUNNING|NOT STARTED)\s*\|")
_ESC = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\x1b\(B")


def entries(src: str) -> dict:
    """{number: [(test name, flags, scenarios)]} of test.c's table of tests."""
    with open(os.path.join(src, "tests", "test.c")) as f:
        text = f.read()
    table = text[text.index("struct test tests[]"):]
    table = table[:table.index("\n};")]
    out = {}
    for chunk in table.split("_TEST(")[1:]:
        m = _ENTRY.match(chunk)
        if m is None:
            continue
        number, name, flags = m.groups()
        m = _SCENARIO.search(chunk)
        scenarios = m.group(1).split(",") if m else ["default"]
        out.setdefault(number, []).append((f"{number}_{name}", flags.strip(), scenarios))
    return out


class Server:
    """``shmq server`` on a namespace of its own with a Kafka listener on a free port."""

    def __init__(self, sasl: bool, workdir: str, auto_create: bool = True):
        self.namespace = "rdk" + uuid.uuid4().hex[:8]
        self.token = uuid.uuid4().hex if sasl else None
        args = [sys.executable, "-m", "shmq", "server", "--namespace", self.namespace, "--no-persist", "--port", "0",
                "--kafka-port", "0", "--log-level", "info",
                "--kafka-auto-create-partitions", "4",  # the suite's clusters: num.partitions=4 (scenarios/)
                "--kafka-max-replication-factor", "3",  # and replication_factor=3: one copy here all the same
                "--kafka-topic-max-bytes", "1GiB"]  # and 1 GiB segments: 0041 keeps 510 MB in one partition
        if not auto_create:
            args.append("--no-kafka-auto-create")
        if self.token:
            path = os.path.join(workdir, "token")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(self.token)
            args += ["--token-file", path]
        else:
            args += ["--no-auth"]
        self.log_path = os.path.join(workdir, f"{self.namespace}.log")
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"kafka listener on \S+:(\d+)", open(self.log_path).read())
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the server did not start: {open(self.log_path).read()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        subprocess.run([sys.executable, "-m", "shmq", "namespace", "destroy", self.namespace, "--yes"],
                       capture_output=True)
        self.log.close()

    def client_conf(self) -> dict:
        """A client's settings beyond bootstrap.servers (SASL where the token is wanted)."""
        if not self.token:
            return {}
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN", "sasl.username": "librdkafka",
                "sasl.password": self.token}

    def conf(self) -> str:
        lines = [f"bootstrap.servers=127.0.0.1:{self.port}", "test.topic.random=true"]
        if self.token:
            lines += ["security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=PLAIN", "sasl.username=librdkafka",
                      f"sasl.password={self.token}"]
        return "\n".join(lines) + "\n"


def _kafka_path(workdir: str) -> str:
    """A KAFKA_PATH whose ``bin/kafka-topics.sh`` is ``kafka_topics``' stand-in."""
    path = os.path.join(workdir, "kafka")
    script = os.path.join(path, "bin", "kafka-topics.sh")
    if not os.path.exists(script):
        os.makedirs(os.path.dirname(script))
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(script, "w") as f:
            f.write(f'#!/bin/sh\ncd "{root}" && exec "{sys.executable}" -m tests.peers.kafka_topics "$@"\n')
        os.chmod(script, 0o700)
    return path


def run(src: str, number: str, scenario: str, sasl: bool, timeout: float, workdir: str) -> tuple[dict, float, str]:
    """({test name: PASSED / FAILED / SKIPPED / TIMEOUT}, seconds, the output's tail) of
    one program's tests of one scenario ("default": topics auto-created with 4 partitions;
    "noautocreate": not auto-created)."""
    srv = Server(sasl, workdir, auto_create=scenario != "noautocreate")
    tests = os.path.join(src, "tests")
    conf = os.path.join(workdir, "test.conf")
    with open(conf, "w") as f:
        f.write(srv.conf())
    env = {**os.environ, "TESTS": number, "TEST_KAFKA_VERSION": VERSION, "RDKAFKA_TEST_CONF": conf,
           "TEST_SCENARIO": scenario, "LD_LIBRARY_PATH": f"{src}/src:{src}/src-cpp",
           "KAFKA_PATH": _kafka_path(workdir), "BROKERS": f"127.0.0.1:{srv.port}",
           "SHMQ_KAFKA_CONF": json.dumps(srv.client_conf())}
    t0 = time.monotonic()
    try:
        p = subprocess.run(["./test-runner", "-p1", "-L"], cwd=tests, env=env, capture_output=True, timeout=timeout)
        out = _ESC.sub("", (p.stdout + p.stderr).decode(errors="replace"))
        found = dict(_ROW.findall(out))
        if not found and p.returncode != 0:
            found = {number: "FAILED"}
    except subprocess.TimeoutExpired as e:
        out = _ESC.sub("", ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace"))
        found = {name: "TIMEOUT" for name, status in _ROW.findall(out) if status in ("RUNNING", "NOT STARTED")} \
            or {number: "TIMEOUT"}
        found.update({name: status for name, status in _ROW.findall(out) if status not in ("RUNNING", "NOT STARTED")})
    finally:
        srv.stop()
    if os.environ.get("RDK_OUTPUT"):  # the whole output of the program, for a person to read
        with open(os.environ["RDK_OUTPUT"], "a") as f:
            f.write(out)
    return found, time.monotonic() - t0, out[-4000:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--sasl", action="store_true", help="the server wants its token (SASL/PLAIN)")
    ap.add_argument("--tests", default="", help="comma-separated program numbers (default: every one)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    wanted = set(filter(None, a.tests.split(",")))
    results = {}
    with tempfile.TemporaryDirectory(prefix="rdk-") as workdir:
        for number, tests in entries(a.src).items():
            if wanted and number not in wanted:
                continue
            remote = [(name, scenarios) for name, flags, scenarios in tests  # (manual ones: run by hand only)
                      if "TEST_F_LOCAL" not in flags and "TEST_F_MANUAL" not in flags]
            for scenario in sorted({sc for _n, scs in remote for sc in scs if sc in ("default", "noautocreate")}):
                found, secs, tail = run(a.src, number, scenario, a.sasl, a.timeout, workdir)
                for name, status in found.items():
                    if status == "SKIPPED" and name in results:
                        continue  # run in its own scenario
                    results[name] = {"status": status, "scenario": scenario, "seconds": round(secs, 1),
                                     "tail": tail if status in ("FAILED", "TIMEOUT") else ""}
                    print(f"{name:50} {scenario:12} {status:8} {secs:6.1f}s", flush=True)
    counts = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"version": VERSION, "sasl": a.sasl, "counts": counts, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
