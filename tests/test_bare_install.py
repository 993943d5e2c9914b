"""The README's first command with no extra installed: ``pip install .`` then ``shmq
server``. The suite's venv has every extra, so these tests hide them: a
``sitecustomize`` on the path makes every module of a distribution that only an extra
brings (kio, crc32c, the codecs, Celery, Dramatiq, pyspark, numpy...) fail to import, as
on a bare install. (``.ci/run`` also runs the command itself in a bare virtualenv:
``.ci/bare``.)"""

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.test_server_tcp import ServerProcess

_BLOCKER = """\
import importlib.abc, os, sys

_HIDDEN = set(os.environ["SHMQ_TEST_HIDDEN"].split(","))


class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hide())
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_only_modules() -> set[str]:
    """The top-level modules of the distributions that shmq's extras name and its core
    dependencies do not."""
    reqs = importlib.metadata.distribution("shmq").requires or []
    core, extra = set(), set()
    for r in reqs:
        name = _norm(re.match(r"[A-Za-z0-9_.\-]+", r).group(0))
        (extra if "extra ==" in r else core).add(name)
    hidden = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        if any(_norm(d) in extra - core for d in dists) and not module.startswith("_"):
            hidden.add(module)
    return hidden


@pytest.fixture
def bare_env(tmp_path):
    """The environment of a process that sees only shmq's core dependencies."""
    site = tmp_path / "bare-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCKER)
    hidden = extras_only_modules()
    assert {"kio", "crc32c", "lz4", "snappy", "zstandard", "celery", "dramatiq", "pyspark"} <= hidden
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.getcwd()}", "SHMQ_TEST_HIDDEN": ",".join(sorted(hidden))}


def _cli(env, *args, timeout=30):
    return subprocess.run([sys.executable, "-m", "shmq.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_the_hidden_extras_are_hidden(bare_env):
    r = subprocess.run([sys.executable, "-c", "import kio"], capture_output=True, text=True, env=bare_env, timeout=30)
    assert r.returncode == 1 and "No module named 'kio'" in r.stderr


def test_a_bare_install_serves_queues_tcp_persistence_metrics_and_transactions(namespace, servers, tmp_path,
                                                                               bare_env):
    data = tmp_path / "data"
    srv = servers(namespace, "--data-dir", str(data), "--metrics", "127.0.0.1:0", env=bare_env)
    metrics_port = int(next(x for x in srv.log if "metrics on http" in x).split("/metrics")[0].rsplit(":", 1)[1])
    ns = ["--namespace", namespace]
    assert _cli(bare_env, "create", "orders", *ns).returncode == 0
    r = _cli(bare_env, "produce", "orders", "-m", "local one", *ns)
    assert r.returncode == 0, r.stderr
    r = _cli(bare_env, "produce", "orders", "-m", "tcp one", "--url", srv.url, *ns)
    assert r.returncode == 0, r.stderr
    r = _cli(bare_env, "consume", "orders", "-n", "1", "--url", srv.url, *ns)
    assert (r.returncode, r.stdout) == (0, "local one\n"), r.stderr
    r = _cli(bare_env, "consume", "orders", "-n", "1", *ns)
    assert (r.returncode, r.stdout) == (0, "tcp one\n"), r.stderr
    # a native transaction (the coordinator shares Kafka's codes and markers, not its codec)
    script = f"""
import shmq
with shmq.connect({srv.url!r}) as b:
    b.create_stream("ev", partitions=1)
    p = b.transactional("etl-1")
    with p.transaction():
        p.append("ev", b"x", key=b"k")
    print([r.value for r in b.stream("ev").read(0, 0, 10)])
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=bare_env, timeout=60)
    assert (r.returncode, r.stdout) == (0, "[b'x']\n"), r.stderr
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        scraped = resp.read().decode()
    assert re.search(r'^shmq_queue_enqueued_total\{[^}]*queue="orders"[^}]*\} 2\.0$', scraped, re.M), scraped[:2000]
    _cli(bare_env, "produce", "orders", "-m", "kept", *ns)
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0
    assert (data / "orders.dmsq").exists()


def test_a_kafka_port_without_the_kafka_extra_is_one_line_and_exit_2(namespace, bare_env):
    r = _cli(bare_env, "server", "--namespace", namespace, "--port", "0", "--no-persist", "--kafka-port", "0")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "pip install 'shmq[kafka]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
