"""A TCP front (``shmq.server.tcp.TcpServer``, no descriptor budget: what ``shmq server``
fits to its limit is left out) in a process of few descriptors, so that its accepts
fail for EMFILE: ``python -m tests._starved_server NAMESPACE NOFILE LOOP``
prints its port, then serves until its stdin closes (tests/test_server_descriptors.py)."""

import asyncio
import resource
import sys

import shmq
from shmq.logs import configure
from shmq.server import loops
from shmq.server.tcp import TcpServer


def main():
    namespace, nofile, loop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    configure("info")
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    async def serve():
        broker = shmq.connect(namespace=namespace)
        server = TcpServer(broker, port=0)
        await server.start()
        print(server.port, flush=True)
        running = asyncio.get_running_loop()
        done = running.create_future()
        running.add_reader(sys.stdin.fileno(), lambda: done.done() or done.set_result(None))
        await done
        await server.stop()
        broker.close()

    loops.run(serve(), loop)


if __name__ == "__main__":
    main()
