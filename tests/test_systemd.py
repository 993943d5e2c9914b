"""Running under systemd: ``Type=notify`` readiness over a real datagram socket (the test
is systemd), the shipped unit files parse, the docs show them as shipped."""

import configparser
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid

import pytest

from shmq.server.notify import notify
from tests.test_cli import shmq_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = sorted(glob.glob(os.path.join(ROOT, "examples", "systemd", "**", "*.service"), recursive=True))


@pytest.fixture(params=["path", "abstract"])
def systemd_socket(request, tmp_path, monkeypatch):
    """A unix datagram socket playing systemd's notify socket, named in $NOTIFY_SOCKET."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = name = str(tmp_path / "notify")
    else:
        name = "@shmq-test-" + uuid.uuid4().hex
        address = "\0" + name[1:]
    s.bind(address)
    s.settimeout(60)  # the bound on every wait below
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    yield s
    s.close()


def test_the_server_says_ready_once_it_serves_and_stopping_at_sigterm(systemd_socket, namespace, servers):
    srv = servers(namespace, "--no-persist")
    ready = systemd_socket.recv(4096).decode()
    assert ready == f"READY=1\nSTATUS=serving namespace {namespace} on 127.0.0.1:{srv.port}\n"
    assert srv.alive()  # it serves
    assert srv.stop() == 0
    assert systemd_socket.recv(4096).decode() == "STOPPING=1\nSTATUS=stopping: answering what is in flight\n"


def test_a_socket_it_cannot_reach_is_a_warning_and_it_serves(tmp_path, namespace, servers, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    srv = servers(namespace, "--no-persist")
    line = srv.wait_for_line(lambda x: "cannot tell systemd" in x)
    assert f"cannot tell systemd READY, STATUS through $NOTIFY_SOCKET={tmp_path / 'nobody-listens'}: " \
           f"No such file or directory" in line
    assert srv.alive()
    assert srv.stop() == 0


def test_without_notify_socket_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify(READY="1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")  # systemd's vsock form: not spoken here, refused in a log
    assert notify(READY="1") is False


def _keys(path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # systemd's keys are case-sensitive
    cp.read(path)
    return cp


@pytest.mark.parametrize("unit", UNITS, ids=[os.path.relpath(u, ROOT) for u in UNITS])
def test_the_unit_files_parse_and_say_what_the_docs_promise(unit, tmp_path):
    cp = _keys(unit)
    service = cp["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    assert int(service["LimitNOFILE"]) >= 4096
    assert re.search(r"/shmq server --config \S+\.toml", service["ExecStart"])
    assert "DynamicUser" not in service and "RemoveIPC" not in service  # either would remove the queues
    assert cp["Install"]["WantedBy"] in ("multi-user.target", "default.target")
    if "/user/" not in unit:
        assert (service["User"], service["Environment"], service["StateDirectory"]) == \
            ("shmq", "SHMQ_HOME=/var/lib/shmq", "shmq")
    if shutil.which("systemd-analyze") is None:
        return
    # systemd's own parser: every key known, every value well formed, the binary there
    shmq = os.path.join(os.path.dirname(sys.executable), "shmq")
    text = open(unit).read()
    text = re.sub(r"^ExecStart=\S+/shmq ", f"ExecStart={shmq} ", text, flags=re.M)
    copy = tmp_path / os.path.basename(unit).replace("@.", "@test.")  # a template is verified as an instance
    copy.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stderr.splitlines() if copy.name in line] == []


def _values(unit, key) -> list[str]:
    """Every value of ``key`` in ``unit``'s [Service], in order (a key may repeat)."""
    return re.findall(rf"^{key}=(.*)$", open(unit).read(), re.M)


