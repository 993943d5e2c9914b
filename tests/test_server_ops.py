"""Running ``shmq server``: its log lines (text or JSON, one per event, with its fields),
persistence on by default (and where), ``--no-persist``, and one broker per namespace."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

import shmq
from shmq.auth import data_root, default_data_dir
from shmq.engine.shm.segment import namespace_entries
from shmq.protocol import MsgType, Status, encode_request
from shmq.server.lock import lock_name, lock_path
from tests.test_cli import shmq_cli
from tests.test_server_tcp import _closed, _read_frames, _sock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _events(lines):
    """The JSON objects of log lines (each must be one)."""
    return [json.loads(line) for line in lines if line.strip()]


def _event(srv, name, **fields):
    """Wait for the first log line of event ``name`` with ``fields``; it is returned parsed."""
    def match(line):
        try:
            e = json.loads(line)
        except ValueError:
            return False
        return e.get("event") == name and all(e.get(k) == v for k, v in fields.items())
    return json.loads(srv.wait_for_line(match))


def _run_server(namespace, *args, env=None):
    """``shmq server`` expected to refuse to start (exit code, stderr)."""
    r = subprocess.run([sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0", *args],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    return r.returncode, r.stderr


# ---------------------------------------------------------------- logs
def test_json_log_lines_carry_each_event_and_its_fields(namespace, servers):
    data = default_data_dir(namespace)
    os.makedirs(data, mode=0o700)
    with open(os.path.join(data, "junk.dmsq"), "wb") as f:  # a damaged file: quarantined at start
        f.write(b"\x89PNG not a snapshot")
    srv = servers(namespace, "--log-format", "json", "--log-level", "debug")
    start = _events(srv.log)  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= e.keys() for e in start)
    by_event = {e.get("event"): e for e in start}
    quarantined = by_event["file_quarantined"]
    assert quarantined["file"] == os.path.join(data, "junk.dmsq") and quarantined["level"] == "ERROR"
    assert quarantined["moved_to"].endswith(".corrupt") and os.path.exists(quarantined["moved_to"])
    assert by_event["recovery"]["data_dir"] == data and by_event["recovery"]["queues"] == []
    assert by_event["snapshot"]["data_dir"] == data and "duration_ms" in by_event["snapshot"]
    assert by_event["persistence"]["data_dir"] == data and by_event["persistence"]["default"] is True
    assert by_event["server_started"]["port"] == srv.port and by_event["server_started"]["pid"] == srv.proc.pid

    s = _sock(srv.port)  # HELLO with the token
    peer = "%s:%d" % s.getsockname()
    s.sendall(encode_request(MsgType.PING, 1))
    _read_frames(s)
    s.close()
    opened = _event(srv, "connection_opened", peer=peer)
    assert (opened["logger"], opened["level"]) == ("shmq.server", "DEBUG")
    closed = _event(srv, "connection_closed", peer=peer)
    assert (closed["requests"], closed["reason"], closed["level"]) == (2, "closed by the client", "DEBUG")

    s = _sock(srv.port, hello=False)
    s.sendall(encode_request(MsgType.HELLO, 0, {"token": "not the token"}))
    assert _read_frames(s)[0].status == Status.UNAUTHORIZED
    refused = _event(srv, "token_refused", peer="%s:%d" % s.getsockname())
    assert (refused["level"], refused["token_given"]) == ("WARNING", True)
    closed = _event(srv, "connection_closed", peer=refused["peer"])
    assert "wrong or missing token" in closed["reason"] and closed["level"] == "INFO"  # a fault: said at info
    s.close()

    s = _sock(srv.port)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _read_frames(s)[0].status == Status.BAD_FRAME and _closed(s)
    bad = _event(srv, "protocol_error", peer="%s:%d" % s.getsockname())
    assert (bad["status"], bad["fatal"], bad["level"]) == ("BAD_FRAME", True, "WARNING") and "magic" in bad["error"]

    with shmq.connect(srv.url) as remote:
        remote.create_queue("q").put(b"x")
    assert srv.stop() == 0
    every = start + _events(srv.later)
    last = [e for e in every if e.get("event") == "snapshot"][-1]  # the one after the stop, at info
    assert (last["queues"], last["messages"], last["level"]) == (1, 1, "INFO")
    assert every[-1]["event"] == "server_stopped"


def test_every_json_line_of_a_session_names_its_event(namespace, servers):
    """Before: asyncio's own lines, the metrics line, the stop line and any plain call had
    no ``event``. A session: start (asyncio at debug speaks), requests, a bad one, a stop."""
    srv = servers(namespace, "--log-format", "json", "--log-level", "debug", "--loop", "asyncio", "--no-persist",
                  "--metrics", "127.0.0.1:0")
    with shmq.connect(srv.url) as remote:
        q = remote.create_queue("q")
        q.put(b"x")
        q.get(timeout=5).ack()
    s = _sock(srv.port)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not a frame: BAD_FRAME, and a warning line
    assert _read_frames(s)[0].status == Status.BAD_FRAME and _closed(s)
    s.close()
    _event(srv, "protocol_error")
    assert srv.stop() == 0
    every = _events(srv.log) + _events(srv.later)  # every line one JSON object
    assert [e for e in every if not e.get("event")] == []
    by_event = {e["event"]: e for e in every}
    assert {"server_started", "metrics_started", "protocol_error", "server_stopping", "server_stopped"} <= \
        by_event.keys()
    plain = [e for e in every if e["logger"] == "asyncio"]  # a library's line names no event: "log"
    assert plain and {e["event"] for e in plain} == {"log"}


def test_a_server_in_a_terminal_says_nothing_per_connection(namespace, servers):
    """The default level: connections opened and closed by their clients are debug lines."""
    srv = servers(namespace, "--no-persist")
    for _ in range(3):
        with shmq.connect(srv.url) as remote:
            remote.ping()
    assert srv.stop() == 0
    assert " INFO stopped" in srv.later[-1]  # everything it said is in
    assert [line for line in srv.log + srv.later if "connection" in line] == []


@pytest.mark.parametrize("which", ["--port", "--metrics", "--kafka-port"])
def test_a_port_in_use_is_one_line_naming_its_option_and_the_start_makes_nothing(namespace, which):
    """Before: INFO lines, then ``[Errno 98] error while attempting to bind``, and the
    namespace's registry left behind; then a line that did not say which option chose the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _run_server(namespace, which, str(port))
    assert (code, err) == (1, f"shmq: error: port {port} on 127.0.0.1 is in use ({which}): choose another port, "
                              "or stop what listens on it\n")
    assert namespace_entries(namespace) == [] and not os.path.exists(default_data_dir(namespace))


