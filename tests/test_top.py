"""``shmq top`` (and ``shmq stats`` on a terminal) under a real pseudo-terminal, with
known queues: depths, leases held, a dead-letter queue with messages in it, and traffic
while ``top`` samples so a rate is not zero; locally and over TCP."""

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from tests.test_server_tcp import ServerProcess

ANSI = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][A-Z0-9]|[=>78])")
DURATION = re.compile(r"^(\d+(\.\d)?(µs|ms|s)|\d+m\d\ds|\d+h\d\dm)$")


# the pty on stdin becomes the controlling terminal, then the command runs (no preexec_fn: the test has threads)
_AS_TERMINAL = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


class Pty:
    """``shmq ARGS`` with a pseudo-terminal of ``cols`` x ``rows`` as its controlling
    terminal and stdin, stdout and stderr."""

    def __init__(self, *args, cols=120, rows=60):
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.mode = termios.tcgetattr(self.slave)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
        self.proc = subprocess.Popen(  # in a session of its own, the pty its terminal: ^C is a SIGINT
            [sys.executable, "-c", _AS_TERMINAL, "-m", "shmq.cli", *args], stdin=self.slave, stdout=self.slave,
            stderr=self.slave, env={**env, "TERM": "xterm-256color", "PYTHONPATH": os.getcwd()},
            start_new_session=True)
        self.out = b""

    def read_until(self, done, timeout=30.0):
        """Read the terminal until ``done(text so far)`` or the process has exited and
        everything it wrote is read; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.text):
            assert time.monotonic() < deadline, f"timed out; output so far:\n{self.text}"
            exited = self.proc.poll() is not None
            if select.select([self.master], [], [], 0.05)[0]:
                self.out += os.read(self.master, 65536)
            elif exited:
                return self.text
        return self.text

    def wait(self, timeout=30.0):
        self.read_until(lambda _text: False, timeout)
        return self.proc.wait(timeout)

    def write(self, data: bytes):
        os.write(self.master, data)

    @property
    def text(self):
        return ANSI.sub("", self.out.decode("utf-8", "replace")).replace("\r", "")

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def pty_run():
    ptys = []

    def run(*args, **kwargs):
        ptys.append(Pty(*args, **kwargs))
        return ptys[-1]

    yield run
    for p in ptys:
        p.close()


@pytest.fixture
def known(broker):
    """jobs10: 5 ready; jobs2: 2 ready, 2 leased (held here), 3 dead-lettered into dead
    (a name that sorts before both); busy: a put, a get and an ack every few ms until the
    test ends; a stream with a group 3 records behind."""
    broker.create_queue("dead")
    jobs2 = broker.create_queue("jobs2", dead_letter_queue="dead", visibility_timeout=300)
    jobs10 = broker.create_queue("jobs10", max_bytes=2**20)
    busy = broker.create_queue("busy")
    jobs10.put_many([b"y" * 1000] * 5)
    jobs2.put_many([b"x" * 100] * 7)
    for d in jobs2.get_many(3):
        d.reject()
    held = jobs2.get_many(2)
    assert len(held) == 2 and jobs2.stats().ready == 2
    s = broker.create_stream("events", partitions=2, max_bytes=1 << 16)
    s.append_many([b"x" * 10] * 4, partition=1)
    with s.consumer("billing") as c:
        c.commit({1: 1})
    stop = threading.Event()

    def traffic():
        while not stop.wait(0.002):  # paced load, not a synchronization
            busy.put(b"t")
            busy.get().ack()

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    yield held
    stop.set()
    t.join(10)
    for d in held:
        d.ack()
    s.close()


def _rows(text, first_header):
    """{name: cells} of the table whose header starts with ``first_header``, in order."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_header])
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())  # columns are 2 spaces apart at least; "25 KiB" is one cell
        rows[cells[0]] = dict(zip(header, cells))
    return header, rows


