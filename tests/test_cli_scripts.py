"""A command line that fits scripts (issue 14), end to end through real processes:
consume -n/--wait/--follow, produce streaming standard input, NUL-separated and raw
bodies, the exit codes, sizes with units, ``python -m shmq``, ``shmq namespace
list|destroy``, and a namespace that does not exist."""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid

import click
import pytest

import shmq
from shmq.auth import default_data_dir
from shmq.cli import app
from shmq.engine.shm.segment import namespace_entries
from tests._wait import drain, wait_for
from tests.test_cli import shmq_cli, target  # noqa: F401  (the fixture: local and tcp)
from tests.test_server_tcp import ServerProcess



def env(**more):
    """The environment of a CLI process: this one's as it is now (the suite's $SHMQ_HOME)."""
    return {**os.environ, "PYTHONPATH": os.getcwd(), **more}


def cli_process(*args):
    """``shmq ARGS`` running, its stdin and stdout pipes (bytes)."""
    return subprocess.Popen([sys.executable, "-m", "shmq.cli", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())


class Lines:
    """The lines a process writes to its stdout, read by a thread, taken with a bound."""

    def __init__(self, proc):
        self._lines = queue.Queue()
        self._thread = threading.Thread(target=lambda: [self._lines.put(x) for x in iter(proc.stdout.readline, b"")],
                                        daemon=True)
        self._thread.start()

    def next(self, timeout=10.0) -> bytes:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s") from None


def one_line_error(r, code, start):
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.startswith(start), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# ---------------------------------------------------------------- consume
def test_consume_takes_up_to_n_within_the_wait(target, broker):
    q = broker.create_queue("q")
    proc = cli_process("consume", "q", "-n", "3", "--wait", "60", *target)
    lines = Lines(proc)
    q.put(b"one")
    assert lines.next() == b"one\n"
    q.put_many([b"two", b"three"])  # it did not return after the first: it waits for -n in all
    assert (lines.next(), lines.next()) == (b"two\n", b"three\n")
    assert proc.wait(30) == 0 and proc.stderr.read() == b""
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)


def test_consume_returns_what_it_got_when_the_wait_ends_and_3_when_nothing(target, broker):
    broker.create_queue("q").put_many([b"a", b"b"])
    r = shmq_cli("consume", "q", "-n", "5", "--wait", "0.2", *target)
    assert (r.returncode, r.stdout, r.stderr) == (0, "a\nb\n", "")
    r = shmq_cli("consume", "q", "--wait", "0.2", *target)
    assert (r.returncode, r.stdout, r.stderr) == (app.EXIT_EMPTY, "", "")  # empty queue: 3
    assert shmq_cli("produce", "q", "-m", "", *target).returncode == 0
    r = shmq_cli("consume", "q", *target)
    assert (r.returncode, r.stdout) == (0, "\n")  # an empty message: 0 and its line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_follow_consumes_until_a_signal_and_loses_nothing(target, broker, sig):
    q = broker.create_queue("q")
    proc = cli_process("consume", "q", "--follow", *target)
    lines = Lines(proc)
    q.put(b"m1")
    assert lines.next() == b"m1\n"
    q.put_many([b"m2", b"m3"])
    assert (lines.next(), lines.next()) == (b"m2\n", b"m3\n")
    wait_for(lambda: q.stats().acked_total == 3, what="the three acked")
    proc.send_signal(sig)
    assert proc.wait(30) == 0
    assert proc.stderr.read() == b""
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 3)  # nothing leased, nothing lost


def test_a_closed_stdout_acks_nothing(broker):
    q = broker.create_queue("q", visibility_timeout=300)
    q.put_many([b"x", b"y"])
    r, w = os.pipe()
    os.close(r)  # no reader: the first write fails
    try:
        proc = subprocess.run([sys.executable, "-m", "shmq.cli", "consume", "q", "-n", "2", "--namespace",
                               broker.namespace], stdout=w, stderr=subprocess.PIPE, text=True, env=env(), timeout=60)
    finally:
        os.close(w)
    one_line_error(proc, 1, "shmq: error: standard output was closed: the last 2 message(s) taken were put back")
    s = q.stats()
    assert (s.ready, s.in_flight, s.acked_total) == (2, 0, 0)  # put back at once, not acked
    assert drain(q) == [b"x", b"y"]


