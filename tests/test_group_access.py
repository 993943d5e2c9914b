"""A namespace shared with a Unix group (shmq/sharing.py), with real users made by
``useradd`` and run by ``runuser``: two members share a namespace locally and through
a TCP server's data dir, a user outside the group is refused in one line, and every
/dev/shm entry and data file has exactly the mode and group docs/OPERATIONS.md says."""

import contextlib
import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
from collections import namedtuple

import pytest

import shmq
from shmq.engine.shm.segment import SHM_DIR, namespace_entries
from shmq.persistence.files import snapshot_path
from tests._wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GROUP, ALICE, BOB, EVE = "shmqshare", "shmqalice", "shmqbob", "shmqeve"  # Eve is in no group of theirs

Users = namedtuple("Users", "python env gid uid")
RUNUSER = shutil.which("runuser") or "runuser"  # (the users' PATH has no sbin)


def _sh(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def users():
    """The group and the three users (made here if missing, removed after), and a
    Python they can run that imports this checkout's shmq."""
    if os.geteuid() != 0:
        pytest.skip("making users and running as them (useradd, runuser) needs root")
    missing = [t for t in ("groupadd", "useradd", "userdel", "groupdel", "runuser") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)} on this host")
    with _users_lock() as state:  # (pytest-xdist's workers each run this module's fixture: one makes them)
        state["holders"] = [pid for pid in state.get("holders", []) if _alive(pid)]  # (a killed run's go)
        if not state["holders"]:
            state.update(made_group=False, made_users=[])
            try:
                grp.getgrnam(GROUP)
            except KeyError:
                _sh("groupadd", GROUP)
                state["made_group"] = True
            for user, groups in ((ALICE, ["-G", GROUP]), (BOB, ["-G", GROUP]), (EVE, [])):
                try:
                    pwd.getpwnam(user)
                except KeyError:  # a group of its own as its primary: the shared one is a supplementary group
                    _sh("useradd", "-M", "-U", "-s", "/usr/sbin/nologin", *groups, user)
                    state["made_users"].append(user)
        state["holders"].append(os.getpid())
    try:
        members = grp.getgrnam(GROUP).gr_mem
        assert ALICE in members and BOB in members and EVE not in members, members
        yield Users(*_python(), grp.getgrnam(GROUP).gr_gid, {u: pwd.getpwnam(u).pw_uid for u in (ALICE, BOB, EVE)})
    finally:
        with _users_lock() as state:  # the last holder removes what was made
            state["holders"] = [pid for pid in state["holders"] if pid != os.getpid() and _alive(pid)]
            if not state["holders"]:
                for user in state.pop("made_users", []):
                    _sh("userdel", user)
                if state.pop("made_group", False):
                    _sh("groupdel", GROUP)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def _users_lock():
    """The users' state shared by this host's test processes (how many hold them, what
    was made), under an exclusive lock."""
    path = os.path.join(tempfile.gettempdir(), "shmq-test-users.json")
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
        yield state
        with open(path, "w") as f:
            json.dump(state, f)


def _python():
    """An interpreter the new users can run (the venv's may sit in /root), with the
    venv's packages and this checkout on its path."""
    env = {"PYTHONPATH": os.pathsep.join([ROOT, sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]),
           "PATH": "/usr/bin:/bin"}
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    why = []
    for python in filter(None, dict.fromkeys([sys.executable, os.path.realpath(sys.executable),
                                              shutil.which(version, path="/usr/bin:/bin")])):
        r = subprocess.run([RUNUSER, "-u", BOB, "--", python, "-c", "import shmq"], env=env, cwd="/",
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return python, env
        why.append(f"{python}: {(r.stderr.strip().splitlines() or ['exit %d' % r.returncode])[-1]}")
    pytest.skip("the test users cannot run a Python that imports shmq: " + "; ".join(why))


def run_as(users, user, code, *args, env=None):
    """``code`` (Python) run as ``user``; its CompletedProcess."""
    return subprocess.run([RUNUSER, "-u", user, "--", users.python, "-c", textwrap.dedent(code), *args],
                          env={**users.env, **(env or {})}, cwd="/", capture_output=True, text=True, timeout=120)


def ok(r):
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def owners_modes(paths):
    """{path: (owner's name, mode, group's name)}."""
    out = {}
    for p in paths:
        st = os.lstat(p)
        out[p] = (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode), grp.getgrgid(st.st_gid).gr_name)
    return out


