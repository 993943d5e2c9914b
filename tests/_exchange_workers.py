"""Entry points for the processes that the exchange and request/reply tests start (spawn)."""

import shmq


def publisher(ns, exchange, tag, count):
    """Publish ``count`` messages ``tag:i`` to ``exchange``."""
    with shmq.connect(namespace=ns) as b:
        for i in range(count):
            b.publish(exchange, f"{tag}:{i}".encode(), routing_key="k")


def publish_once(ns, exchange, body, dedup_id):
    """One publish; the test kills it while it waits for room in a full target."""
    with shmq.connect(namespace=ns) as b:
        b.publish(exchange, body, dedup_id=dedup_id)


def worker(url_or_ns, queue, count):
    """Answer ``count`` requests of ``queue`` with the body upper-cased and its header ``n``."""
    b = shmq.connect(url_or_ns) if url_or_ns.startswith("tcp://") else shmq.connect(namespace=url_or_ns)
    with b:
        q = b.queue(queue)
        for _ in range(count):
            d = q.get(timeout=30)
            d.reply(d.body.upper(), {"n": d.headers.get("n", 0)})
            d.ack()


def requester(url_or_ns, queue):
    """A request nobody answers: the test kills it while it waits."""
    b = shmq.connect(url_or_ns) if url_or_ns.startswith("tcp://") else shmq.connect(namespace=url_or_ns)
    with b:
        b.request(queue, b"never answered", timeout=None)
