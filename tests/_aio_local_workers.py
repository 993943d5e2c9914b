"""Processes for tests/test_aio_local.py: ``python -m tests._aio_local_workers put NS QUEUE BODY``
puts one message with the blocking local API; ``... hold NS QUEUE N`` takes N deliveries
through the local asyncio client, says "held" on stdout and waits (to be killed)."""

import asyncio
import sys

import shmq
from shmq import aio


async def hold(namespace, queue, n):
    b = await aio.connect(namespace=namespace)
    q = await b.queue(queue)
    held = [await q.get(timeout=30) for _ in range(n)]
    print("held", " ".join(str(d.id) for d in held), flush=True)
    await asyncio.sleep(3600)  # until killed


def main(argv):
    what, namespace, queue, arg = argv
    if what == "put":
        shmq.connect(namespace=namespace).queue(queue).put(arg.encode())
    else:
        asyncio.run(hold(namespace, queue, int(arg)))


if __name__ == "__main__":
    main(sys.argv[1:])