def shm(ns, *names):
    return [os.path.join(SHM_DIR, n.format(ns=ns)) for n in names]


# ---------------------------------------------------------------- locally
def test_two_members_share_a_namespace_and_an_outsider_is_refused(namespace, users):
    r = run_as(users, ALICE, "from shmq.cli import main; main()", "namespace", "create", namespace,
               "--group", GROUP)
    assert ok(r) == [f"made namespace {namespace}, shared with group {GROUP} (0660)"]
    assert ok(run_as(users, ALICE, """
        import sys, shmq
        with shmq.connect(namespace=sys.argv[1], create=False) as b:
            b.create_queue("jobs").put(b"from alice")
            b.create_stream("events", partitions=2).append(b"e1")
            print(b.shared_group)
    """, namespace)) == [str(users.gid)]
    # Bob works on Alice's queue and makes one of his own; Alice uses his
    assert ok(run_as(users, BOB, """
        import sys, shmq
        with shmq.connect(namespace=sys.argv[1], create=False) as b:
            q = b.queue("jobs")
            q.put(b"from bob")
            ds = q.get_many(10, timeout=5)
            q.ack_many(ds)
            print([d.body for d in ds], q.stats().ready + q.stats().in_flight)
            b.create_queue("replies").put(b"to alice")
            for delete, name in ((b.delete_queue, "jobs"), (b.delete_stream, "events")):  # Alice's: refused
                try:
                    delete(name)
                except shmq.Unauthorized as e:
                    print(e)
            print(b.list_queues(), b.list_streams())
    """, namespace)) == [
        "[b'from alice', b'from bob'] 0",
        *(f"{what} is uid {users.uid[ALICE]}'s, not yours (uid {users.uid[BOB]}): in a namespace shared with a "
          "group only its maker (or root) may delete it" for what in ("queue 'jobs'", "stream 'events'")),
        "['jobs', 'replies'] ['events']"]
    assert ok(run_as(users, ALICE, """
        import sys, shmq
        with shmq.connect(namespace=sys.argv[1], create=False) as b:
            q = b.queue("replies")
            d = q.get(timeout=5)
            d.ack()
            print(d.body, q.stats().ready + q.stats().in_flight)
    """, namespace)) == ["b'to alice' 0"]

    # Eve is in no group of theirs: refused in one line, locally and at the command line
    registry = os.path.join(SHM_DIR, f"shmq.{namespace}.registry")
    assert ok(run_as(users, EVE, """
        import sys, shmq
        try:
            shmq.connect(namespace=sys.argv[1])
        except shmq.Unauthorized as e:
            print(isinstance(e, PermissionError), e)
    """, namespace)) == [
        f"True namespace {namespace!r} belongs to another user ({registry} is uid {users.uid[ALICE]}'s, mode 0660, "
        f"shared with group {GROUP!r} (gid {users.gid}), which you are not in): run as its owner, or ask for the "
        "namespace to be shared with a group of yours (docs/OPERATIONS.md, Sharing with a group)"]
    r = run_as(users, EVE, "from shmq.cli import main; main()", "list", "--namespace", namespace)
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (
        1, "", [f"shmq: error: namespace {namespace!r} belongs to another user ({registry} is uid "
                f"{users.uid[ALICE]}'s, mode 0660, shared with group {GROUP!r} (gid {users.gid}), which you are not "
                "in): run as its owner, or ask for the namespace to be shared with a group of yours "
                "(docs/OPERATIONS.md, Sharing with a group)"])
    r = run_as(users, EVE, "from shmq.cli import main; main()", "namespace", "create", namespace + "x",
               "--group", GROUP)
    assert (r.returncode, r.stderr.splitlines()) == (1, [
        f"shmq: error: you (uid {users.uid[EVE]}) are not in group {GROUP!r} (gid {users.gid}): add yourself with "
        f"usermod -aG {GROUP} $USER and log in again, or choose one of your groups (id -Gn)"])
    assert namespace_entries(namespace + "x") == []

    alice = (ALICE, 0o660, GROUP)
    bob = (BOB, 0o660, GROUP)
    assert owners_modes(shm(namespace, *namespace_entries(namespace))) == {
        **dict.fromkeys(shm(namespace, "shmq.{ns}.registry", "shmq.{ns}.q.jobs", "sem.shmq.{ns}.q.jobs.ne",
                            "sem.shmq.{ns}.q.jobs.nf", "shmq.{ns}.s.events", "shmq.{ns}.s.events#0",
                            "shmq.{ns}.s.events#1", "sem.shmq.{ns}.s.events.ne"), alice),
        **dict.fromkeys(shm(namespace, "shmq.{ns}.q.replies", "sem.shmq.{ns}.q.replies.ne",
                            "sem.shmq.{ns}.q.replies.nf"), bob)}