@pytest.mark.parametrize("key", ["port", "kafka-port", "metrics"])
def test_a_port_in_use_that_a_config_file_chose_names_the_files_key(namespace, key, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "shmq.toml"
        value = f'"127.0.0.1:{port}"' if key == "metrics" else port
        config.write_text(f"{key} = {value}\n" + ("port = 0\n" if key != "port" else ""))
        r = shmq_cli("server", "--namespace", namespace, "--no-persist", "--config", str(config))
    assert (r.returncode, r.stderr) == (1, f"shmq: error: port {port} on 127.0.0.1 is in use (key {key!r} of config "
                                           f"file {config}): choose another port, or stop what listens on it\n")
    assert namespace_entries(namespace) == []


def test_a_server_makes_its_namespace_at_start(namespace, servers):
    srv = servers(namespace, "--no-persist")
    try:
        assert f"shmq.{namespace}.registry" in namespace_entries(namespace)  # listed while it runs, even empty
        with shmq.connect(namespace=namespace, create=False) as b:
            assert b.list_queues() == []
    finally:
        assert srv.stop() == 0
    shmq.destroy_namespace(namespace)


def test_text_log_lines_say_the_same_fields_in_one_line(namespace, servers):
    srv = servers(namespace, "--no-persist", "--frame-timeout", "0.3")
    assert any("no data dir (--no-persist)" in line for line in srv.log)
    s = _sock(srv.port)
    peer = "%s:%d" % s.getsockname()
    s.sendall(encode_request(MsgType.PING, 1)[:7])  # half a header, then nothing: a slow client
    slow = srv.wait_for_line(lambda line: f"peer={peer}" in line and " WARNING " in line)
    assert slow.count("\n") == 1 and 'why="frame timeout"' in slow
    closed = srv.wait_for_line(lambda line: "connection closed" in line and f"peer={peer}" in line)
    assert " INFO connection closed peer=" in closed and "requests=1 " in closed and "reason=" in closed
    assert _closed(s)
    assert srv.stop() == 0


# ---------------------------------------------------------------- persistence by default
def _files_private(path):
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    for name in os.listdir(path):
        assert stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode) == 0o600, name