def _top_once(pty_run, target, *args, cols=120):
    p = pty_run("top", "--once", "--interval", "0.5", *args, *target, cols=cols)
    assert p.wait() == 0, p.text
    assert "Traceback" not in p.text
    return p.text


def _check_numbers(rows, links):
    assert (rows["jobs10"]["ready"], rows["jobs10"]["in flight"]) == ("5", "0")
    jobs2 = rows["jobs2"]
    assert (jobs2["ready"], jobs2["in flight"]) == ("2", "2")
    dead = rows["└ dead" if links else "dead"]
    assert dead["ready"] == "3"
    if links:
        assert jobs2["dlq"] == "3" and rows["jobs10"]["dlq"] == "-"
    for name in ("jobs10", "jobs2"):
        assert DURATION.match(rows[name]["oldest"]), rows[name]
        assert rows[name]["put/s"] == rows[name]["ack/s"] == "0"
    assert rows["busy"]["put/s"] not in ("0", "-") and rows["busy"]["ack/s"] not in ("0", "-"), rows["busy"]
    assert rows["jobs10"]["used"].endswith("KiB") and rows["jobs10"]["full"] == f"{rows['jobs10']['full'][:-1]}%"


def test_top_once_locally_shows_the_numbers_sorted_by_depth_dlq_under_its_source(broker, known, pty_run):
    text = _top_once(pty_run, ["--namespace", broker.namespace])
    assert text.startswith("shmq top") and f"namespace {broker.namespace}" in text and "sort: depth" in text
    header, rows = _rows(text, "queue")
    assert header == ["queue", "ready", "in flight", "delayed", "oldest", "dlq", "put/s", "ack/s", "used", "memory",
                      "full"]
    assert list(rows) == ["jobs10", "jobs2", "└ dead", "busy"]  # by depth; the DLQ under its source
    _check_numbers(rows, links=True)
    _, streams = _rows(text, "stream")
    assert streams["events"]["partitions"] == "2" and streams["events"]["records"] == "4"
    groups = [line.split() for line in text.splitlines() if line.startswith("events  billing")]
    assert groups == [["events", "billing", "0", "3", "0"]]  # members, lag, commit/s


def test_top_once_other_sort_keys(broker, known, pty_run):
    ns = ["--namespace", broker.namespace]
    assert list(_rows(_top_once(pty_run, ns, "--sort", "name"), "queue")[1]) == ["busy", "jobs2", "└ dead", "jobs10"]
    assert list(_rows(_top_once(pty_run, ns, "--sort", "dlq"), "queue")[1])[:2] == ["jobs2", "└ dead"]
    assert list(_rows(_top_once(pty_run, ns, "--sort", "rate"), "queue")[1])[0] == "busy"


def test_top_once_over_tcp(broker, known, pty_run):
    srv = ServerProcess(broker.namespace)
    try:
        text = _top_once(pty_run, ["--url", srv.url])
    finally:
        assert srv.stop() == 0
    assert srv.url in text
    header, rows = _rows(text, "queue")
    assert "dlq" in header and "dead-letter links" not in text  # STATS says which queue is whose DLQ
    assert list(rows) == ["jobs10", "jobs2", "└ dead", "busy"]
    _check_numbers(rows, links=True)
    assert [line.split() for line in text.splitlines() if line.startswith("events  billing")] == [
        ["events", "billing", "0", "3", "0"]]


def test_top_fits_a_narrow_terminal(broker, known, pty_run):
    text = _top_once(pty_run, ["--namespace", broker.namespace], cols=60)
    assert max(len(line) for line in text.splitlines()) <= 60
    header, rows = _rows(text, "queue")
    assert "full" not in header and {"queue", "ready", "in flight", "oldest", "dlq", "put/s", "ack/s"} <= set(header)
    assert rows["jobs2"]["dlq"] == "3"


