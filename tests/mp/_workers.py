"""Entry points for the processes the tests in tests/mp/ start (fork and spawn); the same
functions serve multiprocessing's queues and shmq.mp's. Importing this stays light."""

import multiprocessing

_pool_queue = None


def echo(q_in, q_out, n):
    """Get ``n`` objects and put each back doubled."""
    for _ in range(n):
        q_out.put(q_in.get(timeout=30) * 2)


def pool_init(q):
    global _pool_queue
    _pool_queue = q


def pool_put_square(x):
    _pool_queue.put(x * x)
    return x


def take_then_finish(jq, n, taken, go):
    """Get ``n`` objects, say so, and mark them done only when told to."""
    for _ in range(n):
        jq.get(timeout=30)
    taken.set()
    go.wait(30)
    for _ in range(n):
        jq.task_done()


def put_big(q, n):
    q.put(b"\x01" * n)
    q.put(bytearray(b"\x02") * n)


def produce(q, tag, n):
    for i in range(n):
        q.put((tag, i), timeout=30)


def consume(jq, out):
    """Move objects from ``jq`` to ``out`` until a None, marking each done."""
    while True:
        item = jq.get(timeout=30)
        if item is not None:
            out.put(item)
        jq.task_done()
        if item is None:
            return


def lease_and_wait(q, conn):
    lease = q.lease(timeout=30)
    conn.send(len(lease.value))
    conn.recv()  # killed here


def create_and_wait(conn):
    """Make queues (one holding an object in a segment of its own) and a fork child that
    blocks on one of them; report the namespaces, the reaper's pid and the child's; wait
    to be killed."""
    from shmq import mp
    from shmq.mp.lifetime import owner

    q, jq, idle = mp.Queue(), mp.JoinableQueue(2), mp.Queue()
    q.put(bytearray(200_000))
    jq.put("x")
    child = multiprocessing.get_context("fork").Process(target=idle.get, daemon=True)
    child.start()
    conn.send(([q._ns, jq._ns, idle._ns], owner.reaper_pid(), child.pid))
    conn.recv()


def relay_last(q, conn):
    q.get(timeout=30)
    conn.send(q.get(timeout=30))


def create_and_exit(conn):
    """Make a queue, start a spawn child that reads it, and return at once: the queue
    must outlive this process's main code until the child is done."""
    from shmq import mp
    from shmq.mp.lifetime import owner

    q = mp.Queue()
    q.put(bytearray(200_000))
    q.put("hello")
    multiprocessing.get_context("spawn").Process(target=relay_last, args=(q, conn)).start()
    conn.send((q._ns, owner.reaper_pid()))


def create_kill_reaper_create(conn):
    """Make a queue, kill the reaper, make another (a new reaper must take both); wait
    to be killed."""
    import os
    import signal

    from shmq import mp
    from shmq.mp.lifetime import owner

    first = mp.Queue()
    os.kill(owner.reaper_pid(), signal.SIGKILL)
    owner._proc.wait()
    second = mp.Queue()
    conn.send(([first._ns, second._ns], owner.reaper_pid()))
    conn.recv()
