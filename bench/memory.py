"""What a queue and a stream partition cost in memory: ``python -m bench.memory``.

Per system, three states of one queue (or partition): empty (the mean of ``--empty``
of them: 200, the brief's case), holding ``--count`` messages of ``--size`` bytes, and
after they were consumed and acked. shmq: the bytes of /dev/shm its segments hold
(what the kernel counts, st_blocks; after the drain, what housekeeping leaves, the rounds
``shmq server`` runs every 0.25 s). Redis: ``used_memory`` before and after (lists for
queues, streams for partitions; an empty Redis key does not exist, so "empty" holds one
64 B message). RabbitMQ: the classic queue's own ``memory`` as ``rabbitmqctl
list_queues`` reports it (its process; a queue's messages may sit in the node's message
store, counted elsewhere). One run: these are sizes, not timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from bench import provenance
from bench.adapters import run_namespace
from bench.machine import machine_info
from bench.servers import RABBITMQ_BIN, RabbitServer, RedisServer, rabbitmq_missing

PROG = "python -m bench.memory"
KiB = 1024


def _held(namespace: str, part: str) -> int:
    from shmq.engine.shm.segment import SHM_DIR, namespace_entries

    return sum(os.stat(f"{SHM_DIR}/{e}").st_blocks * 512 for e in namespace_entries(namespace) if part in e)


def shmq_queue(args) -> dict:
    import shmq
    from shmq.engine import maintenance
    from shmq.engine.shm.segment import destroy_namespace

    ns = run_namespace("memq")
    broker = shmq.connect(namespace=ns)
    try:
        base = _held(ns, "")
        for i in range(args.empty):
            broker.create_queue(f"e{i}")
        empty = (_held(ns, "") - base) / args.empty
        for i in range(args.empty):
            broker.delete_queue(f"e{i}")
        broker.create_queue("full")
        q = broker.queue("full")
        body = b"x" * args.size
        for _ in range(0, args.count, 100):
            q.put_many([body] * min(100, args.count - _))
        held = q.stats().bytes_held
        while True:
            try:
                q.ack_many(q.get_many(1000, timeout=0))
            except shmq.QueueEmpty:
                break
        for _ in range(64):  # housekeeping's rounds give memory back, 16 MiB a round at most
            maintenance.housekeep(q)
        drained = q.stats().bytes_held
        q.close()
        return {"empty": empty, "held": held, "drained": drained}
    finally:
        broker.close()
        destroy_namespace(ns)


def shmq_partition(args) -> dict:
    import shmq
    from shmq.engine.shm.segment import destroy_namespace

    ns = run_namespace("memp")
    broker = shmq.connect(namespace=ns)
    try:
        base = _held(ns, "")
        broker.create_stream("empty", partitions=args.empty)
        empty = (_held(ns, "") - base) / args.empty
        broker.delete_stream("empty")
        broker.create_stream("full", partitions=1)
        s = broker.stream("full")
        before = _held(ns, "")
        body = b"x" * args.size
        for _ in range(0, args.count, 100):
            s.append_many([body] * min(100, args.count - _), partition=0)
        held = _held(ns, "") - before + empty
        s.close()
        return {"empty": empty, "held": held, "drained": None}
    finally:
        broker.close()
        destroy_namespace(ns)


def _redis(args, kind) -> dict:
    import redis

    server = RedisServer()
    try:
        r = redis.Redis(port=server.port)
        r.config_set("maxmemory-policy", "noeviction")

        def used():
            return r.info("memory")["used_memory"]

        def push(key, values):
            if kind == "list":
                r.lpush(key, *values)
            else:
                with r.pipeline(transaction=False) as p:
                    for v in values:
                        p.xadd(key, {"v": v})
                    p.execute()

        base = used()
        for i in range(args.empty):
            push(f"e{i}", [b"x" * 64])
        empty = (used() - base) / args.empty
        r.flushall()
        base = used()
        body = b"x" * args.size
        for i in range(0, args.count, 100):
            push("full", [body] * min(100, args.count - i))
        held = used() - base
        if kind == "list":
            while r.rpop("full", 1000):
                pass
        else:  # a group reads and acks everything; the stream keeps its entries (as a partition does)
            r.xgroup_create("full", "g", id="0")
            while got := r.xreadgroup("g", "c", {"full": ">"}, count=1000):
                r.xack("full", "g", *[mid for mid, _ in got[0][1]])
        drained = used() - base
        return {"empty": empty, "held": held, "drained": drained}
    finally:
        server.close()


def rabbitmq(args) -> dict:
    import pika

    server = RabbitServer()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.port))
        ch = conn.channel()

        def memory(names):
            out = subprocess.run([f"{RABBITMQ_BIN}/rabbitmqctl", "-n", server.env["RABBITMQ_NODENAME"], "list_queues",
                                  "name", "memory", "-q", "--no-table-headers"],
                                 env=server.env, capture_output=True, text=True, timeout=60, check=True).stdout
            rows = dict(line.split("\t")[:2] for line in out.splitlines() if "\t" in line)
            return sum(int(rows[n]) for n in names)

        names = [f"e{i}" for i in range(args.empty)]
        for n in names:
            ch.queue_declare(n)
        empty = memory(names) / args.empty
        ch.queue_declare("full")
        body = b"x" * args.size
        for _ in range(args.count):
            ch.basic_publish("", "full", body)
        deadline = time.monotonic() + 60
        while ch.queue_declare("full", passive=True).method.message_count < args.count:
            if time.monotonic() > deadline:
                raise RuntimeError("RabbitMQ did not take the messages in 60 s")
            conn.process_data_events(0.05)
        held = memory(["full"])
        while (m := ch.basic_get("full"))[0] is not None:
            ch.basic_ack(m[0].delivery_tag)
        drained = memory(["full"])
        conn.close()
        return {"empty": empty, "held": held, "drained": drained}
    finally:
        server.close()


SYSTEMS = {
    ("queue", "shmq"): shmq_queue,
    ("queue", "redis"): lambda args: _redis(args, "list"),
    ("queue", "rabbitmq"): rabbitmq,
    ("partition", "shmq"): shmq_partition,
    ("partition", "redis"): lambda args: _redis(args, "stream"),
}


def missing(system) -> str | None:
    """Why ``system`` cannot run here, or None."""
    import shutil

    if system == "redis" and shutil.which("redis-server") is None:
        return "redis-server not installed (apt-get install redis-server)"
    if system == "rabbitmq":
        return rabbitmq_missing()
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=10_000, help="messages held (default 10000)")
    p.add_argument("--size", type=int, default=KiB, help="bytes per message (default 1024)")
    p.add_argument("--empty", type=int, default=200, help="empty queues / partitions averaged (default 200)")
    p.add_argument("--systems", default="shmq,redis,rabbitmq")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows, skipped = [], {}
    for (what, system), run in SYSTEMS.items():
        if system not in args.systems.split(","):
            continue
        why = missing(system)
        if why:
            skipped[system] = why
            continue
        try:
            rows.append(dict(what=what, system=system, error=None, **run(args)))
        except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, the others still run
            rows.append({"what": what, "system": system, "error": f"{type(exc).__name__}: {exc}"})
    for r in rows:
        figures = "  ".join(f"{k} {r[k] / KiB:,.1f} KiB" for k in ("empty", "held", "drained")
                            if r.get(k) is not None)
        print(f"{r['what']:9} {r['system']:9} {r['error'] or figures}")
    for system, why in skipped.items():
        print(f"{system}: skipped ({why})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.run_header("memory", shlex.join([*PROG.split(), *argv])), "machine": machine_info(),
                       "count": args.count, "size": args.size, "empty": args.empty, "rows": rows,
                       "skipped": skipped}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