@pytest.mark.parametrize("args, message", [
    (["--follow", "-n", "2"], "--follow takes neither -n nor --wait"),
    (["--follow", "--wait", "1"], "--follow takes neither -n nor --wait"),
    (["--follow", "--requeue"], "--requeue with --follow"),
    (["--raw", "-n", "2"], "--raw writes one body as it is: use -0"),
    (["--json", "-0"], "--json is a format of its own"),
])
def test_consume_option_clashes_are_usage_errors(broker, args, message):
    broker.create_queue("q").put(b"x")
    r = shmq_cli("consume", "q", *args, "--namespace", broker.namespace)
    one_line_error(r, 2, f"shmq: error: {message}")
    assert broker.queue("q").stats().ready == 1


# ---------------------------------------------------------------- produce
def test_produce_puts_each_line_as_it_arrives(target, broker):
    q = broker.create_queue("q")
    proc = cli_process("produce", "q", *target)
    proc.stdin.write(b"first\n")
    proc.stdin.flush()
    wait_for(lambda: q.stats().ready == 1, what="the first line put before EOF")
    proc.stdin.write(b"second\nthird")  # the last line has no newline
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert (proc.stdout.read(), proc.stderr.read()) == (b"produced 3 message(s) to q: ids 1..3\n", b"")
    assert drain(q) == [b"first", b"second", b"third"]


def test_produce_into_a_small_queue_waits_for_room(target, broker):
    q = broker.create_queue("small", max_bytes=4096)
    bodies = [f"{i:04d}".encode() * 15 for i in range(200)]  # 12 KB of bodies: three times the ring
    proc = cli_process("produce", "small", *target)
    feeder = threading.Thread(target=lambda: (proc.stdin.write(b"\n".join(bodies) + b"\n"), proc.stdin.close()))
    feeder.start()
    got = []
    wait_for(lambda: got.extend(drain(q)) or len(got) >= 200 or proc.poll() is not None, timeout=60,
             what="200 messages through a 4 KiB queue")
    feeder.join(10)
    assert proc.wait(30) == 0, proc.stderr.read()
    assert proc.stdout.read() == b"produced 200 message(s) to small: ids 1..200\n"
    assert got + drain(q) == bodies


def test_produce_names_the_message_too_large_and_what_was_put(target, broker):
    q = broker.create_queue("q", max_message_bytes=100)
    r = shmq_cli("produce", "q", *target, stdin="a\nb\n" + "x" * 200 + "\nc\n")
    one_line_error(r, 1, "shmq: error: message 3 not put: message body is 200 bytes; queue 'q' takes at most 100 "
                         "(2 message(s) before it were put)")
    assert drain(q) == [b"a", b"b"]


def test_produce_stops_on_a_signal_and_puts_what_it_read(broker):
    q = broker.create_queue("q")
    proc = cli_process("produce", "q", "--json", "--namespace", broker.namespace)
    proc.stdin.write(b"one\ntw")
    proc.stdin.flush()
    wait_for(lambda: q.stats().ready == 1, what="the first line put")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert json.loads(proc.stdout.read()) == {"queue": "q", "ids": [1]}
    assert proc.stderr.read() == (b"shmq: warning: stopped: the last 2 byte(s) read had no terminator yet and were "
                                  b"not put\n")
    proc.stdin.close()
    assert drain(q) == [b"one"]


