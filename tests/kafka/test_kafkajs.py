"""KafkaJS (Node) against a real ``shmq server --kafka-port`` with SASL/PLAIN (the
server's token for a password): a group whose committed offset DeleteRecords moved the
partition's start past. KafkaJS's consumer meets OFFSET_OUT_OF_RANGE there and resets
by committing -1 (-2 with ``fromBeginning``: ``OffsetManager.setDefaultOffset``), which
Kafka's coordinator takes; a refusal (INVALID_COMMIT_OFFSET_SIZE) is fatal to it. The
reset must go through and the consumer go on: from the earliest offset, or at the end.

Skips, saying why, without node and npm, or where kafkajs 2 cannot be had: the test
installs it (``npm install --prefix DIR kafkajs@2``, bounded) into ``$SHMQ_TEST_KAFKAJS``
(default ``~/.cache/shmq-tests/kafkajs``) when it is not there yet.
"""

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from tests._wait import wait_for
from tests.kafka.conftest import KafkaServer

KAFKAJS_DIR = os.environ.get("SHMQ_TEST_KAFKAJS") or os.path.join(os.path.expanduser("~"), ".cache", "shmq-tests",
                                                                   "kafkajs")
MEMBER = os.path.join(os.path.dirname(__file__), "kafkajs_member.js")
NPM_TIMEOUT_S = 180
TOKEN = "kafkajs-token"


@pytest.fixture(scope="module")
def kafkajs():
    """(node, the node_modules folder holding kafkajs 2), installed there if need be."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip(f"KafkaJS needs node and npm on PATH (node: {node}, npm: {npm})")
    modules = os.path.join(KAFKAJS_DIR, "node_modules")
    there = os.path.join(modules, "kafkajs", "package.json")
    os.makedirs(KAFKAJS_DIR, exist_ok=True)
    with open(os.path.join(KAFKAJS_DIR, ".lock"), "w") as lock:  # (xdist workers: one installs, the others wait)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(there):
            try:
                r = subprocess.run([npm, "install", "--prefix", KAFKAJS_DIR, "--no-audit", "--no-fund",
                                    "--prefer-offline", "--fetch-retries=1", "--fetch-timeout=20000",
                                    "--loglevel=error", "kafkajs@2"], capture_output=True, text=True,
                                   timeout=NPM_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.skip(f"npm install kafkajs@2 took over {NPM_TIMEOUT_S} s (no registry?)")
            if r.returncode != 0 or not os.path.isfile(there):
                pytest.skip(f"npm install kafkajs@2 into {KAFKAJS_DIR} failed: {(r.stderr or r.stdout)[-400:]}")
    with open(there) as f:
        version = json.load(f)["version"]
    if not version.startswith("2."):
        pytest.skip(f"{there} is kafkajs {version}, not 2.x")
    return node, modules


class Member:
    """``kafkajs_member.js`` in a node process of its own: what it said (``said``, one JSON
    object a line) and its stderr (KafkaJS's own log, for a failure's message)."""

    def __init__(self, node, modules, *args):
        self.proc = subprocess.Popen([node, MEMBER, *map(str, args)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, "NODE_PATH": modules})
        self.said, self.log = [], []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True)]
        for t in self._readers:
            t.start()

    def _read(self, stream, json_lines):
        for line in stream:
            if json_lines:
                self.said.append(json.loads(line))
            else:
                self.log.append(line)

    def records(self) -> list:
        return [x["record"] for x in list(self.said) if "record" in x]

    def crashes(self) -> list:
        return [x for x in list(self.said) if "crash" in x]

    def stop(self) -> int:
        """SIGTERM (it leaves its group), and its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for t in self._readers:
            t.join(10)
        return self.proc.returncode


@contextlib.contextmanager
def member(kafkajs, *args):
    m = Member(*kafkajs, *args)
    try:
        yield m
    finally:
        m.stop()


def _sasl(srv) -> dict:
    return {"bootstrap.servers": srv.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": "anyone", "sasl.password": TOKEN}


@pytest.mark.parametrize("from_beginning", [False, True], ids=["latest", "earliest"])
def test_kafkajs_resets_past_deleted_records_and_goes_on(broker, servers, tmp_path, kafkajs, from_beginning):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    srv = KafkaServer(servers(broker.namespace, "--no-persist", "--kafka-port", "0", "--token-file", str(token_file),
                              "--kafka-initial-rebalance-delay-ms", "0"))
    try:
        p = Producer(_sasl(srv))
        for i in range(10):
            p.produce("ev", b"early-%d" % i, partition=0)
        assert p.flush(30) == 0
        c = Consumer({**_sasl(srv), "group.id": "js"})
        c.commit(offsets=[TopicPartition("ev", 0, 2)], asynchronous=False)
        c.close()
        admin = AdminClient(_sasl(srv))
        (f,) = admin.delete_records([TopicPartition("ev", 0, 5)], request_timeout=30).values()
        assert f.result(30).low_watermark == 5  # the new start, past the group's commit (2)
        s = broker.stream("ev")
        assert s.offsets(0) == (5, 10) and s.committed("js") == {0: 2}
        with member(kafkajs, srv.bootstrap, TOKEN, "ev", "js", int(from_beginning)) as m:
            if from_beginning:  # reset to the earliest offset, 5
                wait_for(lambda: len(m.records()) >= 5 or m.crashes() or m.proc.poll() is not None, 60,
                         "KafkaJS reading from the earliest offset")
                assert not m.crashes(), (m.said, m.log)
                assert [(r["offset"], r["value"]) for r in m.records()] == [(o, "early-%d" % o) for o in range(5, 10)]
            else:  # reset to the end: only what comes after it. A record a round until one is read (bounded)
                deadline, i = time.monotonic() + 60, 0
                while not m.records() and not m.crashes() and m.proc.poll() is None:
                    assert time.monotonic() < deadline, ("KafkaJS never read a record produced after its reset",
                                                         m.said, m.log)
                    p.produce("ev", b"late-%d" % i, partition=0)
                    assert p.flush(30) == 0
                    i += 1
                    with contextlib.suppress(AssertionError):
                        wait_for(lambda: m.records() or m.crashes() or m.proc.poll() is not None, 1.0)
                assert not m.crashes(), (m.said, m.log)
                first = m.records()[0]
                assert first["offset"] >= 10 and first["value"].startswith("late-"), m.said  # none of 5..9
            assert m.proc.poll() is None, (m.said, m.log)
        assert m.proc.returncode == 0, (m.said, m.log)
        assert not [x for x in srv.proc.later if "refused:" in x and "commit of topic" in x]
        p.flush(30)
    finally:
        assert srv.stop() == 0
