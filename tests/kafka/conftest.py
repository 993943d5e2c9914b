"""Fixtures of the Kafka listener's tests: a real ``shmq server --kafka-port 0`` process."""

import re

import pytest


class KafkaServer:
    """A ``shmq server`` process with its Kafka listener (``bootstrap``: host:port)."""

    def __init__(self, proc):
        self.proc = proc
        line = next(x for x in proc.log if "kafka listener on" in x)
        self.port = int(re.search(r"kafka listener on \S+:(\d+)", line).group(1))
        self.bootstrap = f"127.0.0.1:{self.port}"

    def stop(self):
        return self.proc.stop()


@pytest.fixture
def kafka_server(broker, servers):
    """``start(*args)``: a server of the test's namespace with a Kafka listener on a free
    port, no token (``--no-auth``) unless args say otherwise; stopped at the end."""
    started = []

    def start(*args):
        if "--token-file" not in args:
            args = ("--no-auth", *args)
        srv = KafkaServer(servers(broker.namespace, "--no-persist", "--kafka-port", "0", *args))
        started.append(srv)
        return srv

    yield start
    for srv in started:
        assert srv.stop() == 0
