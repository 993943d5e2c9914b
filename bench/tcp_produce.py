"""One TCP connection carrying a batched producer: ``python -m bench.tcp_produce``.

A ``shmq server --no-persist --no-auth`` of its own (``--server-arg`` adds options, e.g.
``--server-arg=--loop=uvloop``), one queue large enough for every run, and one producer
process on one connection putting ``--batch`` bodies of ``--size`` bytes per request
until ``--count`` messages are in. Two producers:

- ``client``: the blocking client's ``q.put_many(batch)`` in a loop (one request in flight);
- ``raw``: PRODUCE_BATCH frames encoded once, then written ``--window`` requests ahead
  of their replies: the client costs next to nothing, so the figure is what the server
  takes on one connection.

Besides msgs/s, the server's CPU time per message (user + system, read from /proc
around the run) says where its time goes. The queue is purged between runs. Each
figure is the median of ``--runs`` runs, with min .. max.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import psutil

from bench.plan import pin_cpus

QUEUE = "produce"


def _client(url, count, batch, size, window):
    import shmq
    body = b"x" * size
    with shmq.connect(url) as b:
        q = b.queue(QUEUE)
        bodies = [body] * batch
        t0 = time.perf_counter()
        for _ in range(count // batch):
            q.put_many(bodies)
        return time.perf_counter() - t0


def _raw(url, count, batch, size, window):
    from shmq.protocol import FrameDecoder, MsgType, encode_request
    host, port = url[len("tcp://"):].rsplit(":", 1)
    frames = [encode_request(MsgType.PRODUCE_BATCH, i + 1,
                             {"queue": QUEUE, "messages": [{"body": b"x" * size}] * batch}) for i in range(window)]
    decoder = FrameDecoder()
    requests = count // batch
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        sent = min(window, requests)
        s.sendall(b"".join(frames[:sent]))
        done = 0
        while done < requests:
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError("the server closed the connection")
            decoder.feed(data)
            n = 0
            for f in decoder.frames():
                if f.status:
                    raise RuntimeError(f"error reply: {f.payload}")
                n += 1
            done += n
            more = min(n, requests - sent)
            if more:
                s.sendall(b"".join(frames[(sent + i) % window] for i in range(more)))
                sent += more
        return time.perf_counter() - t0


PRODUCERS = {"client": _client, "raw": _raw}


def _child(fn, args, cpu, out):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import shmq  # noqa: F401  imported before the clock starts
    out.put(fn(*args))


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tcp_produce", description=__doc__.splitlines()[0])
    ap.add_argument("--producer", choices=tuple(PRODUCERS), default="client")
    ap.add_argument("--count", type=int, default=200_000, help="messages per run")
    ap.add_argument("--batch", type=int, default=1000, help="bodies per request")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--window", type=int, default=4, help="raw: requests written ahead of their replies")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server-arg", action="append", default=[], help="an option for shmq server (repeatable)")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let the OS place server and producer")
    args = ap.parse_args(argv)
    import shmq
    from bench.servers import ShmqServer

    ns = f"bench-{os.getpid()}-produce"
    server = ShmqServer(ns, "--no-auth", *args.server_arg)
    cpus = pin_cpus(args.pin)
    ctx = mp.get_context("spawn")
    rates, costs = [], []
    try:
        sproc = psutil.Process(server.proc.pid)
        if cpus:
            sproc.cpu_affinity([cpus[0]])
        with shmq.connect(server.url) as b:
            record = (48 + args.size + 7) & -8
            b.create_queue(QUEUE, max_bytes=max(args.count, 2000) * record + 2**20,
                           max_message_bytes=max(args.size, 1024))
            q = b.queue(QUEUE)
            for run in range(args.runs + 1):  # the first is a warm-up
                n = args.count if run else min(args.count, 20 * args.batch)
                out = ctx.Queue()
                p = ctx.Process(target=_child, args=(PRODUCERS[args.producer],
                                                     (server.url, n, args.batch, args.size, args.window),
                                                     cpus[1] if cpus else None, out))
                p.start()
                c0 = _cpu(sproc)
                seconds = out.get(timeout=120)
                c1 = _cpu(sproc)
                p.join()
                sent = n // args.batch * args.batch
                if q.stats().ready != sent:
                    raise RuntimeError(f"{q.stats().ready} messages in the queue, {sent} put")
                q.purge()
                if run:
                    rates.append(sent / seconds)
                    costs.append((c1 - c0) / sent * 1e6)
    finally:
        server.close()
        shmq.destroy_namespace(ns)
    print(f"one connection, {args.producer} producer, put_many of {args.batch} x {args.size} B"
          f"{f', window {args.window}' if args.producer == 'raw' else ''}; {args.count} messages, median of "
          f"{args.runs}; server {' '.join(args.server_arg) or '(defaults)'}; CPUs {cpus or 'unpinned'}")
    print(f"  {statistics.median(rates):>10,.0f} msgs/s  ({min(rates):,.0f} .. {max(rates):,.0f}); "
          f"server CPU {statistics.median(costs):.2f} us/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
