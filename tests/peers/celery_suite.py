"""Celery's own integration tests (``t/integration/test_tasks.py``, ``test_canvas.py``)
with shmq as the broker, Redis beside it as the baseline: not a pytest module of shmq's
(it needs Celery's sdist), a script a person runs.

    python -m tests.peers.celery_suite [--target shmq-local|shmq-tcp|redis|all] [--jobs 3]
                                       [--backend redis|shmq|URL] [--worker thread|process]
                                       [--shmq REV|DIR] [--src DIR] [--out FILE]

Celery's ``t/`` comes from its sdist at the installed version (pip download into
``--src``, default ~/.cache/shmq-peers; or ``--src`` a Celery source tree), and runs as
Celery runs it: ``pytest -p celery.contrib.pytest`` with the broker and the result
backend in ``TEST_BROKER`` / ``TEST_BACKEND``, Celery's pytest settings (``python_classes =
test_*``, ``xfail_strict``), each file in a run of its own. The suite imports pydantic
(``t/integration/tasks.py``): where this venv lacks it, it is pip-installed into
~/.cache/shmq-peers/deps, put on the suite's PYTHONPATH only.

The worker. The suite's conftest asks ``celery_session_worker`` for ``pool='prefork'``:
``celery.contrib.testing.worker.start_worker`` builds a WorkController (concurrency 1; no
heartbeat, mingle or gossip) and runs it in a thread of the pytest process, whose prefork
pool forks its one child from that process (``--worker thread``, the default: the suite
as upstream runs it). ``--worker process`` sets ``NO_WORKER=1`` (the suite then starts
none) and runs a real ``celery worker -P prefork`` process of its own with the session
app's settings (``peer_worker.py``, written beside the suite; ``--concurrency``, default 1
as the suite's), and loads ``peer_noworker.py`` before Celery's plugin: under NO_WORKER its
``celery_session_worker`` yields nothing, which pytest 8.4+ turns into an error. Fourteen
tests (eleven of test_tasks.py, three stamping ones of test_canvas.py) read the worker's
state or signals in their own process (``worker_state``, ``task_received`` receivers) and
fail with any broker that way: compare with Redis run the same way. pytest-rerunfailures is not used: ``@flaky`` tests run once.

Targets, each on brokers of its own: ``shmq-local`` (``shmq:///NS``, a fresh namespace),
``shmq-tcp`` (a ``shmq server`` on a free port with a token), ``redis``. A
``redis-server`` on a free port serves every target as the result backend
(``--backend redis``, db 0, also the suite's ``REDIS_HOST``/``REDIS_PORT``). ``--backend
shmq``: the result backend is the target's shmq url (a fresh namespace's on the redis
target), with ``shmq.celery`` imported (it registers the scheme; ``--import`` names
another module); any other value is a url, ``{shmq}`` and ``{redis}`` in it replaced.

Each test has ``--deadline`` seconds (default 300, what the suite's ``@flaky`` gives its
tests through pytest-timeout's mark; less where its own ``@pytest.mark.timeout`` says less;
``test_disabling_flag_allow_error_cb_on_chord_header`` waits about 220 s by design): a
hung test fails, and a hard hang ends its pytest, whose remaining tests run in a new one.
The suite mostly waits (about 18 minutes a target here, 2 cores): ``--jobs 3`` runs the
targets side by side, each on brokers of its own. ``--shmq HEAD`` tests a commit (exported
and built in the work directory) whatever the work tree holds. Prints the counts and each
failure; ``--out`` writes every test's outcome and traceback as JSON.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid

from . import pysuites

TARGETS = ("shmq-local", "shmq-tcp", "redis")
FILES = ("test_tasks.py", "test_canvas.py")

WORKER_APP = '''"""Written by tests/peers/celery_suite.py (shmq): the suite's session app, for a
``celery worker`` process of its own (the suite runs with NO_WORKER=1)."""

import importlib
import os

for name in filter(None, os.environ.get("PEER_IMPORTS", "").split(",")):
    importlib.import_module(name)

from celery import Celery  # noqa: E402
from celery.contrib.testing.app import DEFAULT_TEST_CONFIG  # noqa: E402

import celery.contrib.testing.tasks  # noqa: E402,F401 - celery.ping
import t.integration.tasks  # noqa: E402,F401
from t.integration.tasks import ClassBasedAutoRetryTask  # noqa: E402

app = Celery("celery.tests", set_as_current=True)
# conftest.py's celery_config over celery.contrib.testing's defaults
app.conf.update(dict(DEFAULT_TEST_CONFIG, broker_url=os.environ["TEST_BROKER"],
                     result_backend=os.environ["TEST_BACKEND"], result_extended=True,
                     task_create_missing_queues=False))
app.register_task(ClassBasedAutoRetryTask)  # (conftest.py's celery_class_tasks)
'''

NO_WORKER_PLUGIN = '''"""Written by tests/peers/celery_suite.py (shmq), loaded before celery.contrib.pytest
with NO_WORKER=1: its celery_session_worker then yields nothing, which pytest 8.4+ refuses
("did not yield a value"); this one yields None, the worker being a process of its own."""

import pytest

import celery.contrib.pytest


@pytest.fixture(scope="session")
def celery_session_worker(celery_session_app):
    yield None


celery.contrib.pytest.celery_session_worker = celery_session_worker  # (what conftest.py imports)
'''


class Worker:
    """``celery -A peer_worker worker -P prefork`` in ``root``, in a process group of its own."""

    def __init__(self, root: str, env: dict, concurrency: int, log_path: str):
        self.log_path = log_path
        self.log = open(log_path, "w+")  # noqa: SIM115 - closed by stop()
        name = f"peer{uuid.uuid4().hex[:6]}@%h"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "peer_worker", "worker", "-P", "prefork", "-c", str(concurrency),
             "-l", "info", "-n", name, "--without-heartbeat", "--without-mingle", "--without-gossip"],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if re.search(r"@\S+ ready\.", pysuites.read_text(log_path)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the worker did not start: {pysuites.read_text(log_path)[-3000:]}")

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # a warm shutdown
            self.proc.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
        pysuites._killpg(self.proc)
        self.log.close()


def _backend(spec: str, redis_url: str, shmq_url) -> str:
    if spec == "redis":
        return redis_url
    if spec == "shmq":
        return shmq_url()
    return spec.replace("{redis}", redis_url).replace("{shmq}", shmq_url() if "{shmq}" in spec else "")


def run(target: str, a, root: str, workdir: str) -> dict:
    redis = pysuites.Redis(workdir)
    shmqs = []

    def shmq_url(tcp=False):
        shmqs.append(pysuites.Shmq(workdir, tcp=tcp, prefix="celery"))
        return shmqs[-1].url()

    worker = None
    try:
        broker = redis.url(0) if target == "redis" else shmq_url(tcp=target == "shmq-tcp")
        if a.backend == "shmq" and target != "redis":
            backend = broker  # the same broker's url, as a result backend
        else:
            backend = _backend(a.backend, redis.url(0), shmq_url)
        imports = (["shmq.kombu"] if broker.startswith("shmq") else []) + list(a.imports or [])
        if re.match(r"^([\w.:]+\+)?shmqs?://", backend) and not a.imports:
            if subprocess.run([sys.executable, "-c", "import shmq.celery"], capture_output=True,
                              check=False).returncode:
                raise SystemExit("this shmq has no shmq.celery (the result backend): give --import MODULE")
            imports.append("shmq.celery")
        env = {**os.environ, "TEST_BROKER": broker, "TEST_BACKEND": backend, "REDIS_HOST": "127.0.0.1",
               "REDIS_PORT": str(redis.port), "PEER_IMPORTS": ",".join(dict.fromkeys(imports))}
        if a.worker == "process":
            env["NO_WORKER"] = "1"
            worker = Worker(root, env, a.concurrency, os.path.join(workdir, f"{target}-worker.log"))
        out = {"broker": _hide(broker, shmqs), "backend": _hide(backend, shmqs), "worker": a.worker, "tests": {},
               "files": {}}
        for name in a.files:
            options = (["-p", "peer_noworker"] if worker else []) + ["-p", "celery.contrib.pytest"]
            options += ["-k", a.k] if a.k else []
            result = pysuites.run_pytest(root, [f"t/integration/{name}"], options, env, a.deadline,
                                         os.path.join(workdir, f"{target}.log"))
            out["tests"].update(result["tests"])
            out["files"][name] = {"seconds": result["seconds"], "counts": pysuites.counts(result["tests"])}
        out["seconds"] = round(sum(f["seconds"] for f in out["files"].values()), 1)
        return out
    finally:
        if worker is not None:
            worker.stop()
        for s in shmqs:
            s.stop()
        redis.stop()


def _hide(url: str, shmqs) -> str:
    for s in shmqs:
        if getattr(s, "token", None):
            url = url.replace(s.token, "TOKEN")
    return url


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="all", help=f"{', '.join(TARGETS)}, several with commas, or all")
    ap.add_argument("--jobs", type=int, default=1, help="targets run side by side (default 1)")
    ap.add_argument("--backend", default="redis", help="redis (default), shmq, or a url with {shmq} / {redis}")
    ap.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                    help="import this module first, in the tests and the worker (repeatable)")
    ap.add_argument("--worker", default="thread", choices=("thread", "process"))
    ap.add_argument("--concurrency", type=int, default=1, help="--worker process: its pool's size (default 1)")
    ap.add_argument("--files", default=",".join(FILES), help=f"files of t/integration (default {','.join(FILES)})")
    ap.add_argument("--src", default=None, help="where Celery's sdist is (or goes), or a Celery source tree")
    ap.add_argument("--shmq", default=None, metavar="REV|DIR",
                    help="test this git revision (exported, extension built) or source tree, not the installed shmq")
    ap.add_argument("--deadline", type=float, default=300,
                    help="seconds per test (default 300, the suite's own for its @flaky tests)")
    ap.add_argument("-k", default=None, help="pytest's -k")
    ap.add_argument("--out", default=None, help="write the outcomes and tracebacks here (JSON)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, worker log)")
    a = ap.parse_args(argv)
    a.files = [f.strip() for f in a.files.split(",") if f.strip()]
    targets = pysuites.targets_of(a.target, TARGETS)
    workdir = tempfile.mkdtemp(prefix="celery-suite-")
    root = pysuites.sdist_tests("celery", a.src, workdir)
    pysuites.write_ini(root, ["python_classes = test_*", "xfail_strict = true", "markers =", "    flaky",
                              "    timeout", "    amqp"])
    for name, text in (("peer_worker.py", WORKER_APP), ("peer_noworker.py", NO_WORKER_PLUGIN)):
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    shmq_dir, revision = pysuites.shmq_source(a.shmq, workdir)
    deps = pysuites.ensure_modules({"pydantic": "pydantic"})
    os.environ.update(pysuites.with_path(dict(os.environ), shmq_dir, deps))
    from importlib.metadata import version

    out = {"celery": version("celery"), "kombu": version("kombu"), "shmq": revision, "worker": a.worker,
           "backend": a.backend, "started": time.strftime("%Y-%m-%d %H:%M"), "targets": {}}
    print(f"celery {out['celery']} integration suite ({', '.join(a.files)}), shmq {revision}, "
          f"{a.worker} worker, backend {a.backend}; work dir {workdir}", flush=True)

    def done(target, result):
        out["targets"][target] = result
        pysuites.report(f"{target} (broker {result['broker']}, backend {result['backend']})", result)
        for name, f in result["files"].items():
            print(f"    {name}: " + " ".join(f"{k}={v}" for k, v in f["counts"].items()) +
                  f" ({f['seconds']:.0f} s)", flush=True)
        if a.out:
            pysuites.write_out(a.out, out)

    return pysuites.run_and_close(
        targets, a.jobs, lambda t: run(t, a, root, workdir), done, a.out, out, a.keep, workdir)


if __name__ == "__main__":
    sys.exit(main())
