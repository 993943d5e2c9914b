"""One TCP connection at full speed, produce or consume: ``python -m bench.tcp_one``.

A ``shmq server --no-persist --no-auth`` of its own (``--server-arg`` adds options, e.g.
``--server-arg=--loop=asyncio``), one queue large enough for every run, and one client
process on one connection (two for ``pingpong``):

- ``--role produce``: put ``--batch`` bodies of ``--size`` bytes per request until
  ``--count`` messages are in;
- ``--role consume``: the queue filled beforehand (locally, not timed), then a
  subscription with ``--prefetch`` takes and acks every message;
- ``--role put`` / ``--role get``: one plain request at a time, each waited for:
  ``q.put(body)``; or, the queue filled beforehand, ``q.get()`` + ``d.ack(wait=False)``
  (the ack goes with the next get): what one request costs each side. With ``--client
  raw``, the same plain frames (a PRODUCE of one; a CONSUME of one and the ACK of the last
  one's delivery) written ``--window`` at a time ahead of their replies: the server never
  waits for the client, so its CPU per request is its own work on them, without its spins
  and wake-ups.
- ``--role pingpong``: ``--count`` round trips over two queues between two client
  processes: a put, the other side's waiting get + ack(wait=False) and its put back, the
  waiting get + ack here (bench.tcp's ping-pong): what a get that waits costs the server,
  lined up and answered. Per round trip: the server's CPU, and the pinger's and the
  ponger's (the client CPU figure is theirs together); the server is not pinned.

Two clients each:

- ``client``: the blocking client (``q.put_many(batch)`` in a loop, one request in
  flight; ``q.consume(prefetch=N)`` with ``d.ack(wait=False)``);
- ``raw``: frames encoded once and written on a socket ahead of their replies
  (``--window`` PRODUCE_BATCHes in flight; one ACK per DELIVER push, not waited for):
  the client costs next to nothing, so the figure is what the server takes on one
  connection.

Besides msgs/s, the server's CPU time per message (user + system, from /proc around the
run) says what the server costs, and the client's (its process time) what the client
costs. ``--busy-poll-us N`` sets the client's spin (``--server-arg=--busy-poll-us=N`` the
server's): with 0 on both, the figures are each side's work alone, without the spin. The queue is purged between runs. Each figure is the
median of ``--runs`` runs (after a short warm-up run), with min .. max.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import psutil

from bench import harness
from bench.plan import pin_cpus
from bench.prefetch import consume_acked

QUEUE = "one"
BACK = "back"  # pingpong's way back


def _connect(url, args):
    import shmq
    return shmq.connect(url) if args.busy_poll_us is None else shmq.connect(url, busy_poll_us=args.busy_poll_us)


def _timed(fn):
    """(seconds, the process's CPU seconds) that ``fn()`` took."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _produce_client(url, count, args):
    with _connect(url, args) as b:
        q = b.queue(QUEUE)
        bodies = [b"x" * args.size] * args.batch

        def run():
            for _ in range(count // args.batch):
                q.put_many(bodies)
        return _timed(run)


def _put_client(url, count, args):
    with _connect(url, args) as b:
        q = b.queue(QUEUE)
        body = b"x" * args.size

        def run():
            for _ in range(count):
                q.put(body)
        return _timed(run)


def _get_client(url, count, args):
    with _connect(url, args) as b:
        q = b.queue(QUEUE)

        def run():
            for _ in range(count):
                q.get().ack(wait=False)
            b.ping()  # every ack handled
        return _timed(run)


def _pinger(url, count, args):
    with _connect(url, args) as b:
        there, back = b.queue(QUEUE), b.queue(BACK)
        body = b"x" * args.size

        def run():
            for _ in range(count):
                there.put(body)
                back.get().ack(wait=False)
            b.ping()  # every ack handled
        return _timed(run)


def _ponger(url, count, args):
    with _connect(url, args) as b:
        there, back = b.queue(QUEUE), b.queue(BACK)
        return _timed(lambda: _pong(b, there, back, count))


def _pong(b, there, back, count):
    for _ in range(count):
        d = there.get()
        d.ack(wait=False)
        back.put(d.body)
    b.ping()


def _connect_raw(url):
    host, port = url[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _frames_of_a_read(s, decoder):
    """The frames one read of socket ``s`` completes; RuntimeError for a close or an error reply."""
    data = s.recv(1 << 20)
    if not data:
        raise RuntimeError("the server closed the connection")
    decoder.feed(data)
    for f in decoder.frames():
        if f.status:
            raise RuntimeError(f"error reply: {f.payload}")
        yield f


def _produce_raw(url, count, args):
    c0 = time.process_time()
    return _produce_raw_run(url, count, args), time.process_time() - c0


def _produce_raw_run(url, count, args):
    from shmq.protocol import FrameDecoder, MsgType, encode_request
    batch, window = args.batch, args.window
    frames = [encode_request(MsgType.PRODUCE_BATCH, i + 1,
                             {"queue": QUEUE, "messages": [{"body": b"x" * args.size}] * batch})
              for i in range(window)]
    decoder = FrameDecoder()
    requests = count // batch
    with _connect_raw(url) as s:
        t0 = time.perf_counter()
        sent = min(window, requests)
        s.sendall(b"".join(frames[:sent]))
        done = 0
        while done < requests:
            n = 0
            for _f in _frames_of_a_read(s, decoder):
                n += 1
            done += n
            more = min(n, requests - sent)
            if more:
                s.sendall(b"".join(frames[(sent + i) % window] for i in range(more)))
                sent += more
        return time.perf_counter() - t0


def _plain_raw(url, count, args):
    c0 = time.process_time()
    return _plain_raw_run(url, count, args), time.process_time() - c0


def _plain_raw_run(url, count, args):
    """--role put|get --client raw: plain PRODUCEs, or CONSUMEs of one each with the ACK of the
    delivery before, ``--window`` requests written ahead of their replies."""
    from shmq.protocol import FrameDecoder, MsgType, encode_request
    from shmq.protocol.shapes import ack_shape, consume_shape, produce_shape
    put, window = args.role == "put", args.window
    pshape, cshape, ashape = produce_shape(QUEUE), consume_shape(QUEUE), ack_shape(QUEUE)
    body = b"x" * args.size
    decoder = FrameDecoder(1 << 30)
    with _connect_raw(url) as s:
        t0 = time.perf_counter()
        msg_id, sent, done, tag = 0, 0, 0, None

        def request():
            nonlocal msg_id
            msg_id += 1
            return pshape.frame(msg_id, body) if put else cshape.frame(msg_id, 0)
        s.sendall(b"".join(request() for _ in range(min(window, count))))
        sent = min(window, count)
        while done < count:
            out = []
            for f in _frames_of_a_read(s, decoder):
                if f.type & 0x7F == MsgType.ACK:
                    continue
                done += 1
                if not put:
                    (m,) = f.payload["messages"]
                    msg_id += 1
                    out.append(ashape.frame(msg_id, m["delivery"]))
                if sent < count:
                    out.append(request())
                    sent += 1
            if out:
                s.sendall(b"".join(out))
        elapsed = time.perf_counter() - t0
        s.sendall(encode_request(MsgType.PING, msg_id + 1))  # every ack handled before the queue is looked at
        while not any(f.type & 0x7F == MsgType.PING for f in decoder.frames()):
            decoder.feed(s.recv(1 << 20))
        return elapsed


def _consume_client(url, count, args):
    with _connect(url, args) as b:
        q = b.queue(QUEUE)

        return _timed(lambda: consume_acked(b, q, count, args.prefetch))


def _consume_raw(url, count, args):
    c0 = time.process_time()
    return _consume_raw_run(url, count, args), time.process_time() - c0


def _consume_raw_run(url, count, args):
    from shmq.protocol import REPLY_BIT, FrameDecoder, MsgType, PushType, encode_request
    decoder = FrameDecoder(1 << 30)
    deliver = PushType.DELIVER | REPLY_BIT
    with _connect_raw(url) as s:
        t0 = time.perf_counter()
        s.sendall(encode_request(MsgType.SUBSCRIBE, 1, {"queue": QUEUE, "prefetch": args.prefetch}))
        acked, msg_id = 0, 1
        while acked < count:
            acks = []
            for f in _frames_of_a_read(s, decoder):
                if f.type == deliver:
                    msg_id += 1
                    tags = [m["delivery"] for m in f.payload["messages"]]
                    acks.append(encode_request(MsgType.ACK, msg_id, {"queue": QUEUE, "deliveries": tags}))
                    acked += len(tags)
            if acks:
                s.sendall(b"".join(acks))  # not waited for: their replies come with the next pushes
        s.sendall(encode_request(MsgType.PING, msg_id + 1))
        while not any(f.msg_id == msg_id + 1 and f.type & 0x7F == MsgType.PING for f in decoder.frames()):
            decoder.feed(s.recv(1 << 20))  # every ack handled
        return time.perf_counter() - t0


CLIENTS = {("produce", "client"): _produce_client, ("produce", "raw"): _produce_raw,
           ("consume", "client"): _consume_client, ("consume", "raw"): _consume_raw,
           ("put", "client"): _put_client, ("get", "client"): _get_client, ("put", "raw"): _plain_raw,
           ("get", "raw"): _plain_raw, ("pingpong", "client"): _pinger}


def _child(fn, args, cpu, out):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import shmq  # noqa: F401  imported before the clock starts
    out.put(fn(*args))


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


@harness.leaves_no_processes
def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tcp_one", description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=("produce", "consume", "put", "get", "pingpong"), default="produce")
    ap.add_argument("--client", choices=("client", "raw"), default="client")
    ap.add_argument("--count", type=int, default=200_000, help="messages per run")
    ap.add_argument("--batch", type=int, default=1000, help="produce: bodies per request")
    ap.add_argument("--size", type=int, default=1024, help="body bytes")
    ap.add_argument("--window", type=int, default=4, help="raw produce: requests written ahead of their replies")
    ap.add_argument("--prefetch", type=int, default=100, help="consume: un-acked deliveries pushed at most")
    ap.add_argument("--busy-poll-us", type=int, default=None,
                    help="the client's busy_poll_us (default: the client's default)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server-arg", action="append", default=[], help="an option for shmq server (repeatable)")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="let the OS place server and client")
    args = ap.parse_args(argv)
    if args.role in ("put", "get", "pingpong"):
        args.batch = 1
    if (args.role, args.client) not in CLIENTS:
        ap.error(f"--role {args.role} has no --client {args.client}")
    import shmq
    from bench.servers import ShmqServer

    ns = f"bench-{os.getpid()}-one"
    server = ShmqServer(ns, "--no-auth", *args.server_arg)
    cpus = pin_cpus(args.pin)
    ctx = harness.context()
    fn = CLIENTS[args.role, args.client]
    rates, costs, client_costs = [], [], []
    try:
        sproc = psutil.Process(server.proc.pid)
        if cpus and args.role != "pingpong":
            sproc.cpu_affinity([cpus[0]])
        record = (48 + args.size + 7) & -8
        with shmq.connect(namespace=ns) as local:
            local.create_queue(QUEUE, max_bytes=max(args.count, 2000) * record + 2**20,
                               max_message_bytes=max(args.size, 1024))
            if args.role == "pingpong":
                local.create_queue(BACK, max_message_bytes=max(args.size, 1024))
            q = local.queue(QUEUE)
            for run in range(args.runs + 1):  # the first is a warm-up
                n = args.count if run else min(args.count, 20 * args.batch)
                n = n // args.batch * args.batch if args.role == "produce" else n
                if args.role in ("consume", "get"):
                    for i in range(0, n, 1000):
                        q.put_many([b"x" * args.size] * min(1000, n - i))
                out, pong = ctx.Queue(), ctx.Queue()
                if args.role == "pingpong":  # the other side: each put echoed back
                    other = ctx.Process(target=_child, args=(_ponger, (server.url, n, args),
                                                             cpus[0] if cpus else None, pong))
                    other.start()
                p = ctx.Process(target=_child, args=(fn, (server.url, n, args), cpus[1] if cpus else None, out))
                p.start()
                c0 = _cpu(sproc)
                seconds, client_cpu = out.get(timeout=120)
                c1 = _cpu(sproc)
                p.join()
                if args.role == "pingpong":
                    client_cpu += pong.get(timeout=120)[1]
                    other.join()
                s = q.stats()
                left = (s.ready, s.in_flight)
                if args.role == "pingpong":
                    s = local.queue(BACK).stats()
                    left += (s.ready, s.in_flight)
                if left != ((n, 0) if args.role in ("produce", "put") else (0,) * len(left)):
                    raise RuntimeError(f"after the run: {left} (ready, in flight) for {n} messages")
                q.purge()
                if run:
                    rates.append(n / seconds)
                    costs.append((c1 - c0) / n * 1e6)
                    client_costs.append(client_cpu / n * 1e6)
            local.delete_queue(QUEUE)
            if args.role == "pingpong":
                local.delete_queue(BACK)
    finally:
        server.close()
        shmq.destroy_namespace(ns)
    what = {"produce": f"put_many of {args.batch} x {args.size} B", "put": f"put of {args.size} B",
            "get": f"get + ack(wait=False) of {args.size} B",
            "pingpong": f"round trips of {args.size} B (msgs/s: round trips/s; CPU a round trip, the clients' both)",
            "consume": f"consume(prefetch={args.prefetch}) + acks of {args.size} B"}[args.role]
    if args.busy_poll_us is not None:
        what += f", client busy_poll_us={args.busy_poll_us}"
    if args.client == "raw" and args.role in ("produce", "put", "get"):
        what += f", {args.window} requests in flight"
    print(f"one connection, {args.client} client, {what}; {args.count} messages, median of {args.runs}; "
          f"server {' '.join(args.server_arg) or '(defaults)'}; CPUs {cpus or 'unpinned'}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"  {statistics.median(rates):>10,.0f} msgs/s  ({min(rates):,.0f} .. {max(rates):,.0f}); "
          f"server CPU {statistics.median(costs):.2f} us/msg, client CPU {statistics.median(client_costs):.2f} us/msg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
