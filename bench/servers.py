"""Servers the adapters start for a run and stop at its end: ``shmq server``, ``redis-server``, ``nats-server``,
``rabbitmq-server``.

Strategy: a server is ready when it says so on its output (no polling of its port); the
line is read with a deadline, the rest of the output is drained by a thread, so a chatty
server never blocks on a full pipe, and its last lines go into the error if it dies.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

START_TIMEOUT = 30.0
RABBIT_START_TIMEOUT = 120.0  # an Erlang node's boot: seconds on a quiet host, over 30 s beside a loaded suite
STOP_TIMEOUT = 30.0


class ServerProcess:
    """A child process, started and read until a line matches ``ready`` (kept as ``self.ready``)."""

    def __init__(self, argv, ready, what, timeout=START_TIMEOUT):
        self.what = what
        self._tail = collections.deque(maxlen=20)
        self._lines = queue.Queue()
        self._started = threading.Event()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, name=f"{what} output", daemon=True)
        self._reader.start()
        try:
            self.ready = self._wait_for(re.compile(ready), timeout)
        except BaseException:
            self.close()
            raise
        self._started.set()

    def _read(self):
        for line in self.proc.stdout:
            self._tail.append(line.rstrip())
            if not self._started.is_set():
                self._lines.put(line)
        self._lines.put(None)

    def _wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{self.what} did not start within {timeout:.0f}s{self.output()}") from None
            if line is None:
                raise RuntimeError(f"{self.what} exited with code {self.proc.wait()}{self.output()}")
            match = pattern.search(line)
            if match:
                return match

    def output(self):
        """The server's last lines, for an error message."""
        return "".join(f"\n  {line}" for line in self._tail)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(STOP_TIMEOUT)


class ShmqServer(ServerProcess):
    """``shmq server --namespace NS --port 0`` (plus ``extra`` options); its URL from its start-up line."""

    def __init__(self, namespace, *extra):
        if "--data-dir" not in extra:  # the run's own namespace: nothing in the user's data directory
            extra = ("--no-persist", *extra)
        argv = [sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0", *extra]
        super().__init__(argv, r"serving namespace \S+ on (\S+):(\d+)", "shmq server")
        self.url = f"tcp://{self.ready.group(1)}:{self.ready.group(2)}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer(ServerProcess):
    """A private ``redis-server`` on a free loopback port, no persistence, in a temporary directory."""

    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir]
        try:
            super().__init__(argv, r"Ready to accept connections", "redis-server")
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def close(self):
        super().close()
        shutil.rmtree(self.dir, ignore_errors=True)


class NatsServer(ServerProcess):
    """A private ``nats-server -js`` on a free loopback port, its JetStream store in a temporary directory."""

    def __init__(self):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-nats-")
        argv = ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.dir]
        try:
            super().__init__(argv, r"Server is ready", "nats-server")
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.url = f"nats://127.0.0.1:{self.port}"

    def close(self):
        super().close()
        shutil.rmtree(self.dir, ignore_errors=True)


RABBITMQ_BIN = "/usr/lib/rabbitmq/bin"  # the Debian package's own scripts: the /usr/sbin wrapper switches user


def rabbitmq_missing():
    """Why a RabbitServer cannot start here, or None."""
    if not os.path.exists(f"{RABBITMQ_BIN}/rabbitmq-server"):
        return "rabbitmq-server not installed (apt-get install rabbitmq-server)"
    return None


class RabbitServer:
    """A private RabbitMQ node on free loopback ports, everything under a temporary directory
    (``rabbitmq-server`` from the system packages, run directly, not as a service); ready once
    ``rabbitmqctl await_startup`` says so, stopped with ``rabbitmqctl stop``."""

    def __init__(self, timeout=RABBIT_START_TIMEOUT):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="bench-rabbit-")
        d = self.dir
        with open(f"{d}/enabled_plugins", "w") as f:
            f.write("[].\n")
        with open(f"{d}/rabbitmq.conf", "w") as f:
            f.write("loopback_users = none\n")
        self.env = dict(
            os.environ, HOME=d, RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_DIST_PORT=str(free_port()), RABBITMQ_MNESIA_BASE=f"{d}/mnesia", RABBITMQ_LOG_BASE=f"{d}/log",
            RABBITMQ_NODENAME=f"bench{self.port}@localhost", RABBITMQ_ENABLED_PLUGINS_FILE=f"{d}/enabled_plugins",
            RABBITMQ_CONFIG_FILE=f"{d}/rabbitmq", RABBITMQ_PID_FILE=f"{d}/rabbit.pid",
            ERL_EPMD_PORT=str(free_port()))
        self._log = open(f"{d}/server.out", "w")
        self.proc = subprocess.Popen([f"{RABBITMQ_BIN}/rabbitmq-server"], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:  # await_startup fails at once while the node has not registered yet
                try:  # (else it waits for the boot: for what is left of the bound)
                    self._ctl("await_startup", timeout=max(1.0, deadline - time.monotonic()))
                    break
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"rabbitmq-server did not start within {timeout:g}s: {e}") from None
                    time.sleep(0.5)
        except BaseException:
            self.close()
            raise

    def _ctl(self, *args, timeout=STOP_TIMEOUT):
        r = subprocess.run([f"{RABBITMQ_BIN}/rabbitmqctl", "-n", self.env["RABBITMQ_NODENAME"], *args],
                           env=self.env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            tail = open(f"{self.dir}/server.out").read()[-2000:]
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {r.stderr.strip()[-500:]}\n{tail}")

    def close(self):
        if self.proc.poll() is None:
            try:
                self._ctl("stop")
            except Exception:
                pass
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._kill_epmd()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_epmd(self):
        """The node started an ``epmd -daemon`` on its own port (ERL_EPMD_PORT): ours to stop, by pid."""
        import psutil
        for p in psutil.process_iter(["name"]):
            try:
                if p.info["name"] == "epmd" and p.environ().get("ERL_EPMD_PORT") == self.env["ERL_EPMD_PORT"]:
                    p.kill()
            except psutil.Error:
                pass
