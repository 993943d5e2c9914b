"""shmq over TCP against Redis lists over loopback, in one run: ``python -m bench.tcp``.

Each case starts producers and consumers as separate processes (spawn), each with its
own connection, released together by a barrier; the consumers time from the release
until they have received (and acked) every message. Modes:

- ``msg``: one message per request (shmq put / get + ack; Redis LPUSH / BRPOP);
- ``batch``: 64 per request (shmq put_many / get_many(64) + ack_many; Redis LPUSH of
  64 values / BLMPOP COUNT 64).

``conns`` is the number of client connections: 2 = one producer and one consumer,
8 = four of each. Redis runs only where ``redis-server`` is on the PATH (the harness
starts its own on a free loopback port and stops it) and redis-py is installed;
otherwise it is reported as skipped. Every figure is the median of ``--runs`` runs.
"""

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import shmq

BATCH = 64
SIZE = 1024


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ systems


class ShmqSystem:
    name = "shmq-tcp"

    def __init__(self):
        self.namespace = "bt" + uuid.uuid4().hex[:8]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shmq.cli", "server", "--namespace", self.namespace, "--port", "0",
             "--log-level", "warning"],
            stderr=subprocess.PIPE, text=True,
        )
        # the port: ask the OS which one the server bound (it logs only warnings here)
        import psutil

        deadline = time.monotonic() + 30
        self.port = None
        while self.port is None and time.monotonic() < deadline:
            conns = [c for c in psutil.Process(self.proc.pid).net_connections("tcp") if c.status == "LISTEN"]
            if conns:
                self.port = conns[0].laddr.port
            else:
                time.sleep(0.01)
        if self.port is None:
            raise RuntimeError("shmq server did not start listening")
        self.url = f"tcp://127.0.0.1:{self.port}"

    def reset(self, name):
        with shmq.connect(self.url) as b:
            if name in b.list_queues():
                b.delete_queue(name)
            b.create_queue(name, max_bytes=256 * 2**20)

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)
        shmq.destroy_namespace(self.namespace)

    def spec(self):
        return ("shmq", self.url)


class RedisSystem:
    name = "redis"

    @staticmethod
    def available():
        if shutil.which("redis-server") is None:
            return "redis-server not on PATH"
        try:
            import redis  # noqa: F401
        except ImportError:
            return "redis-py not installed"
        return None

    def __init__(self):
        import redis

        self.port = _free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.version = client.info()["redis_version"]
        client.close()

    def reset(self, name):
        import redis

        with redis.Redis(port=self.port) as c:
            c.delete(name)

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def spec(self):
        return ("redis", self.port)


# ------------------------------------------------------------------ workers (spawned)


def _open(spec, qname):
    kind, where = spec
    if kind == "shmq":
        b = shmq.connect(where)
        return b, b.queue(qname)
    import redis

    return None, redis.Redis(port=where)


def producer(spec, qname, count, mode, barrier):
    broker, q = _open(spec, qname)
    body = b"x" * SIZE
    barrier.wait(60)
    if spec[0] == "shmq":
        if mode == "msg":
            for _ in range(count):
                q.put(body)
        else:
            batch = [body] * BATCH
            for _ in range(count // BATCH):
                q.put_many(batch)
    else:
        if mode == "msg":
            for _ in range(count):
                q.lpush(qname, body)
        else:
            batch = [body] * BATCH
            for _ in range(count // BATCH):
                q.lpush(qname, *batch)
    if broker is not None:
        broker.close()


def consumer(spec, qname, count, mode, barrier, total, out):
    """Take (and ack) until all consumers together have ``count``; report (start, last)."""
    broker, q = _open(spec, qname)
    barrier.wait(60)
    t0 = last = time.perf_counter()
    while total.value < count:
        if spec[0] == "shmq":
            try:
                if mode == "msg":
                    q.get(timeout=0.1).ack()
                    n = 1
                else:
                    ds = q.get_many(BATCH, timeout=0.1)
                    q.ack_many(ds)
                    n = len(ds)
            except shmq.QueueEmpty:
                continue
        else:
            if mode == "msg":
                n = 0 if q.brpop(qname, timeout=0.1) is None else 1
            else:
                r = q.blmpop(0.1, 1, qname, direction="RIGHT", count=BATCH)
                n = 0 if r is None else len(r[1])
            if not n:
                continue
        last = time.perf_counter()
        with total.get_lock():
            total.value += n
    out.put((t0, last))
    if broker is not None:
        broker.close()


# ------------------------------------------------------------------ driver


def run_case(system, mode, conns, count, ctx):
    pairs = conns // 2
    per = count // pairs // BATCH * BATCH
    qname = f"bench-{mode}-{conns}"
    system.reset(qname)
    barrier = ctx.Barrier(2 * pairs + 1)
    out = ctx.Queue()
    total = ctx.Value("q", 0)
    procs = [ctx.Process(target=producer, args=(system.spec(), qname, per, mode, barrier)) for _ in range(pairs)]
    procs += [ctx.Process(target=consumer, args=(system.spec(), qname, per * pairs, mode, barrier, total, out))
              for _ in range(pairs)]
    for p in procs:
        p.start()
    barrier.wait(60)
    spans = [out.get(timeout=300) for _ in range(pairs)]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"{system.name} {mode} worker exited with {p.exitcode}")
    return per * pairs / (max(last for _t0, last in spans) - min(t0 for t0, _last in spans))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tcp", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--count", type=int, default=40_000, help="messages per case (msg mode; batch mode x4)")
    ap.add_argument("--quick", action="store_true", help="count / 10, 2 runs")
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args(argv)
    runs, count = (2, args.count // 10) if args.quick else (args.runs, args.count)
    ctx = mp.get_context("spawn")
    systems = [ShmqSystem()]
    skipped = {}
    reason = RedisSystem.available()
    if reason:
        skipped["redis"] = reason
    else:
        systems.append(RedisSystem())
    print("shmq TCP benchmark (1 KiB messages, separate producer and consumer processes)")
    print(f"machine : {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, shmq {shmq.__version__}"
          + (f", redis {systems[1].version}" if len(systems) > 1 else ""))
    for name, why in skipped.items():
        print(f"skipped : {name}: {why}")
    results = []
    try:
        for mode in ("msg", "batch"):
            for conns in (2, 8):
                for system in systems:
                    n = count if mode == "msg" else count * 4
                    rates = []
                    for r in range(runs):
                        print(f"  {system.name} {mode} conns={conns} run {r + 1}/{runs}", file=sys.stderr, flush=True)
                        rates.append(run_case(system, mode, conns, n, ctx))
                    results.append({"system": system.name, "mode": mode, "conns": conns, "median": statistics.median(rates),
                                    "min": min(rates), "max": max(rates)})
    finally:
        for system in systems:
            system.close()
    print(f"\n{'mode':6s} {'conns':>5s}  {'system':9s} {'msgs/s':>10s}  (min .. max)")
    for r in results:
        print(f"{r['mode']:6s} {r['conns']:5d}  {r['system']:9s} {r['median']:10,.0f}  "
              f"({r['min']:,.0f} .. {r['max']:,.0f})")
    by = {(r["system"], r["mode"], r["conns"]): r["median"] for r in results}
    if any(r["system"] == "redis" for r in results):
        print("\nshmq-tcp / redis")
        for mode in ("msg", "batch"):
            for conns in (2, 8):
                print(f"{mode:6s} {conns:5d}  {by[('shmq-tcp', mode, conns)] / by[('redis', mode, conns)]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "skipped": skipped}, f, indent=2)


if __name__ == "__main__":
    main()