def test_nul_separated_and_raw_bodies_round_trip(broker):
    q = broker.create_queue("q")
    ns = ["--namespace", broker.namespace]  # framing is the same on both transports
    run = lambda *args, stdin=b"": subprocess.run([sys.executable, "-m", "shmq.cli", *args, *ns], input=stdin,
                                                  capture_output=True, env=env(), timeout=60)
    r = run("produce", "q", "-0", stdin=b"one\nline\0\0two\0")  # a newline inside, an empty body
    assert (r.returncode, r.stdout) == (0, b"produced 3 message(s) to q: ids 1..3\n")
    r = run("consume", "q", "-n", "5", "-0")
    assert (r.returncode, r.stdout) == (0, b"one\nline\0\0two\0")
    binary = bytes(range(256)) * 3
    assert run("produce", "q", "--raw", stdin=binary).returncode == 0
    r = run("consume", "q", "--raw")
    assert (r.returncode, r.stdout) == (0, binary)  # verbatim: nothing decoded, nothing added
    r = run("produce", "q", "-m", "x", "--raw")
    assert r.returncode == 2 and r.stderr.startswith(b"shmq: error: --raw reads standard input: not with -m")
    assert q.stats().enqueued_total == 4


# ---------------------------------------------------------------- exit codes, sizes, python -m shmq
def test_each_exit_code(broker):
    ns = ["--namespace", broker.namespace]
    broker.create_queue("q").put(b"x")
    assert shmq_cli("consume", "q", *ns).returncode == app.EXIT_OK == 0
    one_line_error(shmq_cli("consume", "missing", *ns), app.EXIT_ERROR, "shmq: error: no queue 'missing'")
    one_line_error(shmq_cli("consume", "q", "--bogus", *ns), app.EXIT_USAGE,
                   "shmq: error: No such option '--bogus'; try ")
    one_line_error(shmq_cli("create", *ns), app.EXIT_USAGE, "shmq: error: Missing argument 'NAME'")
    one_line_error(shmq_cli("nosuch"), app.EXIT_USAGE, "shmq: error: No such command 'nosuch'")
    assert shmq_cli("consume", "q", *ns).returncode == app.EXIT_EMPTY == 3
    assert app.EXIT_ERROR == 1 and app.EXIT_USAGE == 2


def test_the_documented_exit_codes_are_the_codes():
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "OPERATIONS.md")) as f:
        page = f.read()
    section = page[page.index("## Exit codes"):]
    codes = [int(c) for c in re.findall(r"^\| `(\d+)` \|", section[:section.index("\n\n", section.index("|"))], re.M)]
    assert codes == [app.EXIT_OK, app.EXIT_ERROR, app.EXIT_USAGE, app.EXIT_EMPTY] == [0, 1, 2, 3]


@pytest.mark.parametrize("text, n", [("65536", 65536), ("64KiB", 65536), ("64MiB", 64 * 2**20), ("1GiB", 2**30),
                                     ("64KB", 64000), ("64MB", 64 * 10**6), ("1.5MiB", 3 * 2**19), ("4 kib", 4096),
                                     ("100b", 100)])
def test_sizes_take_units(text, n):
    assert app.Size().convert(text, None, None) == n


@pytest.mark.parametrize("text, message", [("64XB", "is not a size"), ("-1", "is not a size"), ("", "is not a size"),
                                           ("0.5B", "is not a whole number of bytes"),
                                           ("1KiB", "is less than the least allowed, 4096 bytes")])
def test_size_junk_is_refused(text, message):
    with pytest.raises(click.BadParameter, match=message):
        app.Size(min=4096).convert(text, None, None)


def test_size_options_take_units(broker):
    ns = ["--namespace", broker.namespace]
    assert shmq_cli("create", "q", "--max-bytes", "64KiB", "--max-message-bytes", "1KB", *ns).returncode == 0
    s = broker.queue("q").settings()
    assert (s["max_bytes"], s["max_message_bytes"]) == (65536, 1000)
    r = shmq_cli("stream", "create", "s", "--partitions", "1", "--max-bytes", "64KiB", "--max-message-bytes", "2KiB",
                 "--retention-bytes", "1MB", *ns)
    assert r.returncode == 0, r.stderr
    with broker.stream("s") as st:
        assert (st.max_bytes, st.max_message_bytes, st.retention_bytes) == (65536, 2048, 10**6)
    one_line_error(shmq_cli("create", "x", "--max-bytes", "64XB", *ns), 2,
                   "shmq: error: Invalid value for '--max-bytes': '64XB' is not a size")
    one_line_error(shmq_cli("server", "--max-frame-bytes", "3GiB", *ns), 2,
                   "shmq: error: Invalid value for '--max-frame-bytes': '3GiB' is more than the most allowed")
    assert broker.list_queues() == ["q"]


