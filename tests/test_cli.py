"""The ``shmq`` command line end to end, through real subprocesses."""

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from shmq.engine.queues.delivery import QueueStats
from tests._processes import run_module
from tests.test_server_tcp import ServerProcess


def shmq_cli(*args, stdin=None, env=None):
    """``python -m shmq.cli *args``, finished (``subprocess.run``'s result): a fork of the
    suite's process server running the command line's ``__main__`` (tests._processes), or a
    new interpreter where ``env`` changes what one reads at its start."""
    return run_module("shmq.cli", args, stdin=stdin, timeout=60,
                      env={**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})})


@pytest.fixture(params=["local", "tcp"])
def target(request, broker):
    """CLI arguments that select the transport."""
    if request.param == "local":
        yield ["--namespace", broker.namespace]
        return
    srv = ServerProcess(broker.namespace)
    yield ["--url", srv.url]
    assert srv.stop() == 0


def test_quick_start(target):
    assert shmq_cli("create", "orders", *target).stdout == "created orders\n"
    r = shmq_cli("produce", "orders", "-m", "order #42", *target)
    assert r.returncode == 0 and "produced 1 message(s)" in r.stdout
    r = shmq_cli("consume", "orders", *target)
    assert (r.returncode, r.stdout) == (0, "order #42\n")
    r = shmq_cli("consume", "orders", *target)
    assert (r.returncode, r.stdout) == (3, "")  # acked: gone, and exit code 3 says the queue was empty


def test_json_output(target):
    shmq_cli("create", "q", "--max-bytes", "1048576", *target)
    r = shmq_cli("produce", "q", "--header", "k=v", "--json", *target, stdin="one\ntwo\n")
    assert json.loads(r.stdout) == {"queue": "q", "ids": [1, 2]}
    stats = json.loads(shmq_cli("stats", "q", "--json", *target).stdout)
    assert stats["queues"]["q"]["ready"] == 2 and stats["queues"]["q"]["max_bytes"] == 1048576
    assert stats["streams"] == {}
    assert json.loads(shmq_cli("list", "--json", *target).stdout) == ["q"]
    lines = shmq_cli("consume", "q", "-n", "5", "--json", *target).stdout.splitlines()
    got = [json.loads(line) for line in lines]
    assert [(m["id"], m["body"], m["headers"], m["attempt"]) for m in got] == [(1, "one", {"k": "v"}, 1),
                                                                               (2, "two", {"k": "v"}, 1)]


def test_stats_human_units_natural_order_and_the_dlq_next_to_its_source(target, broker):
    broker.create_queue("dead")
    for name in ("q10", "q2"):
        broker.create_queue(name, max_bytes=2**20)
    q1 = broker.create_queue("q1", dead_letter_queue="dead", visibility_timeout=300)
    q1.put_many([b"x" * 3000] * 4)
    for d in q1.get_many(3):
        d.reject()
    r = shmq_cli("stats", *target)
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0])  # cells are 2 spaces apart at least; "64 MiB" is one
    rows = {}
    for line in lines[1:lines.index("")] if "" in lines else lines[1:]:
        cells = re.split(r"\s{2,}", line)
        rows[cells[0]] = dict(zip(header, cells))
    assert header == ["queue", "ready", "in flight", "delayed", "oldest", "dlq", "used", "memory", "max", "put",
                      "acked", "redelivered", "dead-lettered"]
    assert list(rows) == ["q1", "└ dead", "q2", "q10"]  # natural order; the DLQ under its source (both transports)
    assert (rows["q1"]["dlq"], rows["q2"]["dlq"]) == ("3", "-")
    dead = rows["└ dead"]
    assert (dead["ready"], rows["q1"]["ready"], rows["q1"]["dead-lettered"]) == ("3", "1", "3")
    assert re.fullmatch(r"\d+(\.\d)? KiB", rows["q1"]["used"]) and re.fullmatch(r"\d+(\.\d)? KiB", dead["used"])
    assert (rows["q2"]["used"], rows["q2"]["max"], rows["q1"]["max"]) == ("0 B", "1 MiB", "64 MiB")
    # what each holds of /dev/shm: its header (128 KiB), and for q1 the ring's first chunk (64 KiB) beside it,
    # and the chunk its puts claimed ahead until a housekeeping round gives it back (a loaded machine's stats
    # may come before that round)
    assert (rows["q2"]["memory"], rows["q10"]["memory"]) == ("128 KiB", "128 KiB")
    assert rows["q1"]["memory"] in ("192 KiB", "256 KiB"), rows["q1"]
    assert re.fullmatch(r"\d+(\.\d)?(µs|ms|s)", rows["q1"]["oldest"]) and rows["q2"]["oldest"] == "-"
    assert max(len(line) for line in lines) < 120  # 165 columns before, for these names
    as_json = json.loads(shmq_cli("stats", "--json", *target).stdout)  # unchanged for scripts
    assert sorted(as_json) == ["queues", "streams"] and sorted(as_json["queues"]) == ["dead", "q1", "q10", "q2"]
    assert sorted(as_json["queues"]["q1"]) == sorted(f.name for f in dataclasses.fields(QueueStats))
    assert (as_json["queues"]["q1"]["bytes_used"], as_json["queues"]["q1"]["dead_lettered_total"]) == (
        broker.queue("q1").stats().bytes_used, 3)