def test_the_readmes_first_use_survives_a_reboot(namespace, servers):
    ns = ["--namespace", namespace]
    srv = servers(namespace)
    data = default_data_dir(namespace)
    assert data == os.path.join(os.environ["SHMQ_HOME"], "data", namespace)  # the suite never writes into ~
    assert any(f"data dir {data} (the default" in line for line in srv.log)  # said at start
    assert shmq_cli("create", "orders", *ns).stdout == "created orders\n"
    assert shmq_cli("produce", "orders", "-m", "order #42", *ns).returncode == 0
    assert srv.stop() == 0  # a clean stop writes a last snapshot
    _files_private(data)
    assert shmq.destroy_namespace(namespace) > 0  # the reboot: shared memory is gone
    srv = servers(namespace, "--log-format", "json")
    rebuilt = [e for e in _events(srv.log) if e.get("event") == "queue_rebuilt"]
    assert [(e["queue"], e["messages"], e["data_dir"]) for e in rebuilt] == [("orders", 1, data)]
    r = shmq_cli("consume", "orders", *ns)
    assert (r.returncode, r.stdout) == (0, "order #42\n")
    assert srv.stop() == 0


def test_no_persist_keeps_nothing(namespace, servers):
    srv = servers(namespace, "--no-persist")
    with shmq.connect(srv.url) as remote:
        remote.create_queue("orders").put(b"order #42")
    assert srv.stop() == 0
    assert not os.path.exists(default_data_dir(namespace))
    shmq.destroy_namespace(namespace)
    srv = servers(namespace, "--no-persist")
    with shmq.connect(srv.url) as remote:
        assert remote.list_queues() == []
    assert srv.stop() == 0
    assert not os.path.exists(default_data_dir(namespace))
    assert _run_server(namespace, "--no-persist", "--data-dir", "x")[0] == 2  # a usage error


def test_where_the_default_data_dir_is(monkeypatch, tmp_path):
    monkeypatch.setenv("SHMQ_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir("ns") == str(tmp_path / "h" / "data" / "ns")
    monkeypatch.delenv("SHMQ_HOME")
    assert default_data_dir("ns") == str(tmp_path / "xdg" / "shmq" / "ns")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/is/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_data_dir("ns") == str(tmp_path / "home" / ".local" / "share" / "shmq" / "ns")
    assert data_root() == str(tmp_path / "home" / ".local" / "share" / "shmq")


def test_without_shmq_home_the_data_goes_to_xdg_data_home(namespace, servers, monkeypatch, tmp_path):
    monkeypatch.delenv("SHMQ_HOME")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the token, the runtime files
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    srv = servers(namespace)
    data = tmp_path / "data" / "shmq" / namespace
    assert any(f"data dir {data} (the default" in line for line in srv.log)
    assert srv.stop() == 0
    assert data.is_dir() and (tmp_path / "state" / "shmq" / "token").exists()
    _files_private(data)


# ---------------------------------------------------------------- one broker per namespace
def test_a_second_broker_on_a_namespace_is_refused_naming_the_first(namespace, servers, tmp_path):
    first = servers(namespace, "--no-persist")
    assert lock_name(namespace) in namespace_entries(namespace)
    for args, env in ((("--no-persist",), None),
                      (("--data-dir", str(tmp_path / "other")), {"SHMQ_HOME": str(tmp_path / "home")})):
        code, err = _run_server(namespace, *args, env=env)  # even with another $SHMQ_HOME and data dir
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"shmq: error: namespace {namespace!r} already has a broker: pid {first.proc.pid} ")
        assert f"tcp 127.0.0.1:{first.port}" in err
    assert not (tmp_path / "other").exists()  # refused before touching anything
    assert first.alive()

    first.proc.send_signal(signal.SIGKILL)  # the kernel lets go of its lock
    first.proc.wait(10)
    assert os.path.exists(lock_path(namespace))  # a stale file stops no one
    second = servers(namespace, "--no-persist")
    assert second.alive()
    with open(lock_path(namespace)) as f:
        assert json.load(f)["pid"] == second.proc.pid
    assert second.stop() == 0
    assert lock_name(namespace) not in namespace_entries(namespace)  # a clean stop removes it