@pytest.mark.parametrize("key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_live_top_quits_on_q_or_ctrl_c_and_restores_the_terminal(broker, known, pty_run, key):
    p = pty_run("top", "--interval", "0.1", "--namespace", broker.namespace)
    p.read_until(lambda text: text.count("jobs10") >= 2)  # two frames: the second has rates
    assert "(q quits)" in p.text
    p.write(key)
    assert p.wait() == 0, p.text
    assert "Traceback" not in p.text
    assert p.out.endswith(b"\x1b[?25h\x1b[?1049l")  # cursor shown, the screen as it was
    assert termios.tcgetattr(p.slave) == p.mode  # echo and line mode back


def test_stats_fits_the_terminal_it_is_shown_on(broker, known, pty_run):
    p = pty_run("stats", "--namespace", broker.namespace, cols=72)
    assert p.wait() == 0, p.text
    assert max(len(line) for line in p.text.splitlines()) <= 72
    header, rows = _rows(p.text, "queue")
    assert header[:6] == ["queue", "ready", "in flight", "delayed", "oldest", "dlq"]
    assert "max" not in header  # the first to go
    assert list(rows) == ["busy", "jobs2", "└ dead", "jobs10"]  # natural order, the DLQ under its source
    assert rows["jobs2"]["dlq"] == "3" and rows["jobs10"]["used"].endswith(" KiB")


def test_top_piped_prints_a_frame_per_interval_and_stops_on_sigterm(broker, known):
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "shmq.cli", "top", "--interval", "0.1", "--namespace",
                             broker.namespace], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    out, deadline = b"", time.monotonic() + 30
    try:
        while out.count(b"shmq top") < 2:  # frames are flushed one by one
            assert time.monotonic() < deadline and proc.poll() is None, out
            if select.select([proc.stdout], [], [], 0.1)[0]:
                out += os.read(proc.stdout.fileno(), 65536)
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, err) == (0, b"")
    assert b"\x1b" not in out + rest  # plain text: no colors, no cursor moves
    assert b"jobs10" in out and b"rates over" in out


def test_units_and_natural_order():
    from shmq.views import human_bytes, human_duration, human_rate, natural_key

    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 64 * 2**20, 10 * 2**30 - 1, 3 * 2**40)] == [
        "0 B", "1023 B", "1 KiB", "1.5 KiB", "64 MiB", "10 GiB", "3 TiB"]
    assert [human_duration(s) for s in (0.00035, 0.012, 1.5, 9.96, 42, 59.7, 245, 7380, 3 * 86400 + 4 * 3600)] == [
        "350µs", "12ms", "1.5s", "10s", "42s", "1m00s", "4m05s", "2h03m", "3d04h"]
    assert [human_rate(r) for r in (None, 0, 0.4, 7.5, 120, 999.6, 1234, 15000, 3.4e6)] == [
        "-", "0", "0.4", "7.5", "120", "1.0k", "1.2k", "15k", "3.4M"]
    assert sorted(["q10", "q2", "Q1", "q1a", "q", "orders-dlq", "orders"], key=natural_key) == [
        "orders", "orders-dlq", "q", "Q1", "q1a", "q2", "q10"]


def test_a_stop_signal_is_noted_and_ends_the_wait_without_an_interrupt_inside_a_sample():
    """``top``'s signals are answered between samples (``views._stop_asked``): SIGINT or
    SIGTERM while a sample runs raises nothing there (a KeyboardInterrupt could land with a
    queue's lock taken and its release not yet under way), and the wait after it returns
    at once; the handlers and the wakeup descriptor are put back after."""
    import signal

    from shmq import views

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    for sig in (signal.SIGINT, signal.SIGTERM):
        with views._stop_asked() as wait:
            os.kill(os.getpid(), sig)  # (delivered to this thread before kill returns: "inside a sample")
            for _ in range(1000):
                pass
            t0 = time.monotonic()
            assert wait(30) is True
            assert time.monotonic() - t0 < 5
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert signal.set_wakeup_fd(-1) == -1  # none was left set
    with views._stop_asked() as wait:
        assert wait(0.05) is False  # nothing asked: the whole wait
