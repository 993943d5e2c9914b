"""What loopback TCP itself costs on this machine, with no broker's work in it:
``python -m bench.loopback``.

Plain Python sockets, no parsing, no shmq:

- ``rtt``: one round trip of 64 B between a client pinned to one CPU and an echo
  process on another (and both on one CPU), each side either asleep in ``recv`` /
  ``epoll`` or spinning on a non-blocking look (with ``sched_yield``, as
  ``shmq.busypoll`` does): what a wake-up across CPUs costs, and what spinning saves;
- ``pingpong``: bench.tcp's ping-pong (a put, the other side's blocking get, its put
  back, a get: four exchanges) by two clients that cost next to nothing (prebuilt
  ``LPUSH`` / ``BRPOP`` bytes, one ``recv`` each) against ``redis-server`` itself,
  pinned as bench.tcp pins them: the least any client and server take for that case.

Each figure is the median over ``--runs`` runs of each run's p50, in µs.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import sys
import time

from bench import harness
from bench.plan import pin_cpus

BODY = b"x" * 64


def _nodelay(s):
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv(sock, spin_s):
    """One read; with ``spin_s``, looked for without sleeping that long first."""
    if spin_s:
        end = time.perf_counter() + spin_s
        while True:
            try:
                return sock.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if time.perf_counter() > end:
                    break
                os.sched_yield()
    return sock.recv(4096)


def _echo(ready, cpu, spin_s):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        ready.put(ls.getsockname()[1])
        conn, _ = ls.accept()
    with _nodelay(conn):
        poller = select.epoll()
        poller.register(conn.fileno(), select.EPOLLIN)
        last = time.perf_counter()
        while True:  # a loop as an event loop's: epoll, then read what is there
            if not poller.poll(0 if time.perf_counter() - last < spin_s else -1):
                os.sched_yield()
                continue
            data = conn.recv(4096)
            if not data:
                return
            conn.sendall(data)
            last = time.perf_counter()


def _rtt_client(port, cpu, spin_s, n, out):
    os.sched_setaffinity(0, {cpu})
    lat = []
    with _nodelay(socket.create_connection(("127.0.0.1", port))) as s:
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(BODY)
            _recv(s, spin_s)
            lat.append(time.perf_counter() - t)
    out.put(statistics.median(lat) * 1e6)


def rtt(ctx, client_cpu, server_cpu, server_spin_s, client_spin_s, n):
    """One run's p50 round trip in µs."""
    ready, out = ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=_echo, args=(ready, server_cpu, server_spin_s), daemon=True)
    server.start()
    try:
        port = ready.get(timeout=30)
        client = ctx.Process(target=_rtt_client, args=(port, client_cpu, client_spin_s, n, out))
        client.start()
        p50 = out.get(timeout=120)
        client.join(30)
        return p50
    finally:
        server.join(10)
        if server.is_alive():
            server.kill()


def _resp(*parts):
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def _pingpong_client(port, cpu, first, n, out):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    put_a, put_b = _resp(b"LPUSH", b"a", BODY), _resp(b"LPUSH", b"b", BODY)
    get_a, get_b = _resp(b"BRPOP", b"a", b"0"), _resp(b"BRPOP", b"b", b"0")
    lat = []
    with _nodelay(socket.create_connection(("127.0.0.1", port))) as s:
        for _ in range(n):
            if first:
                t = time.perf_counter()
                s.sendall(put_a)
                s.recv(4096)
                s.sendall(get_b)
                s.recv(4096)  # (a BRPOP's reply is one small segment)
                lat.append(time.perf_counter() - t)
            else:
                s.sendall(get_a)
                s.recv(4096)
                s.sendall(put_b)
                s.recv(4096)
    if first:
        out.put(statistics.median(lat) * 1e6)


def pingpong(ctx, port, cpus, n):
    out = ctx.Queue()
    procs = [ctx.Process(target=_pingpong_client, args=(port, cpus[i] if cpus else None, i == 0, n, out))
             for i in (0, 1)]
    for p in procs:
        p.start()
    p50 = out.get(timeout=120)
    for p in procs:
        p.join(30)
    return p50


@harness.leaves_no_processes
def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.loopback", description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20_000, help="round trips per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spin-us", type=int, default=200, help="how long a spinning side looks before it sleeps")
    args = ap.parse_args(argv)
    if min(args.count, args.runs, args.spin_us) < 1:
        ap.error("--count, --runs and --spin-us must be positive")
    cpus = pin_cpus(True)
    if len(cpus) < 2:
        print("python -m bench.loopback: needs two CPUs to pin to", file=sys.stderr)
        return 2
    ctx = harness.context()
    spin = args.spin_us / 1e6
    med = lambda f: statistics.median(f() for _ in range(args.runs))  # noqa: E731
    print(f"loopback TCP, 64 B, plain Python sockets; p50 µs, median of {args.runs} runs of {args.count}; "
          f"CPUs {cpus[0]} and {cpus[1]}; load {os.getloadavg()[0]:.2f}")
    print("one round trip (client on one CPU, echo on the other):")
    for server_spin, client_spin, what in ((0, 0, "both asleep"), (spin, 0, "echo spinning"),
                                           (0, spin, "client spinning"), (spin, spin, "both spinning")):
        p50 = med(lambda: rtt(ctx, cpus[0], cpus[1], server_spin, client_spin, args.count))
        print(f"  {what:<32} {p50:8.1f}")
    p50 = med(lambda: rtt(ctx, cpus[0], cpus[0], 0, 0, args.count))
    print(f"  {'both asleep, on one CPU':<32} {p50:8.1f}")
    from bench.servers import RedisServer
    import shutil
    if shutil.which("redis-server") is None:
        print("ping-pong against redis-server: skipped (redis-server not on PATH)")
        return 0
    redis = RedisServer()
    try:
        p50 = med(lambda: pingpong(ctx, redis.port, cpus, max(1, args.count // 4)))
    finally:
        redis.close()
    print(f"ping-pong (LPUSH; BRPOP on the other side; back), zero-cost clients against redis-server, "
          f"pinned as bench.tcp: {p50:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
