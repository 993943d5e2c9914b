"""shmq in a default container's /dev/shm: a 64 MiB tmpfs of its own (Docker's and
Kubernetes' default), in a mount namespace made for the test (``unshare -m``, as root;
skipped, saying why, where that is not allowed). The README's first use, then a
Celery-sized set of queues and a stream, a thousand messages through each, all in it."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r"""
    import json, os, subprocess, sys, time
    import shmq

    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "shmq.cli", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout

    def held():
        return sum(os.stat("/dev/shm/" + e).st_blocks * 512 for e in os.listdir("/dev/shm"))

    out = {"shm_size": os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize}
    # the README's first use: the broker, a queue, produce and consume locally and over TCP, then Python
    server = subprocess.Popen([sys.executable, "-m", "shmq.cli", "server", "--port", "0"], stderr=subprocess.PIPE,
                              text=True)
    try:
        while True:
            line = server.stderr.readline()
            assert line, "the server ended before it listened"
            if "serving namespace" in line:
                break
        url = "tcp://127.0.0.1:" + line.split(" on ")[1].split()[0].rsplit(":", 1)[1]
        cli("create", "orders")
        cli("produce", "orders", "-m", "order #42")
        out["consumed"] = cli("consume", "orders").strip()
        cli("produce", "orders", "-m", "order #43", "--url", url)
        out["consumed_tcp"] = json.loads(cli("consume", "orders", "--url", url, "--json"))["body"]
        broker = shmq.connect()
        q = broker.queue("orders")
        q.put(b"order #44", headers={"customer": "ada"})
        d = q.get(timeout=5)
        out["python"] = [d.body.decode(), d.headers]
        d.ack()
        # a Celery-sized set: the task queue, its dead letters, two workers' control queues, results; a stream
        names = ["celery", "celery.dlq", "w1.celery.pidbox", "w2.celery.pidbox", "results"]
        queues = [broker.create_queue(n) for n in names]
        s = broker.create_stream("events", partitions=4)
        out["held_empty"] = held()
        body = b"t" * 900  # about a Celery task message
        for q in queues:
            for i in range(0, 1000, 100):
                q.put_many([body] * 100)
        s.append_many([body] * 1000)
        out["held_full"] = held()
        got = 0
        for q in queues:
            while True:
                try:
                    ds = q.get_many(100, timeout=0)
                except shmq.QueueEmpty:
                    break
                q.ack_many(ds)
                got += len(ds)
        out["consumed_jobs"] = got
        c = s.consumer("g")
        records = 0
        while records < 1000:
            rs = c.poll(max_records=500, timeout=5)
            assert rs, "the stream's records did not come"
            records += len(rs)
            c.commit()
        out["records"] = records
        c.close()
        for q in queues:  # settled: a few housekeeping rounds give their memory back
            for _ in range(3):
                q._housekeep()
        out["held_drained"] = held()
    finally:
        server.terminate()
        out["server_exit"] = server.wait(30)
    print(json.dumps(out))
""")


def test_a_default_containers_64_mib_dev_shm_runs_shmq(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot make a mount namespace here (root needed): {probe.stderr.strip()}")
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "SHMQ_HOME": str(tmp_path)}
    env.pop("SHMQ_NAMESPACE", None)
    r = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         'mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable, SCRIPT],
        capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path),
    )
    assert r.returncode == 0, f"exit {r.returncode} (-7 is SIGBUS): {r.stdout[-1000:]} {r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["shm_size"] == 64 * 2**20
    assert (out["consumed"], out["consumed_tcp"]) == ("order #42", "order #43")
    assert out["python"] == ["order #44", {"customer": "ada"}]
    assert out["consumed_jobs"] == 5000 and out["records"] == 1000
    assert out["held_empty"] < 4 * 2**20  # six queues, a stream of four partitions, the namespace
    assert out["held_full"] < 16 * 2**20  # what 6000 messages of 900 B take, beside that
    assert out["held_drained"] < out["held_empty"] + 2 * 2**20  # the stream keeps its records
    assert out["server_exit"] == 0