def test_python_dash_m_shmq_is_the_cli(broker):
    run = lambda *args, stdin=None: subprocess.run([sys.executable, "-m", "shmq", *args, "--namespace",
                                                    broker.namespace], input=stdin, capture_output=True, text=True,
                                                   env=env(), timeout=60)
    assert run("create", "q").stdout == "created q\n"
    assert run("produce", "q", stdin="hello\n").returncode == 0
    assert (run("consume", "q").stdout, run("consume", "q").returncode) == ("hello\n", 3)


# ---------------------------------------------------------------- namespaces
def test_namespace_list_shows_ours_with_counts(broker):
    broker.create_queue("a").close()
    broker.create_queue("b").close()
    broker.create_stream("s", partitions=1, max_bytes=4096).close()
    r = shmq_cli("namespace", "list")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}  # others' namespaces may be there
    assert r.stdout.split()[:4] == ["namespace", "broker", "queues", "streams"]
    assert rows[broker.namespace] == [broker.namespace, "-", "2", "1"]
    listed = {ns["namespace"]: ns for ns in json.loads(shmq_cli("namespace", "list", "--json").stdout)}
    ours = listed[broker.namespace]
    assert (ours["queues"], ours["streams"], ours["broker"]) == (["a", "b"], ["s"], None)


def test_namespace_destroy_asks_refuses_and_removes(namespace):
    with shmq.connect(namespace=namespace) as b:
        b.create_queue("q").put(b"x")
    r = shmq_cli("namespace", "destroy", namespace, stdin="n\n")
    assert r.returncode == 1 and namespace_entries(namespace) != []  # not confirmed: nothing removed
    srv = ServerProcess(namespace, "--no-persist")
    try:
        one_line_error(shmq_cli("namespace", "destroy", namespace, "--yes"), 1,
                       f"shmq: error: namespace {namespace!r} has a running broker, pid {srv.proc.pid}")
    finally:
        assert srv.stop() == 0
    r = shmq_cli("namespace", "destroy", namespace, stdin="y\n")
    assert r.returncode == 0 and re.search(f"destroyed namespace {namespace} \\(\\d+ entries removed; no data dir at ",
                                           r.stdout)
    assert namespace_entries(namespace) == []
    one_line_error(shmq_cli("namespace", "destroy", namespace, "--yes"), 1,
                   f"shmq: error: no namespace {namespace!r} on this host")


def test_a_destroyed_namespace_does_not_come_back(namespace, servers):
    """Before: the data dir stayed, and the next server rebuilt every queue and stream."""
    srv = servers(namespace)  # persistence on, the default data dir
    with shmq.connect(srv.url) as b:
        b.create_queue("q").put(b"kept before")
        b.create_stream("s", partitions=1, durability="wal").append(b"r")
    assert srv.stop() == 0  # with a last snapshot
    data = default_data_dir(namespace)
    assert {"q.dmsq", "@s#0.dmsq"} <= set(os.listdir(data))
    r = shmq_cli("namespace", "destroy", namespace, "--yes")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(f"destroyed namespace {namespace} \\(\\d+ entries removed; its data dir {re.escape(data)}: "
                        f"\\d+ file\\(s\\) removed; data dirs given with --data-dir are not touched\\)\n", r.stdout)
    assert namespace_entries(namespace) == [] and not os.path.exists(data)
    srv = servers(namespace)
    try:
        with shmq.connect(srv.url) as b:
            assert (b.list_queues(), b.list_streams()) == ([], [])  # it starts empty
    finally:
        assert srv.stop() == 0
    shmq.destroy_namespace(namespace)
    shutil.rmtree(data, ignore_errors=True)


