"""The token of ``shmq server``: on by default, found by the server's own user, refused
to every other user; ``--no-auth``, ``--token-file``, and a warning for ``--token``."""

import asyncio
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import shmq
from shmq import auth
from shmq.client import aio
from shmq.protocol import MsgType, Status, encode_request
from tests.test_cli import shmq_cli
from tests.test_server_tcp import ServerProcess, _read_frames, _sock

NOBODY = 65534
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh per-user directory for this test; servers and clients inherit it."""
    path = tmp_path / "home"
    monkeypatch.setenv("SHMQ_HOME", str(path))
    return path


@pytest.fixture
def server(broker, home):
    """A default ``shmq server``: no token option at all."""
    srv = ServerProcess(broker.namespace)
    yield srv
    assert srv.stop() == 0


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _run_server(namespace, *args):
    """``shmq server`` that is expected to refuse to start."""
    return subprocess.run([sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})


# ---------------------------------------------------------------- another user
def _as_nobody(args, env):
    return subprocess.run(args, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def nobody_python():
    """An interpreter uid 65534 can run that imports this checkout's shmq, and its env."""
    if os.geteuid() != 0:
        pytest.skip("running a client as another uid (65534) needs root")
    try:
        pwd.getpwuid(NOBODY)
    except KeyError:
        pytest.skip("no user with uid 65534 on this host")
    env = {"PYTHONPATH": os.pathsep.join([ROOT, sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]),
           "HOME": "/nonexistent", "PATH": "/usr/bin:/bin"}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    # the venv's interpreter first; it may sit in a home nobody can enter (then the same
    # Python version elsewhere, with the venv's packages on the path)
    candidates = dict.fromkeys([sys.executable, os.path.realpath(sys.executable),
                                shutil.which(version, path="/usr/bin:/bin")])
    why = []
    for python in filter(None, candidates):
        try:
            r = _as_nobody([python, "-c", "import shmq"], env)
        except OSError as e:
            why.append(f"{python}: {e.strerror}")
            continue
        if r.returncode == 0:
            return python, env
        why.append(f"{python}: {(r.stderr.strip().splitlines() or ['exit %d' % r.returncode])[-1]}")
    pytest.skip("uid 65534 cannot run a Python that imports shmq: " + "; ".join(why))


_NOBODY_CLIENT = textwrap.dedent("""
    import sys, shmq
    for token in (None, "wrong"):
        try:
            with shmq.connect(sys.argv[1], token=token) as b:
                print("served", b.list_queues())
        except shmq.Unauthorized as e:
            print("unauthorized:", e)
""")


@pytest.mark.parametrize("args,expect", [
    ((), [r"unauthorized: 127\.0\.0\.1:\d+ requires a token \(wrong or missing token\) and none was found: .*",
          r"unauthorized: 127\.0\.0\.1:\d+ refused the token given: wrong or missing token"]),
    (("--no-auth",), [r"served \['orders'\]", r"served \['orders'\]"]),
], ids=["default", "no-auth"])
def test_another_user_is_refused_by_default_and_served_with_no_auth(broker, home, nobody_python, args, expect):
    python, env = nobody_python
    broker.create_queue("orders")
    srv = ServerProcess(broker.namespace, *args)
    try:
        # it may even point at our directory: it cannot read it
        r = _as_nobody([python, "-c", _NOBODY_CLIENT, srv.url], {**env, "SHMQ_HOME": str(home)})
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 2 and all(re.fullmatch(p, line) for p, line in zip(expect, lines)), lines
        with shmq.connect(srv.url) as b:  # and its own user still is served
            assert b.list_queues() == ["orders"]
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- the same user
def test_the_same_user_is_served_with_no_configuration(server, broker, home):
    broker.create_queue("orders")
    assert f"token required (file {home / 'token'})" in server.log[-1]
    r = shmq_cli("produce", "orders", "-m", "order #42", "--url", server.url)
    assert (r.returncode, r.stderr) == (0, "")
    with shmq.connect(server.url) as b:
        b.queue("orders").put(b"order #43")

    async def over_asyncio():
        async with await aio.connect(server.url) as b:
            q = await b.queue("orders")
            await q.put(b"order #44")

    asyncio.run(over_asyncio())
    r = shmq_cli("consume", "orders", "-n", "3", "--url", server.url)
    assert (r.returncode, r.stdout) == (0, "order #42\norder #43\norder #44\n")
    token = (home / "token").read_text().strip()
    assert not any(token in line for line in server.log)