def test_requeue_and_no_ack(target, broker):
    shmq_cli("create", "q", "--visibility-timeout", "300", *target)
    shmq_cli("produce", "q", "-m", "again", *target)
    assert shmq_cli("consume", "q", "--requeue", "--json", *target).returncode == 0
    first = json.loads(shmq_cli("consume", "q", "--no-ack", "--json", *target).stdout)
    assert first["attempt"] == 2
    # --no-ack left it leased to a process that has exited: it comes back promptly
    r = shmq_cli("consume", "q", "--wait", "10", "--json", *target)
    assert json.loads(r.stdout)["attempt"] == 3
    assert broker.queue("q").stats().acked_total == 1


def test_file_purge_delete(target, tmp_path):
    shmq_cli("create", "q", *target)
    (tmp_path / "payload.bin").write_bytes(b"\x00\x01binary")
    assert shmq_cli("produce", "q", "--file", str(tmp_path / "payload.bin"), *target).returncode == 0
    shmq_cli("produce", "q", "-m", "a", "-m", "b", *target)
    assert shmq_cli("purge", "q", *target).stdout == "purged 3 message(s) from q\n"
    assert shmq_cli("delete", "q", *target).stdout == "deleted q\n"
    assert shmq_cli("list", *target).stdout == ""


@pytest.mark.parametrize("args,message", [
    (["consume", "missing"], "shmq: error: no queue 'missing'"),
    (["delete", "missing"], "shmq: error: no queue 'missing'"),
    (["create", "bad/name"], "shmq: error: invalid queue name"),
    (["produce", "missing", "-m", "x"], "shmq: error: no queue 'missing'"),
])
def test_errors_are_one_line_without_traceback(target, args, message):
    r = shmq_cli(*args, *target)
    assert r.returncode == 1
    assert r.stderr.startswith(message)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_existing_queue_and_unreachable_broker(broker):
    shmq_cli("create", "q", "--namespace", broker.namespace)
    r = shmq_cli("create", "q", "--namespace", broker.namespace)
    assert r.returncode == 1 and r.stderr.startswith("shmq: error: queue 'q' already exists")
    r = shmq_cli("list", "--url", "tcp://127.0.0.1:1")
    assert r.returncode == 1 and r.stderr.startswith("shmq: error: cannot connect to 127.0.0.1:1")
    r = shmq_cli("list", env={"SHMQ_URL": "tcp://127.0.0.1:1"})
    assert r.returncode == 1 and "127.0.0.1:1" in r.stderr


def test_bench_command_runs_the_checkouts_harness(tmp_path):
    r = shmq_cli("bench", "--help")
    assert r.returncode == 0 and "--quick" in r.stdout
    outside = subprocess.run([sys.executable, "-m", "shmq.cli", "bench", "--quick"], capture_output=True, text=True,
                             timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert outside.returncode == 1 and outside.stderr.startswith("shmq: error: shmq bench runs the bench/ folder")


def test_the_command_table_names_each_commands_module():
    """app.COMMANDS (a command's module, imported when it runs) is what the modules register."""
    import importlib
    import inspect

    from shmq.cli import app

    for module in set(app.COMMANDS.values()):
        importlib.import_module(f"shmq.cli.{module}")
    registered = {name: inspect.getmodule(cmd.callback).__name__.rsplit(".", 1)[1]
                  for name, cmd in app.main.commands.items()}
    assert registered == app.COMMANDS


def test_the_version_imports_no_command_module():
    r = subprocess.run([sys.executable, "-c", "import sys; from shmq.cli import main\n"
                        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
                        "print(sorted(m for m in sys.modules if m.startswith(('shmq.cli.', 'shmq.engine.broker'))))"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    loaded = r.stdout.strip().splitlines()[-1]
    assert "shmq.engine.broker" not in loaded and "shmq.cli.queues" not in loaded, r.stdout + r.stderr