def test_the_default_stays_owner_only(broker, users):
    broker.create_queue("jobs", lanes=2)
    entries = shm(broker.namespace, *namespace_entries(broker.namespace))
    assert len(entries) == 7  # the registry, two lanes of a segment and two semaphores each
    assert {p: m[1:] for p, m in owners_modes(entries).items()} == dict.fromkeys(entries, (0o600, "root"))
    assert broker.shared_group is None
    r = run_as(users, BOB, "from shmq.cli import main; main()", "list", "--namespace", broker.namespace)
    registry = os.path.join(SHM_DIR, f"shmq.{broker.namespace}.registry")
    assert (r.returncode, r.stderr.splitlines()) == (1, [
        f"shmq: error: namespace {broker.namespace!r} belongs to another user ({registry} is uid 0's, mode 0600): "
        "run as its owner, or ask for the namespace to be shared with a group of yours (docs/OPERATIONS.md, "
        "Sharing with a group)"])


def test_sharing_an_existing_namespace_converts_it(broker, users):
    broker.create_queue("jobs")
    assert broker.create_namespace(group=GROUP) is False
    entries = shm(broker.namespace, *namespace_entries(broker.namespace))
    assert owners_modes(entries) == dict.fromkeys(entries, ("root", 0o660, GROUP))
    assert broker.shared_group == users.gid
    broker.create_queue("later")  # made after: shared too
    assert owners_modes(shm(broker.namespace, "shmq.{ns}.q.later")) == dict.fromkeys(
        shm(broker.namespace, "shmq.{ns}.q.later"), ("root", 0o660, GROUP))
    with pytest.raises(shmq.ShmqError, match=r"^no group 'no-such-group-x' on this host \(see getent group\)$"):
        broker.create_namespace(group="no-such-group-x")


# ---------------------------------------------------------------- a server and its data dir
@pytest.fixture
def base(users):
    """A directory Alice owns that every user may enter (tmp_path is root's alone)."""
    path = tempfile.mkdtemp(prefix="shmq-group-", dir="/tmp")
    os.chmod(path, 0o755)
    os.chown(path, users.uid[ALICE], -1)
    yield path
    shutil.rmtree(path)


