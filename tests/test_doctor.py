"""``shmq doctor``: /dev/shm's size, namespaces and their brokers, orphans, data dirs;
``--clean`` removes exactly the orphans. Other brokers may run on this host: every test
looks at (and cleans) only namespaces it made, with ``--namespace``."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import shmq
from shmq import doctor
from shmq.auth import default_data_dir, run_dir
from shmq.engine.shm.segment import SHM_DIR, destroy_namespace, namespace_entries, unlink_segment
from shmq.server.lock import lock_name
from tests.test_cli import shmq_cli


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def make_namespace():
    """Fresh namespaces, destroyed at the end whatever happened."""
    made = []

    def make():
        ns = "t" + uuid.uuid4().hex[:12]
        made.append(ns)
        return ns

    yield make
    for ns in made:
        destroy_namespace(ns)


def _in_a_child_that_dies(script):
    """Run ``script`` (with ``os``, ``signal`` and ``shmq`` imported) in a process that
    SIGKILLs itself where the script says ``die()``."""
    code = "import os, signal, shmq\ndef die():\n    os.kill(os.getpid(), signal.SIGKILL)\n" + textwrap.dedent(script)
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT}, timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr


def _doctor(*args):
    """doctor's output; its exit code must be 1 exactly when it found something it left
    for a hand (its report's ``problems``: orphans not removed, ...), with one line saying so."""
    r = shmq_cli("doctor", *args)
    problems = json.loads(shmq_cli("doctor", *[a for a in args if a != "--clean"], "--json").stdout)["problems"] \
        if "--json" not in args else json.loads(r.stdout)["problems"]
    if "--clean" in args and "--json" not in args:
        problems = json.loads(shmq_cli("doctor", *[a for a in args if a not in ("--clean", "--data-dirs")],
                                       "--json").stdout)["problems"]
    assert r.returncode == (1 if problems else 0), (r.returncode, problems, r.stderr)
    assert (r.stderr.count("\n") == 1 and r.stderr.startswith("shmq: error: ")) if r.returncode and "--json" not in args \
        else r.stderr == "", r.stderr
    return r.stdout


def test_doctor_reports_brokers_and_orphans_and_clean_removes_exactly_the_orphans(make_namespace, servers):
    live, gone, half, unborn, killed = (make_namespace() for _ in range(5))
    # a namespace with a broker (and its default data dir) and a queue
    srv = servers(live)
    with shmq.connect(srv.url) as remote:
        remote.create_queue("orders").put(b"order #42")
    data_dir, deadline = default_data_dir(live), time.monotonic() + 30
    while not any(e.endswith(".dmsq") for e in os.listdir(data_dir)):  # the broker's first snapshot of it
        assert time.monotonic() < deadline, "no snapshot of queue orders"
        time.sleep(0.01)
    # a namespace whose registry is gone: its queue's segment and semaphores are orphans
    with shmq.connect(namespace=gone) as b:
        b.create_queue("lost", max_bytes=4096).close()
        b.create_stream("lost-stream", partitions=2, max_bytes=4096).close()
    unlink_segment(f"/shmq.{gone}.registry")
    orphans_of_gone = set(namespace_entries(gone))
    # a create whose process died half-way (segment and one semaphore made), beside a live queue
    with shmq.connect(namespace=half) as b:
        b.create_queue("ok", max_bytes=4096).close()
    _in_a_child_that_dies(f"""
        import shmq.engine.broker as B
        real = B.create_semaphore
        def dying(name, *more):
            if name.endswith(".nf"):
                die()
            return real(name, *more)
        B.create_semaphore = dying
        shmq.connect(namespace={half!r}).create_queue("half", max_bytes=4096)
    """)
    orphans_of_half = {f"shmq.{half}.q.half", f"sem.shmq.{half}.q.half.ne"}
    assert orphans_of_half <= set(namespace_entries(half))
    # a registry whose creator died before publishing it
    _in_a_child_that_dies(f"""
        from shmq.engine.shm.registry import creation_guard
        with creation_guard({unborn!r}):
            die()
    """)
    # a broker that was SIGKILLed: its lock file stays
    dead = servers(killed, "--no-persist")
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait(10)
    runtime_file = os.path.join(run_dir(), f"server-{dead.port}-{dead.proc.pid}.json")  # stays after a SIGKILL
    expected = orphans_of_gone | orphans_of_half | {f"shmq.{unborn}.registry", lock_name(killed), runtime_file}
    ns_args = [a for ns in (live, gone, half, unborn, killed) for a in ("--namespace", ns)]

    report = json.loads(_doctor(*ns_args, "--json"))
    fs = os.statvfs(SHM_DIR)
    assert (report["shm"]["path"], report["shm"]["size"]) == (SHM_DIR, fs.f_blocks * fs.f_frsize)
    assert 0 < report["shm"]["free"] <= report["shm"]["size"]
    by_ns = {ns["namespace"]: ns for ns in report["namespaces"]}
    assert set(by_ns) == {live, gone, half, unborn, killed}
    assert by_ns[live]["broker"]["pid"] == srv.proc.pid and by_ns[live]["broker"]["alive"] is True
    assert by_ns[live]["broker"]["port"] == srv.port and by_ns[live]["queues"] == ["orders"]
    assert by_ns[killed]["broker"]["pid"] == dead.proc.pid and by_ns[killed]["broker"]["alive"] is False
    assert by_ns[gone]["registry"] == "missing" and by_ns[unborn]["registry"] == "dead-creator"
    assert by_ns[half]["queues"] == ["ok"]
    found = {o["entry"]: o for o in report["orphans"]}
    assert set(found) == expected
    assert all("removed" not in o for o in found.values())  # a report changes nothing
    assert "whose process died" in found[f"shmq.{half}.q.half"]["reason"]
    assert "no registry" in found[f"shmq.{gone}.q.lost"]["reason"]
    data = {d["namespace"]: d for d in report["data_dirs"]}
    assert data[live]["path"] == default_data_dir(live) and data[live]["broker"] == srv.proc.pid
    assert data[live]["files"] == 3 and data[live]["disk_free"] > 0  # its snapshot, registry.id, disk-reserve

    text = _doctor(*ns_args)
    assert text.startswith(f"{SHM_DIR}: ") and f"broker pid {srv.proc.pid} on 127.0.0.1:{srv.port}" in text
    assert f"broker pid {dead.proc.pid} not running" in text and "`shmq doctor --clean` removes them" in text
    everything = json.loads(_doctor("--json"))  # the whole host, read only: ours are in it
    assert {live, gone} <= {ns["namespace"] for ns in everything["namespaces"]}

    before = {ns: set(namespace_entries(ns)) for ns in (live, gone, half, unborn, killed)}
    cleaned = json.loads(_doctor(*ns_args, "--clean", "--json"))
    assert {o["entry"] for o in cleaned["orphans"] if o["removed"]} == expected
    after = {ns: set(namespace_entries(ns)) for ns in (live, gone, half, unborn, killed)}
    assert set().union(*before.values()) - set().union(*after.values()) == expected - {runtime_file}  # exactly those
    assert not os.path.exists(runtime_file)
    assert after[gone] == after[unborn] == set() and after[killed] == {f"shmq.{killed}.registry"}
    assert srv.alive()
    with shmq.connect(srv.url) as remote:
        assert remote.queue("orders").get(timeout=5).body == b"order #42"
    with shmq.connect(namespace=half) as b:
        assert b.list_queues() == ["ok"]
        b.create_queue("half", max_bytes=4096).close()  # the half-made entry is free again
    assert json.loads(_doctor(*ns_args, "--json"))["orphans"] == []
    assert srv.stop() == 0


def test_a_small_dev_shm_is_named_with_the_docker_fix(monkeypatch):
    monkeypatch.setattr(doctor, "_fs", lambda path: {"size": 64 * 10**6, "free": 4 * 10**6})
    shm = doctor.shm_report()
    assert any("Docker's default is 64 MB" in w and "--shm-size" in w for w in shm["warnings"])
    assert any("full" in w for w in shm["warnings"])
    assert any("warning: " in line for line in doctor.render({"shm": shm, "namespaces": [], "orphans": [],
                                                              "data_dirs": [], "other_users_entries": 0}))


def test_doctor_names_a_killed_servers_runtime_file_and_the_data_dirs_of_gone_namespaces(make_namespace, servers):
    """Before: "orphans: none" with a SIGKILLed broker's runtime file left, and a data dir
    listed without saying that its namespace is gone."""
    gone, live = make_namespace(), make_namespace()
    srv = servers(gone)  # persistence on: the default data dir
    with shmq.connect(srv.url) as remote:
        remote.create_queue("q").put(b"x")
    data = default_data_dir(gone)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(data, "q.dmsq")):
        assert time.monotonic() < deadline, "no snapshot of q"
        time.sleep(0.01)
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    runtime_file = os.path.join(run_dir(), f"server-{srv.port}-{srv.proc.pid}.json")
    assert os.path.exists(runtime_file)
    with shmq.connect(namespace=live) as b:  # a namespace that is there, with a data dir
        b.create_queue("stays").close()
    os.makedirs(default_data_dir(live))
    open(os.path.join(default_data_dir(live), "stays.dmsq"), "wb").close()
    ns_args = ["--namespace", gone, "--namespace", live]
    try:
        report = json.loads(_doctor(*ns_args, "--json"))
        stale = [o for o in report["orphans"] if o["entry"] == runtime_file]
        assert len(stale) == 1 and stale[0]["namespace"] == gone
        assert stale[0]["reason"] == f"the runtime file of a server that is gone (pid {srv.proc.pid}, port {srv.port})"
        assert "orphans: none" not in _doctor(*ns_args)

        destroy_namespace(gone)  # its shared memory gone (a reboot): the data dir stays
        report = json.loads(_doctor(*ns_args, "--json"))
        exists = {d["namespace"]: d["exists"] for d in report["data_dirs"]}
        assert exists == {gone: False, live: True}
        assert f"no namespace {gone} in /dev/shm" in _doctor(*ns_args)
        assert f"no namespace {live} " not in _doctor(*ns_args)

        cleaned = json.loads(_doctor(*ns_args, "--clean", "--json"))  # the runtime file, not the data dir
        assert [o["removed"] for o in cleaned["orphans"] if o["entry"] == runtime_file] == [True]
        assert not os.path.exists(runtime_file) and os.path.exists(os.path.join(data, "q.dmsq"))

        r = shmq_cli("doctor", "--data-dirs")
        assert r.returncode == 2 and r.stderr.startswith("shmq: error: --data-dirs goes with --clean")
        cleaned = json.loads(_doctor(*ns_args, "--clean", "--data-dirs", "--json"))
        assert {d["namespace"]: d.get("removed") for d in cleaned["data_dirs"]} == {gone: True, live: None}
        assert not os.path.exists(data) and namespace_entries(gone) == []  # (its broker lock taken back too)
        assert os.path.exists(os.path.join(default_data_dir(live), "stays.dmsq"))
    finally:
        for ns in (gone, live):
            shutil.rmtree(default_data_dir(ns), ignore_errors=True)