def test_the_token_file_is_private_and_reused_at_the_next_start(broker, home):
    srv = ServerProcess(broker.namespace)
    try:
        token = (home / "token").read_text()
        (runtime,) = (home / "run").iterdir()
        info = json.loads(runtime.read_text())
        assert (info["pid"], info["port"], info["token"]) == (srv.proc.pid, srv.port, token.strip())
        assert [_mode(p) for p in (home, home / "token", home / "run", runtime)] == [0o700, 0o600, 0o700, 0o600]
    finally:
        assert srv.stop() == 0
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}\n", token)
    assert list((home / "run").iterdir()) == []  # a clean stop withdraws the runtime file
    srv = ServerProcess(broker.namespace)
    try:
        assert (home / "token").read_text() == token
        with shmq.connect(srv.url, token=token.strip()) as b:
            b.ping()
    finally:
        assert srv.stop() == 0


def test_no_auth_serves_a_client_that_never_says_hello(broker, home):
    srv = ServerProcess(broker.namespace, "--no-auth")
    try:
        assert "no auth (--no-auth): every local user can connect" in srv.log[-1]
        s = _sock(srv.port, hello=False)
        s.sendall(encode_request(MsgType.LIST, 1))
        (f,) = _read_frames(s)
        assert (f.status, f.payload) == (Status.OK, {"queues": []})
        s.close()
    finally:
        assert srv.stop() == 0
    assert [p.name for p in home.iterdir()] == ["data"]  # no token, no runtime file: only the default data dir


def test_token_file_is_created_if_missing_then_used(broker, home, tmp_path):
    path = tmp_path / "secrets" / "shmq.token"
    srv = ServerProcess(broker.namespace, "--token-file", str(path))
    try:
        assert f"token required (file {path})" in srv.log[-1]
        token = path.read_text().strip()
        assert (_mode(path), _mode(path.parent)) == (0o600, 0o700)
        assert not (home / "token").exists()
        with shmq.connect(srv.url) as b:  # found through the runtime file
            b.ping()
        with shmq.connect(srv.url, token=token) as b:
            b.ping()
    finally:
        assert srv.stop() == 0
    path.write_text("my-own-token\n")  # a file of ours, 0600: used as it is
    srv = ServerProcess(broker.namespace, "--token-file", str(path))
    try:
        with shmq.connect(srv.url, token="my-own-token") as b:
            b.ping()
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("content,mode,error", [
    ("t0ken\n", 0o644, "has mode 0644: group or other users can access it; run chmod 600 {path}"),
    ("t0ken\n", 0o640, "has mode 0640: group or other users can access it; run chmod 600 {path}"),
    ("t0ken\n", 0o602, "has mode 0602: group or other users can access it; run chmod 600 {path}"),
    ("\n", 0o600, "must hold one token: not empty, no spaces"),
])
def test_a_token_file_others_may_read_is_refused(broker, home, tmp_path, content, mode, error):
    path = tmp_path / "token"
    path.write_text(content)
    path.chmod(mode)
    r = _run_server(broker.namespace, "--token-file", str(path))
    assert (r.returncode, r.stderr) == (1, f"shmq: error: token file {path} {error.format(path=path)}\n")
    home.mkdir(mode=0o700)  # the same rule for the default file
    (home / "token").write_text(content)
    (home / "token").chmod(mode)
    r = _run_server(broker.namespace)
    assert (r.returncode, r.stderr) == (1, f"shmq: error: token file {home / 'token'} "
                                           f"{error.format(path=home / 'token')}\n")


