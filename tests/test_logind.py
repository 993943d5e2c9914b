"""shmq.logind and ``shmq doctor``: whether systemd-logind's RemoveIPC would remove a
user's shared memory, read from a fake root (logind.conf and its drop-ins, login.defs,
the linger files) and, for the real host, through ``shmq doctor --json``."""

import json
import os

import pytest

from shmq import doctor, logind
from tests.test_cli import shmq_cli


@pytest.fixture
def root(tmp_path):
    """A fake root of a host that runs systemd, nothing configured."""
    (tmp_path / "run" / "systemd" / "system").mkdir(parents=True)
    return tmp_path


def _put(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_an_ordinary_user_on_a_default_systemd_host_is_warned(root):
    got = logind.check(str(root), uid=1000, user="alice")
    assert {k: got[k] for k in ("systemd", "remove_ipc", "remove_ipc_source", "sys_uid_max", "linger")} == \
        {"systemd": True, "remove_ipc": True, "remove_ipc_source": None, "sys_uid_max": 999, "linger": False}
    assert got["warning"] == (
        f"logind removes the shared memory of user alice (uid 1000 > SYS_UID_MAX 999, no lingering) when their "
        f"last session ends: RemoveIPC=yes in {root}/etc/systemd/logind.conf (unset: the default). Their queues "
        f"would go with it: run the broker as a system user, set RemoveIPC=no, or `loginctl enable-linger alice` "
        f"(docs/OPERATIONS.md, Running under systemd)")


def test_no_warning_without_systemd_for_system_users_or_with_lingering(root, tmp_path_factory):
    bare = tmp_path_factory.mktemp("no-systemd")
    assert logind.check(str(bare), uid=1000, user="alice")["warning"] is None
    assert logind.check(str(root), uid=999, user="daemon")["warning"] is None
    assert logind.check(str(root), uid=0, user="root")["warning"] is None
    _put(root, "var/lib/systemd/linger/alice", "")
    got = logind.check(str(root), uid=1000, user="alice")
    assert (got["linger"], got["warning"]) == (True, None)
    assert logind.check(str(root), uid=1001, user="bob")["warning"] is not None


def test_sys_uid_max_comes_from_login_defs(root):
    _put(root, "etc/login.defs", "# SYS_UID_MAX 10\nSYS_UID_MIN   100\nSYS_UID_MAX\t\t499\n")
    assert logind.sys_uid_max(str(root)) == 499
    assert logind.check(str(root), uid=499, user="svc")["warning"] is None
    assert "uid 500 > SYS_UID_MAX 499" in logind.check(str(root), uid=500, user="svc")["warning"]


def test_remove_ipc_as_logind_reads_its_files(root):
    main = _put(root, "etc/systemd/logind.conf",
                "[Login]\n#RemoveIPC=yes\nRemoveIPC = no\n[Other]\nRemoveIPC=yes\n")
    assert logind.remove_ipc(str(root)) == (False, main)  # comments and other sections do not count
    assert logind.check(str(root), uid=1000, user="alice")["warning"] is None
    vendor = _put(root, "usr/lib/systemd/logind.conf.d/50-vendor.conf", "[Login]\nRemoveIPC=yes\n")
    assert logind.remove_ipc(str(root)) == (True, vendor)  # a drop-in wins over the main file
    _put(root, "etc/systemd/logind.conf.d/40-local.conf", "[Login]\nRemoveIPC=off\n")
    assert logind.remove_ipc(str(root)) == (True, vendor)  # the later name wins, whatever its directory
    masked = _put(root, "etc/systemd/logind.conf.d/50-vendor.conf", "[Login]\nRemoveIPC=false\n")
    assert logind.remove_ipc(str(root)) == (False, masked)  # /etc hides /usr/lib's file of the same name
    _put(root, "run/systemd/logind.conf.d/60-bad.conf", "[Login]\nRemoveIPC=perhaps\n")
    assert logind.remove_ipc(str(root)) == (False, masked)  # logind ignores a bad value


def test_doctor_reports_it_and_renders_the_warning(root):
    report = {"shm": {"path": "/dev/shm", "size": 2**30, "free": 2**30, "warnings": []},
              "logind": logind.check(str(root), uid=1000, user="alice"),
              "namespaces": [], "orphans": [], "data_dirs": [], "other_users_entries": 0}
    lines = doctor.render(report)
    assert lines[1] == f"  warning: {report['logind']['warning']}"
    report["logind"] = logind.check(str(root), uid=10, user="svc")
    assert not any("logind" in line for line in doctor.render(report))


def test_shmq_doctor_json_has_the_hosts_answer():
    r = shmq_cli("doctor", "--json", "--namespace", "tnothing")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["logind"]
    assert got == logind.check()
    assert got["uid"] == os.geteuid()
