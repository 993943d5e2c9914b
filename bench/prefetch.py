"""TCP consume with prefetch, 1 producer -> 1 consumer, acks: ``python -m bench.prefetch``.

shmq's ``q.consume(prefetch=100)`` + ``d.ack(wait=False)`` over TCP against RabbitMQ
(pika, ``basic_qos(prefetch_count=100)``, ``basic_consume`` with manual ``basic_ack`` of
each message), Redis Streams (``XREADGROUP COUNT 100`` + one ``XACK`` of the ids read,
as the streams adapter does) and NATS JetStream (nats-py; a memory stream and a durable
pull consumer with ``AckPolicy.EXPLICIT``, ``fetch(100)``, then ``ack()`` of each
message, which nats-py sends without waiting for a reply). The producer batches on every
system so that the consumer is what is measured: shmq ``put_many`` of 64, RabbitMQ
``basic_publish`` without confirms (pika writes without waiting), Redis 64 ``XADD`` in
one pipeline, NATS 64 ``js.publish_async`` and then their 64 PubAcks. Each server is
started by this harness on free loopback ports with a temporary directory and stopped at
the end (``rabbitmq-server`` from the system packages, run directly; ``redis-server``;
``nats-server -js``; ``shmq server --no-persist``); a system that is missing is skipped,
saying why. The
consumer times from the start barrier until it has acked ``--count`` messages; each
figure is the median of ``--runs`` runs, with min .. max, and shmq's ratio to each peer.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import shutil
import statistics
import sys
import time

from bench import harness
from bench.plan import pin_cpus

PREFETCH = 100
BATCH = 64
NATS_DURABLE = "bench"
SYSTEMS = ("shmq-tcp", "rabbitmq", "redis-streams", "nats-js")
NATS_FETCH_S = 1.0  # a NATS fetch's wait for messages before it asks again


# ---------------------------------------------------------------- the two ends, per system
def _shmq_produce(url, name, count, body):
    import shmq
    with shmq.connect(url) as b:
        q = b.queue(name)
        for i in range(0, count, BATCH):
            q.put_many([body] * min(BATCH, count - i))


def consume_acked(broker, q, count, prefetch):
    """Take ``count`` messages of ``q`` through ``consume(prefetch=...)``, each acked with
    ``ack(wait=False)``; returns once the server handled every ack."""
    with q.consume(prefetch=prefetch) as it:
        n = 0
        for d in it:
            d.ack(wait=False)
            n += 1
            if n == count:
                break
    broker.ping()  # every ack handled


def _shmq_consume(url, name, count):
    import shmq
    with shmq.connect(url) as b:
        consume_acked(b, b.queue(name), count, PREFETCH)


def _rabbit_produce(port, name, count, body):
    import pika
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = c.channel()
    for _ in range(count):
        ch.basic_publish("", name, body)
    c.close()


def _rabbit_consume(port, name, count):
    import pika
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = c.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    n = 0
    for method, _props, _body in ch.consume(name, auto_ack=False):
        ch.basic_ack(method.delivery_tag)
        n += 1
        if n == count:
            break
    ch.cancel()
    c.close()


def _redis_produce(port, name, count, body):
    import redis
    r = redis.Redis(port=port)
    for i in range(0, count, BATCH):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(BATCH, count - i)):
            pipe.xadd(name, {b"v": body})
        pipe.execute()
    r.close()


def _redis_consume(port, name, count):
    import redis
    r = redis.Redis(port=port)
    n = 0
    while n < count:
        reply = r.xreadgroup(b"bench", b"c", {name: b">"}, count=PREFETCH, block=0)
        entries = reply[0][1]
        r.xack(name, b"bench", *[i for i, _ in entries])
        n += len(entries)
    r.close()


async def _nats_produce_async(url, name, count, body):
    import nats
    nc = await nats.connect(url)
    js = nc.jetstream()
    for i in range(0, count, BATCH):
        acks = [await js.publish_async(name, body) for _ in range(min(BATCH, count - i))]
        await asyncio.gather(*acks)
    await nc.close()


def _nats_produce(url, name, count, body):
    asyncio.run(_nats_produce_async(url, name, count, body))


async def _nats_consume_async(url, name, count):
    import nats
    import nats.errors
    nc = await nats.connect(url)
    sub = await nc.jetstream().pull_subscribe_bind(durable=NATS_DURABLE, stream=name)
    n = 0
    while n < count:
        try:
            msgs = await sub.fetch(PREFETCH, timeout=NATS_FETCH_S)
        except (asyncio.TimeoutError, nats.errors.TimeoutError):
            continue
        for m in msgs:
            await m.ack()
        n += len(msgs)
    await nc.flush()  # every ack handled
    await nc.close()


def _nats_consume(url, name, count):
    asyncio.run(_nats_consume_async(url, name, count))


ENDS = {"shmq-tcp": (_shmq_produce, _shmq_consume), "rabbitmq": (_rabbit_produce, _rabbit_consume),
        "redis-streams": (_redis_produce, _redis_consume), "nats-js": (_nats_produce, _nats_consume)}


# what each system's ends import, done before the clock starts: an import costs 50-150 ms,
# a large part of a run
IMPORTS = {"shmq-tcp": ("shmq", "shmq.client.remote"), "rabbitmq": ("pika",), "redis-streams": ("redis",),
           "nats-js": ("nats", "nats.js", "nats.errors")}


def _child(role, fn, args, cpu, barrier, out, imports=()):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    for module in imports:
        importlib.import_module(module)
    barrier.wait(60)
    t0 = time.perf_counter()
    fn(*args)
    out.put((role, time.perf_counter() - t0))


# ---------------------------------------------------------------- servers and channels
class System:
    """One system's server for the whole run; ``make(size)`` a fresh channel per run."""

    def __init__(self, name):
        self.name = name
        self._n = 0
        if name == "shmq-tcp":
            import shmq
            from bench.servers import ShmqServer
            self.namespace = f"bench-{os.getpid()}-prefetch"
            self.server = ShmqServer(self.namespace)
            self.addr = self.server.url
            self._shmq = shmq
        elif name == "rabbitmq":
            from bench.servers import RabbitServer
            self.server = RabbitServer()
            self.addr = self.server.port
        elif name == "redis-streams":
            from bench.servers import RedisServer
            self.server = RedisServer()
            self.addr = self.server.port
        else:
            import nats
            from bench.servers import NatsServer
            self.server = NatsServer()
            self.addr = self.server.url
            self._loop = asyncio.new_event_loop()
            try:
                self._nc = self._loop.run_until_complete(nats.connect(self.addr))
            except BaseException:
                self._loop.close()
                self.server.close()
                raise
            self._jsm = self._nc.jsm()

    @staticmethod
    def missing(name):
        """Why ``name`` cannot run here, or None."""
        if name == "rabbitmq":
            from bench.servers import rabbitmq_missing
            if rabbitmq_missing():
                return rabbitmq_missing()
            if importlib.util.find_spec("pika") is None:
                return "pika not installed (pip install 'shmq[bench]')"
        if name == "redis-streams":
            if shutil.which("redis-server") is None:
                return "redis-server not on PATH"
            if importlib.util.find_spec("redis") is None:
                return "redis not installed (pip install 'shmq[bench]')"
        if name == "nats-js":
            if shutil.which("nats-server") is None:
                return "nats-server not on PATH"
            if importlib.util.find_spec("nats") is None:
                return "nats-py not installed (pip install 'shmq[bench]')"
        return None

    def make(self, size):
        self._n += 1
        name = f"p{self._n}"
        if self.name == "shmq-tcp":
            with self._shmq.connect(self.addr) as b:
                b.create_queue(name, max_bytes=64 * 2**20, max_message_bytes=max(size, 1024))
        elif self.name == "rabbitmq":
            import pika
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.addr))
            c.channel().queue_declare(name)
            c.close()
        elif self.name == "redis-streams":
            import redis
            with redis.Redis(port=self.addr) as r:
                r.xgroup_create(name, b"bench", id="0", mkstream=True)
        else:  # the stream in memory, like Redis without persistence; its one subject is its name
            from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
            run = self._loop.run_until_complete
            run(self._jsm.add_stream(StreamConfig(name=name, subjects=[name], storage=StorageType.MEMORY)))
            run(self._jsm.add_consumer(name, ConsumerConfig(durable_name=NATS_DURABLE, ack_policy=AckPolicy.EXPLICIT,
                                                            deliver_policy=DeliverPolicy.ALL)))
        return name

    def drop(self, name):
        if self.name == "shmq-tcp":
            with self._shmq.connect(self.addr) as b:
                b.delete_queue(name)
        elif self.name == "rabbitmq":
            import pika
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.addr))
            c.channel().queue_delete(name)
            c.close()
        elif self.name == "redis-streams":
            import redis
            with redis.Redis(port=self.addr) as r:
                r.delete(name)
        else:
            self._loop.run_until_complete(self._jsm.delete_stream(name))

    def close(self):
        if self.name == "nats-js":
            try:
                self._loop.run_until_complete(self._nc.close())
            finally:
                self._loop.close()
        self.server.close()
        if self.name == "shmq-tcp":
            self._shmq.destroy_namespace(self.namespace)