def test_a_token_file_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    path = tmp_path / "token"
    path.write_text("t0ken\n")
    path.chmod(0o600)
    os.chown(path, NOBODY, -1)
    with pytest.raises(shmq.ShmqError, match=rf"^token file {re.escape(str(path))} belongs to uid {NOBODY}, "
                                             r"not to you \(uid 0\)$"):
        auth.server_token(token_file=str(path))


def test_token_options_that_exclude_each_other(broker, home, tmp_path):
    r = _run_server(broker.namespace, "--no-auth", "--token-file", str(tmp_path / "t"))
    assert (r.returncode, r.stderr) == (
        1, "shmq: error: --no-auth and a token (--token, --token-file) exclude each other\n")
    r = _run_server(broker.namespace, "--token", "x", "--token-file", str(tmp_path / "t"))
    assert r.stderr.endswith("shmq: error: give --token or --token-file, not both\n")


def test_token_on_the_command_line_is_kept_with_a_warning(broker, home, monkeypatch):
    srv = ServerProcess(broker.namespace, "--token", "s3cret")
    try:
        warnings = [line for line in srv.log if " WARNING " in line]
        assert [w.split(" WARNING ", 1)[1] for w in warnings] == [
            f"--token on the command line is readable by every user in /proc/{srv.proc.pid}/cmdline: "
            "pass the token in $SHMQ_TOKEN or --token-file instead\n"]
        assert "token required (given at start)" in srv.log[-1] and not any("s3cret" in line for line in srv.log)
        with shmq.connect(srv.url) as b:  # its user's clients still find it
            b.ping()
        r = shmq_cli("list", "--url", srv.url, "--token", "s3cret")
        assert r.returncode == 0
        assert re.fullmatch(r"shmq: warning: --token on the command line is readable by every user in "
                            r"/proc/\d+/cmdline: pass the token in \$SHMQ_TOKEN instead\n", r.stderr)
    finally:
        assert srv.stop() == 0
    monkeypatch.setenv("SHMQ_TOKEN", "s3cret")  # the way to pass it: no warning
    srv = ServerProcess(broker.namespace)
    try:
        assert not any(" WARNING " in line for line in srv.log)
        assert "token required (given at start)" in srv.log[-1]
        assert shmq_cli("list", "--url", srv.url).stderr == ""
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- which token a client sends
def test_an_explicit_token_wins_over_discovery_and_the_environment(server, monkeypatch):
    endpoint = f"127.0.0.1:{server.port}"
    with pytest.raises(shmq.Unauthorized, match=rf"^{endpoint} refused the token given: wrong or missing token$"):
        shmq.connect(server.url, token="wrong")
    with pytest.raises(shmq.Unauthorized, match=rf"^{endpoint} refused the token given: wrong or missing token$"):
        asyncio.run(aio.connect(server.url, token="wrong"))
    monkeypatch.setenv("SHMQ_TOKEN", "wrong")
    with pytest.raises(shmq.Unauthorized, match=rf"^{endpoint} refused the token in \$SHMQ_TOKEN: wrong or missing"):
        shmq.connect(server.url)
    with shmq.connect(server.url, token=auth.read_token(auth.default_token_file())) as b:
        b.ping()


def test_a_wrong_or_missing_token_is_one_clear_line(server, home, tmp_path):
    r = shmq_cli("list", "--url", server.url, env={"SHMQ_TOKEN": "wrong"})
    assert (r.returncode, r.stderr) == (
        1, f"shmq: error: 127.0.0.1:{server.port} refused the token in $SHMQ_TOKEN: wrong or missing token\n")
    elsewhere = tmp_path / "elsewhere"
    r = shmq_cli("list", "--url", server.url, env={"SHMQ_HOME": str(elsewhere)})
    assert (r.returncode, r.stderr) == (
        1, f"shmq: error: 127.0.0.1:{server.port} requires a token (wrong or missing token) and none was found: "
           f"pass token= (--token) or $SHMQ_TOKEN, or run the client as the server's user on its host "
           f"(it reads {elsewhere / 'run'})\n")
    (run,) = (home / "run").iterdir()  # a stale file (its server's start time differs) is not used
    info = json.loads(run.read_text())
    run.write_text(json.dumps({**info, "start": info["start"] + 1}))
    with pytest.raises(shmq.Unauthorized, match=r"requires a token \(wrong or missing token\) and none was found"):
        shmq.connect(server.url)