def test_a_spark_spool_is_its_live_drivers_and_an_orphan_once_that_driver_is_gone(make_namespace):
    """The JVM sink's task spools (io.shmq.spark.sink): a live driver's are no orphans (``--clean``
    must never take one from under its commit); a gone driver's are, and are named so."""
    ns = make_namespace()
    with shmq.connect(namespace=ns) as b:
        b.create_namespace()
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = f"shmq.{ns}.spark-spool.{os.getpid()}.9f0c2b1a-0000-4000-8000-000000000000.3.0.7"
    lost = f"shmq.{ns}.spark-spool.{dead.pid}.9f0c2b1a-0000-4000-8000-000000000000.3.0.8"
    for name in (mine, lost):
        with open(os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_WRONLY, 0o600), "wb") as f:
            f.write(b"rows")
    try:
        found = {o["entry"]: o for o in json.loads(_doctor("--namespace", ns, "--json"))["orphans"]}
        assert set(found) == {lost} and "Spark JVM sink whose driver is gone" in found[lost]["reason"]
        cleaned = json.loads(_doctor("--namespace", ns, "--clean", "--json"))
        assert [o["entry"] for o in cleaned["orphans"] if o["removed"]] == [lost]
        assert os.path.exists(os.path.join(SHM_DIR, mine))
    finally:
        for name in (mine, lost):
            if os.path.exists(os.path.join(SHM_DIR, name)):
                os.unlink(os.path.join(SHM_DIR, name))