def test_destroy_after_a_reboot_removes_the_data_dir_and_keeps_what_is_not_shmqs(namespace, tmp_path):
    data = default_data_dir(namespace)
    os.makedirs(data)
    for name in ("q.dmsq", "q.wal.00000002", "@s#0.hwm", "exchanges.dmsx", "q.dmsq.corrupt", "notes.txt"):
        with open(os.path.join(data, name), "wb") as f:
            f.write(b"x")
    try:
        r = shmq_cli("namespace", "destroy", namespace, "--yes")  # nothing in /dev/shm: only its data dir
        assert r.returncode == 0, r.stderr
        assert f"its data dir {data}: 5 file(s) removed, 1 kept that are not shmq's (notes.txt)" in r.stdout
        assert os.listdir(data) == ["notes.txt"]
    finally:
        shutil.rmtree(data, ignore_errors=True)
    one_line_error(shmq_cli("namespace", "destroy", namespace, "--yes"), 1, f"shmq: error: no namespace {namespace!r}")


@pytest.mark.parametrize("args", [["list"], ["stats"], ["consume", "q"], ["produce", "q", "-m", "x"], ["delete", "q"],
                                  ["peek", "q"], ["top", "--once"], ["stream", "list"], ["exchange", "list"],
                                  ["snapshot", "--data-dir", "DIR"]])
def test_a_namespace_that_does_not_exist_is_an_error_not_created(args, tmp_path):
    typo = "t" + uuid.uuid4().hex[:12]
    args = [str(tmp_path) if a == "DIR" else a for a in args]
    how = [] if args == ["list"] else ["--namespace", typo]  # list: from $SHMQ_NAMESPACE
    r = subprocess.run([sys.executable, "-m", "shmq.cli", *args, *how], capture_output=True, text=True, timeout=60,
                       env=env(SHMQ_NAMESPACE=typo))
    one_line_error(r, 1, f"shmq: error: no namespace {typo!r} on this host (check --namespace / $SHMQ_NAMESPACE")
    assert namespace_entries(typo) == []


@pytest.mark.parametrize("args", [["create", "q", "--dead-letter-queue", "missing"], ["restore", "FILE"],
                                  ["exchange", "delete", "x"]])
def test_a_command_that_fails_makes_no_namespace(args, namespace, tmp_path):
    junk = tmp_path / "junk.dmsq"
    junk.write_bytes(b"not a snapshot")
    args = [str(junk) if a == "FILE" else a for a in args]
    r = shmq_cli(*args, "--namespace", namespace)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert namespace_entries(namespace) == []  # (the create and the restore made the registry first, before)


def test_a_malformed_url_is_a_usage_error(namespace):
    for url in ("127.0.0.1:7879", "tcp://127.0.0.1:port", "http://127.0.0.1:7879"):
        one_line_error(shmq_cli("list", "--url", url), 2, "shmq: error: Invalid value for '--url': ")
    one_line_error(shmq_cli("list", env={"SHMQ_URL": "127.0.0.1:7879"}), 2,
                   "shmq: error: Invalid value for '--url': unsupported broker url '127.0.0.1:7879': use tcp://")


def test_the_commands_that_make_things_make_the_namespace(namespace):
    ns = ["--namespace", namespace]
    try:
        assert shmq_cli("create", "q", *ns).returncode == 0
        assert shmq_cli("list", *ns).stdout == "q\n"
    finally:
        shmq.destroy_namespace(namespace)
    for args in (["stream", "create", "s", "--partitions", "1", "--max-bytes", "4KiB"], ["exchange", "create", "x"]):
        try:
            assert shmq_cli(*args, *ns).returncode == 0
        finally:
            assert shmq.destroy_namespace(namespace) > 0


def _commands(group, path=()):
    """(path, command) of every command under ``group``, the group itself first."""
    yield path, group
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _commands(cmd, (*path, name))


def test_every_help_is_plain_text():
    """``--help`` shows docstrings as they are: no reStructuredText markup (``...``)."""
    from click.testing import CliRunner

    from shmq.cli import main

    shown = 0
    for path, _cmd in _commands(main):
        r = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
        assert r.exit_code == 0, (path, r.output)
        assert "``" not in r.output, (path, [line for line in r.output.splitlines() if "``" in line])
        shown += 1
    assert shown > 30  # every command and group, each once