# ---------------------------------------------------------------- the rules, in process
def test_where_the_per_user_directory_is(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SHMQ_HOME")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert auth.home() == str(tmp_path / ".local" / "state" / "shmq")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    assert auth.home() == str(tmp_path / ".local" / "state" / "shmq")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert auth.home() == str(tmp_path / "state" / "shmq")
    monkeypatch.setenv("SHMQ_HOME", str(tmp_path / "mine"))
    assert (auth.home(), auth.default_token_file(), auth.run_dir()) == (
        str(tmp_path / "mine"), str(tmp_path / "mine" / "token"), str(tmp_path / "mine" / "run"))


def test_the_token_is_created_once(home):
    token = auth.load_or_create_token(str(home / "token"))
    assert auth.load_or_create_token(str(home / "token")) == token == auth.read_token(str(home / "token"))
    assert os.listdir(home) == ["token"]  # no temporary file left
    assert auth.server_token() == (token, f"token required (file {home / 'token'})")
    assert auth.server_token(no_auth=True) == (None, "no auth (--no-auth): every local user can connect")
    with pytest.raises(ValueError, match="^the token must not contain spaces$"):
        auth.server_token(token="two words")


def test_a_token_goes_only_to_a_live_server_at_an_address_it_bound(home):
    path = auth.advertise(5555, "127.0.0.1", "ns", "tok")
    here = ("127.0.0.1", 40000)
    assert auth.discover(here, ("127.0.0.1", 5555)) == ("tok", path)
    assert auth.discover(here, ("127.0.0.1", 5556)) == (None, None)   # another port
    assert auth.discover(here, ("127.0.0.2", 5555)) == (None, None)   # an address it did not bind
    assert auth.discover(("::ffff:127.0.0.1", 1), ("::ffff:127.0.0.1", 5555)) == ("tok", path)
    auth.withdraw(path)
    wildcard = auth.advertise(5555, "0.0.0.0", "ns", "tok2")
    assert auth.discover(here, ("127.0.0.9", 5555)) == ("tok2", wildcard)                    # loopback
    assert auth.discover(("192.0.2.7", 1), ("192.0.2.7", 5555)) == ("tok2", wildcard)        # our own address
    assert auth.discover(("192.0.2.7", 1), ("198.51.100.1", 5555)) == (None, None)           # another host
    info = json.loads(open(wildcard).read())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(wildcard, "w") as f:
        json.dump({**info, "pid": dead.pid}, f)
    assert auth.discover(here, ("127.0.0.1", 5555)) == (None, None)   # its server is gone
    assert auth.advertise(5557, "127.0.0.1", "ns", None) is None      # nothing to tell without a token
    live = auth.advertise(5557, "127.0.0.1", "ns", "tok3")
    assert os.listdir(auth.run_dir()) == [os.path.basename(live)]     # a new server prunes the stale file
    auth.withdraw(live)


def test_the_runtime_file_is_written_before_the_port_listens(broker, home):
    """A client that reaches the port at once (one coming back after a restart) finds the
    token: the server writes its runtime file before it listens, not after."""
    code = textwrap.dedent("""
        import sys
        from shmq import auth
        from shmq.cli import main
        from shmq.server import tcp
        start = tcp.TcpServer.start
        async def checked(self):
            print("runtime file before listening:", len(auth._runtime_files(self.port)), flush=True)
            return await start(self)
        tcp.TcpServer.start = checked
        main(["server", "--namespace", sys.argv[1], "--port", "0", "--no-persist"])
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, broker.namespace], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert proc.stdout.readline() == "runtime file before listening: 1\n"
        for line in proc.stderr:
            if "serving namespace" in line:
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert os.listdir(auth.run_dir()) == []  # withdrawn at the stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