@pytest.mark.parametrize("unit", UNITS, ids=[os.path.relpath(u, ROOT) for u in UNITS])
def test_the_units_sandbox_the_broker_and_leave_dev_shm_shared(unit):
    """Before: NoNewPrivileges, ProtectSystem, ProtectHome and PrivateTmp alone (8.5
    EXPOSED). Each exclusion below is a start or a client that breaks (docs/OPERATIONS.md,
    "The sandbox")."""
    one = {key: _values(unit, key) for key in re.findall(r"^(\w+)=", open(unit).read(), re.M)}
    for key, value in [("UMask", "0077"), ("NoNewPrivileges", "yes"), ("RestrictNamespaces", "yes"),
                       ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"), ("LockPersonality", "yes"),
                       ("MemoryDenyWriteExecute", "yes"), ("RestrictRealtime", "yes"),
                       ("SystemCallArchitectures", "native"), ("SystemCallErrorNumber", "EPERM")]:
        assert one.get(key) == [value], key
    assert one["SystemCallFilter"] == ["@system-service", "~@privileged @resources", "@chown"]  # --group: fchown
    for absent in ("PrivateUsers", "ProcSubset", "RestrictSUIDSGID", "PrivateNetwork", "DynamicUser", "RemoveIPC"):
        assert absent not in one, absent
    if "/user/" in unit:  # a user's manager: no namespaces without PrivateUsers, no capabilities to drop
        assert not {"ProtectSystem", "PrivateTmp", "PrivateDevices", "CapabilityBoundingSet"} & one.keys()
        return
    for key, value in [("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("PrivateDevices", "yes"), ("PrivateMounts", "yes"), ("ProtectProc", "noaccess"),
                       ("CapabilityBoundingSet", ""), ("ProtectKernelTunables", "yes"), ("ProtectClock", "yes"),
                       ("ProtectControlGroups", "yes"), ("ProtectKernelModules", "yes"), ("ProtectKernelLogs", "yes"),
                       ("ProtectHostname", "yes")]:
        assert one.get(key) == [value], key
    assert "ReadWritePaths" not in one and "InaccessiblePaths" not in one  # /dev/shm and the StateDirectory only


@pytest.mark.parametrize("unit", UNITS, ids=[os.path.relpath(u, ROOT) for u in UNITS])
def test_systemd_analyze_security_rates_the_units(unit, tmp_path):
    """The system units "OK" or better (under 5.0); the user unit, which a user's manager
    cannot give namespaces, "MEDIUM" (under 7.0; 9.6 UNSAFE before)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    copy = tmp_path / os.path.basename(unit).replace("@.", "@test.")
    copy.write_text(open(unit).read())
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(copy)],
                       capture_output=True, text=True, timeout=120)
    if "offline" in r.stderr and r.returncode != 0:
        pytest.skip(f"this systemd-analyze rates no unit file offline (systemd 250 and later do): {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    score, level = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", r.stdout).groups()
    if "/user/" in unit:
        assert float(score) < 7.0 and level in ("MEDIUM", "OK"), r.stdout.splitlines()[-1]
    else:
        assert float(score) < 5.0 and level in ("OK", "SAFE", "PERFECT"), r.stdout.splitlines()[-1]


def test_systemd_analyze_finds_a_bad_unit(tmp_path):
    """What the test above relies on: a bad key or value is a line naming the file."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nType=notfy\nRestart=on-failure\nExecStart=/bin/true\n")
    r = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=120)
    assert any("bad.service" in line and "notfy" in line for line in r.stderr.splitlines()), r.stderr


def test_the_docs_show_the_units_as_shipped():
    with open(os.path.join(ROOT, "docs", "OPERATIONS.md"), encoding="utf-8") as f:
        blocks = re.findall(r"^```ini\n(.*?)^```", f.read(), re.S | re.M)
    shipped = {os.path.relpath(u, ROOT): open(u).read() for u in UNITS}
    assert len(blocks) == 2
    assert [next((n for n, text in shipped.items() if text == b), None) for b in blocks] == \
        ["examples/systemd/shmq.service", "examples/systemd/user/shmq.service"]


def test_the_example_config_loads():
    r = shmq_cli("server", "--config", os.path.join(ROOT, "examples", "systemd", "shmq.toml"), "--print-config")
    assert r.returncode == 0, r.stderr
    assert 'log-format = "json"  # config file' in r.stdout.splitlines()
    assert "max-connections = 1024  # config file" in r.stdout.splitlines()
