"""Entry points for the work-queue option tests' processes (spawn)."""

import os
import signal
import time

import shmq


def group_consumer(ns, qname, out_path, done_event):
    """Take, record (group, seq, when taken, when about to ack), ack; until the queue is
    empty after ``done_event``."""
    with shmq.connect(namespace=ns) as b, open(out_path, "w") as out:
        q = b.queue(qname)
        while True:
            try:
                d = q.get(timeout=0.2)
            except shmq.QueueEmpty:
                if done_event.is_set() and q.stats().ready == 0 and q.stats().in_flight == 0:
                    return
                continue
            took = time.monotonic_ns()
            group, seq = d.body.decode().split(":")
            assert d.group == group
            out.write(f"{group} {seq} {took} {time.monotonic_ns()}\n")
            out.flush()
            d.ack()


def group_producer(ns, qname, groups, per_group):
    """Put ``per_group`` messages into each group, interleaved: body ``group:seq``."""
    with shmq.connect(namespace=ns) as b:
        q = b.queue(qname)
        for seq in range(per_group):
            for g in groups:
                q.put(f"{g}:{seq}".encode(), group=g, timeout=30)


def die_inside_dedup_put(ns, qname, dedup_id):
    """Put with a dedup id, and die (SIGKILL) after the id is remembered, before the
    put's commit: the lock is held by a dead process."""
    from shmq.engine.shm import dedup

    remember = dedup.remember

    def remember_then_die(*args):
        remember(*args)
        os.kill(os.getpid(), signal.SIGKILL)

    dedup.remember = remember_then_die
    with shmq.connect(namespace=ns) as b:
        b.queue(qname).put(b"x", dedup_id=dedup_id)


def dedup_putter(ns, qname, ids, log_path):
    """Put one message per dedup id, logging each id once its put returned."""
    with shmq.connect(namespace=ns) as b, open(log_path, "a") as log:
        q = b.queue(qname)
        for i in ids:
            q.put(i.encode(), dedup_id=i, timeout=30)
            log.write(i + "\n")
            log.flush()


def redrive_and_die(ns, dlq, after):
    """Redrive, dying (SIGKILL) after ``after`` messages were put back and before the
    next one's ack from the dead-letter queue."""
    from shmq.engine.queues import delivery

    ack = delivery.Delivery.ack
    done = [0]

    def ack_or_die(self, wait=True):
        if done[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        done[0] += 1
        return ack(self, wait)

    delivery.Delivery.ack = ack_or_die
    with shmq.connect(namespace=ns) as b:
        b.redrive(dlq)