def run_once(ctx, system, size, count, cpus, timeout):
    """One run: messages per second the consumer acked."""
    name = system.make(size)
    try:
        produce, consume = ENDS[system.name]
        barrier, out = ctx.Barrier(3), ctx.Queue()
        imports = IMPORTS[system.name]
        procs = [ctx.Process(target=_child, args=("producer", produce, (system.addr, name, count, b"x" * size),
                                                  cpus[0] if cpus else None, barrier, out, imports)),
                 ctx.Process(target=_child, args=("consumer", consume, (system.addr, name, count),
                                                  cpus[1] if cpus else None, barrier, out, imports))]
        for p in procs:
            p.start()
        barrier.wait(60)
        times = {}
        deadline = time.monotonic() + timeout
        try:
            while len(times) < 2:
                role, seconds = out.get(timeout=max(0.1, deadline - time.monotonic()))
                times[role] = seconds
        finally:
            for p in procs:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
        return count / times["consumer"]
    finally:
        system.drop(name)


@harness.leaves_no_processes
def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.prefetch", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--count", type=int, default=20_000, help="messages per run")
    ap.add_argument("--sizes", default="64,1024", help="message sizes in bytes")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let the OS place the two processes")
    ap.add_argument("--run-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    cpus = pin_cpus(args.pin)
    ctx = harness.context()
    results, skipped = {}, {}
    load = os.getloadavg()[0]
    for name in args.systems.split(","):
        why = System.missing(name)
        if why:
            skipped[name] = why
            continue
        try:
            system = System(name)
        except Exception as e:  # a server that does not start is a skip with its reason
            skipped[name] = f"did not start: {str(e).splitlines()[0]}"
            continue
        try:
            for size in sizes:
                run_once(ctx, system, size, min(args.count, 2000), cpus, args.run_timeout)  # warm-up
                results[name, size] = [run_once(ctx, system, size, args.count, cpus, args.run_timeout)
                                       for _ in range(args.runs)]
        finally:
            system.close()
    print(f"TCP consume with prefetch {PREFETCH}, 1 producer -> 1 consumer, every message acked; "
          f"{args.count} messages, median of {args.runs} runs; CPUs {cpus or 'unpinned'}; "
          f"load {load:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'system':<15} {'size':>6} {'msgs/s':>10} {'min .. max':>20}  shmq / it")
    for (name, size), rates in results.items():
        med = statistics.median(rates)
        ours = results.get(("shmq-tcp", size))
        ratio = f"{statistics.median(ours) / med:.2f}x" if ours else "-"
        print(f"{name:<15} {size:>5}B {med:>10,.0f} {min(rates):>9,.0f} .. {max(rates):<9,.0f} {ratio}")
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