@pytest.mark.slow
def test_a_server_with_a_group_writes_data_files_the_group_reads(namespace, users, base):
    data = os.path.join(base, "data")
    # run as Alice directly, not under runuser (which dies of the SIGTERM it passes on): the server's own exit status
    server = subprocess.Popen(
        [users.python, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0", "--group", GROUP,
         "--data-dir", data, "--snapshot-interval", "0.1"],
        user=ALICE, group=pwd.getpwnam(ALICE).pw_gid, extra_groups=[users.gid],
        env={**users.env, "SHMQ_HOME": os.path.join(base, "home")}, cwd="/", stderr=subprocess.PIPE, text=True)
    try:
        log = []
        while not log or "serving namespace" not in log[-1]:
            log.append(server.stderr.readline())
            assert log[-1] and len(log) < 100, log
        lock = os.path.join(SHM_DIR, f"shmq.{namespace}.broker")
        assert owners_modes([lock]) == {lock: (ALICE, 0o660, GROUP)}
        ok(run_as(users, BOB, """
            import sys, shmq
            with shmq.connect(namespace=sys.argv[1], create=False) as b:
                b.create_queue("orders", durability="snapshot").put_many([b"o1", b"o2", b"o3"])
                b.create_queue("audit", durability="wal")
        """, namespace))
        orders, audit = snapshot_path(data, "orders"), snapshot_path(data, "audit")
        wait_for(lambda: os.path.exists(audit) and os.path.exists(orders)
                 and len(shmq.formats.dmsq.read_snapshot(orders).records) == 3, 30,
                 "the server's snapshots of orders (3 messages) and audit")
        # Bob's puts write audit's log (the first appender makes it: Bob's, in the group): he reads it back. A
        # snapshot round may rotate the log away between a put and the look: then one more put, a bounded number
        assert ok(run_as(users, BOB, """
            import glob, os, stat, sys, shmq, shmq.formats.dmsq
            print([r.body for r in shmq.formats.dmsq.read_snapshot(sys.argv[3]).records])
            with shmq.connect(namespace=sys.argv[1], create=False) as b:
                for i in range(100):
                    b.queue("audit").put(b"a%d" % i)
                    for path in glob.glob(os.path.join(sys.argv[2], "audit.wal.*")):
                        try:
                            with open(path, "rb") as f:
                                st = os.fstat(f.fileno())
                                print(f.read(4) != b"", oct(stat.S_IMODE(st.st_mode)), st.st_gid)
                                sys.exit(0)
                        except FileNotFoundError:
                            pass
                sys.exit("audit's log was never seen")
        """, namespace, data, orders)) == ["[b'o1', b'o2', b'o3']", f"True 0o660 {users.gid}"]
        assert ok(run_as(users, EVE, """
            import sys, shmq.formats.dmsq
            try:
                shmq.formats.dmsq.read_snapshot(sys.argv[1])
            except PermissionError as e:
                print("refused:", e.strerror)
        """, orders)) == ["refused: Permission denied"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, server.stderr.read()
        server.stderr.close()
    files = sorted(os.path.join(data, f) for f in os.listdir(data))
    assert all(os.path.basename(f).startswith("audit.wal.") for f in files
               if not f.endswith((".dmsq", "registry.id", "disk-reserve"))), files
    assert {os.path.basename(f) for f in files} >= {"orders.dmsq", "audit.dmsq"}
    assert {p: m[1:] for p, m in owners_modes(files).items()} == dict.fromkeys(files, (0o660, GROUP))
    assert owners_modes([data]) == {data: (ALICE, 0o2770, GROUP)}
    assert not os.path.exists(lock)  # a clean stop unlinks it


def test_a_server_with_an_unknown_group_refuses_to_start(namespace, tmp_path):
    r = subprocess.run([sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0",
                        "--group", "no-such-group-x", "--data-dir", str(tmp_path / "data")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert (r.returncode, r.stderr.splitlines()) == (
        1, ["shmq: error: no group 'no-such-group-x' on this host (see getent group)"])
    assert namespace_entries(namespace) == [] and not (tmp_path / "data").exists()  # nothing made


def test_two_members_share_a_keyed_store(namespace, users):
    """A store's db file and its -wal and -shm (which SQLite makes, and removes at the last
    close) stay usable by both members, whichever of them opens first or last."""
    ok(run_as(users, ALICE, "from shmq.cli import main; main()", "namespace", "create", namespace, "--group", GROUP))
    code = """
        import sys, shmq
        with shmq.connect(namespace=sys.argv[1], create=False) as b:
            kv = b.store("results")
            kv.set(sys.argv[2], b"v")
            print(kv.incr("n"), kv.add("who", sys.argv[2]), sorted(kv.keys()))
    """
    assert ok(run_as(users, ALICE, code, namespace, "alice")) == ["1 1 ['alice', 'n', 'who']"]
    assert ok(run_as(users, BOB, code, namespace, "bob")) == ["2 2 ['alice', 'bob', 'n', 'who']"]
    held = subprocess.Popen([RUNUSER, "-u", ALICE, "--", users.python, "-c", textwrap.dedent("""
        import sys, shmq
        b = shmq.connect(namespace=sys.argv[1], create=False)
        kv = b.store("results")
        print(kv.get("n").decode(), flush=True)
        print(kv.get("done", timeout=60))
    """), namespace], env=users.env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline() == "2\n"  # Alice holds it open: Bob writes under her -wal and -shm
        assert ok(run_as(users, BOB, code, namespace, "bob2")) == ["3 3 ['alice', 'bob', 'bob2', 'n', 'who']"]
        ok(run_as(users, BOB, """
            import sys, shmq
            with shmq.connect(namespace=sys.argv[1], create=False) as b:
                b.store("results").set("done", b"yes")
        """, namespace))
        out, err = held.communicate(timeout=60)
        assert (held.returncode, out) == (0, "b'yes'\n"), err
    finally:
        if held.poll() is None:
            held.kill()
            held.wait()
    r = run_as(users, EVE, """
        import sys, shmq
        try:
            shmq.connect(namespace=sys.argv[1]).store("results").get("n")
        except shmq.Unauthorized as e:
            print("refused")
    """, namespace)
    assert ok(r) == ["refused"]
    files = shm(namespace, *(e for e in namespace_entries(namespace) if ".kv." in e))
    assert files and all(m[1:] == (0o660, GROUP) for m in owners_modes(files).values()), owners_modes(files)
